package billing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

const testToken = "sk_test_Zm9vYmFyYmF6cXV4"

func newClient(t *testing.T, endpoint string, timeout time.Duration) billing.Client {
	t.Helper()
	c, err := billing.NewHTTP(billing.HTTPConfig{Endpoint: endpoint, Token: testToken, Timeout: timeout})
	if err != nil {
		t.Fatalf("NewHTTP(%q): %v", endpoint, err)
	}
	return c
}

func chargeRequest(n int) billing.Request {
	return billing.Request{
		SettlementKey:  fmt.Sprintf("inference/job-%d", n),
		IdempotencyKey: fmt.Sprintf("stl_%032x", n),
		Type:           billing.TypeCharge,
		Customer:       "cus_42",
		Usage:          &billing.Usage{Meter: "gpt-tokens", Quantity: "1523", Unit: "tokens"},
		Metadata:       map[string]string{"job": fmt.Sprintf("job-%d", n)},
	}
}

// wantError asserts err carries a classified *billing.Error of class and code, and
// that the credential is nowhere in its text.
func wantError(t *testing.T, err error, class billing.Class, code string) *billing.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s %s", class, code)
	}
	e, ok := billing.AsError(err)
	if !ok {
		t.Fatalf("error %q carries no *billing.Error", err)
	}
	if e.Class != class || e.Code != code {
		t.Fatalf("got class %s code %q (%v), want %s %q", e.Class, e.Code, err, class, code)
	}
	if strings.Contains(err.Error(), testToken) {
		t.Fatalf("error text contains the token: %q", err)
	}
	return e
}

// capture is an httptest provider that records the last request and answers with a
// fixed reply.
type capture struct {
	header http.Header
	body   []byte
	path   string
	calls  atomic.Int32
}

