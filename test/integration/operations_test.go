package integration_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

const swhSecret = fixtures.StandardWebhooksSecret

var jobEvent = fixtures.JobCompletedEvent

func send(ns, id, body string) sender.Response {
	GinkgoHelper()
	r, err := sender.Send(ctx, nil, sender.Delivery{
		URL: mgr.baseURL + identity.EndpointPath(ns, "inference"), ID: id, Body: []byte(body),
		Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks}, Secret: []byte(swhSecret),
	})
	Expect(err).NotTo(HaveOccurred())
	return r
}

// sendOK retries while the receiver's cache has not seen a just-created provider yet.
func sendOK(ns, id, body string) sender.Response {
	GinkgoHelper()
	var r sender.Response
	Eventually(func() int {
		r = send(ns, id, body)
		return r.Status
	}).Should(Equal(http.StatusOK))
	return r
}

func event(ns, id string) *hooksv1alpha1.WebhookEvent {
	GinkgoHelper()
	ev := &hooksv1alpha1.WebhookEvent{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", id)}, ev)).To(Succeed())
	return ev
}

func settlementOf(ns, jobID string) *hooksv1alpha1.BillingSettlement {
	GinkgoHelper()
	bs := &hooksv1alpha1.BillingSettlement{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns,
		Name: identity.SettlementName("inference", identity.DefaultSettlementKey("inference", jobID))}, bs)).To(Succeed())
	return bs
}

func jobOf(ns, jobID string) *hooksv1alpha1.JobCompletion {
	GinkgoHelper()
	jc := &hooksv1alpha1.JobCompletion{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.JobCompletionName("inference", jobID)}, jc)).To(Succeed())
	return jc
}

func jobState(ns, jobID string) func() hooksv1alpha1.JobCompletionState {
	return func() hooksv1alpha1.JobCompletionState {
		jc := &hooksv1alpha1.JobCompletion{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.JobCompletionName("inference", jobID)}, jc); err != nil {
			return ""
		}
		return jc.Progress().State
	}
}

func settlementState(ns, jobID string) func() hooksv1alpha1.SettlementState {
	return func() hooksv1alpha1.SettlementState {
		bs := &hooksv1alpha1.BillingSettlement{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns,
			Name: identity.SettlementName("inference", identity.DefaultSettlementKey("inference", jobID))}, bs); err != nil {
			return ""
		}
		return bs.Status.State
	}
}

func eventPhase(ns, id string) func() hooksv1alpha1.EventPhase {
	return func() hooksv1alpha1.EventPhase {
		ev := &hooksv1alpha1.WebhookEvent{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", id)}, ev); err != nil {
			return ""
		}
		return ev.Status.Phase
	}
}

// key is the settlement key of a job of the tenant ns.
func key(ns, jobID string) string { return identity.JobSettlementKey(ns, "inference", jobID) }

