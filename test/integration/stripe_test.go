package integration_test

import (
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing/stripebilling"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fakestripe"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// stripeBilling makes a tenant's BillingProvider a Stripe one against fake, usage meter
// "tokens" reported to the fake's meter mtr_tokens (event name tokens_used).
func stripeBilling(fake *fakestripe.Server) func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider) {
	return func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
		bp.Spec.Type, bp.Spec.Endpoint = hooksv1alpha1.BillingProviderStripe, fake.URL()
		bp.Spec.RequestTimeout = fixtures.Duration(time.Second)
		bp.Spec.Stripe = &hooksv1alpha1.StripeSettings{Meters: []hooksv1alpha1.StripeMeter{
			{Meter: "tokens", EventName: "tokens_used", ID: "mtr_tokens"}}}
	}
}

// stripeAPIKey is the Stripe-shaped fake's key (test mode).
const stripeAPIKey = "sk_test_operator"

// startFakeStripe starts a Stripe-shaped fake with the meter mtr_tokens (event name
// tokens_used), closed when the spec ends.
func startFakeStripe() *fakestripe.Server {
	GinkgoHelper()
	fake, err := fakestripe.Start(fakestripe.Options{APIKey: stripeAPIKey,
		Meters: []fakestripe.Meter{{ID: "mtr_tokens", EventName: "tokens_used"}}})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(fake.Close)
	return fake
}

// stripeTenantOn makes a tenant billing through fake, with the invoice-line route
// (withLines) and mutate applied.
func stripeTenantOn(fake *fakestripe.Server, mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
	GinkgoHelper()
	return newTenantWithToken(stripeAPIKey, append([]func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider){
		stripeBilling(fake), withLines}, mutate...)...)
}