func (c *capture) server(t *testing.T, status int, reply string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.calls.Add(1)
		c.header = r.Header.Clone()
		c.path = r.URL.RequestURI()
		c.body, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, reply)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestSubmitSendsTheContract(t *testing.T) {
	tests := []struct {
		name     string
		req      billing.Request
		wantBody string
	}{
		{
			name: "charge for usage: quantity is a JSON number, reverses null, metadata kept",
			req: billing.Request{
				SettlementKey: "inference/job-1", IdempotencyKey: "stl_1", Type: billing.TypeCharge, Customer: "cus_1",
				Usage:    &billing.Usage{Meter: "gpt-tokens", Quantity: "12.5", Unit: "tokens"},
				Metadata: map[string]string{"job": "job-1"},
			},
			wantBody: `{"settlement_key":"inference/job-1","type":"charge","reverses":null,"customer":"cus_1","usage":{"meter":"gpt-tokens","quantity":12.5,"unit":"tokens"},"metadata":{"job":"job-1"}}`,
		},
		{
			name: "large integer quantity keeps every digit",
			req: billing.Request{
				SettlementKey: "k", IdempotencyKey: "stl_2", Type: billing.TypeCharge, Customer: "c",
				Usage: &billing.Usage{Meter: "m", Quantity: "12345678901234567890.000000000001"},
			},
			wantBody: `{"settlement_key":"k","type":"charge","reverses":null,"customer":"c","usage":{"meter":"m","quantity":12345678901234567890.000000000001,"unit":""},"metadata":{}}`,
		},
		{
			name: "leading zeros are dropped because JSON forbids them",
			req: billing.Request{
				SettlementKey: "k", IdempotencyKey: "stl_3", Type: billing.TypeCharge, Customer: "c",
				Usage: &billing.Usage{Meter: "m", Quantity: "007", Unit: "s"},
			},
			wantBody: `{"settlement_key":"k","type":"charge","reverses":null,"customer":"c","usage":{"meter":"m","quantity":7,"unit":"s"},"metadata":{}}`,
		},
		{
			name: "refund of an amount names what it reverses",
			req: billing.Request{
				SettlementKey: "inference/job-1/refund", IdempotencyKey: "stl_4", Type: billing.TypeRefund,
				Reverses: "inference/job-1", Customer: "cus_1", Amount: &billing.Amount{Minor: 1250, Currency: "USD"},
			},
			wantBody: `{"settlement_key":"inference/job-1/refund","type":"refund","reverses":"inference/job-1","customer":"cus_1","amount":{"minor":1250,"currency":"USD"},"metadata":{}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c capture
			srv := c.server(t, http.StatusCreated, `{"id":"set_1","status":"settled"}`)
			rec, err := newClient(t, srv.URL+"/v1/", 0).Submit(context.Background(), tt.req)
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if got := string(c.body); got != tt.wantBody {
				t.Errorf("body\n got %s\nwant %s", got, tt.wantBody)
			}
			if c.path != "/v1/settlements" {
				t.Errorf("path %q, want /v1/settlements", c.path)
			}
			for h, want := range map[string]string{
				"Idempotency-Key": tt.req.IdempotencyKey,
				"Authorization":   "Bearer " + testToken,
				"Content-Type":    "application/json",
				"Accept":          "application/json",
			} {
				if got := c.header.Get(h); got != want {
					t.Errorf("header %s = %q, want %q", h, got, want)
				}
			}
			// The minimal §6.1 reply is completed from the request.
			want := billing.Record{ID: "set_1", Status: billing.StatusSettled, SettlementKey: tt.req.SettlementKey,
				IdempotencyKey: tt.req.IdempotencyKey, Customer: tt.req.Customer, Type: tt.req.Type}
			if rec.ID != want.ID || rec.Status != want.Status || rec.SettlementKey != want.SettlementKey ||
				rec.IdempotencyKey != want.IdempotencyKey || rec.Customer != want.Customer || rec.Type != want.Type {
				t.Errorf("record %+v, want %+v", rec, want)
			}
			if (rec.Usage == nil) != (tt.req.Usage == nil) || (rec.Amount == nil) != (tt.req.Amount == nil) {
				t.Errorf("record usage/amount %v/%v, want as requested", rec.Usage, rec.Amount)
			}
		})
	}
}

func TestSubmitRejectsBadInputWithoutSending(t *testing.T) {
	base := chargeRequest(1)
	tests := []struct {
		name   string
		mutate func(*billing.Request)
	}{
		{"empty settlement key", func(r *billing.Request) { r.SettlementKey = "" }},
		{"empty idempotency key", func(r *billing.Request) { r.IdempotencyKey = "" }},
		{"idempotency key with a newline", func(r *billing.Request) { r.IdempotencyKey = "stl_1\r\nX-Evil: 1" }},
		{"unknown type", func(r *billing.Request) { r.Type = "Charge" }},
		{"negative quantity", func(r *billing.Request) { r.Usage = &billing.Usage{Meter: "m", Quantity: "-1"} }},
		{"exponent quantity", func(r *billing.Request) { r.Usage = &billing.Usage{Meter: "m", Quantity: "1e5"} }},
		{"quantity not a number", func(r *billing.Request) { r.Usage = &billing.Usage{Meter: "m", Quantity: "12,5"} }},
		{"amount without currency", func(r *billing.Request) { r.Amount = &billing.Amount{Minor: 1} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c capture
			srv := c.server(t, http.StatusCreated, `{"id":"set_1","status":"settled"}`)
			r := base
			tt.mutate(&r)
			_, err := newClient(t, srv.URL, 0).Submit(context.Background(), r)
			wantError(t, err, billing.Terminal, "invalid_request")
			if n := c.calls.Load(); n != 0 {
				t.Errorf("provider was called %d times for invalid input", n)
			}
		})
	}
}

// TestClassifyReplies pins the one place where HTTP replies become error classes.
func TestClassifyReplies(t *testing.T) {
	const (
		submit = "submit"
		lookup = "lookup"
		list   = "list"
	)
	tests := []struct {
		name       string
		op         string
		status     int
		header     map[string]string
		body       string
		wantClass  billing.Class // 0: success
		wantCode   string
		wantRetry  time.Duration
		wantReused bool
	}{
		{name: "201 record", op: submit, status: 201, body: `{"id":"set_1","status":"pending"}`},
		{name: "200 garbage body is ambiguous", op: submit, status: 200, body: `<html>ok</html>`, wantClass: billing.Ambiguous, wantCode: "unreadable_response"},
		{name: "200 without id is ambiguous", op: submit, status: 200, body: `{"status":"settled"}`, wantClass: billing.Ambiguous, wantCode: "unreadable_response"},
		{name: "200 unknown status is ambiguous", op: submit, status: 200, body: `{"id":"x","status":"done"}`, wantClass: billing.Ambiguous, wantCode: "unreadable_response"},
		{name: "204 empty body is ambiguous", op: submit, status: 204, wantClass: billing.Ambiguous, wantCode: "unreadable_response"},
		{name: "200 record for another key is ambiguous", op: submit, status: 200, body: `{"id":"x","status":"settled","idempotency_key":"stl_other"}`, wantClass: billing.Ambiguous, wantCode: "mismatched_response"},
		{name: "409 key in use is transient", op: submit, status: 409, body: `{"error":"idempotency_key_in_use"}`, wantClass: billing.Transient, wantCode: "idempotency_key_in_use"},
		{name: "409 other conflict is terminal", op: submit, status: 409, body: `{"error":"customer_locked"}`, wantClass: billing.Terminal, wantCode: "customer_locked"},
		{name: "422 key reused is terminal with KeyReused", op: submit, status: 422, body: `{"error":"idempotency_key_reused"}`, wantClass: billing.Terminal, wantCode: "idempotency_key_reused", wantReused: true},
		{name: "422 other is terminal only", op: submit, status: 422, body: `{"error":"invalid_meter"}`, wantClass: billing.Terminal, wantCode: "invalid_meter"},
		{name: "nested error object", op: submit, status: 400, body: `{"error":{"code":"invalid_currency","message":"XYZ"}}`, wantClass: billing.Terminal, wantCode: "invalid_currency"},
		{name: "400 without JSON uses the status", op: submit, status: 400, body: `bad`, wantClass: billing.Terminal, wantCode: "400"},
		{name: "provider free text is not a code", op: submit, status: 400, body: `{"error":"this is a sentence, not a code"}`, wantClass: billing.Terminal, wantCode: "400"},
		{name: "401 is transient (our credentials)", op: submit, status: 401, wantClass: billing.Transient, wantCode: "401"},
		{name: "408 is transient", op: submit, status: 408, wantClass: billing.Transient, wantCode: "408"},
		{name: "429 seconds", op: submit, status: 429, header: map[string]string{"Retry-After": "7"}, wantClass: billing.Transient, wantCode: "429", wantRetry: 7 * time.Second},
		{name: "429 without Retry-After", op: submit, status: 429, wantClass: billing.Transient, wantCode: "429"},
		{name: "503 with Retry-After is ambiguous", op: submit, status: 503, header: map[string]string{"Retry-After": "2"}, body: "Service Unavailable", wantClass: billing.Ambiguous, wantCode: "503", wantRetry: 2 * time.Second},
		{name: "500 with provider code", op: submit, status: 500, body: `{"error":"internal"}`, wantClass: billing.Ambiguous, wantCode: "internal"},
		{name: "302 is not followed", op: submit, status: 302, header: map[string]string{"Location": "/elsewhere"}, wantClass: billing.Terminal, wantCode: "302"},
		{name: "lookup 404 is not found", op: lookup, status: 404, body: `{"error":"not_found"}`},
		{name: "lookup 200", op: lookup, status: 200, body: `{"id":"set_1","status":"settled","amount":{"minor":5,"currency":"EUR"}}`},
		{name: "lookup 503 is transient: a read commits nothing", op: lookup, status: 503, header: map[string]string{"Retry-After": "3"}, wantClass: billing.Transient, wantCode: "503", wantRetry: 3 * time.Second},
		{name: "lookup garbage is transient", op: lookup, status: 200, body: `[]`, wantClass: billing.Transient, wantCode: "unreadable_response"},
		{name: "lookup 403 is transient (our credentials)", op: lookup, status: 403, wantClass: billing.Transient, wantCode: "403"},
		{name: "list 200", op: list, status: 200, body: `{"items":[{"id":"a","status":"settled"}],"next_cursor":""}`},
		{name: "list bad item", op: list, status: 200, body: `{"items":[{"id":"a","status":"??"}]}`, wantClass: billing.Transient, wantCode: "unreadable_response"},
		{name: "list 500 is transient", op: list, status: 500, wantClass: billing.Transient, wantCode: "500"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var followed atomic.Bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/elsewhere" {
					followed.Store(true)
				}
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			c := newClient(t, srv.URL, 0)
			ctx := context.Background()

			var err error
			switch tt.op {
			case submit:
				var rec billing.Record
				rec, err = c.Submit(ctx, chargeRequest(1))
				if err == nil && (rec.ID != "set_1" || rec.Status != billing.StatusPending) {
					t.Errorf("record %+v, want set_1 pending", rec)
				}
			case lookup:
				var rec billing.Record
				var found bool
				rec, found, err = c.Lookup(ctx, "stl_1")
				if err == nil && found != (tt.status == 200) {
					t.Errorf("found = %v for status %d", found, tt.status)
				}
				// The record does not name its key: it is read as it is, not completed
				// from the request, so Match finds the key missing.
				if err == nil && found && (rec.ID != "set_1" || rec.IdempotencyKey != "" || rec.Amount == nil || rec.Amount.Minor != 5) {
					t.Errorf("record %+v, want set_1 with no key and 5 EUR", rec)
				}
			case list:
				var items []billing.Record
				items, _, err = c.List(ctx, time.Time{}, "")
				if err == nil && (len(items) != 1 || items[0].ID != "a") {
					t.Errorf("items %+v, want [a]", items)
				}
			}
			if followed.Load() {
				t.Error("the client followed a redirect")
			}
			if tt.wantClass == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			e := wantError(t, err, tt.wantClass, tt.wantCode)
			if e.RetryAfter != tt.wantRetry {
				t.Errorf("RetryAfter = %s, want %s", e.RetryAfter, tt.wantRetry)
			}
			if e.KeyReused != tt.wantReused {
				t.Errorf("KeyReused = %v, want %v", e.KeyReused, tt.wantReused)
			}
			if e.Status != tt.status {
				t.Errorf("Status = %d, want %d", e.Status, tt.status)
			}
		})
	}
}

func TestOversizedSuccessIsAmbiguous(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id":"set_1","status":"settled","pad":"`+strings.Repeat("x", billing.MaxResponseBytes)+`"}`)
	}))
	defer srv.Close()
	_, err := newClient(t, srv.URL, 0).Submit(context.Background(), chargeRequest(1))
	e := wantError(t, err, billing.Ambiguous, "unreadable_response")
	if !strings.Contains(e.Message, "exceeded") {
		t.Errorf("message %q does not say the reply was too large", e.Message)
	}
}

