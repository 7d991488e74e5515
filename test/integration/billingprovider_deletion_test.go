package integration_test

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
	"github.com/settlement-operator/settlement-operator/internal/credentials"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// Deleting a BillingProvider (a money-safety defect of the first review): a settlement that may have moved
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

var _ = Describe("deleting a BillingProvider", func() {
	It("waits while a settlement's outcome there is unknown, says why, and goes once it settles", func() {
		ns := newTenant(slowRetries, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Retry.MaxAttempts = 1000 // the outage must not dead-letter it while the test looks
		})
		up := ambiguousThenDown(ns, "msg_bp_delete", "job-bp-delete", 11)
		defer func() { _ = up() }()
		Expect(settlementState(ns, "job-bp-delete")()).To(Equal(hooksv1alpha1.SettlementSubmitted))
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
		// The settlement keeps asking the deleting provider by key meanwhile.
		Expect(settlementState(ns, "job-bp-delete")()).To(Equal(hooksv1alpha1.SettlementSubmitted))

		Expect(up()).To(Succeed())
		Eventually(settlementState(ns, "job-bp-delete")).WithTimeout(time.Minute).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(billing.Charges(key(ns, "job-bp-delete"))).To(Equal(1))
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

// What a namespace deletion does. envtest has no namespace controller and
// no garbage collector: deleting the namespace only marks it Terminating, so this
// test does by hand what the namespace controller does in a cluster — it deletes
// every object in the namespace, and the Secrets (no finalizer) go at once. It pins
// down a known limit documented in docs/runbook.md ("Deleting a namespace"): once the
// credentials Secret is gone and the namespace is Terminating (no new object can be
// created in it, not even a Kubernetes Event), a settlement held by its finalizer
// cannot reach its provider any more, and only a human can end the wait.
var _ = Describe("deleting a namespace (known limit)", func() {
	It("keeps the namespace Terminating while settlements are unresolved, and their Secret cannot come back", func() {
		ns := newTenant(slowRetries, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Retry.MaxAttempts = 1000 // the outage must not dead-letter it while the test looks
		})
		up := ambiguousThenDown(ns, "msg_ns_delete", "job-ns-delete", 13)
		defer func() { _ = up() }()
		Expect(settlementState(ns, "job-ns-delete")()).To(Equal(hooksv1alpha1.SettlementSubmitted))
		Eventually(func() []string {
			bp := &hooksv1alpha1.BillingProvider{}
			Expect(k8s.Get(ctx, billingProviderKey(ns), bp)).To(Succeed())
			return bp.Finalizers
		}).Should(ContainElement(hooksv1alpha1.FinalizerBillingProviderInUse))

		namespace := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: ns}, namespace)).To(Succeed())
		Expect(k8s.Delete(ctx, namespace)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Name: ns}, namespace)).To(Succeed())
		Expect(namespace.Status.Phase).To(Equal(corev1.NamespaceTerminating))

		// The namespace controller's work, by hand: everything in the namespace is deleted.
		for _, obj := range []client.Object{&corev1.Secret{}, &hooksv1alpha1.WebhookProvider{}, &hooksv1alpha1.WebhookEvent{},
			&hooksv1alpha1.JobCompletion{}, &hooksv1alpha1.BillingSettlement{}, &hooksv1alpha1.BillingProvider{}} {
			Expect(k8s.DeleteAllOf(ctx, obj, client.InNamespace(ns))).To(Succeed())
		}
		var secrets corev1.SecretList
		Expect(k8s.List(ctx, &secrets, client.InNamespace(ns))).To(Succeed())
		Expect(secrets.Items).To(BeEmpty(), "Secrets have no finalizer: they go first")

		// The settlement controller keeps a Secret it read for credentials.SecretTTL (a GET per
		// TTL, not per call: docs/decisions.md "Throughput"); once that copy expires, its
		// next retry finds no Secret.
		Eventually(func(g Gomega) {
			c := condition(settlementOf(ns, "job-ns-delete").Status.Conditions, hooksv1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Message).To(And(ContainSubstring(fixtures.BillingSecretName), ContainSubstring("not found")))
		}).WithTimeout(credentials.SecretTTL + 15*time.Second).Should(Succeed())

		Expect(up()).To(Succeed())
		bs := settlementOf(ns, "job-ns-delete")
		Expect(bs.DeletionTimestamp).NotTo(BeNil())
		Consistently(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), bs)).To(Succeed())
			g.Expect(bs.Status.State).To(Equal(hooksv1alpha1.SettlementSubmitted),
				"the provider is up again, but the settlement has no credentials to ask it")
			g.Expect(k8s.Get(ctx, billingProviderKey(ns), &hooksv1alpha1.BillingProvider{})).To(Succeed())
		}).WithTimeout(3 * time.Second).Should(Succeed())
		Expect(billing.Charges(key(ns, "job-ns-delete"))).To(BeZero())
		ready := condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady)
		Expect(ready).NotTo(BeNil())
		Expect(ready.Message).To(And(ContainSubstring(fixtures.BillingSecretName), ContainSubstring("not found")),
			"the calls now fail for want of credentials")

		// The Secret cannot be put back: a Terminating namespace admits no new object.
		for _, sec := range fixtures.Secrets(ns, billingToken, billing.URL()) {
			err := k8s.Create(ctx, sec)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "create %s in a terminating namespace: %v", sec.Name, err)
		}

		// The runbook's way out, once the provider has been asked by key by hand:
		// remove the settlement's finalizer. The BillingProvider then goes by itself:
		// nothing holds it any more. (In a cluster the namespace then finishes.)
		patch := client.MergeFrom(bs.DeepCopy())
		bs.Finalizers = nil
		Expect(k8s.Patch(ctx, bs, patch)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}))
		}).Should(BeTrue())
		Eventually(billingProviderGone(ns)).WithTimeout(5 * time.Second).Should(BeTrue())
	})
})
