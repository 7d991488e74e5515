package signature

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Test vectors. Every expected signature below was computed independently of this
// package (openssl dgst -hmac) or comes from a published source.
const (
	// The Standard Webhooks reference test vector (libraries/go/webhook_test.go,
	// TestWebhookSign), also checked with openssl.
	swSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swSecretRaw = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swMsgID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	swTimestamp = 1614265330
	swPayload   = `{"test": 2432232314}`
	swSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

	// Stripe: secret from stripe-go's webhook tests, signed over "1614265330." + body.
	stripeSecret       = "whsec_test_secret"
	stripeRolledSecret = "whsec_test_secret_rolled_key"
	stripePayload      = `{"id":"evt_test_webhook","object":"event"}`
	stripeSig          = "3c5817089d739023dd6190f70a3757e04f7a2fd8b5dab12c2e000f51970dccff"
	stripeRolledSig    = "585d2e5803f3ac3facba728003442f922de8fe6eab3f68e569d21cf70e735a0f"

	// GitHub's documented example (docs.github.com, "Validating webhook deliveries").
	ghSecret    = "It's a Secret to Everybody"
	ghPayload   = "Hello, World!"
	ghSigHex    = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	ghSigBase64 = "dXEH6g6yUJ/CESIczphLijdXC211hsIsRvQ3nIsEPhc="
	// HMAC over "1614265330.Hello, World!" with the GitHub secret.
	ghSigWithTimestamp = "f37376a318b83773050e9e3ac8c6d599d2254e4f69edd75a1419cb54dc7264f3"
)

var (
	vectorTime = time.Unix(swTimestamp, 0)

	swConfig     = Config{Scheme: SchemeStandardWebhooks}
	stripeConfig = Config{Scheme: SchemeStripe}
	githubConfig = Config{Scheme: SchemeHMACSHA256, Header: "X-Hub-Signature-256", Prefix: "sha256=", Encoding: EncodingHex}
	shopifyCfg   = Config{Scheme: SchemeHMACSHA256, Header: "X-Shopify-Hmac-Sha256", Encoding: EncodingBase64}
	tsHMACConfig = Config{Scheme: SchemeHMACSHA256, Header: "X-Signature", Encoding: EncodingHex, TimestampHeader: "X-Timestamp"}

	// otherSWSecret is a valid Standard Webhooks secret that did not sign anything.
	otherSWSecret = "whsec_" + "YW5vdGhlciBrZXkgdGhhdCBzaWduZWQgbm90aGluZw=="
)

