package signature

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// checkFuzzResult asserts the invariants every Verify call must keep, whatever the
// input: errors always wrap one of the request sentinels (the configuration is
// fixed and valid), and a success reports the configured scheme.
func checkFuzzResult(t *testing.T, cfg Config, res Result, err error) {
	t.Helper()
	if err != nil {
		for _, s := range []error{ErrMissingSignature, ErrMalformedSignature, ErrTimestampOutOfTolerance, ErrSignatureMismatch} {
			if errors.Is(err, s) {
				return
			}
		}
		t.Fatalf("Verify returned an error that is not a request sentinel: %v", err)
	}
	if res.Scheme != cfg.Scheme {
		t.Fatalf("Verify succeeded with Result %+v, want scheme %s", res, cfg.Scheme)
	}
}

func FuzzVerifyStandardWebhooks(f *testing.F) {
	f.Add(swMsgID, "1614265330", swSignature, []byte(swPayload))
	f.Add(swMsgID, "1614265330", "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,x "+swSignature, []byte(swPayload))
	f.Add("", "", "", []byte{})
	f.Add("a.b", "+1", "v1,", []byte("{}"))
	secrets := secretsOf(otherSWSecret, swSecret)
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		h := http.Header{}
		h.Set(HeaderWebhookID, id)
		h.Set(HeaderWebhookTimestamp, ts)
		h.Set(HeaderWebhookSignature, sig)
		res, err := Verify(swConfig, secrets, h, body, vectorTime)
		checkFuzzResult(t, swConfig, res, err)
		if err != nil {
			return
		}
		// Success means the header really carries the signature of this id,
		// timestamp and body under the key that matched.
		want, err := Sign(swConfig, secrets[res.SecretIndex], res.EventID, res.Timestamp, body)
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		if !slices.Contains(strings.Split(h.Get(HeaderWebhookSignature), " "), want.Get(HeaderWebhookSignature)) {
			t.Fatalf("Verify accepted id=%q ts=%q sig=%q for a body it did not sign", id, ts, sig)
		}
	})
}

func FuzzVerifyStripe(f *testing.F) {
	f.Add("t=1614265330,v1="+stripeSig, []byte(stripePayload))
	f.Add("t=1614265330,v1="+stripeRolledSig+",v1="+stripeSig+",v0=00", []byte(stripePayload))
	f.Add("t=,v1=", []byte{})
	f.Add("v1,t=1", []byte("{}"))
	secrets := secretsOf(stripeRolledSecret+"_unused", stripeSecret)
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		h := http.Header{}
		h.Set(HeaderStripeSignature, header)
		res, err := Verify(stripeConfig, secrets, h, body, vectorTime)
		checkFuzzResult(t, stripeConfig, res, err)
		if err != nil {
			return
		}
		want, err := Sign(stripeConfig, secrets[res.SecretIndex], "", res.Timestamp, body)
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		_, wantV1, _ := strings.Cut(want.Get(HeaderStripeSignature), ",")
		found := false
		for _, part := range strings.Split(header, ",") {
			if strings.EqualFold(strings.TrimSpace(part), wantV1) {
				found = true
			}
		}
		if !found {
			t.Fatalf("Verify accepted %q for a body it did not sign", header)
		}
	})
}

func FuzzVerifyHMAC(f *testing.F) {
	f.Add("sha256="+ghSigHex, "", false, false, []byte(ghPayload))
	f.Add(ghSigBase64, "", true, false, []byte(ghPayload))
	f.Add(ghSigWithTimestamp, "1614265330", false, true, []byte(ghPayload))
	f.Add("sha256=", "-1", false, true, []byte{})
	secrets := secretsOf("old secret", ghSecret)
	f.Fuzz(func(t *testing.T, sig, ts string, base64Encoded, timestamped bool, body []byte) {
		cfg := Config{Scheme: SchemeHMACSHA256, Header: "X-Signature", Encoding: EncodingHex}
		if base64Encoded {
			cfg.Encoding = EncodingBase64
		} else {
			cfg.Prefix = "sha256="
		}
		if timestamped {
			cfg.TimestampHeader = "X-Timestamp"
		}
		h := http.Header{}
		h.Set("X-Signature", sig)
		h.Set("X-Timestamp", ts)
		res, err := Verify(cfg, secrets, h, body, vectorTime)
		checkFuzzResult(t, cfg, res, err)
		if err != nil {
			return
		}
		want, err := Sign(cfg, secrets[res.SecretIndex], "", res.Timestamp, body)
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		wantSig, _ := decodeHMACSignature(cfg.Encoding, strings.TrimPrefix(want.Get("X-Signature"), cfg.Prefix))
		gotSig, _ := decodeHMACSignature(cfg.Encoding, strings.TrimSpace(sig)[len(cfg.Prefix):])
		if string(wantSig) != string(gotSig) {
			t.Fatalf("Verify accepted %q for a body it did not sign", sig)
		}
	})
}
