package signingkeys

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/signature"
)

const (
	swh  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
)

func TestSelect(t *testing.T) {
	secret := func(typ corev1.SecretType, data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Type: typ, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	for _, tc := range []struct {
		name     string
		secret   *corev1.Secret
		keys     []string
		scheme   string
		want     []string // the names selected, when no refusal
		implicit bool
		reason   string // the refusal's reason
		mention  string // in the refusal's message
	}{
		{name: "named key among others", secret: secret("", map[string]string{"hmac": "k", "tls.crt": cert}),
			keys: []string{"hmac"}, scheme: signature.SchemeHMACSHA256, want: []string{"hmac"}},
		{name: "two named keys, in the order named", secret: secret(corev1.SecretTypeOpaque, map[string]string{"a": swh, "b": swh}),
			keys: []string{"b", "a"}, scheme: signature.SchemeStandardWebhooks, want: []string{"b", "a"}},
		{name: "the only key, unnamed", secret: secret("", map[string]string{"key": swh, "empty": ""}),
			scheme: signature.SchemeStandardWebhooks, want: []string{"key"}, implicit: true},
		{name: "several keys, unnamed", secret: secret("", map[string]string{"b": "k", "a": "k"}),
			scheme: signature.SchemeHMACSHA256, reason: hooksv1alpha1.ReasonSigningKeysUnnamed, mention: `("a", "b")`},
		{name: "no key", secret: secret("", nil), scheme: signature.SchemeHMACSHA256,
			reason: hooksv1alpha1.ReasonSecretInvalid, mention: "no non-empty key"},
		{name: "TLS Secret", secret: secret(corev1.SecretTypeTLS, map[string]string{"tls.crt": cert, "tls.key": cert, "hmac": "k"}),
			keys: []string{"hmac"}, scheme: signature.SchemeHMACSHA256, reason: hooksv1alpha1.ReasonSigningKeyRefused, mention: "kubernetes.io/tls"},
		{name: "basic-auth Secret", secret: secret(corev1.SecretTypeBasicAuth, map[string]string{"password": "k"}),
			keys: []string{"password"}, scheme: signature.SchemeHMACSHA256, reason: hooksv1alpha1.ReasonSigningKeyRefused},
		{name: "custom type", secret: secret("example.com/webhook", map[string]string{"k": "v"}),
			keys: []string{"k"}, scheme: signature.SchemeHMACSHA256, want: []string{"k"}},
		{name: "named certificate", secret: secret("", map[string]string{"tls.crt": "k"}), keys: []string{"tls.crt"},
			scheme: signature.SchemeHMACSHA256, reason: hooksv1alpha1.ReasonSigningKeyRefused, mention: `"tls.crt"`},
		{name: "unnamed only key named like a key", secret: secret("", map[string]string{"Webhook.PEM": "k"}),
			scheme: signature.SchemeHMACSHA256, reason: hooksv1alpha1.ReasonSigningKeyRefused, mention: `"Webhook.PEM"`},
		{name: "PEM value", secret: secret("", map[string]string{"current": "\n" + cert}), keys: []string{"current"},
			scheme: signature.SchemeHMACSHA256, reason: hooksv1alpha1.ReasonSigningKeyRefused, mention: "PEM"},
		{name: "named key missing", secret: secret("", map[string]string{"a": "k"}), keys: []string{"a", "b"},
			scheme: signature.SchemeHMACSHA256, reason: hooksv1alpha1.ReasonSecretInvalid, mention: `"b" named`},
		{name: "named key blank", secret: secret("", map[string]string{"a": " \n"}), keys: []string{"a"},
			scheme: signature.SchemeHMACSHA256, reason: hooksv1alpha1.ReasonSecretInvalid, mention: "empty"},
		{name: "one named key undecodable refuses both", secret: secret("", map[string]string{"a": swh, "b": "whsec_!!!"}),
			keys: []string{"a", "b"}, scheme: signature.SchemeStandardWebhooks, reason: hooksv1alpha1.ReasonSecretInvalid, mention: `"b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Select(tc.secret, hooksv1alpha1.SigningSecretReference{Name: "s", Keys: tc.keys}, tc.scheme)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Select: %v", err)
				}
				if strings.Join(got.Names, ",") != strings.Join(tc.want, ",") || got.Implicit != tc.implicit || len(got.Values) != len(tc.want) {
					t.Fatalf("Select = %v (implicit %v), want %v (implicit %v)", got.Names, got.Implicit, tc.want, tc.implicit)
				}
				for i, n := range got.Names {
					if string(got.Values[i]) != string(tc.secret.Data[n]) {
						t.Fatalf("value %d is not key %q's", i, n)
					}
				}
				return
			}
			refusal, ok := AsRefusal(err)
			if !ok {
				t.Fatalf("Select = %v, %v; want a refusal %s", got.Names, err, tc.reason)
			}
			if refusal.Reason != tc.reason || !strings.Contains(refusal.Message, tc.mention) {
				t.Fatalf("refusal %s %q, want %s mentioning %q", refusal.Reason, refusal.Message, tc.reason, tc.mention)
			}
			if strings.Contains(refusal.Message, "BEGIN") || strings.Contains(refusal.Message, "MfKQ") || strings.Contains(refusal.Message, "!!!") {
				t.Fatalf("refusal message holds secret material: %q", refusal.Message)
			}
			if !strings.Contains(refusal.Message, "503") {
				t.Fatalf("refusal message does not say what the sender sees meanwhile: %q", refusal.Message)
			}
		})
	}
}

func TestCertificateLike(t *testing.T) {
	for name, want := range map[string]bool{
		"tls.crt": true, "tls.key": true, "ca.crt": true, "server.pem": true, "KEYSTORE.P12": true, "ssh-privatekey": true,
		"key": false, "secret": false, "current": false, "webhook-secret": false, "signing.secret": false, "keys": false,
	} {
		if got := CertificateLike(name); got != want {
			t.Errorf("CertificateLike(%q) = %v, want %v", name, got, want)
		}
	}
}
