package signature

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// verifyHMAC implements the generic scheme: one header, an optional prefix, one hex
// or base64 HMAC-SHA256, and an optional timestamp header that is then part of the
// signed content (otherwise the body alone is signed and replays can only be caught
// by event-ID dedup).
func verifyHMAC(cfg Config, secrets [][]byte, h http.Header, body []byte, now time.Time) (Result, error) {
	value := strings.TrimSpace(h.Get(cfg.Header))
	if value == "" {
		return Result{}, fmt.Errorf("%w: header %s is empty or absent", ErrMissingSignature, cfg.Header)
	}
	if cfg.Prefix != "" {
		if len(value) < len(cfg.Prefix) || !strings.EqualFold(value[:len(cfg.Prefix)], cfg.Prefix) {
			return Result{}, fmt.Errorf("%w: header %s does not start with %q", ErrMalformedSignature, cfg.Header, cfg.Prefix)
		}
		value = value[len(cfg.Prefix):]
	}
	sig, ok := decodeHMACSignature(cfg.Encoding, value)
	if !ok {
		return Result{}, fmt.Errorf("%w: header %s is not a %s-encoded SHA-256 HMAC", ErrMalformedSignature, cfg.Header, encodingName(cfg.Encoding))
	}

	var (
		ts     time.Time
		prefix string
	)
	if cfg.TimestampHeader != "" {
		tsText := h.Get(cfg.TimestampHeader)
		if tsText == "" {
			return Result{}, fmt.Errorf("%w: header %s is empty or absent", ErrMissingSignature, cfg.TimestampHeader)
		}
		var err error
		if ts, err = parseUnixSeconds(tsText); err != nil {
			return Result{}, fmt.Errorf("header %s: %w", cfg.TimestampHeader, err)
		}
		if err := checkTolerance(ts, now, cfg.tolerance()); err != nil {
			return Result{}, err
		}
		prefix = strconv.FormatInt(ts.Unix(), 10) + "."
	}
	signed, err := signedHeaderValues(cfg, h)
	if err != nil {
		return Result{}, err
	}
	prefix += signed

	keys, err := usableSecrets(cfg.Scheme, secrets)
	if err != nil {
		return Result{}, err
	}
	index, ok := matchAny(keys, prefix, body, [][]byte{sig})
	if !ok {
		return Result{}, mismatch(len(secrets))
	}
	return Result{Scheme: cfg.Scheme, Timestamp: ts, SecretIndex: index}, nil
}

// decodeHMACSignature decodes a signature and insists on SHA-256's 32 bytes, so a
// truncated value is reported as malformed rather than as a mismatch.
func decodeHMACSignature(encoding, value string) ([]byte, bool) {
	var (
		sig []byte
		err error
	)
	if encoding == EncodingBase64 {
		var ok bool
		sig, ok = decodeBase64(value)
		if !ok {
			return nil, false
		}
	} else if sig, err = hex.DecodeString(value); err != nil {
		return nil, false
	}
	return sig, len(sig) == 32
}

func encodingName(encoding string) string {
	if encoding == "" {
		return EncodingHex
	}
	return encoding
}

// signedHeaderValues is the signed headers' part of the signed content: each value
// followed by a line break, in the configured order. A signed header that is absent
// or empty is a missing signature: the sender did not sign what we would read.
func signedHeaderValues(cfg Config, h http.Header) (string, error) {
	var b strings.Builder
	for _, name := range cfg.SignedHeaders {
		v := h.Get(name)
		if v == "" {
			return "", fmt.Errorf("%w: signed header %s is empty or absent", ErrMissingSignature, name)
		}
		if strings.ContainsAny(v, "\r\n") || strings.TrimSpace(v) != v {
			// The receiver reads these values trimmed: a value that trimming would change
			// is refused rather than signed one way and read another.
			return "", fmt.Errorf("%w: signed header %s holds a line break or leading or trailing space", ErrMalformedSignature, name)
		}
		b.WriteString(v)
		b.WriteByte('\n')
	}
	return b.String(), nil
}

func signHMAC(cfg Config, key []byte, ts time.Time, body []byte, headers http.Header) (http.Header, error) {
	h := http.Header{}
	var prefix string
	if cfg.TimestampHeader != "" {
		t := strconv.FormatInt(ts.Unix(), 10)
		h.Set(cfg.TimestampHeader, t)
		prefix = t + "."
	}
	signed, err := signedHeaderValues(cfg, headers)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	prefix += signed
	for _, name := range cfg.SignedHeaders {
		h.Set(name, headers.Get(name))
	}
	mac := macSHA256(key, prefix, body)
	var encoded string
	if cfg.Encoding == EncodingBase64 {
		encoded = base64.StdEncoding.EncodeToString(mac)
	} else {
		encoded = hex.EncodeToString(mac)
	}
	h.Set(cfg.Header, cfg.Prefix+encoded)
	return h, nil
}
