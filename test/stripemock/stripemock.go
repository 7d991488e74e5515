// Package stripemock runs Stripe's official mock server (github.com/stripe/stripe-mock)
// for tests: it validates every request against Stripe's OpenAPI spec (required
// parameters, enums, encodings) and answers with fixtures, offline. It keeps no state,
// so it proves the adapter speaks Stripe's API, never that it charges once: that is
// what the stateful fake (test/fakestripe) is for.
//
// The binary is built once from the Go module proxy (`go install`, ~20 s) into the
// repository's bin/ and reused; STRIPE_MOCK names a binary to use instead.
package stripemock

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

// Version is the stripe-mock release the suites use (its OpenAPI spec is what the
// adapter's requests are checked against).
const Version = "v0.203.0"

// Server is a running stripe-mock.
type Server struct {
	cmd  *exec.Cmd
	addr string
}

// URL is the base URL (plain HTTP on loopback).
func (s *Server) URL() string { return "http://" + s.addr }

// Close stops the server.
func (s *Server) Close() {
	_ = s.cmd.Process.Kill()
	_, _ = s.cmd.Process.Wait()
}

// Binary finds or builds stripe-mock.
func Binary() (string, error) {
	if p := os.Getenv("STRIPE_MOCK"); p != "" {
		return p, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("stripemock: cannot locate the repository")
	}
	bin := filepath.Join(filepath.Dir(file), "..", "..", "bin")
	path := filepath.Join(bin, "stripe-mock-"+Version)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp, err := os.MkdirTemp("", "stripe-mock-build-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	cmd := exec.Command("go", "install", "github.com/stripe/stripe-mock@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("stripemock: go install github.com/stripe/stripe-mock@%s: %v\n%s", Version, err, out)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(tmp, "stripe-mock"), path); err != nil {
		return "", err
	}
	return path, nil
}

// Start runs stripe-mock on a free loopback port and waits until it answers.
func Start() (*Server, error) {
	path, err := Binary()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cmd := exec.Command(path, "-http-addr", addr)
	// It logs every request it validates; a test that fails says what it sent itself.
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("stripemock: start: %w", err)
	}
	s := &Server{cmd: cmd, addr: addr}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodGet, s.URL()+"/v1/billing/meters", nil)
		req.Header.Set("Authorization", "Bearer sk_test_123")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
			return s, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.Close()
	return nil, errors.New("stripemock: no answer within 30s")
}
