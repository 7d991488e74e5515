package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/signature"
)

const testKey = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// receiverStub is a real HTTP server that verifies Standard Webhooks signatures with
// testKey, as the receiver does, answering 404 for the first notFound deliveries
// (the provider not in the cache yet) and then what answer says for a valid one.
func receiverStub(t *testing.T, notFound int32, answer func(valid bool) (int, string)) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/webhooks/ns/p" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		if n <= notFound {
			http.Error(w, `{"error":"unknown_provider"}`, http.StatusNotFound)
			return
		}
		_, err := signature.Verify(signature.Config{Scheme: signature.SchemeStandardWebhooks},
			[][]byte{[]byte(testKey)}, r.Header, body, time.Now())
		code, text := answer(err == nil)
		w.WriteHeader(code)
		_, _ = io.WriteString(w, text)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func keyFile(t *testing.T, key string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func runCheck(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := checkReceiver(args, &out, &errOut)
	return code, out.String() + errOut.String()
}

// receiverAnswers is the real receiver's behaviour for the test provider, which routes
// nothing: a valid signature is 200 ignored, any other 401.
func receiverAnswers(valid bool) (int, string) {
	if valid {
		return http.StatusOK, `{"status":"ignored"}`
	}
	return http.StatusUnauthorized, `{"error":"invalid_signature"}`
}

func TestCheckReceiverPassesAgainstAReceiverThatChecksSignatures(t *testing.T) {
	srv, calls := receiverStub(t, 1, receiverAnswers)
	code, out := runCheck(t, "-url", srv.URL+"/webhooks/ns/p", "-secret-file", keyFile(t, testKey), "-timeout", "30s")
	if code != 0 {
		t.Fatalf("exit %d, want 0:\n%s", code, out)
	}
	if calls.Load() != 3 { // 404 (retried), 200 ignored, 401
		t.Fatalf("%d deliveries, want 3:\n%s", calls.Load(), out)
	}
	for _, want := range []string{"attempt 1: 404", "200 {\"status\":\"ignored\"}", "another key: 401", "ok:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestCheckReceiverFails(t *testing.T) {
	for name, tc := range map[string]struct {
		key    string
		answer func(valid bool) (int, string)
		says   string
	}{
		"the key is not the provider's": {"whsec_" + "b3RoZXIga2V5IG9mIDMyIGJ5dGVzIGZvciB0aGUgdGVzdA==", receiverAnswers,
			"signed with the test provider's key was answered 401"},
		"the delivery was stored": {testKey, func(valid bool) (int, string) {
			return http.StatusOK, `{"status":"accepted","event":"e"}`
		}, "want status ignored"},
		"signatures are not checked": {testKey, func(bool) (int, string) { return http.StatusOK, `{"status":"ignored"}` },
			"the receiver does not check signatures"},
		"the key is not a Standard Webhooks key": {"whsec_not base64!", receiverAnswers, "sign the delivery"},
	} {
		t.Run(name, func(t *testing.T) {
			srv, _ := receiverStub(t, 0, tc.answer)
			code, out := runCheck(t, "-url", srv.URL+"/webhooks/ns/p", "-secret-file", keyFile(t, tc.key), "-timeout", "5s")
			if code != 1 || !strings.Contains(out, tc.says) {
				t.Fatalf("exit %d, want 1 saying %q:\n%s", code, tc.says, out)
			}
		})
	}
}

func TestCheckReceiverGivesUpAtItsDeadline(t *testing.T) {
	srv, _ := receiverStub(t, 1<<30, receiverAnswers)
	code, out := runCheck(t, "-url", srv.URL+"/webhooks/ns/p", "-secret-file", keyFile(t, testKey), "-timeout", "3s")
	if code != 1 || !strings.Contains(out, "no answer but 404") {
		t.Fatalf("exit %d, want 1 naming the last answer:\n%s", code, out)
	}
}

func TestCheckReceiverRefusesMissingFlags(t *testing.T) {
	if code, out := runCheck(t, "-url", "http://127.0.0.1:1/webhooks/ns/p"); code != 2 || !strings.Contains(out, "-secret-file") {
		t.Fatalf("exit %d, want 2 naming -secret-file:\n%s", code, out)
	}
}
