package receiver

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

// Only the keys a provider names sign (docs/design.md §15): a certificate or anything
// else kept in the same Secret must never verify a delivery.
var _ = Describe("signing keys", func() {
	const hmacKey = "plain-hmac-secret"
	hmacCfg := signature.Config{Scheme: signature.SchemeHMACSHA256, Header: "X-Signature", TimestampHeader: "X-Timestamp"}
	var ns string
	var certPEM []byte
	BeforeEach(func() {
		ns = newNamespace()
		certPEM, _ = fixtures.CertificatePEM()
	})

	hmacProvider := func(keys ...string) *hooksv1alpha1.WebhookProvider {
		p := inferenceProvider(ns)
		p.Spec.Signature = hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeHMACSHA256,
			SecretRef: hooksv1alpha1.SigningSecretReference{Name: "hmac-secret", Keys: keys},
			Header:    "X-Signature", TimestampHeader: "X-Timestamp"}
		p.Spec.EventID = hooksv1alpha1.EventIDSource{JSONPath: ".id"}
		return p
	}
	post := func(secret []byte, id string) sender.Response {
		GinkgoHelper()
		body := strings.Replace(completedV2, `{"type"`, `{"id":"`+id+`","type"`, 1)
		r, err := sender.Send(ctx, nil, sender.Delivery{URL: url(ns, "inference"), Signature: hmacCfg,
			Secret: secret, Body: []byte(body)})
		Expect(err).NotTo(HaveOccurred())
		return r
	}
	nothingStored := func() {
		GinkgoHelper()
		Expect(listEvents(ns)).To(BeEmpty())
		var bs hooksv1alpha1.BillingSettlementList
		Expect(k8s.List(ctx, &bs, client.InNamespace(ns))).To(Succeed())
		Expect(bs.Items).To(BeEmpty())
	}

	It("refuses (401) a delivery signed with a certificate kept beside the named key, and accepts the named key", func() {
		install(hmacProvider("hmac"), map[string]string{"hmac": hmacKey, "tls.crt": string(certPEM)})
		before := creates.Load()

		r := post(certPEM, "evt_signed_with_cert")
		Expect(r.Status).To(Equal(http.StatusUnauthorized), r.Body)
		nothingStored()
		Expect(creates.Load()).To(Equal(before), "a refused delivery costs no create")

		r = post([]byte(hmacKey), "evt_signed_with_key")
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		Expect(listEvents(ns)).To(HaveLen(1))
	})

	It("answers 503 and stores nothing while a provider names no key and its Secret holds several, until it names one", func() {
		install(hmacProvider(), map[string]string{"hmac": hmacKey, "tls.crt": string(certPEM)})

		for _, secret := range [][]byte{certPEM, []byte(hmacKey)} {
			r := post(secret, "evt_unnamed")
			Expect(r.Status).To(Equal(http.StatusServiceUnavailable), r.Body)
			Expect(r.Body).To(ContainSubstring("Ready condition"))
		}
		nothingStored()

		By("naming the key, the sender's retry is accepted")
		p := &hooksv1alpha1.WebhookProvider{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, p)).To(Succeed())
		p.Spec.Signature.SecretRef.Keys = []string{"hmac"}
		Expect(k8s.Update(ctx, p)).To(Succeed())
		Eventually(func() int { return post([]byte(hmacKey), "evt_unnamed").Status }).Should(Equal(http.StatusOK))
		Expect(post(certPEM, "evt_cert_after_naming").Status).To(Equal(http.StatusUnauthorized))
	})

	It("answers 503 when the named key is a certificate, holds PEM, or the Secret is a TLS Secret", func() {
		By("a key named like a certificate, even if the sender signs with its bytes")
		install(hmacProvider("tls.crt"), map[string]string{"tls.crt": string(certPEM)})
		r := post(certPEM, "evt_cert_named")
		Expect(r.Status).To(Equal(http.StatusServiceUnavailable), r.Body)

		By("a harmless name holding PEM")
		p := hmacProvider("signing")
		p.Name, p.Spec.Signature.SecretRef.Name = "pem", "pem-secret"
		install(p, map[string]string{"signing": string(certPEM)})
		r2, err := sender.Send(ctx, nil, sender.Delivery{URL: url(ns, "pem"), Signature: hmacCfg, Secret: certPEM,
			Body: []byte(strings.Replace(completedV2, `{"type"`, `{"id":"evt_pem","type"`, 1))})
		Expect(err).NotTo(HaveOccurred())
		Expect(r2.Status).To(Equal(http.StatusServiceUnavailable), r2.Body)

		By("a Secret of type kubernetes.io/tls")
		_, keyPEM := fixtures.CertificatePEM()
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tls-secret"},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "hmac": []byte(hmacKey)}})).To(Succeed())
		p = hmacProvider("hmac")
		p.Name, p.Spec.Signature.SecretRef.Name = "tls", "tls-secret"
		Expect(k8s.Create(ctx, p)).To(Succeed())
		Eventually(func() error {
			return mgrCache.Get(ctx, client.ObjectKeyFromObject(p), &hooksv1alpha1.WebhookProvider{})
		}).Should(Succeed())
		r3, err := sender.Send(ctx, nil, sender.Delivery{URL: url(ns, "tls"), Signature: hmacCfg, Secret: []byte(hmacKey),
			Body: []byte(strings.Replace(completedV2, `{"type"`, `{"id":"evt_tls","type"`, 1))})
		Expect(err).NotTo(HaveOccurred())
		Expect(r3.Status).To(Equal(http.StatusServiceUnavailable), r3.Body)
		nothingStored()
	})

	It("accepts nothing while the controller reports the provider's keys invalid, not even with its valid key", func() {
		// Its routes charge through BillingProvider "billing": Ready looks at the Secret once it exists.
		Expect(k8s.Create(ctx, &hooksv1alpha1.BillingProvider{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing"},
			Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://billing.example.com",
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "billing-token"}},
		})).To(Succeed())
		p := inferenceProvider(ns)
		p.Spec.Signature.SecretRef.Keys = []string{"current", "next"}
		install(p, map[string]string{"current": swhSecret, "next": "whsec_!!!not-base64"})
		Eventually(func(g Gomega) {
			got := &hooksv1alpha1.WebhookProvider{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
			c := apimeta.FindStatusCondition(got.Status.Conditions, hooksv1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(hooksv1alpha1.ReasonSecretInvalid))
			g.Expect(c.Message).To(ContainSubstring(`"next"`))
		}).WithTimeout(15 * time.Second).Should(Succeed())
		r := send(ns, "inference", "msg_while_invalid", completedV2)
		Expect(r.Status).To(Equal(http.StatusServiceUnavailable), r.Body)
		nothingStored()
	})
})