func headers(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func swHeaders(id, ts, sig string) http.Header {
	return headers(HeaderWebhookID, id, HeaderWebhookTimestamp, ts, HeaderWebhookSignature, sig)
}

func secretsOf(s ...string) [][]byte {
	out := make([][]byte, len(s))
	for i := range s {
		out[i] = []byte(s[i])
	}
	return out
}

func TestStandardWebhooksSpecVector(t *testing.T) {
	h, err := Sign(swConfig, []byte(swSecret), swMsgID, vectorTime, []byte(swPayload))
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	want := swHeaders(swMsgID, "1614265330", swSignature)
	for _, name := range []string{HeaderWebhookID, HeaderWebhookTimestamp, HeaderWebhookSignature} {
		if got := h.Get(name); got != want.Get(name) {
			t.Errorf("Sign: header %s = %q, want %q", name, got, want.Get(name))
		}
	}

	res, err := Verify(swConfig, secretsOf(swSecret), want, []byte(swPayload), vectorTime)
	if err != nil {
		t.Fatalf("Verify(spec vector): %v", err)
	}
	if res.EventID != swMsgID || !res.Timestamp.Equal(vectorTime) || res.Scheme != SchemeStandardWebhooks || res.SecretIndex != 0 {
		t.Errorf("Verify(spec vector) = %+v, want id %s, timestamp %s", res, swMsgID, vectorTime)
	}
}

func TestVerify(t *testing.T) {
	ts := "1614265330"
	swValid := swHeaders(swMsgID, ts, swSignature)
	stripeValid := headers(HeaderStripeSignature, "t="+ts+",v1="+stripeSig)
	ghValid := headers("X-Hub-Signature-256", "sha256="+ghSigHex)
	at := func(d time.Duration) time.Time { return vectorTime.Add(d) }

	tests := []struct {
		name      string
		cfg       Config
		secrets   [][]byte
		h         http.Header
		body      string
		now       time.Time
		wantErr   error
		wantIndex int
	}{
		// Standard Webhooks.
		{name: "sw: spec vector", cfg: swConfig, secrets: secretsOf(swSecret), h: swValid, body: swPayload, now: vectorTime},
		{name: "sw: secret without whsec_ prefix", cfg: swConfig, secrets: secretsOf(swSecretRaw), h: swValid, body: swPayload, now: vectorTime},
		{name: "sw: secret with trailing newline", cfg: swConfig, secrets: secretsOf(swSecret + "\n"), h: swValid, body: swPayload, now: vectorTime},
		{name: "sw: rotated, second key matches", cfg: swConfig, secrets: secretsOf(otherSWSecret, swSecret), h: swValid, body: swPayload, now: vectorTime, wantIndex: 1},
		{name: "sw: undecodable key skipped", cfg: swConfig, secrets: secretsOf("whsec_%%%", swSecret), h: swValid, body: swPayload, now: vectorTime, wantIndex: 1},
		{name: "sw: only the other key", cfg: swConfig, secrets: secretsOf(otherSWSecret), h: swValid, body: swPayload, now: vectorTime, wantErr: ErrSignatureMismatch},
		{
			name: "sw: list with other versions and a wrong v1 first", cfg: swConfig, secrets: secretsOf(swSecret),
			h:    swHeaders(swMsgID, ts, "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= "+swSignature),
			body: swPayload, now: vectorTime,
		},
		{name: "sw: 4 minutes old", cfg: swConfig, secrets: secretsOf(swSecret), h: swValid, body: swPayload, now: at(4 * time.Minute)},
		{name: "sw: 4 minutes in the future", cfg: swConfig, secrets: secretsOf(swSecret), h: swValid, body: swPayload, now: at(-4 * time.Minute)},
		{name: "sw: exactly at tolerance", cfg: swConfig, secrets: secretsOf(swSecret), h: swValid, body: swPayload, now: at(5 * time.Minute)},
		{name: "sw: 6 minutes old", cfg: swConfig, secrets: secretsOf(swSecret), h: swValid, body: swPayload, now: at(6 * time.Minute), wantErr: ErrTimestampOutOfTolerance},
		{name: "sw: 6 minutes in the future", cfg: swConfig, secrets: secretsOf(swSecret), h: swValid, body: swPayload, now: at(-6 * time.Minute), wantErr: ErrTimestampOutOfTolerance},
		{name: "sw: custom tolerance", cfg: Config{Scheme: SchemeStandardWebhooks, Tolerance: time.Minute}, secrets: secretsOf(swSecret), h: swValid, body: swPayload, now: at(2 * time.Minute), wantErr: ErrTimestampOutOfTolerance},
		{name: "sw: timestamp at the unix epoch", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, "0", swSignature), body: swPayload, now: vectorTime, wantErr: ErrTimestampOutOfTolerance},
		{name: "sw: other body", cfg: swConfig, secrets: secretsOf(swSecret), h: swValid, body: `{"test": 2432232315}`, now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "sw: other id", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders("msg_other", ts, swSignature), body: swPayload, now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "sw: other timestamp", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, "1614265331", swSignature), body: swPayload, now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "sw: missing id", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders("", ts, swSignature), body: swPayload, now: vectorTime, wantErr: ErrMissingSignature},
		{name: "sw: missing timestamp", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, "", swSignature), body: swPayload, now: vectorTime, wantErr: ErrMissingSignature},
		{name: "sw: missing signature", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, ts, ""), body: swPayload, now: vectorTime, wantErr: ErrMissingSignature},
		{name: "sw: no headers at all", cfg: swConfig, secrets: secretsOf(swSecret), h: http.Header{}, body: swPayload, now: vectorTime, wantErr: ErrMissingSignature},
		{name: "sw: timestamp not a number", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, "yesterday", swSignature), body: swPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "sw: timestamp with sign", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, "+1614265330", swSignature), body: swPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "sw: timestamp with fraction", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, "1614265330.0", swSignature), body: swPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "sw: timestamp overflows", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, "99999999999999999999999", swSignature), body: swPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "sw: partial signature", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, ts, "v1,"), body: swPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "sw: only v1a signatures", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, ts, "v1a,"+strings.TrimPrefix(swSignature, "v1,")), body: swPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "sw: signature without version", cfg: swConfig, secrets: secretsOf(swSecret), h: swHeaders(swMsgID, ts, strings.TrimPrefix(swSignature, "v1,")), body: swPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "sw: no secrets", cfg: swConfig, secrets: nil, h: swValid, body: swPayload, now: vectorTime, wantErr: ErrNoSecrets},
		{name: "sw: only unusable secrets", cfg: swConfig, secrets: secretsOf("", "  \n", "whsec_not base64!"), h: swValid, body: swPayload, now: vectorTime, wantErr: ErrNoSecrets},

		// Stripe.
		{name: "stripe: valid", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: stripeValid, body: stripePayload, now: vectorTime},
		{
			name: "stripe: several v1, only the second matches", cfg: stripeConfig, secrets: secretsOf(stripeSecret),
			h:    headers(HeaderStripeSignature, "t="+ts+",v1="+stripeRolledSig+",v1="+stripeSig+",v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"),
			body: stripePayload, now: vectorTime,
		},
		{
			name: "stripe: rotated secrets, second key matches", cfg: stripeConfig, secrets: secretsOf(stripeRolledSecret+"_unused", stripeSecret),
			h: stripeValid, body: stripePayload, now: vectorTime, wantIndex: 1,
		},
		{
			name: "stripe: rolled key signature matches rolled secret", cfg: stripeConfig, secrets: secretsOf(stripeRolledSecret),
			h:    headers(HeaderStripeSignature, "t="+ts+",v1="+stripeSig+",v1="+stripeRolledSig),
			body: stripePayload, now: vectorTime,
		},
		{name: "stripe: invalid v1 values ignored", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: headers(HeaderStripeSignature, "t="+ts+",v1=bad_signature,v1="+stripeSig), body: stripePayload, now: vectorTime},
		{name: "stripe: 4 minutes old", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: stripeValid, body: stripePayload, now: at(4 * time.Minute)},
		{name: "stripe: 6 minutes old", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: stripeValid, body: stripePayload, now: at(6 * time.Minute), wantErr: ErrTimestampOutOfTolerance},
		{name: "stripe: 6 minutes in the future", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: stripeValid, body: stripePayload, now: at(-6 * time.Minute), wantErr: ErrTimestampOutOfTolerance},
		{name: "stripe: other body", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: stripeValid, body: stripePayload + " ", now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "stripe: wrong secret", cfg: stripeConfig, secrets: secretsOf(stripeRolledSecret), h: stripeValid, body: stripePayload, now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "stripe: missing header", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: http.Header{}, body: stripePayload, now: vectorTime, wantErr: ErrMissingSignature},
		{name: "stripe: no t", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: headers(HeaderStripeSignature, "v1="+stripeSig), body: stripePayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "stripe: empty t", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: headers(HeaderStripeSignature, "t=,v1="+stripeSig), body: stripePayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "stripe: two t", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: headers(HeaderStripeSignature, "t="+ts+",t="+ts+",v1="+stripeSig), body: stripePayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "stripe: t not a number", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: headers(HeaderStripeSignature, "t=now,v1="+stripeSig), body: stripePayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "stripe: no v1", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: headers(HeaderStripeSignature, "t="+ts+",v0="+stripeSig), body: stripePayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "stripe: only invalid v1", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: headers(HeaderStripeSignature, "t="+ts+",v1=zz"), body: stripePayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "stripe: not key=value", cfg: stripeConfig, secrets: secretsOf(stripeSecret), h: headers(HeaderStripeSignature, "v1,t=1"), body: stripePayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "stripe: no secrets", cfg: stripeConfig, secrets: secretsOf(), h: stripeValid, body: stripePayload, now: vectorTime, wantErr: ErrNoSecrets},

		// Generic HMAC-SHA256.
		{name: "hmac: GitHub vector", cfg: githubConfig, secrets: secretsOf(ghSecret), h: ghValid, body: ghPayload, now: vectorTime},
		{name: "hmac: any clock without timestamp header", cfg: githubConfig, secrets: secretsOf(ghSecret), h: ghValid, body: ghPayload, now: time.Time{}},
		{name: "hmac: secret with trailing newline", cfg: githubConfig, secrets: secretsOf(ghSecret + "\r\n"), h: ghValid, body: ghPayload, now: vectorTime},
		{name: "hmac: rotated, second key matches", cfg: githubConfig, secrets: secretsOf("old secret", ghSecret), h: ghValid, body: ghPayload, now: vectorTime, wantIndex: 1},
		{name: "hmac: prefix case-insensitive, uppercase hex", cfg: githubConfig, secrets: secretsOf(ghSecret), h: headers("X-Hub-Signature-256", "SHA256="+strings.ToUpper(ghSigHex)), body: ghPayload, now: vectorTime},
		{name: "hmac: no prefix configured", cfg: Config{Scheme: SchemeHMACSHA256, Header: "X-Sig"}, secrets: secretsOf(ghSecret), h: headers("X-Sig", ghSigHex), body: ghPayload, now: vectorTime},
		{name: "hmac: base64", cfg: shopifyCfg, secrets: secretsOf(ghSecret), h: headers("X-Shopify-Hmac-Sha256", ghSigBase64), body: ghPayload, now: vectorTime},
		{name: "hmac: base64 without padding", cfg: shopifyCfg, secrets: secretsOf(ghSecret), h: headers("X-Shopify-Hmac-Sha256", strings.TrimRight(ghSigBase64, "=")), body: ghPayload, now: vectorTime},
		{name: "hmac: base64 with prefix", cfg: Config{Scheme: SchemeHMACSHA256, Header: "X-Sig", Prefix: "v1=", Encoding: EncodingBase64}, secrets: secretsOf(ghSecret), h: headers("X-Sig", "v1="+ghSigBase64), body: ghPayload, now: vectorTime},
		{name: "hmac: hex value in base64 config", cfg: shopifyCfg, secrets: secretsOf(ghSecret), h: headers("X-Shopify-Hmac-Sha256", ghSigHex), body: ghPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "hmac: other body", cfg: githubConfig, secrets: secretsOf(ghSecret), h: ghValid, body: ghPayload + "!", now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "hmac: wrong secret", cfg: githubConfig, secrets: secretsOf("It's a secret to everybody"), h: ghValid, body: ghPayload, now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "hmac: missing header", cfg: githubConfig, secrets: secretsOf(ghSecret), h: headers("X-Hub-Signature", "sha1=abc"), body: ghPayload, now: vectorTime, wantErr: ErrMissingSignature},
		{name: "hmac: missing prefix", cfg: githubConfig, secrets: secretsOf(ghSecret), h: headers("X-Hub-Signature-256", ghSigHex), body: ghPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "hmac: prefix only", cfg: githubConfig, secrets: secretsOf(ghSecret), h: headers("X-Hub-Signature-256", "sha256="), body: ghPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "hmac: not hex", cfg: githubConfig, secrets: secretsOf(ghSecret), h: headers("X-Hub-Signature-256", "sha256=xyz"), body: ghPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "hmac: truncated", cfg: githubConfig, secrets: secretsOf(ghSecret), h: headers("X-Hub-Signature-256", "sha256="+ghSigHex[:62]), body: ghPayload, now: vectorTime, wantErr: ErrMalformedSignature},
		{name: "hmac: empty secret only", cfg: githubConfig, secrets: secretsOf(" \n"), h: ghValid, body: ghPayload, now: vectorTime, wantErr: ErrNoSecrets},
		{name: "hmac: timestamped", cfg: tsHMACConfig, secrets: secretsOf(ghSecret), h: headers("X-Signature", ghSigWithTimestamp, "X-Timestamp", ts), body: ghPayload, now: vectorTime},
		{name: "hmac: timestamped, 4 minutes in the future", cfg: tsHMACConfig, secrets: secretsOf(ghSecret), h: headers("X-Signature", ghSigWithTimestamp, "X-Timestamp", ts), body: ghPayload, now: at(-4 * time.Minute)},
		{name: "hmac: timestamped, 6 minutes old", cfg: tsHMACConfig, secrets: secretsOf(ghSecret), h: headers("X-Signature", ghSigWithTimestamp, "X-Timestamp", ts), body: ghPayload, now: at(6 * time.Minute), wantErr: ErrTimestampOutOfTolerance},
		{name: "hmac: timestamped, 6 minutes in the future", cfg: tsHMACConfig, secrets: secretsOf(ghSecret), h: headers("X-Signature", ghSigWithTimestamp, "X-Timestamp", ts), body: ghPayload, now: at(-6 * time.Minute), wantErr: ErrTimestampOutOfTolerance},
		{name: "hmac: timestamped, body-only signature", cfg: tsHMACConfig, secrets: secretsOf(ghSecret), h: headers("X-Signature", ghSigHex, "X-Timestamp", ts), body: ghPayload, now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "hmac: timestamped, other timestamp", cfg: tsHMACConfig, secrets: secretsOf(ghSecret), h: headers("X-Signature", ghSigWithTimestamp, "X-Timestamp", "1614265331"), body: ghPayload, now: vectorTime, wantErr: ErrSignatureMismatch},
		{name: "hmac: timestamped, missing timestamp", cfg: tsHMACConfig, secrets: secretsOf(ghSecret), h: headers("X-Signature", ghSigWithTimestamp), body: ghPayload, now: vectorTime, wantErr: ErrMissingSignature},
		{name: "hmac: timestamped, bad timestamp", cfg: tsHMACConfig, secrets: secretsOf(ghSecret), h: headers("X-Signature", ghSigWithTimestamp, "X-Timestamp", "-5"), body: ghPayload, now: vectorTime, wantErr: ErrMalformedSignature},

		// Configuration.
		{name: "config: unknown scheme", cfg: Config{Scheme: "Svix"}, secrets: secretsOf(swSecret), h: swValid, body: swPayload, now: vectorTime, wantErr: ErrInvalidConfig},
		{name: "config: hmac without header", cfg: Config{Scheme: SchemeHMACSHA256}, secrets: secretsOf(ghSecret), h: ghValid, body: ghPayload, now: vectorTime, wantErr: ErrInvalidConfig},
		{name: "config: hmac with unknown encoding", cfg: Config{Scheme: SchemeHMACSHA256, Header: "X-Sig", Encoding: "base32"}, secrets: secretsOf(ghSecret), h: ghValid, body: ghPayload, now: vectorTime, wantErr: ErrInvalidConfig},
		{name: "config: negative tolerance", cfg: Config{Scheme: SchemeStripe, Tolerance: -time.Second}, secrets: secretsOf(stripeSecret), h: stripeValid, body: stripePayload, now: vectorTime, wantErr: ErrInvalidConfig},
	}
	sentinels := []error{ErrMissingSignature, ErrMalformedSignature, ErrTimestampOutOfTolerance, ErrSignatureMismatch, ErrNoSecrets, ErrInvalidConfig}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Verify(tt.cfg, tt.secrets, tt.h, []byte(tt.body), tt.now)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if res.SecretIndex != tt.wantIndex || res.Scheme != tt.cfg.Scheme {
					t.Errorf("Verify = %+v, want scheme %s and secret index %d", res, tt.cfg.Scheme, tt.wantIndex)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Verify error = %v, want %v", err, tt.wantErr)
			}
			for _, other := range sentinels {
				if other != tt.wantErr && errors.Is(err, other) {
					t.Errorf("Verify error %q also matches %v; errors must be unambiguous", err, other)
				}
			}
			if res != (Result{}) {
				t.Errorf("Verify returned %+v with an error, want the zero Result", res)
			}
			// Never a secret or the body in an error message.
			for _, s := range tt.secrets {
				if trimmed := strings.TrimSpace(string(s)); len(trimmed) > 3 && strings.Contains(err.Error(), trimmed) {
					t.Errorf("error %q contains a secret", err)
				}
			}
			if strings.Contains(err.Error(), tt.body) {
				t.Errorf("error %q contains the body", err)
			}
		})
	}
}

