package integration_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing/metronomebilling"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// metronomeTenant makes a tenant billing through the Metronome fake: usage meter
// "tokens" reported as event type tokens_used, jobs dated at their completed_at.
func metronomeTenant(fake *fakemetronome.Server, mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
	GinkgoHelper()
	return newTenantWithToken(fake.Token(), append([]func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider){
		func(bp *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Type, bp.Spec.Endpoint = hooksv1alpha1.BillingProviderMetronome, fake.URL()
			bp.Spec.RequestTimeout = fixtures.Duration(time.Second)
			bp.Spec.Metronome = &hooksv1alpha1.MetronomeSettings{Meters: []hooksv1alpha1.MetronomeMeter{
				{Meter: "tokens", EventType: fakemetronome.DefaultEventType, QuantityProperty: "quantity"}}}
			wp.Spec.Routes[0].Operations[0].JobCompletion.CompletedAt = ".data.completed_at"
		}}, mutate...)...)
}

// The billing rows of the failure matrix (docs/design.md §9) against the Metronome fake
// (test/fakemetronome: 34-day deduplication by transaction_id, the events search).
var _ = Describe("a Metronome billing provider", func() {
	var fake *fakemetronome.Server
	BeforeEach(func() {
		var err error
		fake, err = fakemetronome.Start(fakemetronome.Options{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
	})
	completed := func(id string, tokens int, at time.Time) string {
		return fmt.Sprintf(`{"type":"job.completed","data":{"job_id":%q,"version":1,"state":"succeeded","customer":"cus_%s","tokens":%d,"completed_at":%q}}`,
			id, id, tokens, at.UTC().Format(time.RFC3339))
	}

	It("settles a job as one usage event dated at its completion: duplicates and a commit-then-timeout leave one event, confirmed by the search", func() {
		ns := metronomeTenant(fake, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second}}
		})
		at := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Second)
		fake.Fail(adaptercontract.CommitThenTimeout, 1)
		body := completed("job-metronome", 1523, at)
		sendOK(ns, "msg_metronome", body)
		sendOK(ns, "msg_metronome", body)       // the sender's retry of the same delivery
		sendOK(ns, "msg_metronome_again", body) // the same completion under another message ID
		Eventually(settlementState(ns, "job-metronome")).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-metronome")
		Expect(bs.Status.ProviderRef).To(Equal(metronomebilling.EventRef(bs.Spec.IdempotencyKey)))
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
		events := fake.Events()
		Expect(events).To(HaveLen(1))
		Expect(events[0]).To(SatisfyAll(HaveField("TransactionID", bs.Spec.IdempotencyKey), HaveField("CustomerID", "cus_job-metronome"),
			HaveField("EventType", fakemetronome.DefaultEventType), HaveField("Timestamp", at.Format(time.RFC3339))))
		Expect(events[0].Properties).To(SatisfyAll(HaveKeyWithValue("quantity", "1523"),
			HaveKeyWithValue(metronomebilling.PropSettlementKey, bs.Spec.SettlementKey)))
		Expect(fake.Requests()).To(ContainElement(HaveField("Status", 0)), "the first answer was lost")
		Expect(bs.Status.Attempts).To(Equal(int32(1)), "the lost answer was found through the events search, not sent again")
		Expect(fake.Searches()).To(BeNumerically(">=", 1))

		// The pass: Metronome lists no events by time; the settled charge is confirmed by
		// its transaction ID, and nothing is sent.
		Eventually(func() string {
			if c := condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled); c != nil && c.Status == metav1.ConditionTrue {
				return c.Reason
			}
			return ""
		}).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.ReasonConfirmedByProvider))
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
		Expect(fake.Events()).To(HaveLen(1))
	})

	It("retries a rate-limited and a failed ingest under the same key: one event", func() {
		ns := metronomeTenant(fake)
		fake.Fail(adaptercontract.RateLimited, 1)
		fake.Fail(adaptercontract.Unavailable, 1)
		sendOK(ns, "msg_metronome_429", completed("job-metronome-429", 5, time.Now().Add(-time.Minute)))
		Eventually(settlementState(ns, "job-metronome-429")).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-metronome-429")
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
		Expect(fake.Requests()).To(HaveLen(3))
	})

	It("refuses a usage meter with no Metronome event type, sending nothing", func() {
		ns := metronomeTenant(fake, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Metronome.Meters[0].Meter = "gpu-seconds"
		})
		sendOK(ns, "msg_metronome_meter", completed("job-metronome-meter", 5, time.Now().Add(-time.Minute)))
		Eventually(settlementState(ns, "job-metronome-meter")).Should(Equal(hooksv1alpha1.SettlementFailed))
		bs := settlementOf(ns, "job-metronome-meter")
		ready := condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady)
		Expect(ready.Reason).To(Equal(hooksv1alpha1.ReasonTerminalError))
		Expect(ready.Message).To(ContainSubstring(`no Metronome event type is configured for usage meter "tokens"`))
		Expect(fake.Requests()).To(BeEmpty())
		// Nothing was sent, so nothing was learnt about Metronome: its health is not
		// reported as an endpoint that cannot be reached.
		Consistently(func() string {
			if c := billingProviderCondition(ns, hooksv1alpha1.ConditionProviderHealthy)(); c != nil {
				return c.Reason
			}
			return ""
		}).WithTimeout(3 * time.Second).ShouldNot(Equal(hooksv1alpha1.ReasonEndpointUnreachable))
	})

	It("dates an event when it is sent when the sender gives no completion time", func() {
		ns := metronomeTenant(fake, func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[0].JobCompletion.CompletedAt = ""
		})
		sent := time.Now().Add(-time.Second)
		sendOK(ns, "msg_metronome_undated", jobEvent("job-metronome-undated", 1, 7))
		Eventually(settlementState(ns, "job-metronome-undated")).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-metronome-undated")
		Expect(bs.Spec.OccurredAt).To(BeNil())
		events := fake.Events()
		Expect(events).To(HaveLen(1))
		at, err := time.Parse(time.RFC3339Nano, events[0].Timestamp)
		Expect(err).NotTo(HaveOccurred())
		Expect(at).To(BeTemporally(">=", sent), "Metronome needs a time: the one it was sent at")
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
	})

	It("holds a Void and a Refund of a settled Metronome charge: Metronome can neither cancel nor price it back", func() {
		ns := metronomeTenant(fake)
		sendOK(ns, "msg_metronome_comp", completed("job-metronome-comp", 40, time.Now().Add(-time.Minute)))
		Eventually(settlementState(ns, "job-metronome-comp")).Should(Equal(hooksv1alpha1.SettlementSettled))
		orig := settlementOf(ns, "job-metronome-comp")
		void := compensation(ns, "metronome/void-1", hooksv1alpha1.SettlementVoid, orig, orig.Spec.Customer, 0, "")
		void.Spec.Amount, void.Spec.Usage = nil, orig.Spec.Usage.DeepCopy()
		refund := compensation(ns, "metronome/refund-1", hooksv1alpha1.SettlementRefund, orig, orig.Spec.Customer, 100, "USD")
		Expect(k8s.Create(ctx, void)).To(Succeed())
		Expect(k8s.Create(ctx, refund)).To(Succeed())
		Eventually(readyReason(void)).Should(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))
		Eventually(readyReason(refund)).Should(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))
		Consistently(func() int { return len(fake.Requests()) }).WithTimeout(2*time.Second).Should(Equal(1), "nothing but the charge was sent")
		Expect(fake.Effects(orig.Spec.IdempotencyKey)).To(Equal(1))
	})

	// Metronome's events search is asynchronous: an event it holds (and deduplicates) may
	// not show yet. A settlement whose ingest may have committed, deleted while the search
	// answers "not found", is never released as having charged nothing: a human looks.
	It("never releases a deleted settlement on the events search's silence while the event may be held", func() {
		lagging, err := fakemetronome.Start(fakemetronome.Options{SearchLag: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(lagging.Close)
		ns := metronomeTenant(lagging)
		lagging.Fail(adaptercontract.CommitThenTimeout, 1) // ingested; the answer is lost
		lagging.Fail(adaptercontract.Unavailable, 1000)    // every resend fails: nothing proves the outcome
		sendOK(ns, "msg_metronome_lag", completed("job-metronome-lag", 9, time.Now().Add(-time.Minute)))
		Eventually(func() int { return len(lagging.Requests()) }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 1))
		bs := settlementOf(ns, "job-metronome-lag")
		Eventually(func() hooksv1alpha1.Exposure { return get(bs).Status.Exposure }).Should(Equal(hooksv1alpha1.ExposurePossible))
		Expect(k8s.Delete(ctx, bs)).To(Succeed())

		// Released (gone) would read "": the search's silence is no proof that nothing was
		// ingested, and nothing may be resent while deleting, so a human looks.
		Eventually(stateOf(bs)).WithTimeout(90 * time.Second).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		got := get(bs)
		Expect(got.Status.Exposure).To(Equal(hooksv1alpha1.ExposurePossible))
		Expect(readyReason(bs)()).To(Equal(hooksv1alpha1.ReasonDeletionBlocked))
		Consistently(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}) }).
			WithTimeout(3*time.Second).Should(Succeed(), "held: Metronome holds the event")
		Expect(lagging.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
	})

	// Metronome lists no events by time: the pass compares its usage totals per customer
	// and billable metric (POST /v1/usage) with what the settlements sent, the customers
	// named by ingest alias resolved to their Metronome IDs.
	Describe("usage totals", func() {
		const (
			idA = "0a0a0a0a-1111-4222-8333-444444444444"
			idB = "0b0b0b0b-1111-4222-8333-444444444444"
		)
		var totals *fakemetronome.Server
		BeforeEach(func() {
			var err error
			totals, err = fakemetronome.Start(fakemetronome.Options{Customers: []fakemetronome.Customer{
				{ID: idA, IngestAliases: []string{"cus_job-mt-total-a"}},
				{ID: idB, IngestAliases: []string{"cus_job-mt-total-b"}},
				{ID: "0c0c0c0c-1111-4222-8333-444444444444", IngestAliases: []string{"cus_job-mt-nometric"}},
			}})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(totals.Close)
		})
		reconciling := func(metricID string) func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider) {
			return func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
				bp.Spec.Metronome.Meters[0].BillableMetricID = metricID
				bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
					Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Hour}}
			}
		}
		// reportsIn lists the reconciliation reports of ns.
		reportsIn := func(ns string) []hooksv1alpha1.ReconciliationReport {
			var l hooksv1alpha1.ReconciliationReportList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			return l.Items
		}
		// examined sums key over the completed reports of ns.
		examined := func(ns, key string) func() int32 {
			return func() int32 {
				var n int32
				for _, rr := range reportsIn(ns) {
					if rr.Status.Phase == hooksv1alpha1.ReportCompleted {
						n += rr.Status.Examined[key]
					}
				}
				return n
			}
		}
		usageFindings := func(ns string) []hooksv1alpha1.Discrepancy {
			var out []hooksv1alpha1.Discrepancy
			for _, rr := range reportsIn(ns) {
				for _, d := range rr.Status.Items {
					if d.Type == hooksv1alpha1.DiscrepancyUsageTotalMismatch {
						out = append(out, d)
					}
				}
			}
			return out
		}

		It("reports usage at Metronome nobody here sent, and finds nothing where the totals agree", func() {
			ns := metronomeTenant(totals, reconciling(fakemetronome.DefaultBillableMetricID))
			// A total covers whole minutes that ended (here 1s ago: the suite's lag; the
			// clock skew allowed is 1s): the jobs are sent early in a minute, so that each
			// settlement is certainly inside the minute its total is read for.
			Eventually(func() int { return time.Now().Second() }).WithTimeout(70*time.Second).WithPolling(100*time.Millisecond).
				Should(SatisfyAll(BeNumerically(">=", 3), BeNumerically("<", 6)), "early in a minute, past the 1s clock skew")
			at := time.Now().Add(-time.Second).UTC().Truncate(time.Second)
			sendOK(ns, "msg-mt-total-a", completed("job-mt-total-a", 40, at))
			sendOK(ns, "msg-mt-total-b", completed("job-mt-total-b", 9, at))
			Eventually(settlementState(ns, "job-mt-total-a")).Should(Equal(hooksv1alpha1.SettlementSettled))
			Eventually(settlementState(ns, "job-mt-total-b")).Should(Equal(hooksv1alpha1.SettlementSettled))
			// Metronome holds 2 more units for B's customer, under its Metronome ID, at the
			// time of B's usage: nobody here sent them.
			totals.Put(fakemetronome.Event{TransactionID: "foreign-mt-total-b", CustomerID: idB, EventType: fakemetronome.DefaultEventType,
				Timestamp: at.Format(time.RFC3339), Properties: map[string]string{"quantity": "2"}}, time.Now())

			var more hooksv1alpha1.Discrepancy
			Eventually(func() bool {
				for _, d := range usageFindings(ns) {
					if strings.Contains(d.ProviderRef, "customer cus_job-mt-total-b,") {
						more = d
						return true
					}
				}
				return false
			}).WithTimeout(90*time.Second).WithPolling(200*time.Millisecond).Should(BeTrue(), "a report compares B's total")
			Expect(more.Action).To(Equal(hooksv1alpha1.RepairManualReview))
			Expect(more.Object).To(Equal("BillingProvider/" + fixtures.BillingProviderName))
			Expect(more.Message).To(SatisfyAll(ContainSubstring("totals 11 "), ContainSubstring("add up to 9 (1 settled in the window"), ContainSubstring("more than")))
			// A's total was compared too, and agreed: no finding about it.
			Eventually(examined(ns, "UsageTotal")).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 2))
			for _, d := range usageFindings(ns) {
				Expect(d.ProviderRef).NotTo(ContainSubstring("cus_job-mt-total-a"), "a matching total is no finding: %s", d.Message)
			}
			// The totals were asked for by Metronome customer ID and billable metric; the
			// comparison sent nothing.
			var asked []string
			for _, r := range totals.UsageRequests() {
				Expect(r.BillableMetricIDs).To(Equal([]string{fakemetronome.DefaultBillableMetricID}))
				Expect(r.WindowSize).To(Equal("NONE"))
				asked = append(asked, r.CustomerIDs...)
			}
			Expect(asked).To(ContainElements(idA, idB))
			Expect(totals.Requests()).To(HaveLen(2), "one ingest per job, nothing else")
		})

		It("counts a meter without billableMetricID as not comparable, asking Metronome nothing", func() {
			ns := metronomeTenant(totals, reconciling(""))
			sendOK(ns, "msg-mt-nometric", completed("job-mt-nometric", 5, time.Now().Add(-time.Second)))
			Eventually(settlementState(ns, "job-mt-nometric")).Should(Equal(hooksv1alpha1.SettlementSettled))
			Eventually(examined(ns, "UsageTotalNotComparable")).WithTimeout(90 * time.Second).Should(BeNumerically(">=", 1))
			Expect(usageFindings(ns)).To(BeEmpty(), "a meter left without an ID by choice is counted, not reported")
			Expect(examined(ns, "UsageTotal")()).To(BeZero())
			Expect(totals.UsageRequests()).To(BeEmpty())
			Expect(totals.CustomerRequests()).To(BeZero())
		})
	})
})
