package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPlatformsDemo runs `DEMO_BILLING=platforms DEMO_EXIT=1 hack/demo.sh` as a user
// would: a real control plane, the manager and every platform fake in this checkout
// as processes, signed webhooks over HTTP. It passes only if the script exits 0, that
// is, if for every platform each job was Applied, each settlement Settled and each
// settlement key billed exactly once in the platform's books.
func TestPlatformsDemo(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "demo.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "DEMO_BILLING=platforms", "DEMO_EXIT=1", "DEMO_DIR="+t.TempDir())
	// On the deadline the script gets SIGTERM, so its trap stops what it started.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 90 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	t.Logf("DEMO_BILLING=platforms DEMO_EXIT=1 hack/demo.sh: %s in %s", exitOf(err), time.Since(start).Round(time.Second))
	if err != nil {
		t.Fatalf("the platforms demo failed:\n%s", out.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "demo (") {
			t.Log(line) // which platforms ran
		}
	}
	for _, want := range []string{"[ok  ] all 2 settlements are Settled", "books hold exactly one billed event per settlement key", "every check passed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out.String())
		}
	}
}

func exitOf(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}