// recordEventReasons lists the reasons of the Kubernetes Events recorded about the
// tenant's records (events, jobs, settlements), leaving out the providers' own.
func recordEventReasons(ns string) []string {
	GinkgoHelper()
	var l eventsv1.EventList
	Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
	var reasons []string
	for _, e := range l.Items {
		switch e.Regarding.Kind {
		case "WebhookEvent", "JobCompletion", "BillingSettlement":
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

func condition(conds []metav1.Condition, typ string) *metav1.Condition {
	return apimeta.FindStatusCondition(conds, typ)
}

var _ = Describe("the failure matrix (docs/design.md §9)", func() {
	It("settles a completed job once: event Complete, job Applied, one charge", func() {
		ns := newTenant()
		sendOK(ns, "msg_happy", jobEvent("job-happy", 1, 1523))
		Eventually(eventPhase(ns, "msg_happy")).Should(Equal(hooksv1alpha1.EventComplete))
		jc := jobOf(ns, "job-happy")
		Expect(jc.Progress().State).To(Equal(hooksv1alpha1.JobCompletionApplied))
		Expect(*jc.Progress().AppliedVersion).To(Equal(int64(1)))
		bs := settlementOf(ns, "job-happy")
		Expect(bs.Status.State).To(Equal(hooksv1alpha1.SettlementSettled))
		Expect(bs.Status.ProviderRef).NotTo(BeEmpty())
		Expect(bs.Status.Attempts).To(Equal(int32(1)))
		Expect(bs.Status.Charge).To(Equal("1523 tokens"), "the CHARGE column")
		Expect(bs.Spec.IdempotencyKey).To(Equal(identity.NamespacedIdempotencyKey(ns, key(ns, "job-happy"))))
		Expect(bs.Finalizers).To(ContainElement(hooksv1alpha1.FinalizerSettlementProtection))
		Expect(condition(bs.Status.Conditions, hooksv1alpha1.ConditionSettled).Status).To(Equal(metav1.ConditionTrue))
		Expect(billing.Charges(key(ns, "job-happy"))).To(Equal(1))
		// A job never seen before: its charge was sent directly, with no lookup first
		// (defect 13: one provider call per charge on the happy path).
		calls := billing.CallsFor(bs.Spec.IdempotencyKey)
		Expect(calls).To(HaveLen(1))
		Expect(calls[0].Method).To(Equal(http.MethodPost))
		Expect(bs.Status.Exposure).To(Equal(hooksv1alpha1.ExposureConfirmed))
		ev := event(ns, "msg_happy")
		Expect(ev.Status.Operations).To(HaveLen(2))
		for _, op := range ev.Status.Operations {
			Expect(op.Outcome).To(Equal(hooksv1alpha1.OutcomeCreated))
		}
		Expect(bs.OwnerReferences).To(BeEmpty(), "financial records are never owned by events")
		// Kubernetes Events are for what a human acts on: a charge that settled the normal
		// way records none about its records (measured: 2 of 10 writes per event were Events).
		Consistently(func() []string { return recordEventReasons(ns) }).
			WithTimeout(3 * time.Second).Should(BeEmpty())
	})

	It("turns sequential and 50 concurrent duplicates into one event, one job transition, one charge", func() {
		ns := newTenant()
		body := jobEvent("job-dup", 1, 10)
		sendOK(ns, "msg_dup", body)
		for i := 0; i < 3; i++ {
			Expect(send(ns, "msg_dup", body).Status).To(Equal(http.StatusOK))
		}
		var wg sync.WaitGroup
		codes := make(chan int, 50)
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				codes <- send(ns, "msg_dup", body).Status
			}()
		}
		wg.Wait()
		close(codes)
		for c := range codes {
			Expect(c).To(Equal(http.StatusOK))
		}
		Eventually(settlementState(ns, "job-dup")).Should(Equal(hooksv1alpha1.SettlementSettled))
		var evs hooksv1alpha1.WebhookEventList
		Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
		Expect(evs.Items).To(HaveLen(1))
		Expect(jobOf(ns, "job-dup").Generation).To(Equal(int64(1)), "one job transition")
		Consistently(func() int { return billing.Charges(key(ns, "job-dup")) }).WithTimeout(time.Second).Should(Equal(1))
	})

	for _, nulls := range nullModes {
		It(nulls.spec("keeps the job Applied while billing fails, retries with the same key, and completes once settled"), func() {
			nulls.use()
			ns := newTenant()
			billing.FailNext(4, http.StatusServiceUnavailable)
			sendOK(ns, "msg_billfail", jobEvent("job-billfail", 1, 5))
			Eventually(eventPhase(ns, "msg_billfail")).Should(Equal(hooksv1alpha1.EventPartiallyFailed))
			Expect(jobOf(ns, "job-billfail").Progress().State).To(Equal(hooksv1alpha1.JobCompletionApplied))
			Eventually(eventPhase(ns, "msg_billfail")).Should(Equal(hooksv1alpha1.EventComplete))
			bs := settlementOf(ns, "job-billfail")
			Expect(bs.Status.State).To(Equal(hooksv1alpha1.SettlementSettled))
			Expect(bs.Status.Attempts).To(BeNumerically(">=", 2))
			Expect(billing.Charges(key(ns, "job-billfail"))).To(Equal(1))
			for _, r := range billing.Records() {
				if r.SettlementKey == key(ns, "job-billfail") {
					Expect(r.IdempotencyKey).To(Equal(bs.Spec.IdempotencyKey))
				}
			}
		})
	}

	for _, nulls := range nullModes {
		It(nulls.spec("learns the outcome by key when the charge succeeded but the response was lost: no second charge"), func() {
			nulls.use()
			ns := newTenant()
			billing.CommitThenTimeoutNext(1)
			sendOK(ns, "msg_lost", jobEvent("job-lost", 1, 7))
			Eventually(settlementState(ns, "job-lost")).Should(Equal(hooksv1alpha1.SettlementSettled))
			bs := settlementOf(ns, "job-lost")
			Expect(bs.Status.Attempts).To(Equal(int32(1)), "the lookup by key answered; nothing was resubmitted")
			Expect(billing.Charges(key(ns, "job-lost"))).To(Equal(1))
		})
	}

	It("never moves a job backward when v2 arrives before v1", func() {
		ns := newTenant()
		sendOK(ns, "msg_v2", jobEvent("job-ooo", 2, 20))
		Eventually(jobState(ns, "job-ooo")).
			Should(Equal(hooksv1alpha1.JobCompletionApplied))
		sendOK(ns, "msg_v1", jobEvent("job-ooo", 1, 10))
		Eventually(func() hooksv1alpha1.OperationOutcome {
			for _, op := range event(ns, "msg_v1").Status.Operations {
				if op.Type == hooksv1alpha1.OperationJobCompletion {
					return op.Outcome
				}
			}
			return ""
		}).Should(Equal(hooksv1alpha1.OutcomeSuperseded))
		// v1 reports other usage than v2 did: its settlement operation is superseded
		// too (the charge follows the newest report), so the event still completes.
		Eventually(eventPhase(ns, "msg_v1")).Should(Equal(hooksv1alpha1.EventComplete))
		// v2's charge settles on its own time: v1's event completing does not wait for it.
		Eventually(settlementState(ns, "job-ooo")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(billing.Charges(key(ns, "job-ooo"))).To(Equal(1))
		jc := jobOf(ns, "job-ooo")
		Expect(jc.Spec.Completion.Version).To(Equal(int64(2)))
		Expect(*jc.Progress().AppliedVersion).To(Equal(int64(2)))
		Expect(jc.Generation).To(Equal(int64(1)))
	})

	It("applies v2 after v1 as a guarded transition", func() {
		ns := newTenant()
		sendOK(ns, "msg_a1", jobEvent("job-fwd", 1, 10))
		Eventually(jobState(ns, "job-fwd")).
			Should(Equal(hooksv1alpha1.JobCompletionApplied))
		sendOK(ns, "msg_a2", jobEvent("job-fwd", 2, 10))
		Eventually(func() int64 {
			jc := jobOf(ns, "job-fwd")
			if jc.Progress().AppliedVersion == nil {
				return 0
			}
			return *jc.Progress().AppliedVersion
		}).Should(Equal(int64(2)))
		// The job went Applied (v1) → Applied (v2) in one status write: the event that
		// proposed v2 must still see it applied and finish (it is woken by the
		// completion's new generation, not only by a change of its state).
		for _, msg := range []string{"msg_a1", "msg_a2"} {
			Eventually(func() hooksv1alpha1.EventPhase {
				ev := &hooksv1alpha1.WebhookEvent{}
				if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", msg)}, ev); err != nil {
					return ""
				}
				return ev.Status.Phase
			}).Should(Equal(hooksv1alpha1.EventComplete), msg)
		}
	})

	It("answers the same event ID with another payload 409 and lets it cause nothing", func() {
		ns := newTenant()
		sendOK(ns, "msg_reuse", jobEvent("job-reuse", 1, 10))
		r := send(ns, "msg_reuse", jobEvent("job-reuse-other", 1, 99))
		Expect(r.Status).To(Equal(http.StatusConflict))
		Eventually(func() int {
			var evs hooksv1alpha1.WebhookEventList
			Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			n := 0
			for _, e := range evs.Items {
				if e.Status.Phase == hooksv1alpha1.EventQuarantined {
					n++
				}
			}
			return n
		}).Should(Equal(1))
		Eventually(settlementState(ns, "job-reuse")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.JobCompletionName("inference", "job-reuse-other")},
				&hooksv1alpha1.JobCompletion{})
		}).WithTimeout(time.Second).Should(Satisfy(apierrors.IsNotFound))
		Expect(billing.Charges(key(ns, "job-reuse-other"))).To(Equal(0))
	})

	It("dead-letters when the provider is down past maxElapsed, and a replay settles it with the same key", func() {
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Retry.MaxElapsed = &metav1.Duration{Duration: 3 * time.Second}
		})
		Expect(billing.SetDown(true)).To(Succeed())
		downed := true
		defer func() {
			if downed {
				_ = billing.SetDown(false)
			}
		}()
		sendOK(ns, "msg_down", jobEvent("job-down", 1, 3))
		Eventually(settlementState(ns, "job-down")).Should(Equal(hooksv1alpha1.SettlementFailed))
		bs := settlementOf(ns, "job-down")
		dl := condition(bs.Status.Conditions, hooksv1alpha1.ConditionDeadLettered)
		Expect(dl).NotTo(BeNil())
		Expect(dl.Status).To(Equal(metav1.ConditionTrue))
		Expect(dl.Message).To(ContainSubstring("kubectl annotate"))
		Expect(eventPhase(ns, "msg_down")()).To(Equal(hooksv1alpha1.EventPartiallyFailed))
		Expect(billing.SetDown(false)).To(Succeed())
		downed = false

		patch := client.MergeFrom(bs.DeepCopy())
		bs.Annotations = map[string]string{hooksv1alpha1.AnnotationReplay: "r1"}
		Expect(k8s.Patch(ctx, bs, patch)).To(Succeed())
		Eventually(settlementState(ns, "job-down")).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs = settlementOf(ns, "job-down")
		Expect(bs.Status.Replay.Count).To(Equal(int32(1)))
		Expect(condition(bs.Status.Conditions, hooksv1alpha1.ConditionDeadLettered).Status).To(Equal(metav1.ConditionFalse))
		Expect(billing.Charges(key(ns, "job-down"))).To(Equal(1))
		Eventually(eventPhase(ns, "msg_down")).Should(Equal(hooksv1alpha1.EventComplete))
		// The dead letter's Warning is answered by an Event when it settles; the routine
		// submission records none.
		Eventually(func() []string { return recordEventReasons(ns) }).Should(ContainElements(
			hooksv1alpha1.ReasonRetriesExhausted, hooksv1alpha1.ReasonReplayed, hooksv1alpha1.ReasonProviderSettled))
		Expect(recordEventReasons(ns)).NotTo(ContainElement(hooksv1alpha1.ReasonSubmittedToProvider))
	})

	for _, nulls := range nullModes {
		It(nulls.spec("learns a Refund's outcome by key when its reply was lost: one refund, what it reverses read back"), func() {
			nulls.use()
			ns := newTenant()
			sendOK(ns, "msg_refund_lost", jobEvent("job-refund-lost", 1, 4))
			Eventually(settlementState(ns, "job-refund-lost")).Should(Equal(hooksv1alpha1.SettlementSettled))
			refund := refundOf(settlementOf(ns, "job-refund-lost"), 400)
			billing.CommitThenTimeoutNext(1)
			Expect(k8s.Create(ctx, refund)).To(Succeed())
			Eventually(stateOf(refund)).Should(Equal(hooksv1alpha1.SettlementSettled))
			Expect(get(refund).Status.Attempts).To(Equal(int32(1)), "the lookup by key answered; nothing was resubmitted")
			Expect(billing.Charges(refund.Spec.SettlementKey)).To(Equal(1))
		})
	}

	for _, nulls := range nullModes {
		It(nulls.spec("never dead-letters while an attempt may have charged: it keeps asking by key"), func() {
			nulls.use()
			ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
				bp.Spec.Retry.MaxElapsed = &metav1.Duration{Duration: 2 * time.Second}
				bp.Spec.Retry.MaxBackoff = &metav1.Duration{Duration: time.Second}
			})
			billing.CommitThenTimeoutNext(1)
			sendOK(ns, "msg_unknown", jobEvent("job-unknown", 1, 6))
			// The charge is committed, its answer is lost, and the provider goes down.
			Eventually(func() int { return billing.Charges(key(ns, "job-unknown")) }).Should(Equal(1))
			Expect(billing.SetDown(true)).To(Succeed())
			downed := true
			defer func() {
				if downed {
					_ = billing.SetDown(false)
				}
			}()
			Eventually(func() string {
				bs := &hooksv1alpha1.BillingSettlement{}
				if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.SettlementNameFor("inference", key(ns, "job-unknown"))}, bs); err != nil {
					return ""
				}
				if c := condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady); c != nil && strings.Contains(c.Message, "retries exhausted") {
					return c.Reason
				}
				return ""
			}).Should(Equal(hooksv1alpha1.ReasonOutcomeUnknown))
			Consistently(settlementState(ns, "job-unknown")).WithTimeout(2 * time.Second).Should(Equal(hooksv1alpha1.SettlementSubmitted))
			Expect(settlementOf(ns, "job-unknown").Status.Exposure).To(Equal(hooksv1alpha1.ExposurePossible))

			Expect(billing.SetDown(false)).To(Succeed())
			downed = false
			Eventually(settlementState(ns, "job-unknown")).Should(Equal(hooksv1alpha1.SettlementSettled))
			Expect(billing.Charges(key(ns, "job-unknown"))).To(Equal(1))
		})
	}

	for _, nulls := range nullModes {
		It(nulls.spec("resolves settlements left Submitted by a killed manager without a second charge"), func() {
			nulls.use()
			ns := newTenant()
			billing.CommitThenTimeoutNext(3)
			for i := 0; i < 3; i++ {
				sendOK(ns, fmt.Sprintf("msg_restart_%d", i), jobEvent(fmt.Sprintf("job-restart-%d", i), 1, 1))
			}
			// Stop the manager while the calls hang: the charges are committed at the
			// provider, the answers never arrive, the settlements are Submitted.
			for i := 0; i < 3; i++ {
				Eventually(settlementState(ns, fmt.Sprintf("job-restart-%d", i))).Should(Equal(hooksv1alpha1.SettlementSubmitted))
			}
			mgr.stop()
			mgr = startManager()
			for i := 0; i < 3; i++ {
				job := fmt.Sprintf("job-restart-%d", i)
				Eventually(settlementState(ns, job)).Should(Equal(hooksv1alpha1.SettlementSettled))
				Expect(billing.Charges(key(ns, job))).To(Equal(1))
			}
		})
	}

	It("settles 100 distinct jobs with exactly 100 charges", func() {
		ns := newTenant()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 10)
		for i := 0; i < 100; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				sem <- struct{}{}
				defer func() { <-sem }()
				sendOK(ns, fmt.Sprintf("msg_bulk_%d", i), jobEvent(fmt.Sprintf("job-bulk-%d", i), 1, i+1))
			}()
		}
		wg.Wait()
		Eventually(func() int {
			var l hooksv1alpha1.BillingSettlementList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			n := 0
			for _, bs := range l.Items {
				if bs.Status.State == hooksv1alpha1.SettlementSettled {
					n++
				}
			}
			return n
		}).WithTimeout(2 * time.Minute).Should(Equal(100))
		for i := 0; i < 100; i++ {
			Expect(billing.Charges(key(ns, fmt.Sprintf("job-bulk-%d", i)))).To(Equal(1))
		}
	})
})

