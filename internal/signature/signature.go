// Package signature verifies and produces webhook signatures (docs/design.md §4 step 6).
//
// The receiver calls Verify before it parses or stores anything, so an unsigned or
// replayed request never reaches the API server. Verify is a pure function of its
// arguments, including the clock, which keeps it table-testable and lets every
// replica agree on the same decision for the same request.
//
// Four schemes are supported: Standard Webhooks (Svix, under svix- or webhook- header
// names, and everyone following standardwebhooks.com), Stripe, a generic HMAC-SHA256
// header used by GitHub, Shopify and many smaller providers, and a shared credential in
// a header (APIKey) for senders that sign nothing (EventBridge API destinations). Each scheme accepts several secrets at once so
// that keys can be rotated without dropping deliveries.
package signature

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Scheme names as they appear in a WebhookProvider's spec.
const (
	// SchemeStandardWebhooks is https://www.standardwebhooks.com: webhook-id,
	// webhook-timestamp and webhook-signature headers, base64 HMAC over
	// "id.timestamp.body", "whsec_"-prefixed base64 secrets.
	SchemeStandardWebhooks = "StandardWebhooks"
	// SchemeStripe is Stripe's Stripe-Signature header: "t=<unix>,v1=<hex>,…", hex HMAC
	// over "t.body".
	SchemeStripe = "Stripe"
	// SchemeHMACSHA256 is a single header carrying an HMAC-SHA256 of the body (or of
	// "timestamp.body" when a timestamp header is configured), optionally prefixed,
	// hex or base64 encoded.
	SchemeHMACSHA256 = "HMACSHA256"
	// SchemeAPIKey is no signature: a shared credential (an API key, a "Basic …" or
	// "Bearer …" value) in a configured header, compared with the key in constant
	// time. For senders that sign nothing (EventBridge API destinations, most
	// CloudEvents sources).
	SchemeAPIKey = "APIKey"
)

// Encodings of the HMACSHA256 scheme's signature header.
const (
	// EncodingHex is lowercase or uppercase hex, as GitHub sends it; the default.
	EncodingHex = "Hex"
	// EncodingBase64 is standard base64 (padding optional), as Shopify sends it.
	EncodingBase64 = "Base64"
)

// Header names fixed by the Standard Webhooks and Stripe schemes, exported so the
// receiver, the sender command and tests cannot disagree on spelling.
const (
	// HeaderWebhookID carries the Standard Webhooks message ID; it is signed, so it
	// can serve as the event ID.
	HeaderWebhookID = "webhook-id"
	// HeaderWebhookTimestamp carries the Standard Webhooks send time in unix seconds.
	HeaderWebhookTimestamp = "webhook-timestamp"
	// HeaderWebhookSignature carries the space-separated Standard Webhooks
	// signatures ("v1,<base64>").
	HeaderWebhookSignature = "webhook-signature"
	// HeaderStripeSignature carries Stripe's "t=…,v1=…" signature.
	HeaderStripeSignature = "Stripe-Signature"
)

// SignedIDHeader is the request header that scheme signs and that identifies an
// event, or "" when the scheme signs none: Standard Webhooks signs "id.timestamp.body",
// so its webhook-id is covered; Stripe signs "t.body" and HMACSHA256 "timestamp.body"
// or the body alone, so none of their other headers is. A field that decides an effect
// (event ID, event type) may come from a header only if it is this one
// (decisions.md "Signed fields").
func SignedIDHeader(scheme string) string {
	if scheme == SchemeStandardWebhooks {
		return HeaderWebhookID
	}
	return ""
}

// DefaultTolerance is how far a signed timestamp may be from the receiver's clock, in
// either direction, when Config.Tolerance is zero. Five minutes is what both
// Standard Webhooks and Stripe use: long enough for clock skew and queueing, short
// enough that a captured request cannot be replayed much later.
const DefaultTolerance = 5 * time.Minute

