package integration_test

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	billingapi "github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// The money-safety defects of the first review, each against the real API server and a real
// HTTP provider whose ledger is the assertion. Every one of these failed on the
// controller before the exposure model.

// handMade is a settlement created by hand (or by the runbook's repair): nothing says
// its key was never used, so it must be asked for by key before it is sent.
func handMade(ns, key, customer string, amount int64, currency string) *hooksv1alpha1.BillingSettlement {
	return &hooksv1alpha1.BillingSettlement{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.SettlementName("inference", key)},
		Spec: hooksv1alpha1.BillingSettlementSpec{
			BillingProviderRef: fixtures.BillingProviderName, SettlementKey: key, IdempotencyKey: identity.IdempotencyKey(key),
			Type: hooksv1alpha1.SettlementCharge, Customer: customer,
			Amount: &hooksv1alpha1.Amount{Minor: amount, Currency: currency},
		},
	}
}

func compensation(ns, key string, typ hooksv1alpha1.SettlementType, orig *hooksv1alpha1.BillingSettlement,
	customer string, amount int64, currency string) *hooksv1alpha1.BillingSettlement {
	bs := handMade(ns, key, customer, amount, currency)
	bs.Spec.Type, bs.Spec.Reverses = typ, orig.Name
	return bs
}

func get(bs *hooksv1alpha1.BillingSettlement) *hooksv1alpha1.BillingSettlement {
	GinkgoHelper()
	got := &hooksv1alpha1.BillingSettlement{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)).To(Succeed())
	return got
}

func stateOf(bs *hooksv1alpha1.BillingSettlement) func() hooksv1alpha1.SettlementState {
	return func() hooksv1alpha1.SettlementState {
		got := &hooksv1alpha1.BillingSettlement{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(bs), got); err != nil {
			return ""
		}
		return got.Status.State
	}
}

func readyReason(bs *hooksv1alpha1.BillingSettlement) func() string {
	return func() string {
		got := &hooksv1alpha1.BillingSettlement{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(bs), got); err != nil {
			return ""
		}
		if c := condition(got.Status.Conditions, hooksv1alpha1.ConditionReady); c != nil {
			return c.Reason
		}
		return ""
	}
}

func deadLettered(bs *hooksv1alpha1.BillingSettlement) bool {
	got := &hooksv1alpha1.BillingSettlement{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(bs), got); err != nil {
		return false
	}
	c := condition(got.Status.Conditions, hooksv1alpha1.ConditionDeadLettered)
	return c != nil && c.Status == metav1.ConditionTrue
}

// settleByHand creates a hand-made charge and waits until it is Settled.
func settleByHand(bs *hooksv1alpha1.BillingSettlement) {
	GinkgoHelper()
	Expect(k8s.Create(ctx, bs)).To(Succeed())
	Eventually(stateOf(bs)).Should(Equal(hooksv1alpha1.SettlementSettled))
}

func posts(calls []fakebilling.Call) int { return fakebilling.Posts(calls) }