func TestVerifyResult(t *testing.T) {
	ts := "1614265330"
	tests := []struct {
		name    string
		cfg     Config
		secret  string
		h       http.Header
		body    string
		wantID  string
		wantTS  time.Time
		wantErr bool
	}{
		{name: "standard webhooks carries id and timestamp", cfg: swConfig, secret: swSecret, h: swHeaders(swMsgID, ts, swSignature), body: swPayload, wantID: swMsgID, wantTS: vectorTime},
		{name: "stripe carries a timestamp only", cfg: stripeConfig, secret: stripeSecret, h: headers(HeaderStripeSignature, "t="+ts+",v1="+stripeSig), body: stripePayload, wantTS: vectorTime},
		{name: "hmac without timestamp carries neither", cfg: githubConfig, secret: ghSecret, h: headers("X-Hub-Signature-256", "sha256="+ghSigHex), body: ghPayload},
		{name: "hmac with timestamp carries it", cfg: tsHMACConfig, secret: ghSecret, h: headers("X-Signature", ghSigWithTimestamp, "X-Timestamp", ts), body: ghPayload, wantTS: vectorTime},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Verify(tt.cfg, secretsOf(tt.secret), tt.h, []byte(tt.body), vectorTime)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if res.EventID != tt.wantID || !res.Timestamp.Equal(tt.wantTS) {
				t.Errorf("Verify = %+v, want id %q, timestamp %v", res, tt.wantID, tt.wantTS)
			}
		})
	}
}