// Errors returned by Verify, usable with errors.Is so the receiver can map them to
// a response and a metric label without parsing messages. Messages never contain a
// secret or the body.
var (
	// ErrMissingSignature means a header the scheme requires is absent or empty.
	ErrMissingSignature = errors.New("missing signature")
	// ErrMalformedSignature means the signature headers are present but cannot be
	// parsed (bad timestamp, no usable signature value, wrong prefix or length).
	ErrMalformedSignature = errors.New("malformed signature")
	// ErrTimestampOutOfTolerance means the signed timestamp is too old or too far in
	// the future: a replay, or a badly skewed clock.
	ErrTimestampOutOfTolerance = errors.New("signature timestamp out of tolerance")
	// ErrSignatureMismatch means no signature in the request was produced by any of
	// the configured secrets over this body.
	ErrSignatureMismatch = errors.New("signature mismatch")
	// ErrNoSecrets means no usable secret was configured (none given, or every one
	// empty or undecodable). It is our configuration problem, not the sender's.
	ErrNoSecrets = errors.New("no usable signing secret")
	// ErrInvalidConfig means the Config itself is unusable (unknown scheme or
	// encoding, missing header name, negative tolerance).
	ErrInvalidConfig = errors.New("invalid signature configuration")
)

// Config selects and parameterises a signature scheme; it mirrors the signature
// section of a WebhookProvider's spec.
type Config struct {
	// Scheme is one of SchemeStandardWebhooks, SchemeStripe, SchemeHMACSHA256.
	Scheme string
	// Header carries the signature for SchemeHMACSHA256 (for example
	// "X-Hub-Signature-256"). Ignored by the other schemes, whose headers are fixed.
	Header string
	// Prefix is stripped from the HMACSHA256 header value before decoding (for
	// example "sha256="); matched case-insensitively. Optional.
	Prefix string
	// Encoding of the HMACSHA256 signature: EncodingHex (default) or EncodingBase64.
	Encoding string
	// TimestampHeader, for SchemeHMACSHA256 only, names a header carrying unix
	// seconds; when set, the signed content is "timestamp.body" and Tolerance applies.
	TimestampHeader string
	// SignedHeaders, for SchemeHMACSHA256 only, names request headers whose values are
	// signed too (CloudEvents binary mode: ce-id, ce-type), so an event ID or type may
	// be taken from them. The signed content is then
	// "[timestamp.]value1\nvalue2\n…body": a header value cannot hold a line break, so
	// where one value ends and the next begins is never ambiguous.
	SignedHeaders []string
	// Tolerance bounds the distance between a signed timestamp and now, in both
	// directions; 0 means DefaultTolerance.
	Tolerance time.Duration
}

// Validate reports whether the Config can be used, so a controller can surface a bad
// WebhookProvider spec as a condition instead of failing every delivery.
func (c Config) Validate() error {
	if c.Tolerance < 0 {
		return fmt.Errorf("%w: tolerance %s is negative", ErrInvalidConfig, c.Tolerance)
	}
	if len(c.SignedHeaders) > 0 && c.Scheme != SchemeHMACSHA256 {
		return fmt.Errorf("%w: signed headers apply to scheme %s only", ErrInvalidConfig, SchemeHMACSHA256)
	}
	for i, name := range c.SignedHeaders {
		if name == "" || strings.EqualFold(name, c.Header) || strings.EqualFold(name, c.TimestampHeader) {
			return fmt.Errorf("%w: signed header %q is empty, the signature header or the timestamp header", ErrInvalidConfig, name)
		}
		for _, earlier := range c.SignedHeaders[:i] {
			if strings.EqualFold(name, earlier) {
				return fmt.Errorf("%w: signed header %q is listed twice", ErrInvalidConfig, name)
			}
		}
	}
	switch c.Scheme {
	case SchemeStandardWebhooks, SchemeStripe:
		return nil
	case SchemeAPIKey:
		if c.Header == "" {
			return fmt.Errorf("%w: scheme %s needs a header name", ErrInvalidConfig, c.Scheme)
		}
		if c.Prefix != "" || c.Encoding != "" || c.TimestampHeader != "" {
			return fmt.Errorf("%w: scheme %s compares a header's whole value: prefix, encoding and timestamp header do not apply", ErrInvalidConfig, c.Scheme)
		}
		return nil
	case SchemeHMACSHA256:
		if c.Header == "" {
			return fmt.Errorf("%w: scheme %s needs a header name", ErrInvalidConfig, c.Scheme)
		}
		switch c.Encoding {
		case "", EncodingHex, EncodingBase64:
			return nil
		default:
			return fmt.Errorf("%w: unknown encoding %q (want %s or %s)", ErrInvalidConfig, c.Encoding, EncodingHex, EncodingBase64)
		}
	default:
		return fmt.Errorf("%w: unknown scheme %q (want %s, %s, %s or %s)", ErrInvalidConfig, c.Scheme,
			SchemeStandardWebhooks, SchemeStripe, SchemeHMACSHA256, SchemeAPIKey)
	}
}