var _ = Describe("money safety", func() {
	for _, nulls := range nullModes {
		It(nulls.spec("polls a pending charge past maxElapsed through failed polls: never dead-lettered, deletion held (defect 1)"), func() {
			nulls.use()
			key := nulls.key("debit/1")
			slow, err := fakebilling.Start(nulls.options(fakebilling.Options{Token: billingToken, PendingPolls: 1 << 30}))
			Expect(err).NotTo(HaveOccurred())
			defer func() { _ = slow.Close() }()
			ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
				bp.Spec.Endpoint = slow.URL()
				bp.Spec.Retry.MaxElapsed = fixtures.Duration(2 * time.Second)
			})
			bs := handMade(ns, key, "cus_1", 100, "USD")
			Expect(k8s.Create(ctx, bs)).To(Succeed())
			Eventually(func() string { return get(bs).Status.ProviderStatus }).Should(Equal(billingapi.StatusPending))
			time.Sleep(2500 * time.Millisecond) // past maxElapsed, as a bank debit is
			slow.FailNextLookups(3, http.StatusServiceUnavailable)
			Eventually(func() int { return slow.Calls().Faults }).Should(Equal(3))
			Consistently(func() bool { return deadLettered(bs) }).WithTimeout(2 * time.Second).Should(BeFalse())
			Expect(get(bs).Status.State).To(Equal(hooksv1alpha1.SettlementSubmitted))
			Expect(get(bs).Status.Exposure).To(Equal(hooksv1alpha1.ExposureConfirmed))

			Expect(k8s.Delete(ctx, bs)).To(Succeed())
			Eventually(readyReason(bs)).Should(Equal(hooksv1alpha1.ReasonDeletionBlocked))
			Consistently(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}) }).
				WithTimeout(2 * time.Second).Should(Succeed())
			Expect(slow.SetStatus(key, billingapi.StatusSettled, "")).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}))
			}).WithTimeout(time.Minute).Should(BeTrue())
			Expect(slow.Charges(key)).To(Equal(1))
		})
	}

	for _, nulls := range nullModes {
		It(nulls.spec("never dead-letters while a request with the key is still in flight at the provider (defect 1, 409 in use)"), func() {
			nulls.use()
			key := nulls.key("inflight/1")
			ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
				bp.Spec.Retry.MaxElapsed = fixtures.Duration(2 * time.Second)
				bp.Spec.RequestTimeout = fixtures.Duration(500 * time.Millisecond)
			})
			// The first POST times out on our side and commits at the provider 5 s later;
			// meanwhile lookups say "not found" and resends get 409 in use.
			billing.CommitLaterNext(1, 5*time.Second)
			bs := handMade(ns, key, "cus_1", 100, "USD")
			Expect(k8s.Create(ctx, bs)).To(Succeed())
			Consistently(func() bool { return deadLettered(bs) }).WithTimeout(6 * time.Second).Should(BeFalse())
			Eventually(stateOf(bs)).Should(Equal(hooksv1alpha1.SettlementSettled))
			Expect(billing.Charges(key)).To(Equal(1))
		})
	}

	for _, nulls := range nullModes {
		It(nulls.spec("sends nothing until a failed precautionary lookup has answered (defects 2 and 13)"), func() {
			nulls.use()
			key := nulls.key("recreated/1")
			ns := newTenant()
			orig := handMade(ns, key, "cus_1", 250, "USD")
			settleByHand(orig)
			// Deleted (it was settled, so the finalizer lets it go) and created again by
			// hand, after the provider's key window: only a lookup finds the charge.
			Expect(k8s.Delete(ctx, orig)).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(orig), &hooksv1alpha1.BillingSettlement{}))
			}).Should(BeTrue())
			billing.ForgetKeys()
			billing.FailNextLookups(3, http.StatusForbidden) // a token without read scope, then fixed
			again := handMade(ns, key, "cus_1", 250, "USD")
			again.ResourceVersion = ""
			Expect(k8s.Create(ctx, again)).To(Succeed())
			Eventually(stateOf(again)).Should(Equal(hooksv1alpha1.SettlementSettled))
			Consistently(func() int { return billing.Charges(key) }).WithTimeout(time.Second).Should(Equal(1))
			Expect(get(again).Status.Attempts).To(BeZero(), "adopted by lookup, never resubmitted")
		})
	}

	for _, nulls := range nullModes {
		It(nulls.spec("asks before resending after a 429, a crash mid-call and a restart (defect 9)"), func() {
			nulls.use()
			key := nulls.key("crash/1")
			ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
				bp.Spec.RequestTimeout = fixtures.Duration(20 * time.Second)
			})
			billing.RateLimitNext(1, time.Second)
			billing.CommitThenTimeoutNext(1)
			bs := handMade(ns, key, "cus_1", 300, "USD")
			Expect(k8s.Create(ctx, bs)).To(Succeed())
			// The second POST commits and hangs: the manager dies mid-call.
			Eventually(func() int { return billing.Charges(key) }).Should(Equal(1))
			mgr.stop()
			billing.ForgetKeys() // and the provider's key window passes before it is back
			mgr = startManager()
			Eventually(stateOf(bs)).Should(Equal(hooksv1alpha1.SettlementSettled))
			Consistently(func() int { return billing.Charges(key) }).WithTimeout(time.Second).Should(Equal(1))
		})
	}

	It("backs off lookups exponentially during a provider outage (defect 12)", func() {
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Retry.InitialBackoff = fixtures.Duration(200 * time.Millisecond)
			bp.Spec.Retry.MaxBackoff = fixtures.Duration(time.Minute)
		})
		// A 503 to the POST: it may have committed, so the provider must be asked; then
		// every lookup fails for the length of the outage.
		billing.FailNext(1, http.StatusServiceUnavailable)
		bs := handMade(ns, "outage/1", "cus_1", 100, "USD")
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		key := bs.Spec.IdempotencyKey
		Eventually(func() int { return posts(billing.CallsFor(key)) }).WithPolling(10 * time.Millisecond).Should(Equal(1))
		billing.FailNextLookups(1000, http.StatusServiceUnavailable)
		defer billing.ClearLookupFaults()
		before := len(billing.CallsFor(key))
		time.Sleep(6 * time.Second)
		// 200 ms doubling: 0.2+0.4+0.8+1.6+3.2 s ≈ 6 s is 5-6 lookups (jitter shortens
		// waits by at most 20%); a constant 200 ms would be ~30.
		Expect(len(billing.CallsFor(key)) - before).To(BeNumerically("<=", 8))
		Expect(posts(billing.CallsFor(key))).To(Equal(1), "nothing is resent while the outcome is unknown")
		billing.ClearLookupFaults()
	})

	for _, nulls := range nullModes {
		It(nulls.spec("never adopts a record that lacks what we sent, nor lets a pass confirm it (defect 5)"), func() {
			nulls.use()
			key := nulls.key("seeded/1")
			ns := newTenant()
			billing.MinimalLookups(true)
			defer billing.MinimalLookups(false)
			bs := handMade(ns, key, "cus_1", 100, "USD")
			// Another tenant's (or a stale) record under our key, for 999,999 USD.
			Expect(billing.Import(billingapi.Record{IdempotencyKey: bs.Spec.IdempotencyKey, SettlementKey: key,
				Customer: "cus_other", Type: billingapi.TypeCharge, Status: billingapi.StatusSettled,
				Amount: &billingapi.Amount{Minor: 99999900, Currency: "USD"}})).To(Succeed())
			Expect(k8s.Create(ctx, bs)).To(Succeed())
			Eventually(stateOf(bs)).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
			got := get(bs)
			Expect(got.Status.Disagreement).NotTo(BeNil())
			Expect(got.Status.Disagreement.Reason).To(Equal(hooksv1alpha1.ReasonMissingField))
			c := condition(got.Status.Conditions, hooksv1alpha1.ConditionReady)
			Expect(c.Message).To(ContainSubstring("missing"))
			Expect(c.Message).NotTo(ContainSubstring("cus_other"))
			Expect(c.Message).NotTo(ContainSubstring("99999900"))

			// A replay asks again and still does not adopt it; neither does a reconcile request.
			patch := client.MergeFrom(got.DeepCopy())
			got.Annotations = map[string]string{hooksv1alpha1.AnnotationReplay: "r1",
				hooksv1alpha1.AnnotationReconcileRequest: "rr1"}
			Expect(k8s.Patch(ctx, got, patch)).To(Succeed())
			Eventually(func() int32 {
				if r := get(bs).Status.Replay; r != nil {
					return r.Count
				}
				return 0
			}).Should(Equal(int32(1)))
			Consistently(stateOf(bs)).WithTimeout(2 * time.Second).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
			Expect(condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled)).To(BeNil())
			Expect(posts(billing.CallsFor(bs.Spec.IdempotencyKey))).To(BeZero())
		})
	}

	for _, nulls := range nullModes {
		It(nulls.spec("holds a settlement whose provider now points elsewhere while money may be at the first (defect 6)"), func() {
			nulls.use()
			key := nulls.key("moved/1")
			// A provider of its own: a fault queued on the shared one is taken by whichever
			// tenant's POST comes first, and going down would stall every other tenant.
			first, err := fakebilling.Start(nulls.options(fakebilling.Options{Token: billingToken}))
			Expect(err).NotTo(HaveOccurred())
			defer func() { _ = first.Close() }()
			other, err := fakebilling.Start(nulls.options(fakebilling.Options{Token: billingToken}))
			Expect(err).NotTo(HaveOccurred())
			defer func() { _ = other.Close() }()
			ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
				bp.Spec.Endpoint = first.URL()
				bp.Spec.RequestTimeout = fixtures.Duration(time.Second)
			})
			first.CommitThenTimeoutNext(1)
			bs := handMade(ns, key, "cus_1", 100, "USD")
			Expect(k8s.Create(ctx, bs)).To(Succeed())
			// Committed, the reply lost, and the provider down before it could be asked.
			// Going down may land between the commit and the fake's holding of the
			// connection: net/http then sends the POST again by itself on a new connection,
			// which is refused — still ambiguous, as the first attempt was read (this spec
			// failed once so, before the billing transport counted written attempts).
			Eventually(func() int { return first.Charges(key) }).WithPolling(10 * time.Millisecond).Should(Equal(1))
			Expect(first.SetDown(true)).To(Succeed())
			Eventually(func() *hooksv1alpha1.SettlementError { return get(bs).Status.LastError }).ShouldNot(BeNil())

			var bp hooksv1alpha1.BillingProvider
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fixtures.BillingProviderName}, &bp)).To(Succeed())
			patch := client.MergeFrom(bp.DeepCopy())
			bp.Spec.Endpoint = other.URL()
			// The token may go to both: what holds the settlement is money, not credentials.
			patchSecret(ns, fixtures.BillingSecretName, nil, map[string]string{
				hooksv1alpha1.AnnotationCredentialDestinations: first.URL() + "," + other.URL()})
			Expect(k8s.Patch(ctx, &bp, patch)).To(Succeed())
			Eventually(readyReason(bs)).Should(Equal(hooksv1alpha1.ReasonProviderChanged))
			Consistently(func() int { c := other.Calls(); return c.Posts + c.Gets }).WithTimeout(2 * time.Second).Should(BeZero())

			// Pointed back: the lookup at the first provider finds the charge.
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(&bp), &bp)).To(Succeed())
			patch = client.MergeFrom(bp.DeepCopy())
			bp.Spec.Endpoint = first.URL()
			Expect(k8s.Patch(ctx, &bp, patch)).To(Succeed())
			Expect(first.SetDown(false)).To(Succeed())
			Eventually(stateOf(bs)).WithTimeout(2 * time.Minute).Should(Equal(hooksv1alpha1.SettlementSettled))
			Expect(first.Charges(key)).To(Equal(1))
			Expect(other.Records()).To(BeEmpty())
		})
	}

	It("refuses a hand-made settlement whose idempotency key is not derived from its settlement key (defect 10)", func() {
		ns := newTenant()
		bs := handMade(ns, "borrowed/1", "cus_1", 100, "USD")
		bs.Spec.IdempotencyKey = "stl_" + strings.Repeat("0", 32) // another operation's key
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		Eventually(readyReason(bs)).Should(Equal(hooksv1alpha1.ReasonInvalidIdentity))
		got := get(bs)
		Expect(got.Status.State).To(Equal(hooksv1alpha1.SettlementFailed))
		Expect(condition(got.Status.Conditions, hooksv1alpha1.ConditionReady).Message).To(ContainSubstring(identity.IdempotencyKey("borrowed/1")))
		Consistently(func() int { return len(billing.CallsFor(bs.Spec.IdempotencyKey)) }).WithTimeout(time.Second).Should(BeZero())
		// Nothing was sent, so it may be deleted.
		Expect(k8s.Delete(ctx, bs)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}))
		}).Should(BeTrue())
	})

	for _, nulls := range nullModes {
		It(nulls.spec("never lets a record go while the provider may still be processing its last attempt (review: 404 right after a timeout)"), func() {
			nulls.use()
			key := nulls.key("late/1")
			ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
				bp.Spec.RequestTimeout = fixtures.Duration(500 * time.Millisecond)
			})
			billing.CommitLaterNext(1, 4*time.Second)
			bs := handMade(ns, key, "cus_1", 100, "USD")
			Expect(k8s.Create(ctx, bs)).To(Succeed())
			Eventually(func() int32 { return get(bs).Status.Attempts }).Should(BeNumerically(">=", 1))
			Expect(k8s.Delete(ctx, bs)).To(Succeed())
			// Lookups answer 404 until the provider commits, 4 s after the POST.
			Consistently(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}) }).
				WithTimeout(3 * time.Second).Should(Succeed())
			Eventually(func() int { return billing.Charges(key) }).WithTimeout(10 * time.Second).Should(Equal(1))
			// The charge committed: it is found and settled before the record may go.
			Eventually(func() bool {
				got := &hooksv1alpha1.BillingSettlement{}
				err := k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)
				return apierrors.IsNotFound(err)
			}).WithTimeout(time.Minute).Should(BeTrue())
			Expect(billing.Charges(key)).To(Equal(1))
		})
	}

	It("guards a replayed refund like a new one (review: replay bypassed the guard)", func() {
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Retry.MaxAttempts = 2
		})
		orig := handMade(ns, "replay/charge", "cus_1", 100, "USD")
		settleByHand(orig)
		billing.RateLimitNext(2, 0)
		first := compensation(ns, "replay/refund-1", hooksv1alpha1.SettlementRefund, orig, "cus_1", 100, "USD")
		Expect(k8s.Create(ctx, first)).To(Succeed())
		Eventually(func() bool { return deadLettered(first) }).Should(BeTrue())
		second := compensation(ns, "replay/refund-2", hooksv1alpha1.SettlementRefund, orig, "cus_1", 100, "USD")
		Expect(k8s.Create(ctx, second)).To(Succeed())
		Eventually(stateOf(second)).Should(Equal(hooksv1alpha1.SettlementSettled))

		got := get(first)
		patch := client.MergeFrom(got.DeepCopy())
		got.Annotations = map[string]string{hooksv1alpha1.AnnotationReplay: "r1"}
		Expect(k8s.Patch(ctx, got, patch)).To(Succeed())
		Eventually(readyReason(first)).Should(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))
		Consistently(func() int { return billing.Charges("replay/refund-1") }).WithTimeout(2 * time.Second).Should(BeZero())
	})

	Describe("compensation guards (defect 4)", func() {
		held := func(bs *hooksv1alpha1.BillingSettlement) {
			GinkgoHelper()
			Expect(k8s.Create(ctx, bs)).To(Succeed())
			Eventually(readyReason(bs)).Should(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))
			Consistently(func() int { return billing.Charges(bs.Spec.SettlementKey) }).WithTimeout(time.Second).Should(BeZero())
			Expect(get(bs).Status.State).To(Equal(hooksv1alpha1.SettlementPending))
		}

		It("refuses a Refund of a charge that failed, to another customer, in another currency, or beyond the original", func() {
			ns := newTenant()
			orig := handMade(ns, "comp/charge", "cus_1", 1000, "USD")
			settleByHand(orig)
			held(compensation(ns, "comp/other-customer", hooksv1alpha1.SettlementRefund, orig, "cus_2", 100, "USD"))
			held(compensation(ns, "comp/other-currency", hooksv1alpha1.SettlementRefund, orig, "cus_1", 100, "EUR"))
			first := compensation(ns, "comp/refund-1", hooksv1alpha1.SettlementRefund, orig, "cus_1", 600, "USD")
			Expect(k8s.Create(ctx, first)).To(Succeed())
			Eventually(stateOf(first)).Should(Equal(hooksv1alpha1.SettlementSettled))
			held(compensation(ns, "comp/refund-2", hooksv1alpha1.SettlementRefund, orig, "cus_1", 500, "USD"))
			held(compensation(ns, "comp/void", hooksv1alpha1.SettlementVoid, orig, "cus_1", 1000, "USD"))

			billing.RejectNext(1, http.StatusBadRequest, "card_declined")
			declined := handMade(ns, "comp/declined", "cus_1", 1000, "USD")
			Expect(k8s.Create(ctx, declined)).To(Succeed())
			Eventually(stateOf(declined)).Should(Equal(hooksv1alpha1.SettlementFailed))
			held(compensation(ns, "comp/refund-of-failed", hooksv1alpha1.SettlementRefund, declined, "cus_1", 100, "USD"))
		})
	})
})