func TestNetworkFailures(t *testing.T) {
	// A port nobody listens on: bind, note it, release it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := "http://" + ln.Addr().String()
	_ = ln.Close()

	// The provider reads the whole request, then drops the connection without a word.
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	defer hangUp.Close()
	// The provider answers only after the client has given up.
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // lets the server notice the client hanging up
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer slow.Close()
	// The provider starts a success reply and is cut off in the middle of the body.
	cutOff := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
		_ = buf.Flush()
		_ = conn.Close()
	}))
	defer cutOff.Close()

	tests := []struct {
		name      string
		endpoint  string
		lookup    bool
		wantClass billing.Class
		wantCode  string
	}{
		{name: "connection refused: never received", endpoint: closedPort, wantClass: billing.Transient, wantCode: "connection_refused"},
		{name: "connection refused on a read", endpoint: closedPort, lookup: true, wantClass: billing.Transient, wantCode: "connection_refused"},
		{name: "hang-up after the request was sent", endpoint: hangUp.URL, wantClass: billing.Ambiguous, wantCode: "connection_closed"},
		{name: "timeout after the request was sent", endpoint: slow.URL, wantClass: billing.Ambiguous, wantCode: "timeout"},
		{name: "timeout on a read is transient", endpoint: slow.URL, lookup: true, wantClass: billing.Transient, wantCode: "timeout"},
		{name: "success reply cut off mid-body", endpoint: cutOff.URL, wantClass: billing.Ambiguous, wantCode: "connection_closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, tt.endpoint, 300*time.Millisecond)
			var err error
			if tt.lookup {
				_, _, err = c.Lookup(context.Background(), "stl_1")
			} else {
				_, err = c.Submit(context.Background(), chargeRequest(1))
			}
			e := wantError(t, err, tt.wantClass, tt.wantCode)
			if e.Status != 0 {
				t.Errorf("Status = %d, want 0 (no reply)", e.Status)
			}
		})
	}
}

