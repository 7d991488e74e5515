package integration_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// setBillingToken replaces the token in a tenant's billing Secret.
func setBillingToken(ns, token string) {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fixtures.BillingSecretName}, s)).To(Succeed())
	patch := client.MergeFrom(s.DeepCopy())
	s.Data["token"] = []byte(token)
	Expect(k8s.Patch(ctx, s, patch)).To(Succeed())
}

// billingProviderCondition returns a condition of the tenant's BillingProvider.
func billingProviderCondition(ns, typ string) func() *metav1.Condition {
	return func() *metav1.Condition {
		bp := &hooksv1alpha1.BillingProvider{}
		if err := k8s.Get(ctx, billingProviderKey(ns), bp); err != nil {
			return nil
		}
		return condition(bp.Status.Conditions, typ)
	}
}

// latestFailedReportReason is the Ready reason of the tenant's newest failed report.
func latestFailedReportReason(ns string) func() string {
	return func() string {
		var l hooksv1alpha1.ReconciliationReportList
		if err := k8s.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return ""
		}
		reason, newest := "", ""
		for _, rr := range l.Items {
			if rr.Status.Phase != hooksv1alpha1.ReportFailed || rr.Name < newest {
				continue
			}
			if c := condition(rr.Status.Conditions, hooksv1alpha1.ConditionReady); c != nil {
				reason, newest = c.Reason, rr.Name
			}
		}
		return reason
	}
}

var _ = Describe("a BillingProvider's health", func() {
	It("says the provider refuses its token, in its conditions and its reports, and recovers once it is fixed", func() {
		ns := reconcilingTenant()
		Eventually(billingProviderCondition(ns, hooksv1alpha1.ConditionProviderHealthy)).Should(
			HaveField("Reason", hooksv1alpha1.ReasonCallsSucceeding))

		setBillingToken(ns, "an-expired-token")
		Eventually(billingProviderCondition(ns, hooksv1alpha1.ConditionProviderHealthy)).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", hooksv1alpha1.ReasonCredentialsRejected),
			HaveField("Message", ContainSubstring(fixtures.BillingSecretName))))
		ready := billingProviderCondition(ns, hooksv1alpha1.ConditionReady)()
		Expect(ready).To(HaveField("Reason", hooksv1alpha1.ReasonCredentialsRejected))
		Expect(ready.Message).NotTo(ContainSubstring("an-expired-token"), "never the token")
		Eventually(billingProviderCondition(ns, hooksv1alpha1.ConditionStalled)).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", hooksv1alpha1.ReasonCredentialsRejected)),
			"only a new token helps: Stalled at once, for GitOps tools")
		Eventually(latestFailedReportReason(ns)).Should(Equal(hooksv1alpha1.ReasonCredentialsRejected),
			"a pass the provider refused says so, not APIServerFailure")

		setBillingToken(ns, billingToken)
		Eventually(billingProviderCondition(ns, hooksv1alpha1.ConditionProviderHealthy)).Should(
			HaveField("Reason", hooksv1alpha1.ReasonCallsSucceeding))
		Eventually(billingProviderCondition(ns, hooksv1alpha1.ConditionReady)).Should(
			HaveField("Status", metav1.ConditionTrue))
		Expect(billingProviderCondition(ns, hooksv1alpha1.ConditionStalled)()).To(BeNil(), "absent once it works")
	})

	It("says its endpoint cannot be reached", func() {
		const nowhere = "http://127.0.0.1:1" // nothing listens on port 1
		ns := reconcilingTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Endpoint = nowhere
		})
		Eventually(billingProviderCondition(ns, hooksv1alpha1.ConditionProviderHealthy)).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", hooksv1alpha1.ReasonEndpointUnreachable),
			HaveField("Message", ContainSubstring(nowhere))))
		Expect(strings.ToLower(billingProviderCondition(ns, hooksv1alpha1.ConditionProviderHealthy)().Message)).
			To(ContainSubstring("connection_refused"))
		Eventually(latestFailedReportReason(ns)).Should(Equal(hooksv1alpha1.ReasonEndpointUnreachable))
		// An outage may heal by itself: Reconciling first, Stalled once it outlasts
		// the waiting grace, so a GitOps wait on it ends.
		Expect(billingProviderCondition(ns, hooksv1alpha1.ConditionStalled)()).To(BeNil())
		Expect(billingProviderCondition(ns, hooksv1alpha1.ConditionReconciling)()).To(
			HaveField("Reason", hooksv1alpha1.ReasonEndpointUnreachable))
		Eventually(billingProviderCondition(ns, hooksv1alpha1.ConditionStalled)).WithTimeout(time.Minute).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", hooksv1alpha1.ReasonEndpointUnreachable)))
		Expect(billingProviderCondition(ns, hooksv1alpha1.ConditionReconciling)()).To(BeNil())
	})
})
