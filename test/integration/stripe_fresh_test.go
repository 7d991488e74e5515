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
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/test/fakestripe"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// withUsageItems routes "usage.reported" events to one usage charge per item, keyed by
// the item's id (keyFrom), on meter "tokens".
func withUsageItems(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
	wp.Spec.Routes = append(wp.Spec.Routes, hooksv1alpha1.Route{EventType: "usage.reported",
		Operations: []hooksv1alpha1.RouteOperation{{Type: hooksv1alpha1.OperationBillingSettlement,
			ForEach: ".data.items", Settlement: &hooksv1alpha1.SettlementMapping{
				BillingProviderRef: "billing", KeyFrom: []string{".id"}, Customer: "$.data.customer",
				Usage: &hooksv1alpha1.UsageMapping{Quantity: ".n", Meter: "tokens"}}}}})
}

// Charges that were never presented anywhere go out as one call, whoever made them and
// under whichever key: a settlement's freshness is read from the facts — nothing in the
// cluster or the archive holds its name or keys, and it never recorded an attempt
// (docs/design.md §14) — not from who created it. Against a provider that cannot be
// asked by key (Stripe's meter events), anything else would end in
// RequiresReconciliation without a single attempt.
var _ = Describe("a Stripe charge that was never presented", func() {
	var fake *fakestripe.Server
	BeforeEach(func() { fake = startFakeStripe() })
	stripeTenant := func(mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
		GinkgoHelper()
		return stripeTenantOn(fake, append([]func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider){withUsageItems}, mutate...)...)
	}
	// sentOnce waits for bs to settle and checks that it was sent once and looked up
	// never: one POST, and the one record at the fake.
	sentOnce := func(bs *hooksv1alpha1.BillingSettlement) *hooksv1alpha1.BillingSettlement {
		GinkgoHelper()
		Eventually(stateOf(bs)).Should(Equal(hooksv1alpha1.SettlementSettled))
		got := get(bs)
		Expect(got.Status.Attempts).To(Equal(int32(1)), "one submission")
		Expect(fake.Charges(got.Spec.IdempotencyKey)).To(Equal(1))
		return got
	}

	It("sends a usage charge under a keyFrom key as one meter event", func() {
		ns := stripeTenant()
		sendOK(ns, "msg_usage_items", `{"type":"usage.reported","data":{"customer":"cus_items","items":[{"id":"u-1","n":40}]}}`)
		bs := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns,
			Name: identity.SettlementNameFor("inference", identity.FieldsSettlementKey(ns, "inference", "u-1"))}}
		got := sentOnce(bs)
		Expect(fake.MeterEvents()).To(ConsistOf(SatisfyAll(HaveField("Identifier", got.Spec.IdempotencyKey),
			HaveField("Customer", "cus_items"), HaveField("Value", "40"))))
	})

	It("sends a settlement made with the operator's identity but not in its job's first dispatch as one meter event", func() {
		// As a retried create, a second completion version, or a read that missed the
		// job's JobCompletion leaves it: no fresh-for-job annotation.
		ns := stripeTenant()
		ev := &hooksv1alpha1.WebhookEvent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "by-hand"},
			Spec: hooksv1alpha1.WebhookEventSpec{Provider: "inference", EventID: "evt-by-hand"}}
		bs := settlement.New(ev, &hooksv1alpha1.SettlementFacts{BillingProviderRef: "billing",
			SettlementKey: identity.JobSettlementKey(ns, "inference", "job-by-hand"), JobID: "job-by-hand", Customer: "cus_by_hand",
			Usage: &hooksv1alpha1.Usage{Meter: "tokens", Quantity: "12"}})
		Expect(bs.Annotations).NotTo(HaveKey(hooksv1alpha1.AnnotationFreshForJob))
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		sentOnce(bs)
		Expect(fake.MeterEvents()).To(HaveLen(1))
	})

	It("sends an invoice item under a keyFrom key as one item, however many items the customer has", func() {
		ns := stripeTenant()
		fake.AddInvoiceItems("cus_busy", 1001)
		sendOK(ns, "msg_busy_invoice", fmt.Sprintf(`{"type":"invoice.paid","data":{"customer":"cus_busy","lines":[{"a":"inv","b":"7","cents":%d}]}}`, 990))
		bs := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns,
			Name: identity.SettlementNameFor("inference", identity.FieldsSettlementKey(ns, "inference", "inv", "7"))}}
		got := sentOnce(bs)
		ours := 0
		for _, it := range fake.InvoiceItems() {
			if it.Metadata[stripebilling.MetaIdempotencyKey] == got.Spec.IdempotencyKey {
				ours++
			}
		}
		Expect(ours).To(Equal(1))
	})

	It("charges a job whose second completion is dispatched first once, as one meter event", func() {
		ns := stripeTenant()
		sendOK(ns, "msg_v2_first", jobEvent("job-v2-first", 2, 20))
		Eventually(settlementState(ns, "job-v2-first")).Should(Equal(hooksv1alpha1.SettlementSettled))
		sendOK(ns, "msg_v1_late", jobEvent("job-v2-first", 1, 10))
		bs := settlementOf(ns, "job-v2-first")
		Expect(bs.Status.Attempts).To(Equal(int32(1)), "one submission")
		Consistently(fake.MeterEvents).WithTimeout(3 * time.Second).Should(ConsistOf(
			SatisfyAll(HaveField("Identifier", bs.Spec.IdempotencyKey), HaveField("Value", "20"))))
	})

	It("charges a job whose second completion follows its first once, as one meter event", func() {
		ns := stripeTenant()
		sendOK(ns, "msg_v1", jobEvent("job-v1-v2", 1, 10))
		Eventually(settlementState(ns, "job-v1-v2")).Should(Equal(hooksv1alpha1.SettlementSettled))
		sendOK(ns, "msg_v2", jobEvent("job-v1-v2", 2, 10))
		bs := settlementOf(ns, "job-v1-v2")
		Expect(bs.Status.Attempts).To(Equal(int32(1)))
		Consistently(fake.MeterEvents).WithTimeout(3 * time.Second).Should(HaveLen(1))
	})

	// outage fails every meter event POST with a 500 (ambiguous: Stripe may have
	// executed it) until the settlement's first attempt is made to look two hours old,
	// then ends; it returns the settlement.
	outage := func(ns, job string) *hooksv1alpha1.BillingSettlement {
		GinkgoHelper()
		fake.FailNext(10000, "/v1/billing/meter_events", http.StatusInternalServerError, "api_error", "", "")
		sendOK(ns, "msg_"+job, jobEvent(job, 1, 64))
		Eventually(settlementState(ns, job)).ShouldNot(BeEmpty())
		Eventually(func() int32 { return settlementOf(ns, job).Status.Attempts }).Should(BeNumerically(">=", 2))
		bs := settlementOf(ns, job)
		patch := client.MergeFrom(bs.DeepCopy())
		bs.Status.FirstSubmittedAt = &metav1.Time{Time: time.Now().Add(-2 * time.Hour)}
		Expect(k8s.Status().Patch(ctx, bs, patch)).To(Succeed())
		fake.ClearFaults()
		return bs
	}
	fastRetries := func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
		bp.Spec.Retry.InitialBackoff, bp.Spec.Retry.MaxBackoff = fixtures.Duration(500*time.Millisecond), fixtures.Duration(time.Second)
		bp.Spec.Retry.MaxAttempts, bp.Spec.Retry.MaxElapsed = 0, nil // as the CRD leaves them
	}

	It("settles a meter event through an outage longer than an hour on its own, once", func() {
		ns := stripeTenant(fastRetries)
		bs := outage(ns, "job-long-outage")
		Eventually(stateOf(bs)).WithTimeout(40 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(get(bs).Status.Attempts).To(BeNumerically(">=", 3))
		Expect(fake.MeterEvents()).To(HaveLen(1))
	})

	It("stops for a human after the same outage where the BillingProvider sets a one-hour budget", func() {
		// The budget the CRD defaulted before it was the key window's.
		ns := stripeTenant(fastRetries, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Retry.MaxAttempts, bp.Spec.Retry.MaxElapsed = 10, fixtures.Duration(time.Hour)
		})
		bs := outage(ns, "job-long-outage-1h")
		Eventually(stateOf(bs)).WithTimeout(40 * time.Second).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		Expect(fake.MeterEvents()).To(BeEmpty(), "nothing was sent after the budget")
	})

	It("takes Stripe's duplicate identifier inside its window as proof that the meter event is there: one event", func() {
		// The first attempt commits and its answer is lost; by the resend Stripe no
		// longer replays the key (its idempotency record is gone) but still holds the
		// identifier, so it answers resource_already_exists.
		ns := stripeTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Retry.InitialBackoff = fixtures.Duration(3 * time.Second)
			bp.Spec.Retry.MaxBackoff = fixtures.Duration(5 * time.Second)
		})
		fake.CommitThenHangNext(1, "/v1/billing/meter_events")
		sendOK(ns, "msg_dup_identifier", jobEvent("job-dup-identifier", 1, 31))
		Eventually(fake.MeterEvents).Should(HaveLen(1))
		fake.ForgetKeys()
		Eventually(settlementState(ns, "job-dup-identifier")).WithTimeout(40 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-dup-identifier")
		Expect(bs.Status.Attempts).To(BeNumerically(">=", 2))
		Expect(fake.MeterEvents()).To(HaveLen(1))
	})
})
