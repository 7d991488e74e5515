package signature

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Stripe signatures are verified here rather than with stripe-go's webhook package
// (github.com/stripe/stripe-go/v82/webhook), for three reasons:
//   - its ValidatePayload* functions read time.Since internally, so they cannot take
//     our clock, and they only reject timestamps that are too old: a timestamp in the
//     future is accepted, where docs/design.md §4 requires tolerance in both directions;
//   - its IgnoringTolerance variant, the only way to supply our own clock, also
//     accepts a header without "t=" (the signature is then checked against year 1);
//   - the package imports the whole stripe-go SDK (hundreds of files) into the
//     manager for what is an HMAC and a header parser.
//
// The parsing rules below follow stripe-go's parseSignatureHeader: several v1 values
// may be present during Stripe's own secret rolling and any match passes; invalid v1
// values and unknown schemes (v0) are ignored.
func verifyStripe(cfg Config, secrets [][]byte, h http.Header, body []byte, now time.Time) (Result, error) {
	header := h.Get(HeaderStripeSignature)
	if header == "" {
		return Result{}, fmt.Errorf("%w: header %s is empty or absent", ErrMissingSignature, HeaderStripeSignature)
	}
	var (
		tsText string
		sigs   [][]byte
	)
	for _, pair := range strings.Split(header, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return Result{}, fmt.Errorf("%w: header %s has an element that is not key=value", ErrMalformedSignature, HeaderStripeSignature)
		}
		switch key {
		case "t":
			if tsText != "" {
				return Result{}, fmt.Errorf("%w: header %s has more than one t= element", ErrMalformedSignature, HeaderStripeSignature)
			}
			if value == "" {
				return Result{}, fmt.Errorf("%w: header %s has an empty t= element", ErrMalformedSignature, HeaderStripeSignature)
			}
			tsText = value
		case "v1":
			if sig, err := hex.DecodeString(value); err == nil && len(sig) == 32 {
				sigs = append(sigs, sig)
			}
		}
	}
	if tsText == "" {
		return Result{}, fmt.Errorf("%w: header %s has no t= element", ErrMalformedSignature, HeaderStripeSignature)
	}
	ts, err := parseUnixSeconds(tsText)
	if err != nil {
		return Result{}, fmt.Errorf("header %s: %w", HeaderStripeSignature, err)
	}
	if len(sigs) == 0 {
		return Result{}, fmt.Errorf("%w: header %s holds no valid v1 signature", ErrMalformedSignature, HeaderStripeSignature)
	}
	if err := checkTolerance(ts, now, cfg.tolerance()); err != nil {
		return Result{}, err
	}
	keys, err := usableSecrets(cfg.Scheme, secrets)
	if err != nil {
		return Result{}, err
	}
	// Sign the canonical decimal form, as stripe-go's ComputeSignature does.
	index, ok := matchAny(keys, strconv.FormatInt(ts.Unix(), 10)+".", body, sigs)
	if !ok {
		return Result{}, mismatch(len(secrets))
	}
	return Result{Scheme: cfg.Scheme, Timestamp: ts, SecretIndex: index}, nil
}

func signStripe(key []byte, ts time.Time, body []byte) http.Header {
	t := strconv.FormatInt(ts.Unix(), 10)
	h := http.Header{}
	h.Set(HeaderStripeSignature, "t="+t+",v1="+hex.EncodeToString(macSHA256(key, t+".", body)))
	return h
}