// refundOf is a Refund of minor USD of the charge orig, as a user creates it.
func refundOf(orig *hooksv1alpha1.BillingSettlement, minor int64) *hooksv1alpha1.BillingSettlement {
	refundKey := "refund/" + orig.Spec.SettlementKey
	return &hooksv1alpha1.BillingSettlement{
		ObjectMeta: metav1.ObjectMeta{Namespace: orig.Namespace, Name: identity.SettlementName("inference", refundKey)},
		Spec: hooksv1alpha1.BillingSettlementSpec{
			BillingProviderRef: "billing", SettlementKey: refundKey, IdempotencyKey: identity.IdempotencyKey(refundKey),
			Type: hooksv1alpha1.SettlementRefund, Reverses: orig.Name, Customer: orig.Spec.Customer,
			Amount: &hooksv1alpha1.Amount{Minor: minor, Currency: "USD"},
		},
	}
}

// slowRetries gives a tenant backoffs long enough for a test to act between attempts.
func slowRetries(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
	bp.Spec.Retry.InitialBackoff = fixtures.Duration(2 * time.Second)
	bp.Spec.Retry.MaxBackoff = fixtures.Duration(4 * time.Second)
}

// ambiguousThenDown delivers a completion of jobID whose charge POST gets a 503 (the
// provider may have committed it: exposure Possible), then takes the provider down
// before it can be asked. up brings it back; calling it again does nothing.
func ambiguousThenDown(ns, msgID, jobID string, tokens int) (up func() error) {
	GinkgoHelper()
	// Aimed at this settlement's key: another tenant's retry must not take the fault.
	billing.FailNextFor(identity.NamespacedIdempotencyKey(ns, key(ns, jobID)), 1, http.StatusServiceUnavailable)
	sendOK(ns, msgID, jobEvent(jobID, 1, tokens))
	Eventually(func() hooksv1alpha1.Exposure {
		bs := &hooksv1alpha1.BillingSettlement{}
		_ = k8s.Get(ctx, client.ObjectKey{Namespace: ns,
			Name: identity.SettlementName("inference", identity.DefaultSettlementKey("inference", jobID))}, bs)
		// Exposure is Possible from the bracket on; wait for the 503 itself, not the
		// moment the POST is in flight.
		if bs.Status.Attempts == 0 || bs.Status.LastError == nil {
			return ""
		}
		return bs.Status.Exposure
	}).Should(Equal(hooksv1alpha1.ExposurePossible))
	Expect(billing.SetDown(true)).To(Succeed())
	downed := true
	return func() error {
		if !downed {
			return nil
		}
		downed = false
		return billing.SetDown(false)
	}
}

