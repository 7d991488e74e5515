// Package sender signs and posts webhooks exactly as a real provider does, for the
// test suites, the demo and the send-webhook command.
package sender

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/signature"
)

// Delivery is one webhook to send.
type Delivery struct {
	// URL is the receiver endpoint, e.g. http://127.0.0.1:8090/webhooks/default/inference.
	URL string
	// Signature is the scheme configuration; Secret signs with it.
	Signature signature.Config
	Secret    []byte
	// ID is the Standard Webhooks webhook-id (ignored by the other schemes).
	ID string
	// Timestamp signs the delivery (now when zero).
	Timestamp time.Time
	// Body is the JSON payload.
	Body []byte
	// Signed holds the values of the headers Signature.SignedHeaders lists (HMACSHA256,
	// e.g. CloudEvents binary mode's ce-id and ce-type): they are signed and sent.
	Signed http.Header
	// Header adds headers that are not signed (the receiver takes nothing that decides
	// an effect from them); a signature header of the same name wins.
	Header http.Header
	// ContentType is sent as Content-Type (application/json when empty).
	ContentType string
}

// Response is the receiver's answer.
type Response struct {
	Status     int
	Body       string
	RetryAfter string
}

// Send signs and posts d with client (http.DefaultClient when nil).
func Send(ctx context.Context, client *http.Client, d Delivery) (Response, error) {
	if client == nil {
		client = http.DefaultClient
	}
	ts := d.Timestamp
	if ts.IsZero() {
		ts = time.Now()
	}
	h, err := signature.SignWithHeaders(d.Signature, d.Secret, d.ID, ts, d.Body, d.Signed)
	if err != nil {
		return Response{}, fmt.Errorf("sign delivery: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Body))
	if err != nil {
		return Response{}, fmt.Errorf("build request: %w", err)
	}
	for k, vs := range d.Header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	// The signature's headers last: an extra header never replaces a signed one.
	for k, vs := range h {
		req.Header[k] = vs
	}
	ct := d.ContentType
	if ct == "" {
		ct = "application/json"
	}
	req.Header.Set("Content-Type", ct)
	resp, err := client.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("post delivery: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return Response{Status: resp.StatusCode, Body: string(b), RetryAfter: resp.Header.Get("Retry-After")}, nil
}