func TestSign(t *testing.T) {
	ts := "1614265330"
	tests := []struct {
		name   string
		cfg    Config
		secret string
		id     string
		body   string
		want   http.Header
	}{
		{name: "standard webhooks", cfg: swConfig, secret: swSecret, id: swMsgID, body: swPayload, want: swHeaders(swMsgID, ts, swSignature)},
		{name: "standard webhooks, raw base64 secret", cfg: swConfig, secret: swSecretRaw, id: swMsgID, body: swPayload, want: swHeaders(swMsgID, ts, swSignature)},
		{name: "stripe", cfg: stripeConfig, secret: stripeSecret, id: "ignored", body: stripePayload, want: headers(HeaderStripeSignature, "t="+ts+",v1="+stripeSig)},
		{name: "hmac hex with prefix", cfg: githubConfig, secret: ghSecret, body: ghPayload, want: headers("X-Hub-Signature-256", "sha256="+ghSigHex)},
		{name: "hmac base64", cfg: shopifyCfg, secret: ghSecret + "\n", body: ghPayload, want: headers("X-Shopify-Hmac-Sha256", ghSigBase64)},
		{name: "hmac with timestamp", cfg: tsHMACConfig, secret: ghSecret, body: ghPayload, want: headers("X-Signature", ghSigWithTimestamp, "X-Timestamp", ts)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Sign(tt.cfg, []byte(tt.secret), tt.id, vectorTime, []byte(tt.body))
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			if len(got) != len(tt.want) {
				t.Errorf("Sign set headers %v, want %v", got, tt.want)
			}
			for name := range tt.want {
				if got.Get(name) != tt.want.Get(name) {
					t.Errorf("header %s = %q, want %q", name, got.Get(name), tt.want.Get(name))
				}
			}
			// What Sign produces, Verify accepts.
			if _, err := Verify(tt.cfg, secretsOf(tt.secret), got, []byte(tt.body), vectorTime); err != nil {
				t.Errorf("Verify(Sign(...)): %v", err)
			}
		})
	}
}

