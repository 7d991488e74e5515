package signature

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// standardWebhooksSecretPrefix marks a Standard Webhooks secret; the rest is base64.
const standardWebhooksSecretPrefix = "whsec_"

// The signature itself is computed and compared by the reference library
// (github.com/standard-webhooks/standard-webhooks/libraries/go), so our format can
// never drift from the spec. We do not use its Verify, though: it reads time.Now()
// and a fixed, unexported 5-minute tolerance, so it can take neither our clock nor
// Config.Tolerance, and it holds a single key. We therefore parse the headers
// ourselves (to classify errors and to return the signed id and timestamp), check
// the tolerance against the caller's clock, and then ask VerifyIgnoringTimestamp
// once per configured key.
func verifyStandardWebhooks(cfg Config, secrets [][]byte, h http.Header, body []byte, now time.Time) (Result, error) {
	h = StandardHeaders(h)
	id := h.Get(HeaderWebhookID)
	tsText := h.Get(HeaderWebhookTimestamp)
	sigText := h.Get(HeaderWebhookSignature)
	for _, hv := range []struct{ name, value string }{
		{HeaderWebhookID, id}, {HeaderWebhookTimestamp, tsText}, {HeaderWebhookSignature, sigText},
	} {
		if hv.value == "" {
			return Result{}, fmt.Errorf("%w: header %s is empty or absent", ErrMissingSignature, hv.name)
		}
	}
	ts, err := parseUnixSeconds(tsText)
	if err != nil {
		return Result{}, fmt.Errorf("header %s: %w", HeaderWebhookTimestamp, err)
	}
	if !hasV1Signature(sigText) {
		return Result{}, fmt.Errorf("%w: header %s holds no v1 signature", ErrMalformedSignature, HeaderWebhookSignature)
	}
	if err := checkTolerance(ts, now, cfg.tolerance()); err != nil {
		return Result{}, err
	}
	keys, err := usableSecrets(cfg.Scheme, secrets)
	if err != nil {
		return Result{}, err
	}
	for _, k := range keys {
		wh, err := standardwebhooks.NewWebhookRaw(k.key)
		if err != nil {
			return Result{}, fmt.Errorf("%w: key %d: %w", ErrNoSecrets, k.index, err)
		}
		err = wh.VerifyIgnoringTimestamp(body, h)
		switch {
		case err == nil:
			return Result{Scheme: cfg.Scheme, EventID: id, Timestamp: ts, SecretIndex: k.index}, nil
		case errors.Is(err, standardwebhooks.ErrNoMatchingSignature):
			continue
		default:
			// Our parsing above accepts a subset of what the library accepts, so this
			// is unexpected; treat it as a malformed request rather than a match.
			return Result{}, fmt.Errorf("%w: %w", ErrMalformedSignature, err)
		}
	}
	return Result{}, mismatch(len(secrets))
}

// Svix sends the Standard Webhooks headers under its own names (svix-id,
// svix-timestamp, svix-signature; only white-labelled accounts send webhook-*): the
// same values, signed the same way (docs.svix.com, "Verifying Webhooks Manually").
const (
	HeaderSvixID        = "svix-id"
	HeaderSvixTimestamp = "svix-timestamp"
	HeaderSvixSignature = "svix-signature"
)

// StandardHeaders returns h with Svix's header names read as their Standard Webhooks
// aliases: when h holds none of webhook-id, webhook-timestamp and webhook-signature,
// a copy with the svix- values under webhook- names; otherwise h itself. The two sets
// are never mixed, so a request is verified and identified by the same three values.
// The receiver calls it before both Verify and reading the event ID.
func StandardHeaders(h http.Header) http.Header {
	if h.Get(HeaderWebhookID) != "" || h.Get(HeaderWebhookTimestamp) != "" || h.Get(HeaderWebhookSignature) != "" {
		return h
	}
	if h.Get(HeaderSvixID) == "" && h.Get(HeaderSvixTimestamp) == "" && h.Get(HeaderSvixSignature) == "" {
		return h
	}
	c := h.Clone()
	c.Set(HeaderWebhookID, h.Get(HeaderSvixID))
	c.Set(HeaderWebhookTimestamp, h.Get(HeaderSvixTimestamp))
	c.Set(HeaderWebhookSignature, h.Get(HeaderSvixSignature))
	return c
}

// hasV1Signature reports whether the space-separated webhook-signature list holds at
// least one well-formed "v1,<base64 of 32 bytes>" entry. Other versions (such as the
// asymmetric v1a) are ignored, as the spec asks.
func hasV1Signature(list string) bool {
	for _, entry := range strings.Split(list, " ") {
		version, sig, ok := strings.Cut(entry, ",")
		if !ok || version != "v1" {
			continue
		}
		if raw, err := base64.StdEncoding.DecodeString(sig); err == nil && len(raw) == 32 {
			return true
		}
	}
	return false
}

func signStandardWebhooks(key []byte, id string, ts time.Time, body []byte) (http.Header, error) {
	if id == "" {
		return nil, fmt.Errorf("sign with scheme %s: the message id is empty", SchemeStandardWebhooks)
	}
	wh, err := standardwebhooks.NewWebhookRaw(key)
	if err != nil {
		return nil, fmt.Errorf("sign with scheme %s: %w", SchemeStandardWebhooks, err)
	}
	sig, err := wh.Sign(id, ts, body)
	if err != nil {
		return nil, fmt.Errorf("sign with scheme %s: %w", SchemeStandardWebhooks, err)
	}
	h := http.Header{}
	h.Set(HeaderWebhookID, id)
	h.Set(HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderWebhookSignature, sig)
	return h, nil
}

// decodeBase64 accepts standard base64 with or without padding: secrets are pasted
// by hand, and some generators drop the padding.
func decodeBase64(s string) ([]byte, bool) {
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, true
	}
	if b, err := base64.RawStdEncoding.DecodeString(s); err == nil {
		return b, true
	}
	return nil, false
}
