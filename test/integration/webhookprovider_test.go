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

// The suite re-checks a Ready WebhookProvider every 10s and one waiting for its Secret
// every 1s (1m and 5s in production), so "within seconds" here is well under 10s.
var _ = Describe("a WebhookProvider's references", func() {
	It("says which BillingProvider its routes name that does not exist, and is Ready once it does", func() {
		ns := fmt.Sprintf("ops-%d", nsCounter.Add(1))
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		bp := fixtures.BillingProvider(ns, billing.URL())
		for _, sec := range fixtures.Secrets(ns, billingToken, bp.Spec.Endpoint) {
			Expect(k8s.Create(ctx, sec)).To(Succeed())
		}
		wp := fixtures.WebhookProvider(ns)
		Expect(k8s.Create(ctx, wp)).To(Succeed())

		Eventually(readyOf(ns, wp)).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", hooksv1alpha1.ReasonBillingProviderNotFound),
			HaveField("Message", ContainSubstring(fmt.Sprintf("%q", fixtures.BillingProviderName)))))

		By("creating the BillingProvider makes it Ready without waiting for a periodic recheck")
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		Eventually(readyOf(ns, wp)).WithTimeout(5 * time.Second).Should(HaveField("Status", metav1.ConditionTrue))

		By("deleting it again is noticed the same way")
		Expect(k8s.Delete(ctx, bp)).To(Succeed())
		Eventually(readyOf(ns, wp)).WithTimeout(5 * time.Second).Should(
			HaveField("Reason", hooksv1alpha1.ReasonBillingProviderNotFound))
	})

	It("notices its signing Secret within seconds once it is created", func() {
		ns := fmt.Sprintf("ops-%d", nsCounter.Add(1))
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		bp := fixtures.BillingProvider(ns, billing.URL())
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		wp := fixtures.WebhookProvider(ns)
		Expect(k8s.Create(ctx, wp)).To(Succeed())
		Eventually(readyOf(ns, wp)).Should(HaveField("Reason", hooksv1alpha1.ReasonSecretNotFound))

		for _, sec := range fixtures.Secrets(ns, billingToken, bp.Spec.Endpoint) {
			Expect(k8s.Create(ctx, sec)).To(Succeed())
		}
		// Secrets are not watched (the operator may only get them): a provider that
		// waits for one looks again every few seconds, not once a minute.
		Eventually(readyOf(ns, wp)).WithTimeout(5 * time.Second).Should(HaveField("Status", metav1.ConditionTrue))
		var got hooksv1alpha1.WebhookProvider
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wp), &got)).To(Succeed())
		Expect(got.Status.SecretKeys).To(BeNumerically(">", 0))
	})
})