func TestSignErrors(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		secret  string
		id      string
		ts      time.Time
		wantErr error
	}{
		{name: "standard webhooks needs an id", cfg: swConfig, secret: swSecret, id: "", ts: vectorTime},
		{name: "standard webhooks secret not base64", cfg: swConfig, secret: "whsec_###", id: "x", ts: vectorTime},
		{name: "empty secret", cfg: githubConfig, secret: "\n", ts: vectorTime},
		{name: "timestamp before 1970", cfg: stripeConfig, secret: stripeSecret, ts: time.Time{}},
		{name: "invalid config", cfg: Config{Scheme: "nope"}, secret: "x", ts: vectorTime, wantErr: ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := Sign(tt.cfg, []byte(tt.secret), tt.id, tt.ts, []byte("{}"))
			if err == nil {
				t.Fatalf("Sign = %v, want an error", h)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Sign error = %v, want %v", err, tt.wantErr)
			}
			if len(strings.TrimSpace(tt.secret)) > 3 && strings.Contains(err.Error(), strings.TrimSpace(tt.secret)) {
				t.Errorf("error %q contains the secret", err)
			}
		})
	}
	// Without a timestamp header the generic scheme signs the body only, so any
	// timestamp is acceptable.
	if _, err := Sign(githubConfig, []byte(ghSecret), "", time.Time{}, []byte(ghPayload)); err != nil {
		t.Errorf("Sign(hmac, zero time): %v", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		cfg     Config
		wantErr bool
	}{
		{cfg: swConfig},
		{cfg: stripeConfig},
		{cfg: githubConfig},
		{cfg: shopifyCfg},
		{cfg: Config{Scheme: SchemeHMACSHA256, Header: "X-Sig"}},
		{cfg: Config{}, wantErr: true},
		{cfg: Config{Scheme: "stripe"}, wantErr: true},
		{cfg: Config{Scheme: SchemeHMACSHA256, Encoding: EncodingHex}, wantErr: true},
		{cfg: Config{Scheme: SchemeHMACSHA256, Header: "X", Encoding: "hex"}, wantErr: true},
		{cfg: Config{Scheme: SchemeStandardWebhooks, Tolerance: -1}, wantErr: true},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if (err != nil) != tt.wantErr {
			t.Errorf("%+v.Validate() = %v, want error %v", tt.cfg, err, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v.Validate() = %v, want ErrInvalidConfig", tt.cfg, err)
		}
	}
}

// CloudEvents binary mode: ce-id and ce-type are signed with the timestamp and the
// body, so neither can be changed, moved or dropped without the signature failing.
func TestHMACSignedHeaders(t *testing.T) {
	cfg := Config{Scheme: SchemeHMACSHA256, Header: "X-Signature", TimestampHeader: "X-Timestamp",
		SignedHeaders: []string{"ce-id", "ce-type"}}
	secret := []byte("binary-mode-secret")
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"job_id":"job-1"}`)
	values := http.Header{}
	values.Set("ce-id", "evt-1")
	values.Set("ce-type", "job.completed")
	h, err := SignWithHeaders(cfg, secret, "", now, body, values)
	if err != nil {
		t.Fatal(err)
	}
	if h.Get("ce-id") != "evt-1" || h.Get("ce-type") != "job.completed" {
		t.Fatalf("signed headers not returned: %v", h)
	}
	if _, err := Verify(cfg, [][]byte{secret}, h, body, now); err != nil {
		t.Fatalf("a correctly signed delivery: %v", err)
	}
	try := func(name string, mutate func(http.Header), want error) {
		t.Helper()
		c := h.Clone()
		mutate(c)
		if _, err := Verify(cfg, [][]byte{secret}, c, body, now); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	try("another type", func(c http.Header) { c.Set("ce-type", "job.refunded") }, ErrSignatureMismatch)
	try("another ID", func(c http.Header) { c.Set("ce-id", "evt-2") }, ErrSignatureMismatch)
	try("no type", func(c http.Header) { c.Del("ce-type") }, ErrMissingSignature)
	try("a padded type", func(c http.Header) { c.Set("ce-type", " job.completed") }, ErrMalformedSignature)
	// Moving a character from one value to the next changes the signed content.
	try("a boundary moved", func(c http.Header) { c.Set("ce-id", "evt-1j"); c.Set("ce-type", "ob.completed") }, ErrSignatureMismatch)
	// Without signed headers configured, the same signature does not verify (the
	// content differs), so a sender and a receiver that disagree fail closed.
	plain := cfg
	plain.SignedHeaders = nil
	if _, err := Verify(plain, [][]byte{secret}, h, body, now); !errors.Is(err, ErrSignatureMismatch) {
		t.Errorf("verified without the signed headers: %v", err)
	}
	if _, err := SignWithHeaders(cfg, secret, "", now, body, http.Header{}); !errors.Is(err, ErrMissingSignature) {
		t.Errorf("signing without the values: %v", err)
	}
	for _, bad := range []Config{
		{Scheme: SchemeStandardWebhooks, SignedHeaders: []string{"ce-id"}},
		{Scheme: SchemeHMACSHA256, Header: "X-Signature", SignedHeaders: []string{"x-signature"}},
		{Scheme: SchemeHMACSHA256, Header: "X-Signature", TimestampHeader: "X-Timestamp", SignedHeaders: []string{"X-Timestamp"}},
		{Scheme: SchemeHMACSHA256, Header: "X-Signature", SignedHeaders: []string{"ce-id", "CE-ID"}},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}
