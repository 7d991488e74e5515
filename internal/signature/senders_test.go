package signature

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

// svixHeaders is how a sender on Svix sends the Standard Webhooks vector: the same
// values under svix- names (docs.svix.com, "Verifying Webhooks Manually").
func svixHeaders(id, ts, sig string) http.Header {
	return headers("svix-id", id, "svix-timestamp", ts, "svix-signature", sig)
}

func TestSvixHeadersAreStandardWebhooksAliases(t *testing.T) {
	res, err := Verify(swConfig, [][]byte{[]byte(swSecret)}, svixHeaders(swMsgID, "1614265330", swSignature), []byte(swPayload), vectorTime)
	if err != nil {
		t.Fatalf("Svix's published example is refused: %v", err)
	}
	if res.EventID != swMsgID {
		t.Fatalf("event ID = %q, want the svix-id %q", res.EventID, swMsgID)
	}
	// The alias changes names only: a wrong signature, a stale timestamp and a missing
	// header are refused exactly as under webhook- names.
	for name, c := range map[string]struct {
		h    http.Header
		want error
	}{
		"mismatch": {svixHeaders(swMsgID, "1614265330", "v1,"+swSigOther()), ErrSignatureMismatch},
		"stale":    {svixHeaders(swMsgID, "1614264000", swSignature), ErrTimestampOutOfTolerance},
		"missing":  {headers("svix-id", swMsgID, "svix-timestamp", "1614265330"), ErrMissingSignature},
	} {
		if _, err := Verify(swConfig, [][]byte{[]byte(swSecret)}, c.h, []byte(swPayload), vectorTime); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", name, err, c.want)
		}
	}
	// Never a mix: once any webhook- header is present, svix- headers are not read, so
	// one request cannot be verified with one ID and identified with another.
	mixed := svixHeaders(swMsgID, "1614265330", swSignature)
	mixed.Set(HeaderWebhookID, "msg_other")
	if _, err := Verify(swConfig, [][]byte{[]byte(swSecret)}, mixed, []byte(swPayload), vectorTime); !errors.Is(err, ErrMissingSignature) {
		t.Errorf("mixed webhook-/svix- headers: err = %v, want %v", err, ErrMissingSignature)
	}
	h := StandardHeaders(svixHeaders(swMsgID, "1614265330", swSignature))
	if h.Get(HeaderWebhookID) != swMsgID || h.Get(HeaderWebhookSignature) != swSignature {
		t.Errorf("StandardHeaders did not copy the svix- values to webhook- names: %v", h)
	}
}

func swSigOther() string { return "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=" }

// Svix's documentation example secret decodes to 18 bytes: it must be usable (the
// Standard Webhooks spec asks for 24 to 64 bytes from generators, not from receivers).
func TestShortSvixSecretIsUsable(t *testing.T) {
	const secret = "whsec_plJ3nmyCDGBKInavdOK15jsl"
	if err := CheckSecret(SchemeStandardWebhooks, []byte(secret)); err != nil {
		t.Fatalf("the 18-byte example secret is refused: %v", err)
	}
	ts := time.Unix(1700000000, 0)
	h, err := Sign(swConfig, []byte(secret), "msg_short", ts, []byte(`{"type":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(swConfig, [][]byte{[]byte(secret)}, h, []byte(`{"type":"a"}`), ts); err != nil {
		t.Fatal(err)
	}
}

func TestAPIKey(t *testing.T) {
	cfg := Config{Scheme: SchemeAPIKey, Header: "x-api-key"}
	body := []byte(`{"id":"e1"}`)
	now := time.Unix(1700000000, 0)
	secrets := [][]byte{[]byte("old-key\n"), []byte("new-key")}
	res, err := Verify(cfg, secrets, headers("X-Api-Key", "new-key"), body, now)
	if err != nil || res.SecretIndex != 1 {
		t.Fatalf("res = %+v, err = %v; want key 1 to match", res, err)
	}
	for name, c := range map[string]struct {
		h    http.Header
		want error
	}{
		"absent":  {headers(), ErrMissingSignature},
		"wrong":   {headers("x-api-key", "new-keyX"), ErrSignatureMismatch},
		"prefix":  {headers("x-api-key", "new"), ErrSignatureMismatch},
		"another": {headers("Authorization", "new-key"), ErrMissingSignature},
	} {
		if _, err := Verify(cfg, secrets, c.h, body, now); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", name, err, c.want)
		}
	}
	// Basic, as EventBridge sends it: the whole Authorization value is the credential.
	basic := Config{Scheme: SchemeAPIKey, Header: "Authorization"}
	if _, err := Verify(basic, [][]byte{[]byte("Basic dXNlcjpwYXNz")}, headers("Authorization", "Basic dXNlcjpwYXNz"), body, now); err != nil {
		t.Fatal(err)
	}
	signed, err := Sign(cfg, []byte("new-key"), "", now, body)
	if err != nil || signed.Get("x-api-key") != "new-key" {
		t.Fatalf("Sign = %v, %v", signed, err)
	}
	if err := (Config{Scheme: SchemeAPIKey}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("APIKey without a header: err = %v", err)
	}
}