func (c Config) tolerance() time.Duration {
	if c.Tolerance == 0 {
		return DefaultTolerance
	}
	return c.Tolerance
}

// Result describes a verified request.
type Result struct {
	// Scheme is the scheme that verified the request.
	Scheme string
	// EventID is the event ID carried in the signed headers (webhook-id for
	// Standard Webhooks), empty when the scheme has none. Being signed, it is a safe
	// dedup key when a provider's config says to take the event ID from the header.
	EventID string
	// Timestamp is the signed timestamp, zero when the scheme has none.
	Timestamp time.Time
	// SecretIndex is the index in secrets of the key that matched, so the receiver
	// can tell (via a metric) when an old key is no longer used and can be removed.
	SecretIndex int
}

// Verify checks that the request headers h carry a valid signature of body under one
// of secrets, and that its signed timestamp, if the scheme has one, is within the
// tolerance of now in either direction.
//
// Every secret is tried, so a Secret holding the old and the new key keeps
// deliveries flowing through a rotation. Secrets are taken as stored in a Kubernetes
// Secret, with surrounding whitespace (such as the newline `kubectl create secret
// --from-file` keeps) trimmed: Standard Webhooks secrets are "whsec_" + base64 (the
// prefix is optional), Stripe secrets ("whsec_…") and HMACSHA256 secrets are used as
// raw bytes. Empty or undecodable secrets are skipped; if none is usable the error
// is ErrNoSecrets.
//
// Errors wrap one of the package's sentinel errors. All signature comparisons are
// constant-time.
func Verify(cfg Config, secrets [][]byte, h http.Header, body []byte, now time.Time) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if len(secrets) == 0 {
		return Result{}, fmt.Errorf("%w: the provider's secret holds no keys", ErrNoSecrets)
	}
	switch cfg.Scheme {
	case SchemeStandardWebhooks:
		return verifyStandardWebhooks(cfg, secrets, h, body, now)
	case SchemeStripe:
		return verifyStripe(cfg, secrets, h, body, now)
	case SchemeAPIKey:
		return verifyAPIKey(cfg, secrets, h, body, now)
	default:
		return verifyHMAC(cfg, secrets, h, body, now)
	}
}

// Sign returns the signature headers a provider using cfg would send with body, so
// that the sender command, the fake provider and tests exercise exactly the format
// Verify accepts. For Standard Webhooks it sets webhook-id (id) and
// webhook-timestamp too; the other schemes ignore id. The caller sets Content-Type.
// secret is interpreted as in Verify.
func Sign(cfg Config, secret []byte, id string, ts time.Time, body []byte) (http.Header, error) {
	return SignWithHeaders(cfg, secret, id, ts, body, nil)
}

// SignWithHeaders is Sign for a configuration with SignedHeaders: headers holds their
// values (each must be present), which are signed and returned with the signature.
func SignWithHeaders(cfg Config, secret []byte, id string, ts time.Time, body []byte, headers http.Header) (http.Header, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	key, err := decodeSecret(cfg.Scheme, secret)
	if err != nil {
		return nil, fmt.Errorf("sign with scheme %s: %w", cfg.Scheme, err)
	}
	usesTimestamp := (cfg.Scheme != SchemeHMACSHA256 && cfg.Scheme != SchemeAPIKey) || cfg.TimestampHeader != ""
	if usesTimestamp && ts.Unix() < 0 {
		return nil, fmt.Errorf("sign with scheme %s: timestamp %s is before 1970", cfg.Scheme, ts.UTC().Format(time.RFC3339))
	}
	switch cfg.Scheme {
	case SchemeStandardWebhooks:
		return signStandardWebhooks(key, id, ts, body)
	case SchemeStripe:
		return signStripe(key, ts, body), nil
	case SchemeAPIKey:
		return signAPIKey(cfg, key), nil
	default:
		return signHMAC(cfg, key, ts, body, headers)
	}
}

