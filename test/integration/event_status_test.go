package integration_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// statusWrites watches the tenant's WebhookEvents and returns the phases, in order,
// of every write the API server reports about event id after its creation.
func statusWrites(ns, id string) (phases func() []hooksv1alpha1.EventPhase, stop func()) {
	GinkgoHelper()
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(ctx, &hooksv1alpha1.WebhookEventList{}, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	name := identity.EventName(ns, "inference", id)
	seen := make(chan hooksv1alpha1.EventPhase, 64)
	go func() {
		defer GinkgoRecover()
		for e := range w.ResultChan() {
			ev, ok := e.Object.(*hooksv1alpha1.WebhookEvent)
			if ok && e.Type == watch.Modified && ev.Name == name {
				seen <- ev.Status.Phase
			}
		}
	}()
	var got []hooksv1alpha1.EventPhase
	return func() []hooksv1alpha1.EventPhase {
		for {
			select {
			case p := <-seen:
				got = append(got, p)
			default:
				return got
			}
		}
	}, w.Stop
}

var _ = Describe("an event's status writes", func() {
	It("writes a happy-path event's status once, when its operations have finished", func() {
		ns := newTenant()
		writes, stop := statusWrites(ns, "msg_once")
		defer stop()
		sendOK(ns, "msg_once", jobEvent("job-once", 1, 700))
		Eventually(eventPhase(ns, "msg_once")).Should(Equal(hooksv1alpha1.EventComplete))
		Expect(settlementState(ns, "job-once")()).To(Equal(hooksv1alpha1.SettlementSettled))
		// Nothing else is coming: the decision was not written on its own first. (The
		// watch may deliver the write a moment after a read shows it.)
		once := []hooksv1alpha1.EventPhase{hooksv1alpha1.EventComplete}
		Eventually(writes).Should(Equal(once))
		Consistently(writes).WithTimeout(7 * time.Second).Should(Equal(once))
		ev := event(ns, "msg_once")
		Expect(ev.Status.Operations).To(HaveLen(2))
		for _, op := range ev.Status.Operations {
			Expect(op.Outcome).To(Equal(hooksv1alpha1.OutcomeCreated), op.Key)
		}
	})

	It("shows an event whose charge takes longer than the status delay as Dispatching, then Complete", func() {
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.RequestTimeout = fixtures.Duration(20 * time.Second)
		})
		billing.SlowNextFor(identity.NamespacedIdempotencyKey(ns, key(ns, "job-slow")), 1, 9*time.Second)
		writes, stop := statusWrites(ns, "msg_slow")
		defer stop()
		sendOK(ns, "msg_slow", jobEvent("job-slow", 1, 700))
		// Not written while the charge is young and going well ...
		Consistently(writes).WithTimeout(3 * time.Second).Should(BeEmpty())
		// ... but within the delay (5s) of receipt, while the charge is still in flight.
		Eventually(eventPhase(ns, "msg_slow")).WithTimeout(8 * time.Second).Should(Equal(hooksv1alpha1.EventDispatching))
		Expect(settlementState(ns, "job-slow")()).To(Equal(hooksv1alpha1.SettlementSubmitted))
		ev := event(ns, "msg_slow")
		Expect(ev.Status.Operations).To(HaveLen(2))
		Eventually(eventPhase(ns, "msg_slow")).WithTimeout(20 * time.Second).Should(Equal(hooksv1alpha1.EventComplete))
		Eventually(writes).Should(Equal([]hooksv1alpha1.EventPhase{hooksv1alpha1.EventDispatching, hooksv1alpha1.EventComplete}))
		Expect(billing.Charges(key(ns, "job-slow"))).To(Equal(1))
	})

	It("does not create again a settlement deleted while the event's first write is held", func() {
		ns := newTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[1].Settlement.BillingProviderRef = "absent" // never sent: waits for it
		})
		writes, stop := statusWrites(ns, "msg_held_del")
		defer stop()
		sendOK(ns, "msg_held_del", jobEvent("job-held-del", 1, 5))
		bs := &hooksv1alpha1.BillingSettlement{}
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns,
				Name: identity.SettlementName("inference", identity.DefaultSettlementKey("inference", "job-held-del"))}, bs)
		}).Should(Succeed())
		Expect(writes()).To(BeEmpty(), "deleted while the event's decision is not written yet")
		Expect(k8s.Delete(ctx, bs)).To(Succeed())
		Eventually(eventPhase(ns, "msg_held_del")).Should(Equal(hooksv1alpha1.EventRequiresReconciliation))
		ev := event(ns, "msg_held_del")
		Expect(ev.Status.Operations).To(ContainElement(SatisfyAll(
			HaveField("Type", hooksv1alpha1.OperationBillingSettlement), HaveField("Outcome", hooksv1alpha1.OutcomeCreated),
			HaveField("State", "Deleted"))))
		Consistently(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}))
		}).WithTimeout(3*time.Second).Should(BeTrue(), "a record a person deleted is not created again")
	})
})
