package integration_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// A WebhookProvider signs only with the keys of its Secret it names (docs/design.md §15);
// its Ready condition says when those keys cannot be trusted, and what to do.
var _ = Describe("a WebhookProvider's signing keys", func() {
	const nextSecret = "whsec_dGhlLW5ldy1rZXktYWZ0ZXItcm90YXRpb24="
	var ns string
	BeforeEach(func() {
		ns = fmt.Sprintf("keys-%d", nsCounter.Add(1))
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		bp := fixtures.BillingProvider(ns, billing.URL())
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		for _, sec := range fixtures.Secrets(ns, billingToken, bp.Spec.Endpoint) {
			Expect(k8s.Create(ctx, sec)).To(Succeed())
		}
	})

	// provider creates the fixture's provider, signing with Secret name and the given keys.
	provider := func(name, secret string, keys ...string) *hooksv1alpha1.WebhookProvider {
		GinkgoHelper()
		wp := fixtures.WebhookProvider(ns)
		wp.Name = name
		wp.Spec.Signature.SecretRef = hooksv1alpha1.SigningSecretReference{Name: secret, Keys: keys}
		Expect(k8s.Create(ctx, wp)).To(Succeed())
		return wp
	}
	secret := func(name string, typ corev1.SecretType, data map[string][]byte) {
		GinkgoHelper()
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Type: typ, Data: data})).To(Succeed())
	}

	It("refuses a Secret of type kubernetes.io/tls, naming its type and what to do", func() {
		certPEM, keyPEM := fixtures.CertificatePEM()
		secret("serving-cert", corev1.SecretTypeTLS, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM})
		wp := provider("tls", "serving-cert", "tls.key")
		Eventually(readyOf(ns, wp)).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", hooksv1alpha1.ReasonSigningKeyRefused),
			HaveField("Message", ContainSubstring("kubernetes.io/tls")),
			HaveField("Message", ContainSubstring("spec.signature.secretRef.keys")),
			HaveField("Message", Not(ContainSubstring("BEGIN")))))
	})

	It("refuses a key named like a certificate or a private key, and a value that is PEM", func() {
		certPEM, _ := fixtures.CertificatePEM()
		// A usable Standard Webhooks secret, but kept under a private key's name.
		secret("misnamed", corev1.SecretTypeOpaque, map[string][]byte{"signing.key": []byte(fixtures.StandardWebhooksSecret)})
		byName := provider("by-name", "misnamed", "signing.key")
		Eventually(readyOf(ns, byName)).Should(And(
			HaveField("Reason", hooksv1alpha1.ReasonSigningKeyRefused),
			HaveField("Message", ContainSubstring(`"signing.key"`))))

		By("the only key of a Secret when none is named is held to the same rule")
		secret("ca-only", corev1.SecretTypeOpaque, map[string][]byte{"ca.crt": []byte(fixtures.StandardWebhooksSecret)})
		unnamed := provider("unnamed-ca", "ca-only")
		Eventually(readyOf(ns, unnamed)).Should(And(
			HaveField("Reason", hooksv1alpha1.ReasonSigningKeyRefused),
			HaveField("Message", ContainSubstring(`"ca.crt"`))))

		By("a harmless name holding PEM")
		secret("pem-value", corev1.SecretTypeOpaque, map[string][]byte{"current": certPEM})
		pem := provider("pem", "pem-value", "current")
		Eventually(readyOf(ns, pem)).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", hooksv1alpha1.ReasonSigningKeyRefused),
			HaveField("Message", ContainSubstring(`"current"`)),
			HaveField("Message", ContainSubstring("PEM")),
			HaveField("Message", Not(ContainSubstring("BEGIN")))))
	})

	It("makes a provider that names no key name them when its Secret holds several, and is Ready once it does", func() {
		secret("two-keys", corev1.SecretTypeOpaque, map[string][]byte{
			"current": []byte(fixtures.StandardWebhooksSecret), "next": []byte(nextSecret)})
		wp := provider("unnamed", "two-keys")
		Eventually(readyOf(ns, wp)).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", hooksv1alpha1.ReasonSigningKeysUnnamed),
			HaveField("Message", ContainSubstring(`"current", "next"`)),
			HaveField("Message", ContainSubstring("spec.signature.secretRef.keys")),
			HaveField("Message", ContainSubstring("503"))))

		By("naming both keys, as during a rotation")
		got := &hooksv1alpha1.WebhookProvider{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wp), got)).To(Succeed())
		got.Spec.Signature.SecretRef.Keys = []string{"current", "next"}
		Expect(k8s.Update(ctx, got)).To(Succeed())
		Eventually(readyOf(ns, wp)).WithTimeout(10 * time.Second).Should(HaveField("Status", metav1.ConditionTrue))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wp), got)).To(Succeed())
		Expect(got.Status.SecretKeys).To(Equal(int32(2)))
	})

	It("signs with the only key of a Secret when none is named, and says to name it", func() {
		wp := provider("legacy", fixtures.SigningSecretName)
		Eventually(readyOf(ns, wp)).Should(And(
			HaveField("Status", metav1.ConditionTrue),
			HaveField("Message", ContainSubstring(`"key"`)),
			HaveField("Message", ContainSubstring("spec.signature.secretRef.keys"))))
	})

	It("says which named key the Secret lacks", func() {
		wp := provider("missing-key", fixtures.SigningSecretName, "key", "next")
		Eventually(readyOf(ns, wp)).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", hooksv1alpha1.ReasonSecretInvalid),
			HaveField("Message", ContainSubstring(`"next"`))))
	})
})
