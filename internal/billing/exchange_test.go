package billing_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

func TestQuantityNumber(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{in: "1523", want: "1523", ok: true},
		{in: "12.5", want: "12.5", ok: true},
		{in: "12.50", want: "12.50", ok: true}, // trailing zeros carry precision: kept
		{in: "0", want: "0", ok: true},
		{in: "000", want: "0", ok: true},
		{in: "007.25", want: "7.25", ok: true},
		{in: "0.001", want: "0.001", ok: true},
		{in: "99999999999999999999999999.1", want: "99999999999999999999999999.1", ok: true},
		{in: ""},
		{in: "-1"},
		{in: "+1"},
		{in: "1e3"},
		{in: ".5"},
		{in: "5."},
		{in: "1,5"},
		{in: " 1"},
		{in: "NaN"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := billing.QuantityNumber(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("QuantityNumber(%q) error = %v, want ok=%v", tt.in, err, tt.ok)
			}
			if tt.ok && got.String() != tt.want {
				t.Errorf("QuantityNumber(%q) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name, value string
		want        time.Duration
	}{
		{name: "absent", value: "", want: 0},
		{name: "seconds", value: "120", want: 2 * time.Minute},
		{name: "zero", value: "0", want: 0},
		{name: "negative", value: "-5", want: 0},
		{name: "http date in the future", value: now.Add(90 * time.Second).Format(http.TimeFormat), want: 90 * time.Second},
		{name: "http date in the past", value: now.Add(-time.Minute).Format(http.TimeFormat), want: 0},
		{name: "garbage", value: "soon", want: 0},
		{name: "absurd seconds are capped, never negative", value: "99999999999999999", want: 365 * 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.value != "" {
				h.Set("Retry-After", tt.value)
			}
			if got := billing.RetryAfter(h, now); got != tt.want {
				t.Errorf("RetryAfter(%q) = %s, want %s", tt.value, got, tt.want)
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	cause := errors.New("read: connection reset by peer")
	tests := []struct {
		name string
		err  *billing.Error
		want string
	}{
		{
			name: "status with provider code",
			err:  &billing.Error{Class: billing.Terminal, Status: 422, Code: "idempotency_key_reused", KeyReused: true, Message: "key reused"},
			want: "terminal provider error (HTTP 422 idempotency_key_reused): key reused",
		},
		{
			name: "status only, with Retry-After",
			err:  &billing.Error{Class: billing.Ambiguous, Status: 503, Code: "503", RetryAfter: 2 * time.Second, Message: "provider failed"},
			want: "ambiguous provider error (HTTP 503), retry after 2s: provider failed",
		},
		{
			name: "network failure with cause",
			err:  &billing.Error{Class: billing.Ambiguous, Code: "connection_reset", Message: "no reply", Err: cause},
			want: "ambiguous provider error (connection_reset): no reply: read: connection reset by peer",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
	if !errors.Is(tests[2].err, cause) {
		t.Error("Unwrap does not expose the cause")
	}
	if _, ok := billing.AsError(errors.New("plain")); ok {
		t.Error("AsError found a *billing.Error in a plain error")
	}
}

func TestClassString(t *testing.T) {
	for c, want := range map[billing.Class]string{
		billing.Transient: "transient", billing.Terminal: "terminal", billing.Ambiguous: "ambiguous", 0: "Class(0)",
	} {
		if got := c.String(); got != want {
			t.Errorf("Class(%d).String() = %q, want %q", int(c), got, want)
		}
	}
}

// FuzzStatusError: whatever a provider answers, classification yields a valid class,
// never panics, and never copies the credential or more than a short message.
func FuzzStatusError(f *testing.F) {
	const secret = "sk_live_secret_token"
	f.Add(422, `{"error":"idempotency_key_reused"}`, "")
	f.Add(400, `{"error":{"code":"x","message":"token sk_live_secret_token"}}`, "")
	f.Add(503, "<html>", "Wed, 21 Oct 2015 07:28:00 GMT")
	f.Add(429, `{"error":"rate_limited","message":"`+strings.Repeat("a", 500)+`"}`, "5")
	f.Fuzz(func(t *testing.T, status int, body, retryAfter string) {
		h := http.Header{}
		h.Set("Retry-After", retryAfter)
		for _, mutating := range []bool{true, false} {
			e := billing.StatusError(billing.Response{Status: status, Header: h, Body: []byte(body)}, mutating, secret)
			if e.Class != billing.Transient && e.Class != billing.Terminal && e.Class != billing.Ambiguous {
				t.Fatalf("invalid class %d", e.Class)
			}
			if !mutating && e.Class == billing.Ambiguous {
				t.Fatal("a read was classified ambiguous")
			}
			if e.RetryAfter < 0 {
				t.Fatalf("negative RetryAfter %s", e.RetryAfter)
			}
			if strings.Contains(e.Error(), secret) {
				t.Fatalf("error text contains the secret: %q", e.Error())
			}
			if len(e.Message) > 200 || len(e.Code) > 64 {
				t.Fatalf("message or code too long: %q %q", e.Message, e.Code)
			}
		}
	})
}

// A rate-limited answer is told apart from other transient ones by its status alone,
// whichever adapter classified it.
func TestRateLimited(t *testing.T) {
	for _, tt := range []struct {
		err  *billing.Error
		want bool
	}{
		{&billing.Error{Class: billing.Transient, Status: 429, RetryAfter: time.Second}, true},
		{&billing.Error{Class: billing.Transient, Status: 429}, true},
		{&billing.Error{Class: billing.Transient, Status: 503}, false},
		{&billing.Error{Class: billing.Transient, Code: "timeout"}, false},
		{nil, false},
	} {
		if got := tt.err.RateLimited(); got != tt.want {
			t.Errorf("%v: RateLimited() = %v, want %v", tt.err, got, tt.want)
		}
	}
}