var _ = Describe("settlement lifecycle", func() {
	for _, nulls := range nullModes {
		It(nulls.spec("holds the deletion of a Submitted settlement until the provider's answer is known"), func() {
			nulls.use()
			ns := newTenant(slowRetries)
			up := ambiguousThenDown(ns, "msg_del", "job-del", 1)
			defer func() { _ = up() }()
			bs := settlementOf(ns, "job-del")
			Expect(k8s.Delete(ctx, bs)).To(Succeed())
			Eventually(func() string {
				got := settlementOf(ns, "job-del")
				if c := condition(got.Status.Conditions, hooksv1alpha1.ConditionReady); c != nil {
					return c.Reason
				}
				return ""
			}).Should(Equal(hooksv1alpha1.ReasonDeletionBlocked))
			Consistently(func() error {
				return k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{})
			}).WithTimeout(2 * time.Second).Should(Succeed())

			Expect(up()).To(Succeed())
			// The provider says it never got the charge: the hold ends, nothing was charged.
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}))
			}).WithTimeout(time.Minute).Should(BeTrue())
			// ...and it stays deleted: its event does not re-create it (that would charge).
			Consistently(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}))
			}).WithTimeout(2 * time.Second).Should(BeTrue())
			Expect(billing.Charges(key(ns, "job-del"))).To(Equal(0))
			Eventually(eventPhase(ns, "msg_del")).Should(Equal(hooksv1alpha1.EventRequiresReconciliation))
		})
	}

	It("compensates with a Refund that is its own settlement and never edits the charge", func() {
		ns := newTenant()
		sendOK(ns, "msg_refund", jobEvent("job-refund", 1, 4))
		Eventually(settlementState(ns, "job-refund")).Should(Equal(hooksv1alpha1.SettlementSettled))
		orig := settlementOf(ns, "job-refund")
		refund := refundOf(orig, 400)
		refundKey := refund.Spec.SettlementKey
		Expect(k8s.Create(ctx, refund)).To(Succeed())
		Eventually(func() hooksv1alpha1.SettlementState {
			got := &hooksv1alpha1.BillingSettlement{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(refund), got)).To(Succeed())
			return got.Status.State
		}).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(billing.Charges(refundKey)).To(Equal(1))
		var found bool
		for _, r := range billing.Records() {
			if r.SettlementKey == refundKey {
				found = true
				Expect(r.Type).To(Equal("refund"))
			}
		}
		Expect(found).To(BeTrue())
		Eventually(func() []string { return settlementOf(ns, "job-refund").Status.ReversedBy }).Should(ConsistOf(refund.Name))
		after := settlementOf(ns, "job-refund")
		Expect(after.Spec).To(Equal(orig.Spec), "the charge is never edited")
		Expect(after.Status.State).To(Equal(hooksv1alpha1.SettlementSettled))
	})

	It("defers a completion the job sink does not know yet, then applies it once the job exists", func() {
		ns := newTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[0].JobCompletion.Sink = &hooksv1alpha1.JobSink{
				Type: hooksv1alpha1.JobSinkHTTP, URL: sink.URL(), AllowInsecureHTTP: true, DeferDeadline: &metav1.Duration{Duration: time.Minute}}
		})
		sendOK(ns, "msg_sink", jobEvent("job-sink", 3, 1))
		Eventually(jobState(ns, "job-sink")).
			Should(Equal(hooksv1alpha1.JobCompletionDeferred))
		Expect(eventPhase(ns, "msg_sink")()).NotTo(Equal(hooksv1alpha1.EventComplete))
		sink.Register("job-sink")
		Eventually(jobState(ns, "job-sink")).
			WithTimeout(time.Minute).Should(Equal(hooksv1alpha1.JobCompletionApplied))
		v, state, n := sink.Applied("job-sink")
		Expect(v).To(Equal(int64(3)))
		Expect(state).To(Equal("Succeeded"))
		Expect(n).To(Equal(1))
		Eventually(eventPhase(ns, "msg_sink")).Should(Equal(hooksv1alpha1.EventComplete))
	})
})
