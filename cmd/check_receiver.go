package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/signature"
)

// checkReceiverCommand is the manager's one subcommand: `manager check-receiver`, run
// by the Helm chart's test Pod (`helm test`, charts/settlement-operator/templates/tests)
// with the manager's own image, so the check needs nothing an offline cluster lacks.
const checkReceiverCommand = "check-receiver"

// checkReceiverEventType is the type of the delivery the check sends. The chart's test
// WebhookProvider routes no type, so the receiver answers it 200 "ignored" and stores
// nothing: the check never creates a record, let alone moves money.
const checkReceiverEventType = "settlement-operator.helm-test"

// checkReceiver sends the installed receiver one delivery signed with the test
// provider's key and expects 200 "ignored", then the same delivery signed with another
// key and expects 401. While the provider is not yet known to every replica (404) or
// its key not yet readable (503), or the receiver is still starting, it retries until
// -timeout. It returns the process's exit code: 0 when both answers are as expected.
func checkReceiver(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(checkReceiverCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the receiver endpoint of the test provider, http://<service>/webhooks/<namespace>/<provider> (required)")
	secretFile := fs.String("secret-file", "", "file holding the test provider's Standard Webhooks key, whsec_... (required)")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to retry while the receiver or the provider is not ready yet")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *url == "" || *secretFile == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: -url and -secret-file are required, and nothing else\n", checkReceiverCommand)
		fs.Usage()
		return 2
	}
	secret, err := os.ReadFile(*secretFile)
	if err != nil {
		fmt.Fprintf(stderr, "%s: read the signing key: %v\n", checkReceiverCommand, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := runCheckReceiver(ctx, *url, secret, stdout); err != nil {
		fmt.Fprintf(stderr, "%s: FAIL: %v\n", checkReceiverCommand, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok: the receiver verifies signatures and answers the test provider\n", checkReceiverCommand)
	return 0
}

func runCheckReceiver(ctx context.Context, url string, secret []byte, log io.Writer) error {
	id := fmt.Sprintf("msg_helm_test_%d", time.Now().UnixNano())
	body := []byte(`{"type":"` + checkReceiverEventType + `","data":{}}`)
	hc := &http.Client{Timeout: 10 * time.Second}

	var status int
	var answer string
	for attempt := 1; ; attempt++ {
		var err error
		status, answer, err = sendSigned(ctx, hc, url, secret, id, body)
		switch {
		case err == nil && status == http.StatusOK:
		case err == nil && status != http.StatusNotFound && status != http.StatusServiceUnavailable &&
			status != http.StatusTooManyRequests:
			return fmt.Errorf("a delivery signed with the test provider's key was answered %d %s; want 200 ignored", status, answer)
		default: // not listening yet, or the provider or its Secret not seen yet: try again
			what := fmt.Sprintf("%d %s", status, answer)
			if err != nil {
				what = err.Error()
			}
			fmt.Fprintf(log, "%s: attempt %d: %s; trying again\n", checkReceiverCommand, attempt, what)
			select {
			case <-ctx.Done():
				return fmt.Errorf("no answer but %s before the deadline: is the receiver Service reaching ready Pods, "+
					"and the test WebhookProvider Ready? (kubectl describe webhookprovider)", what)
			case <-time.After(2 * time.Second):
			}
			continue
		}
		break
	}
	var got struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(answer), &got); err != nil || got.Status != "ignored" {
		return fmt.Errorf("a delivery signed with the test provider's key was answered 200 %s; want status ignored "+
			"(the test provider routes nothing, so nothing may be stored)", answer)
	}
	fmt.Fprintf(log, "%s: signed delivery %s: 200 %s\n", checkReceiverCommand, id, answer)

	// The same delivery signed with another key must be refused before anything else.
	other := append([]byte("whsec_"), []byte("c2V0dGxlbWVudC1vcGVyYXRvciB3cm9uZyBrZXk=")...)
	status, answer, err := sendSigned(ctx, hc, url, other, id, body)
	if err != nil {
		return fmt.Errorf("send a delivery signed with another key: %w", err)
	}
	if status != http.StatusUnauthorized {
		return fmt.Errorf("a delivery signed with another key was answered %d %s; want 401: the receiver does not check signatures", status, answer)
	}
	fmt.Fprintf(log, "%s: delivery signed with another key: 401 %s\n", checkReceiverCommand, answer)
	return nil
}

// sendSigned posts body signed with secret (Standard Webhooks) and returns the answer's
// status and body, trimmed.
func sendSigned(ctx context.Context, hc *http.Client, url string, secret []byte, id string, body []byte) (int, string, error) {
	h, err := signature.Sign(signature.Config{Scheme: signature.SchemeStandardWebhooks}, secret, id, time.Now(), body)
	if err != nil {
		return 0, "", fmt.Errorf("sign the delivery: %w (is the file a whsec_ key?)", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", fmt.Errorf("build the request: %w", err)
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, "", err
		}
		return 0, "", fmt.Errorf("post to %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, "", fmt.Errorf("read the answer: %w", err)
	}
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}
