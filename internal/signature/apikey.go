package signature

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// verifyAPIKey implements SchemeAPIKey: senders that sign nothing but send a shared
// credential in a header (EventBridge API destinations' API key or Basic connection,
// a CloudEvents source with a configured header). The header's whole value must equal
// one of the keys. Both sides are hashed first and the hashes compared in constant
// time, so neither the comparison's duration nor an early exit tells a length or a
// prefix of a key. Nothing binds the body or a time to the credential: whoever holds
// it can send any delivery, so the event ID (deduplication) is all that stops a
// replay, and TLS is what keeps the credential from being captured.
func verifyAPIKey(cfg Config, secrets [][]byte, h http.Header, _ []byte, _ time.Time) (Result, error) {
	value := strings.TrimSpace(h.Get(cfg.Header))
	if value == "" {
		return Result{}, fmt.Errorf("%w: header %s is empty or absent", ErrMissingSignature, cfg.Header)
	}
	keys, err := usableSecrets(cfg.Scheme, secrets)
	if err != nil {
		return Result{}, err
	}
	got := sha256.Sum256([]byte(value))
	for _, k := range keys {
		want := sha256.Sum256(k.key)
		if subtle.ConstantTimeCompare(got[:], want[:]) == 1 {
			return Result{Scheme: cfg.Scheme, SecretIndex: k.index}, nil
		}
	}
	return Result{}, fmt.Errorf("%w: header %s matches none of the %d configured credentials", ErrSignatureMismatch, cfg.Header, len(secrets))
}

func signAPIKey(cfg Config, key []byte) http.Header {
	h := http.Header{}
	h.Set(cfg.Header, string(key))
	return h
}
