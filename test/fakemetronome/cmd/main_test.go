package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
)

// The demo starts the fake as a process: its URL is stdout's first line, the token
// comes from a file, and /_admin/effects holds its books.
func TestProcessPrintsItsURLFirst(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fakemetronome")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("demo-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-token-file", tokenFile)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	url := strings.TrimSpace(line)
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("first line %q is not the URL", line)
	}
	at := time.Now().UTC().Format(time.RFC3339)
	body := `[{"transaction_id":"k1","customer_id":"c","event_type":"` + fakemetronome.DefaultEventType + `","timestamp":"` + at + `","properties":{"quantity":"1"}}]`
	for _, token := range []string{"wrong", "demo-token", "demo-token"} {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/ingest", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{true: 200, false: 401}[token == "demo-token"]; resp.StatusCode != want {
			t.Fatalf("token %q: %d", token, resp.StatusCode)
		}
	}
	resp, err := http.Get(url + "/_admin/effects")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var effects map[string]int
	if err := json.NewDecoder(resp.Body).Decode(&effects); err != nil || effects["k1"] != 1 {
		t.Fatalf("effects %v %v", effects, err)
	}
}