// usableSecrets decodes every secret for scheme, keeping each one's original index.
func usableSecrets(scheme string, secrets [][]byte) ([]indexedKey, error) {
	keys := make([]indexedKey, 0, len(secrets))
	var reasons []error
	for i, s := range secrets {
		key, err := decodeSecret(scheme, s)
		if err != nil {
			reasons = append(reasons, fmt.Errorf("key %d: %w", i, err))
			continue
		}
		keys = append(keys, indexedKey{index: i, key: key})
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: none of the %d keys is usable for scheme %s: %w", ErrNoSecrets, len(secrets), scheme, errors.Join(reasons...))
	}
	return keys, nil
}

type indexedKey struct {
	index int
	key   []byte
}

// CheckSecret reports whether secret is usable by scheme, decoded as Verify decodes
// it, so that a controller can refuse a key before a delivery needs it. The error
// says what is wrong without echoing any part of the secret.
func CheckSecret(scheme string, secret []byte) error {
	_, err := decodeSecret(scheme, secret)
	return err
}

// decodeSecret turns a stored secret into HMAC key bytes. Error messages describe
// the problem without echoing any part of the secret.
func decodeSecret(scheme string, secret []byte) ([]byte, error) {
	s := bytes.TrimSpace(secret)
	if scheme == SchemeStandardWebhooks {
		s = bytes.TrimPrefix(s, []byte(standardWebhooksSecretPrefix))
		key, ok := decodeBase64(string(s))
		if !ok {
			return nil, errors.New("secret is not " + standardWebhooksSecretPrefix + "-prefixed base64")
		}
		s = key
	}
	// An empty key would let anyone compute a valid signature.
	if len(s) == 0 {
		return nil, errors.New("secret is empty")
	}
	return s, nil
}

// macSHA256 returns HMAC-SHA256(key, prefix || body) without copying the body.
func macSHA256(key []byte, prefix string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(prefix))
	m.Write(body)
	return m.Sum(nil)
}

// matchAny reports which key, if any, produced one of sigs over prefix || body. Every
// comparison is constant-time; which key matched is not secret.
func matchAny(keys []indexedKey, prefix string, body []byte, sigs [][]byte) (int, bool) {
	for _, k := range keys {
		expected := macSHA256(k.key, prefix, body)
		for _, sig := range sigs {
			if hmac.Equal(expected, sig) {
				return k.index, true
			}
		}
	}
	return 0, false
}

// parseUnixSeconds parses a signed timestamp strictly: decimal digits only, so that
// "+1", " 1" or "1.0" cannot be signed one way and verified another.
func parseUnixSeconds(s string) (time.Time, error) {
	if s == "" || len(s) > 18 {
		return time.Time{}, fmt.Errorf("%w: timestamp is not unix seconds", ErrMalformedSignature)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return time.Time{}, fmt.Errorf("%w: timestamp is not unix seconds", ErrMalformedSignature)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: timestamp is not unix seconds", ErrMalformedSignature)
	}
	return time.Unix(n, 0), nil
}

// checkTolerance rejects timestamps too far from now in either direction: too old is
// a replay, too new is a replay prepared in advance or a broken clock.
func checkTolerance(ts, now time.Time, tolerance time.Duration) error {
	// Time.Sub saturates instead of overflowing, so absurd timestamps still fail.
	age := now.Sub(ts)
	switch {
	case age > tolerance:
		return fmt.Errorf("%w: timestamp is %s in the past, tolerance is %s", ErrTimestampOutOfTolerance, age.Truncate(time.Second), tolerance)
	case age < -tolerance:
		return fmt.Errorf("%w: timestamp is %s in the future, tolerance is %s", ErrTimestampOutOfTolerance, ts.Sub(now).Truncate(time.Second), tolerance)
	}
	return nil
}

func mismatch(n int) error {
	return fmt.Errorf("%w: no signature matches any of the %d configured keys", ErrSignatureMismatch, n)
}
