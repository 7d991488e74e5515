package controllers_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// Deleting a BillingProvider (issue 10, defect 11): a settlement that may have moved
// money at it can only be resolved through it, so the provider's deletion waits.

func billingProviderKey(ns string) client.ObjectKey {
	return client.ObjectKey{Namespace: ns, Name: fixtures.BillingProviderName}
}

func billingProviderGone(ns string) func() bool {
	return func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, billingProviderKey(ns), &hooksv1alpha1.BillingProvider{}))
	}
}

func deleteBillingProvider(ns string) {
	GinkgoHelper()
	bp := &hooksv1alpha1.BillingProvider{}
	Expect(k8s.Get(ctx, billingProviderKey(ns), bp)).To(Succeed())
	Expect(k8s.Delete(ctx, bp)).To(Succeed())
}

// warningEvents counts the Warning events about the BillingProvider with a reason,
// and how often the recorder saw each (a series counts its repeats).
func warningEvents(ns, reason string) (objects, occurrences int) {
	GinkgoHelper()
	var l eventsv1.EventList
	Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
	for _, e := range l.Items {
		if e.Regarding.Kind == "BillingProvider" && e.Type == corev1.EventTypeWarning && e.Reason == reason {
			objects++
			occurrences++
			if e.Series != nil {
				occurrences += int(e.Series.Count) - 1
			}
		}
	}
	return objects, occurrences
}

var _ = Describe("deleting a BillingProvider (issue 10)", func() {
	It("waits while a settlement's outcome there is unknown, says why, and goes once it settles", func() {
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			// The outage must not dead-letter the settlement while the test looks.
			bp.Spec.Retry.MaxAttempts = 1000
		})
		Expect(billing.SetDown(true)).To(Succeed())
		downed := true
		defer func() {
			if downed {
				_ = billing.SetDown(false)
			}
		}()
		sendOK(ns, "msg_bp_delete", jobEvent("job-bp-delete", 1, 11))
		Eventually(settlementState(ns, "job-bp-delete")).Should(Equal(hooksv1alpha1.SettlementSubmitted))
		bs := settlementOf(ns, "job-bp-delete")
		Expect(bs.Status.FirstSubmittedAt).NotTo(BeNil())

		deleteBillingProvider(ns)
		Consistently(func() error {
			return k8s.Get(ctx, billingProviderKey(ns), &hooksv1alpha1.BillingProvider{})
		}).WithTimeout(3*time.Second).Should(Succeed(), "the provider is the only one that can answer for the settlement")

		bp := &hooksv1alpha1.BillingProvider{}
		Expect(k8s.Get(ctx, billingProviderKey(ns), bp)).To(Succeed())
		Expect(bp.DeletionTimestamp).NotTo(BeNil())
		Expect(bp.Finalizers).To(ContainElement(hooksv1alpha1.FinalizerBillingProviderInUse))
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, billingProviderKey(ns), bp)).To(Succeed())
			c := condition(bp.Status.Conditions, hooksv1alpha1.ConditionDeleting)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(hooksv1alpha1.ReasonSettlementsInFlight))
			g.Expect(c.Message).To(ContainSubstring("1 settlement"))
			g.Expect(c.Message).To(ContainSubstring(bs.Name))
			g.Expect(c.ObservedGeneration).To(Equal(bp.Generation))
		}).Should(Succeed())
		Eventually(func() int { n, _ := warningEvents(ns, hooksv1alpha1.ReasonSettlementsInFlight); return n }).Should(Equal(1))
		// The settlement keeps retrying through the deleting provider meanwhile.
		Expect(settlementState(ns, "job-bp-delete")()).To(Equal(hooksv1alpha1.SettlementSubmitted))

		Expect(billing.SetDown(false)).To(Succeed())
		downed = false
		Eventually(settlementState(ns, "job-bp-delete")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(billing.Charges(key("job-bp-delete"))).To(Equal(1))
		Eventually(billingProviderGone(ns)).WithTimeout(10*time.Second).Should(BeTrue(),
			"nothing holds the provider once the settlement settled")
		_, occurrences := warningEvents(ns, hooksv1alpha1.ReasonSettlementsInFlight)
		Expect(occurrences).To(Equal(1), "the wait is announced once, not on every reconcile")
	})

	It("deletes a BillingProvider that no unresolved settlement references at once", func() {
		ns := newTenant()
		sendOK(ns, "msg_bp_free", jobEvent("job-bp-free", 1, 12))
		Eventually(settlementState(ns, "job-bp-free")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Eventually(func() []string {
			bp := &hooksv1alpha1.BillingProvider{}
			Expect(k8s.Get(ctx, billingProviderKey(ns), bp)).To(Succeed())
			return bp.Finalizers
		}).Should(ContainElement(hooksv1alpha1.FinalizerBillingProviderInUse))

		deleteBillingProvider(ns)
		Eventually(billingProviderGone(ns)).WithTimeout(5 * time.Second).Should(BeTrue())
		n, _ := warningEvents(ns, hooksv1alpha1.ReasonSettlementsInFlight)
		Expect(n).To(BeZero())
	})
})