func TestUnresolvableHostIsTransient(t *testing.T) {
	// .invalid never resolves (RFC 6761); whether the resolver says so or times out,
	// no connection existed, so the request provably was not received.
	c := newClient(t, "http://settlement-operator-test.invalid", 2*time.Second)
	_, err := c.Submit(context.Background(), chargeRequest(1))
	if err == nil {
		t.Fatal("Submit to an unresolvable host succeeded")
	}
	e, ok := billing.AsError(err)
	if !ok || e.Class != billing.Transient {
		t.Fatalf("got %v, want a transient error", err)
	}
}

func TestCallerCancellationBeforeConnecting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := newClient(t, "http://127.0.0.1:1", time.Second)
	_, err := c.Submit(ctx, chargeRequest(1))
	e := wantError(t, err, billing.Transient, "canceled")
	if e.Status != 0 {
		t.Errorf("Status = %d, want 0", e.Status)
	}
}

func TestTokenNeverLeaks(t *testing.T) {
	// A provider that echoes the credential back in its error message.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "bad_auth", "message": "token " + strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") + " is not valid here"})
	}))
	defer srv.Close()
	cfg := billing.HTTPConfig{Endpoint: srv.URL, Token: testToken}
	c, err := billing.NewHTTP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(context.Background(), chargeRequest(1))
	e := wantError(t, err, billing.Terminal, "bad_auth")
	if !strings.Contains(e.Message, "[redacted]") {
		t.Errorf("message %q: want the echoed token replaced by [redacted]", e.Message)
	}
	for _, s := range []string{
		fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprint(c),
		fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg),
	} {
		if strings.Contains(s, testToken) {
			t.Errorf("formatted value contains the token: %s", s)
		}
	}
}

func TestNewHTTPValidatesConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  billing.HTTPConfig
		ok   bool
	}{
		{name: "https with a path", cfg: billing.HTTPConfig{Endpoint: "https://billing.example.com/v1"}, ok: true},
		{name: "not a URL", cfg: billing.HTTPConfig{Endpoint: "::"}},
		{name: "relative", cfg: billing.HTTPConfig{Endpoint: "/settlements"}},
		{name: "ftp", cfg: billing.HTTPConfig{Endpoint: "ftp://billing.example.com"}},
		{name: "credentials in the URL", cfg: billing.HTTPConfig{Endpoint: "https://user:" + testToken + "@billing.example.com"}},
		{name: "query", cfg: billing.HTTPConfig{Endpoint: "https://billing.example.com?x=1"}},
		{name: "token with a line break", cfg: billing.HTTPConfig{Endpoint: "https://b.example.com", Token: testToken + "\n"}},
		{name: "negative timeout", cfg: billing.HTTPConfig{Endpoint: "https://b.example.com", Timeout: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := billing.NewHTTP(tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("NewHTTP error = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && strings.Contains(err.Error(), testToken) {
				t.Errorf("error contains the token: %v", err)
			}
		})
	}
}