// The billing rows of the failure matrix (docs/design.md §9) against the Stripe-shaped
// fake (test/fakestripe: Stripe's idempotency layer, meter events, invoice items), each
// ending with exactly one charge per key in its ledger.
var _ = Describe("a Stripe billing provider", func() {
	var fake *fakestripe.Server
	BeforeEach(func() { fake = startFakeStripe() })
	stripeTenant := func(mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
		GinkgoHelper()
		return stripeTenantOn(fake, mutate...)
	}
	invoice := func(customer string, cents int) string {
		return fmt.Sprintf(`{"type":"invoice.paid","data":{"customer":%q,"lines":[{"a":"inv","b":"1","cents":%d}]}}`, customer, cents)
	}
	// reconciled is the reason of bs's Reconciled=True condition ("" while it has none).
	reconciled := func(bs *hooksv1alpha1.BillingSettlement) func() string {
		return func() string {
			if c := condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled); c != nil && c.Status == metav1.ConditionTrue {
				return c.Reason
			}
			return ""
		}
	}
	// line is the invoice line's settlement (its key: keyFrom .a and .b).
	line := func(ns string) *hooksv1alpha1.BillingSettlement {
		return &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns,
			Name: identity.SettlementNameFor("inference", identity.FieldsSettlementKey(ns, "inference", "inv", "1"))}}
	}

	It("reports usage as one meter event and an amount as one invoice item; the provider shows test mode", func() {
		ns := stripeTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second}}
		})
		sendOK(ns, "msg_stripe_usage", jobEvent("job-stripe", 1, 1523))
		Eventually(settlementState(ns, "job-stripe")).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-stripe")
		Expect(bs.Status.ProviderRef).To(Equal(stripebilling.MeterEventRef(bs.Spec.IdempotencyKey)))
		events := fake.MeterEvents()
		Expect(events).To(HaveLen(1))
		Expect(events[0]).To(SatisfyAll(HaveField("EventName", "tokens_used"), HaveField("Identifier", bs.Spec.IdempotencyKey),
			HaveField("Customer", "cus_job-stripe"), HaveField("Value", "1523")))
		Expect(fake.Charges(bs.Spec.IdempotencyKey)).To(Equal(1))

		sendOK(ns, "msg_stripe_amount", invoice("cus_inv", 4200))
		Eventually(stateOf(line(ns))).Should(Equal(hooksv1alpha1.SettlementSettled))
		charged := get(line(ns))
		Expect(charged.Status.ProviderRef).To(HavePrefix("ii_"))
		items := fake.InvoiceItems()
		Expect(items).To(HaveLen(1))
		Expect(items[0]).To(SatisfyAll(HaveField("Customer", "cus_inv"), HaveField("Amount", int64(4200)), HaveField("Currency", "usd")))
		Expect(items[0].Metadata).To(HaveKeyWithValue(stripebilling.MetaIdempotencyKey, charged.Spec.IdempotencyKey))

		bp := &hooksv1alpha1.BillingProvider{}
		Eventually(func() string {
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fixtures.BillingProviderName}, bp)).To(Succeed())
			return bp.Status.Mode
		}).Should(Equal(hooksv1alpha1.StripeModeTest))
		// The pass: the invoice item is listed and matched; the meter event cannot be
		// listed or read back, and is marked as resting on Stripe's answer to it.
		Eventually(reconciled(bs)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.ReasonProviderCannotAnswer))
		Eventually(reconciled(line(ns))).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.ReasonConfirmedByProvider))
		var reports hooksv1alpha1.ReconciliationReportList
		Expect(k8s.List(ctx, &reports, client.InNamespace(ns))).To(Succeed())
		Expect(reports.Items).To(ContainElement(HaveField("Status.Examined", HaveKeyWithValue("SettlementNotComparable", BeNumerically(">=", 1)))))
		Expect(fake.Charges(bs.Spec.IdempotencyKey)).To(Equal(1), "the pass sent nothing")
	})

	It("resends a meter event whose answer was lost under the same key: Stripe replays it, one event", func() {
		ns := stripeTenant()
		fake.CommitThenHangNext(1, "/v1/billing/meter_events")
		sendOK(ns, "msg_stripe_hang", jobEvent("job-stripe-hang", 1, 77))
		Eventually(settlementState(ns, "job-stripe-hang")).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-stripe-hang")
		Expect(bs.Status.Attempts).To(BeNumerically(">=", 2), "the lost answer was asked for by sending again")
		Expect(fake.Charges(bs.Spec.IdempotencyKey)).To(Equal(1))
		Expect(fake.MeterEvents()).To(HaveLen(1))
		var replayed int
		for _, r := range fake.Requests() {
			if r.IdempotencyKey == bs.Spec.IdempotencyKey && r.Replayed {
				replayed++
			}
		}
		Expect(replayed).To(BeNumerically(">=", 1), "the resend was answered from Stripe's idempotency layer")
	})

	It("finds an invoice item whose answer was lost by listing the customer's items: one item", func() {
		ns := stripeTenant()
		fake.CommitThenHangNext(1, "/v1/invoiceitems")
		sendOK(ns, "msg_stripe_item_hang", invoice("cus_hang", 990))
		Eventually(stateOf(line(ns))).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		charged := get(line(ns))
		Expect(charged.Status.Attempts).To(Equal(int32(1)), "found by the lookup, not sent again")
		Expect(fake.Charges(charged.Spec.IdempotencyKey)).To(Equal(1))
		Expect(fake.InvoiceItems()).To(HaveLen(1))
	})

	It("retries a rate-limited charge after Stripe's Retry-After, once charged", func() {
		ns := stripeTenant()
		fake.RateLimitNext(2, time.Second)
		sendOK(ns, "msg_stripe_429", jobEvent("job-stripe-429", 1, 5))
		Eventually(settlementState(ns, "job-stripe-429")).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-stripe-429")
		Expect(fake.Charges(bs.Spec.IdempotencyKey)).To(Equal(1))
	})

	It("stops for a human when Stripe holds the key for other parameters", func() {
		ns := stripeTenant()
		fake.FailNext(1, "/v1/billing/meter_events", 400, "idempotency_error", "", "")
		sendOK(ns, "msg_stripe_reused", jobEvent("job-stripe-reused", 1, 5))
		Eventually(settlementState(ns, "job-stripe-reused")).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		bs := settlementOf(ns, "job-stripe-reused")
		Expect(condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady).Reason).To(Equal(hooksv1alpha1.ReasonKeyReused))
		Expect(fake.MeterEvents()).To(BeEmpty())
	})

	It("lets Stripe date a meter event at receipt by default, not at the job's completion (docs/decisions.md)", func() {
		ns := stripeTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[0].JobCompletion.CompletedAt = ".data.completed_at"
		})
		// A job that completed three hours ago, reported now: dated at its completion, the
		// usage could fall in a billing period whose invoice is already final, accepted
		// by Stripe and never billed.
		completedAt := time.Now().Add(-3 * time.Hour).UTC().Format(time.RFC3339)
		sent := time.Now().Add(-time.Second).Unix()
		sendOK(ns, "msg_stripe_dated", fmt.Sprintf(
			`{"type":"job.completed","data":{"job_id":"job-dated","version":1,"state":"succeeded","customer":"cus_job-dated","tokens":9,"completed_at":%q}}`,
			completedAt))
		Eventually(settlementState(ns, "job-dated")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(jobOf(ns, "job-dated").Spec.Completion.CompletedAt).NotTo(BeNil(), "the job's completion time is on its record")
		bs := settlementOf(ns, "job-dated")
		Expect(fake.MeterEvents()).To(ContainElement(SatisfyAll(HaveField("Identifier", bs.Spec.IdempotencyKey),
			HaveField("Timestamp", BeNumerically(">=", sent)))), "no timestamp sent: Stripe dates it at receipt")
	})

	It("dates a meter event at the job's completion for a meter that asks, only within the grace period", func() {
		ns := stripeTenant(func(bp *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[0].JobCompletion.CompletedAt = ".data.completed_at"
			bp.Spec.Stripe.Meters[0].Timestamp = hooksv1alpha1.StripeTimestampCompletion
		})
		job := func(id string, ago time.Duration) (time.Time, int64) {
			at := time.Now().Add(-ago).UTC().Truncate(time.Second)
			sent := time.Now().Add(-time.Second).Unix()
			sendOK(ns, "msg_"+id, fmt.Sprintf(
				`{"type":"job.completed","data":{"job_id":%q,"version":1,"state":"succeeded","customer":"cus_%s","tokens":9,"completed_at":%q}}`,
				id, id, at.Format(time.RFC3339)))
			Eventually(settlementState(ns, id)).Should(Equal(hooksv1alpha1.SettlementSettled))
			return at, sent
		}
		event := func(bs *hooksv1alpha1.BillingSettlement) fakestripe.MeterEvent {
			for _, e := range fake.MeterEvents() {
				if e.Identifier == bs.Spec.IdempotencyKey {
					return e
				}
			}
			Fail("no meter event for " + bs.Name)
			return fakestripe.MeterEvent{}
		}
		// Ten minutes ago, inside the default 1 h grace period less the margin: dated.
		at, _ := job("job-recent", 10*time.Minute)
		recent := settlementOf(ns, "job-recent")
		Expect(recent.Spec.OccurredAt).NotTo(BeNil())
		Expect(recent.Status.UsageDatedAt).NotTo(BeNil())
		Expect(recent.Status.UsageDatedAt.Time.Equal(at)).To(BeTrue(), "pinned at the completion")
		Expect(recent.Status.DatedUntil.Time.Equal(at.Add(time.Hour - stripebilling.DateMargin))).To(BeTrue())
		Expect(event(recent).Timestamp).To(Equal(at.Unix()))
		// Three hours ago: past the grace period, so dated at receipt — dated at its
		// completion, Stripe could accept it for a finalized invoice and never bill it.
		_, sent := job("job-late", 3*time.Hour)
		late := settlementOf(ns, "job-late")
		Expect(late.Spec.OccurredAt).NotTo(BeNil())
		Expect(late.Status.UsageDatedAt).To(BeNil())
		Expect(event(late).Timestamp).To(BeNumerically(">=", sent))
	})

	It("reports an invoice item Stripe no longer lists and cannot find among 1,000 newer ones for review", func() {
		// The lookup cannot answer (not Unreadable): a finding, never a confirmation.
		ns := stripeTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Hour}}
		})
		sendOK(ns, "msg_stripe_gone", invoice("cus_gone", 500))
		Eventually(stateOf(line(ns))).Should(Equal(hooksv1alpha1.SettlementSettled))
		charged := get(line(ns))
		// Deleted in the dashboard, and the customer has 1,000 newer items since.
		Expect(fake.DeleteInvoiceItem(charged.Status.ProviderRef)).To(BeTrue())
		fake.AddInvoiceItems("cus_gone", 1000)
		d := finding(ns, hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown, func(d hooksv1alpha1.Discrepancy) bool {
			return d.Object == "BillingSettlement/"+charged.Name
		})
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairManualReview))
		Expect(d.Message).To(SatisfyAll(ContainSubstring("could not be asked"), ContainSubstring(charged.Spec.IdempotencyKey),
			ContainSubstring("search the Stripe dashboard")))
		Expect(fake.Charges(charged.Spec.IdempotencyKey)).To(BeZero(), "nothing was sent again")
		posts := 0
		for _, r := range fake.Requests() {
			if r.Method == http.MethodPost && r.Path == "/v1/invoiceitems" {
				posts++
			}
		}
		Expect(posts).To(Equal(1), "the pass only reads")
	})

	// reversal is a compensation of orig created by hand (as the runbook or kubectl
	// settlement does), for the original's usage and amount unless amount is given.
	reversal := func(orig *hooksv1alpha1.BillingSettlement, key string, typ hooksv1alpha1.SettlementType, amount *hooksv1alpha1.Amount) *hooksv1alpha1.BillingSettlement {
		bs := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: orig.Namespace, Name: identity.SettlementName("inference", key)},
			Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: orig.Spec.BillingProviderRef, SettlementKey: key,
				IdempotencyKey: identity.IdempotencyKey(key), Type: typ, Reverses: orig.Name, Customer: orig.Spec.Customer,
				Usage: orig.Spec.Usage.DeepCopy(), Amount: orig.Spec.Amount.DeepCopy()}}
		if amount != nil {
			bs.Spec.Usage, bs.Spec.Amount = nil, amount
		}
		return bs
	}

	It("voids a settled meter event with a cancel within Stripe's 24 hours, once", func() {
		ns := stripeTenant()
		sendOK(ns, "msg_stripe_void", jobEvent("job-stripe-void", 1, 300))
		Eventually(settlementState(ns, "job-stripe-void")).Should(Equal(hooksv1alpha1.SettlementSettled))
		orig := settlementOf(ns, "job-stripe-void")
		void := reversal(orig, "void/job-stripe-void", hooksv1alpha1.SettlementVoid, nil)
		Expect(k8s.Create(ctx, void)).To(Succeed())
		Eventually(stateOf(void)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(get(void).Status.ProviderRef).To(Equal("meter_event_cancel:" + orig.Spec.IdempotencyKey))
		Expect(get(void).Status.ReversesRef).To(Equal(orig.Status.ProviderRef), "what it cancels is pinned at its first attempt")
		Expect(fake.Charges(orig.Spec.IdempotencyKey)).To(BeZero(), "the meter event is cancelled")
		adjustments := 0
		for _, r := range fake.Requests() {
			if r.Path == "/v1/billing/meter_event_adjustments" {
				Expect(r.IdempotencyKey).To(Equal(void.Spec.IdempotencyKey))
				adjustments++
			}
		}
		Expect(adjustments).To(Equal(1))

		// Voided: neither a second Void nor a Refund of it is sent (a meter event has no
		// price at Stripe, so a refund could not be bounded anyway).
		again := reversal(orig, "void2/job-stripe-void", hooksv1alpha1.SettlementVoid, nil)
		refund := reversal(orig, "refund/job-stripe-void", hooksv1alpha1.SettlementRefund, &hooksv1alpha1.Amount{Minor: 100, Currency: "USD"})
		for _, bs := range []*hooksv1alpha1.BillingSettlement{again, refund} {
			Expect(k8s.Create(ctx, bs)).To(Succeed())
			Eventually(readyReason(bs)).Should(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))
		}
		Expect(condition(get(again).Status.Conditions, hooksv1alpha1.ConditionReady).Message).To(ContainSubstring("is sent only alone"))
		Consistently(func() int { return len(fake.Requests()) }).WithTimeout(2 * time.Second).Should(Equal(len(fake.Requests())))
	})

	It("voids an uninvoiced invoice item by deleting it; an invoiced one is refused with what to do, and refunded as a credit", func() {
		ns := stripeTenant()
		sendOK(ns, "msg_stripe_void_item", invoice("cus_void", 4200))
		Eventually(stateOf(line(ns))).Should(Equal(hooksv1alpha1.SettlementSettled))
		orig := get(line(ns))
		Expect(fake.Invoice(orig.Status.ProviderRef, "in_1")).To(Succeed())

		// A Void must name the whole charge: Stripe deletes the whole item.
		part := reversal(orig, "void-part/inv", hooksv1alpha1.SettlementVoid, &hooksv1alpha1.Amount{Minor: 1000, Currency: "USD"})
		Expect(k8s.Create(ctx, part)).To(Succeed())
		Eventually(readyReason(part)).Should(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))
		Expect(condition(get(part).Status.Conditions, hooksv1alpha1.ConditionReady).Message).To(ContainSubstring("must be the charge's"))
		Expect(k8s.Delete(ctx, part)).To(Succeed())

		void := reversal(orig, "void/inv", hooksv1alpha1.SettlementVoid, nil)
		Expect(k8s.Create(ctx, void)).To(Succeed())
		Eventually(stateOf(void)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementFailed))
		Expect(condition(get(void).Status.Conditions, hooksv1alpha1.ConditionReady).Message).To(SatisfyAll(
			ContainSubstring("cannot be deleted once invoiced"), ContainSubstring("refund it instead")))
		Expect(get(void).Status.Exposure).To(Equal(hooksv1alpha1.ExposureNone))
		Expect(fake.Charges(orig.Spec.IdempotencyKey)).To(Equal(1), "the invoiced item stays")

		// The refused Void moved nothing: a Refund of part of it is a credit.
		refund := reversal(orig, "refund/inv", hooksv1alpha1.SettlementRefund, &hooksv1alpha1.Amount{Minor: 1200, Currency: "USD"})
		Expect(k8s.Create(ctx, refund)).To(Succeed())
		Eventually(stateOf(refund)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(fake.InvoiceItems()).To(ContainElement(SatisfyAll(HaveField("Customer", "cus_void"), HaveField("Amount", int64(-1200)),
			HaveField("Metadata", HaveKeyWithValue(stripebilling.MetaReverses, orig.Spec.SettlementKey)))))
		Expect(fake.Charges(refund.Spec.IdempotencyKey)).To(Equal(1))

		// Refunded in part, the charge is no longer voided whole.
		late := reversal(orig, "void-late/inv", hooksv1alpha1.SettlementVoid, nil)
		Expect(k8s.Create(ctx, late)).To(Succeed())
		Eventually(readyReason(late)).Should(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))

		// Another tenant's item, not invoiced: the Void deletes it, and the pass marks the
		// Void as resting on Stripe's answer (a deleted item cannot be read back), so it
		// can be archived rather than reported.
		// The charge too, once its item is gone: voided, not lost. (Passes start once
		// both have settled, so the pass finds the item already deleted.)
		ns2 := stripeTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: time.Hour}, StuckAfter: &metav1.Duration{Duration: time.Second}}
		})
		sendOK(ns2, "msg_stripe_void_item2", invoice("cus_void2", 800))
		Eventually(stateOf(line(ns2))).Should(Equal(hooksv1alpha1.SettlementSettled))
		orig2 := get(line(ns2))
		void2 := reversal(orig2, "void/inv2", hooksv1alpha1.SettlementVoid, nil)
		Expect(k8s.Create(ctx, void2)).To(Succeed())
		Eventually(stateOf(void2)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(get(void2).Status.ProviderRef).To(Equal("deleted:" + orig2.Status.ProviderRef))
		Expect(fake.Charges(orig2.Spec.IdempotencyKey)).To(BeZero(), "the item is deleted")
		var bp hooksv1alpha1.BillingProvider
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns2, Name: fixtures.BillingProviderName}, &bp)).To(Succeed())
		patch := client.MergeFrom(bp.DeepCopy())
		bp.Spec.Reconciliation.Interval = &metav1.Duration{Duration: 2 * time.Second}
		Expect(k8s.Patch(ctx, &bp, patch)).To(Succeed())
		Eventually(reconciled(void2)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.ReasonProviderCannotAnswer))
		Eventually(reconciled(orig2)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.ReasonVoided))
		var reports hooksv1alpha1.ReconciliationReportList
		Expect(k8s.List(ctx, &reports, client.InNamespace(ns2))).To(Succeed())
		for _, rep := range reports.Items {
			Expect(rep.Status.Items).NotTo(ContainElement(HaveField("Object", SatisfyAny(
				Equal("BillingSettlement/"+void2.Name), Equal("BillingSettlement/"+orig2.Name)))))
		}
	})

	It("charges JPY and ISK in Stripe's units and confirms them in ISO units; refuses a KWD amount Stripe cannot take, sending nothing", func() {
		// The payload's amount is ISO 4217 minor units, its currency per line.
		ns := stripeTenant(func(bp *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second}}
			for i := range wp.Spec.Routes {
				if wp.Spec.Routes[i].EventType == "invoice.paid" {
					wp.Spec.Routes[i].Operations[0].Settlement.Amount = &hooksv1alpha1.AmountMapping{Minor: ".cents", CurrencyPath: ".ccy"}
				}
			}
		})
		lineOf := func(a string) *hooksv1alpha1.BillingSettlement {
			return &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns,
				Name: identity.SettlementNameFor("inference", identity.FieldsSettlementKey(ns, "inference", a, "1"))}}
		}
		sendOK(ns, "msg_stripe_currencies", `{"type":"invoice.paid","data":{"customer":"cus_cur","lines":[`+
			`{"a":"inv-jpy","b":"1","cents":500,"ccy":"JPY"},{"a":"inv-isk","b":"1","cents":5000,"ccy":"ISK"},`+
			`{"a":"inv-kwd","b":"1","cents":1234,"ccy":"KWD"}]}}`)
		jpy, isk, kwd := lineOf("inv-jpy"), lineOf("inv-isk"), lineOf("inv-kwd")
		Eventually(stateOf(jpy)).Should(Equal(hooksv1alpha1.SettlementSettled))
		Eventually(stateOf(isk)).Should(Equal(hooksv1alpha1.SettlementSettled))
		item := func(bs *hooksv1alpha1.BillingSettlement) fakestripe.InvoiceItem {
			for _, it := range fake.InvoiceItems() {
				if it.ID == get(bs).Status.ProviderRef {
					return it
				}
			}
			Fail("no invoice item for " + bs.Name)
			return fakestripe.InvoiceItem{}
		}
		// 500 JPY is 500 at Stripe; 5000 ISK is 500000 (two decimals, always 00).
		Expect(item(jpy)).To(SatisfyAll(HaveField("Amount", int64(500)), HaveField("Currency", "jpy")))
		Expect(item(isk)).To(SatisfyAll(HaveField("Amount", int64(500000)), HaveField("Currency", "isk")))
		// What the CHARGE column shows and the match confirmed are ISO units.
		Expect(get(jpy).Status.Charge).To(Equal("500 JPY"))
		Expect(get(isk).Status.Charge).To(Equal("5000 ISK"))
		Expect(get(isk).Status.ChargedAmount).To(Equal(&hooksv1alpha1.Amount{Minor: 5000, Currency: "ISK"}))
		Eventually(reconciled(jpy)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.ReasonConfirmedByProvider))
		Eventually(reconciled(isk)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.ReasonConfirmedByProvider))

		// 1.234 KWD: Stripe takes three-decimal amounts whose last digit is 0. Refused
		// terminally with the reason, and nothing reached Stripe.
		Eventually(stateOf(kwd)).Should(Equal(hooksv1alpha1.SettlementFailed))
		ready := condition(get(kwd).Status.Conditions, hooksv1alpha1.ConditionReady)
		Expect(ready.Reason).To(Equal(hooksv1alpha1.ReasonTerminalError))
		Expect(ready.Message).To(SatisfyAll(ContainSubstring("1.234 KWD cannot be sent to Stripe exactly"),
			ContainSubstring("bill 1.230 KWD or 1.240 KWD instead")))
		Expect(get(kwd).Status.Exposure).To(Equal(hooksv1alpha1.ExposureNone))
		for _, r := range fake.Requests() {
			Expect(r.IdempotencyKey).NotTo(Equal(get(kwd).Spec.IdempotencyKey), "nothing was sent for the KWD amount")
		}
		Expect(fake.InvoiceItems()).To(HaveLen(2))

		// A refund typed in ISO units (kubectl settlement refund --amount 1000 on ISK)
		// is a credit of Stripe's amount.
		refund := reversal(get(isk), "refund/inv-isk", hooksv1alpha1.SettlementRefund, &hooksv1alpha1.Amount{Minor: 1000, Currency: "ISK"})
		Expect(k8s.Create(ctx, refund)).To(Succeed())
		Eventually(stateOf(refund)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(fake.InvoiceItems()).To(ContainElement(SatisfyAll(HaveField("Amount", int64(-100000)), HaveField("Currency", "isk"),
			HaveField("Metadata", HaveKeyWithValue(stripebilling.MetaReverses, get(isk).Spec.SettlementKey)))))
		Expect(get(refund).Status.Charge).To(Equal("1000 ISK"))
	})

	It("refuses a usage charge for a meter Stripe has no mapping for, sending nothing", func() {
		ns := stripeTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Stripe.Meters[0].Meter = "gpu-seconds"
		})
		sendOK(ns, "msg_stripe_nometer", jobEvent("job-stripe-nometer", 1, 5))
		Eventually(settlementState(ns, "job-stripe-nometer")).Should(Equal(hooksv1alpha1.SettlementFailed))
		Expect(condition(settlementOf(ns, "job-stripe-nometer").Status.Conditions, hooksv1alpha1.ConditionReady).Message).
			To(ContainSubstring(`no Stripe meter is configured for usage meter "tokens"`))
		for _, r := range fake.Requests() {
			Expect(r.Path).NotTo(Equal("/v1/billing/meter_events"), "nothing is sent under a guessed meter")
		}
	})
})
