package integration_test

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	billingapi "github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// reconcilingTenant is a tenant whose billing provider runs a pass every 2s, with
// thresholds short enough for a test.
func reconcilingTenant(mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
	GinkgoHelper()
	return newTenant(append([]func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider){
		func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second},
				EventStaleAfter: &metav1.Duration{Duration: time.Second}, KeepReports: 3,
			}
		}}, mutate...)...)
}

// finding waits for a report in ns that lists a discrepancy of type t matching match.
func finding(ns string, t hooksv1alpha1.DiscrepancyType, match func(hooksv1alpha1.Discrepancy) bool) hooksv1alpha1.Discrepancy {
	GinkgoHelper()
	var found hooksv1alpha1.Discrepancy
	Eventually(func() bool {
		var l hooksv1alpha1.ReconciliationReportList
		Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
		for _, rr := range l.Items {
			for _, d := range rr.Status.Items {
				if d.Type == t && match(d) {
					found = d
					return true
				}
			}
		}
		return false
	}).WithTimeout(45*time.Second).Should(BeTrue(), "a report listing %s", t)
	return found
}

func importRecord(bs *hooksv1alpha1.BillingSettlement, id string, minor int64) {
	GinkgoHelper()
	rec := billingapi.Record{ID: id, Status: billingapi.StatusSettled, SettlementKey: bs.Spec.SettlementKey,
		IdempotencyKey: bs.Spec.IdempotencyKey, Customer: bs.Spec.Customer, Type: billingapi.TypeCharge, CreatedAt: time.Now()}
	if u := bs.Spec.Usage; u != nil {
		rec.Usage = &billingapi.Usage{Meter: u.Meter, Quantity: u.Quantity, Unit: u.Unit}
	}
	if minor > 0 {
		rec.Amount = &billingapi.Amount{Minor: minor, Currency: "USD"}
	}
	Expect(billing.Import(rec)).To(Succeed())
}

var _ = Describe("reconciliation reports (docs/design.md §7)", func() {
	It("imports a charge the provider settled while the local record was dead-lettered", func() {
		ns := reconcilingTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Retry.MaxElapsed = &metav1.Duration{Duration: 2 * time.Second}
		})
		Expect(billing.SetDown(true)).To(Succeed())
		sendOK(ns, "msg_lostsettle", jobEvent("job-lostsettle", 1, 8))
		Eventually(settlementState(ns, "job-lostsettle")).Should(Equal(hooksv1alpha1.SettlementFailed))
		Expect(billing.SetDown(false)).To(Succeed())
		// The provider got the charge another way (e.g. a response lost in an outage,
		// then the local retries ran out): it is settled there, Failed here.
		importRecord(settlementOf(ns, "job-lostsettle"), "pay_lost_1", 0)

		d := finding(ns, hooksv1alpha1.DiscrepancyProviderSettledLocalPending, func(d hooksv1alpha1.Discrepancy) bool {
			return d.ProviderRef == "pay_lost_1"
		})
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairAuthoritativeQuery))
		Expect(d.CarriedOut).To(BeTrue())
		Eventually(settlementState(ns, "job-lostsettle")).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-lostsettle")
		Expect(bs.Status.ProviderRef).To(Equal("pay_lost_1"))
		Expect(billing.Charges(key(ns, "job-lostsettle"))).To(Equal(1), "imported, never charged again")
		Eventually(func() metav1.ConditionStatus {
			c := condition(settlementOf(ns, "job-lostsettle").Status.Conditions, hooksv1alpha1.ConditionReconciled)
			if c == nil {
				return ""
			}
			return c.Status
		}).WithTimeout(45 * time.Second).Should(Equal(metav1.ConditionTrue))
	})

	It("reports a completed billable job whose settlement was never created because the route changed", func() {
		ns := reconcilingTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations = wp.Spec.Routes[0].Operations[:1] // job completion only
		})
		sendOK(ns, "msg_unbilled", jobEvent("job-unbilled", 1, 2))
		Eventually(jobState(ns, "job-unbilled")).Should(Equal(hooksv1alpha1.JobCompletionApplied))
		// The route now charges jobs; the earlier job was never charged.
		wp := &hooksv1alpha1.WebhookProvider{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, wp)).To(Succeed())
		patch := client.MergeFrom(wp.DeepCopy()) // its controller writes status concurrently
		wp.Spec.Routes[0].Operations = append(wp.Spec.Routes[0].Operations, hooksv1alpha1.RouteOperation{
			Type: hooksv1alpha1.OperationBillingSettlement, Settlement: &hooksv1alpha1.SettlementMapping{
				BillingProviderRef: "billing", JobID: ".data.job_id", Customer: ".data.customer",
				Usage: &hooksv1alpha1.UsageMapping{Quantity: ".data.tokens", Meter: "tokens"}}})
		Expect(k8s.Patch(ctx, wp, patch)).To(Succeed())
		d := finding(ns, hooksv1alpha1.DiscrepancyJobWithoutSettlement, func(d hooksv1alpha1.Discrepancy) bool {
			return d.Object == "JobCompletion/"+identity.JobCompletionName("inference", "job-unbilled")
		})
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairManualReview))
		Expect(d.CarriedOut).To(BeFalse())
		Expect(billing.Charges(key(ns, "job-unbilled"))).To(Equal(0), "nothing is charged behind the operator's back")
	})

	It("reports a settlement that names a BillingProvider which does not exist in a report of its namespace", func() {
		ns := reconcilingTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[1].Settlement.BillingProviderRef = "billing-typo"
		})
		sendOK(ns, "msg_orphan", jobEvent("job-orphan", 1, 5))
		name := identity.SettlementName("inference", identity.DefaultSettlementKey("inference", "job-orphan"))
		d := finding(ns, hooksv1alpha1.DiscrepancySettlementWithoutBillingProvider, func(d hooksv1alpha1.Discrepancy) bool {
			return d.Object == "BillingSettlement/"+name
		})
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairManualReview))
		Expect(d.Message).To(And(ContainSubstring(`"billing-typo"`), ContainSubstring("kubectl")))
		Expect(settlementOf(ns, "job-orphan").Status.Exposure).To(Equal(hooksv1alpha1.ExposureNone), "nothing was sent")
	})

	It("reports provider records no local settlement knows, amount mismatches and quarantined events", func() {
		ns := reconcilingTenant()
		Expect(billing.Import(billingapi.Record{ID: "pay_stranger", Status: billingapi.StatusSettled, SettlementKey: "elsewhere/1",
			IdempotencyKey: "stl_" + strings.Repeat("e", 32), Customer: "cus_x", Type: billingapi.TypeCharge,
			Amount: &billingapi.Amount{Minor: 999, Currency: "USD"}, CreatedAt: time.Now()})).To(Succeed())

		// A local settlement under a key the provider already has with another amount.
		mismatchKey := "manual/" + ns
		bs := &hooksv1alpha1.BillingSettlement{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.SettlementName("manual", mismatchKey)},
			Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: mismatchKey,
				IdempotencyKey: identity.IdempotencyKey(mismatchKey), Type: hooksv1alpha1.SettlementCharge,
				Customer: "cus_m", Amount: &hooksv1alpha1.Amount{Minor: 200, Currency: "USD"}},
		}
		importRecord(bs, "pay_mismatch", 100)
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		Eventually(func() hooksv1alpha1.SettlementState {
			got := &hooksv1alpha1.BillingSettlement{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)).To(Succeed())
			return got.Status.State
		}).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))

		sendOK(ns, "msg_q", jobEvent("job-q", 1, 1))
		Expect(send(ns, "msg_q", jobEvent("job-q", 1, 2)).Status).To(Equal(http.StatusConflict))

		d := finding(ns, hooksv1alpha1.DiscrepancyProviderRecordWithoutSettlement, func(d hooksv1alpha1.Discrepancy) bool {
			return d.ProviderRef == "pay_stranger"
		})
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairManualReview))
		d = finding(ns, hooksv1alpha1.DiscrepancyAmountMismatch, func(d hooksv1alpha1.Discrepancy) bool {
			return d.ProviderRef == "pay_mismatch"
		})
		Expect(d.Message).To(ContainSubstring("amount.minor differs"))
		Expect(d.Message).NotTo(ContainSubstring("100 USD"), "another record's amount is never copied")
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairManualReview))
		d = finding(ns, hooksv1alpha1.DiscrepancyEventQuarantined, func(hooksv1alpha1.Discrepancy) bool { return true })
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairManualReview))

		var l hooksv1alpha1.ReconciliationReportList
		Eventually(func() int {
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			return len(l.Items)
		}).WithTimeout(20*time.Second).Should(Equal(3), "older reports are pruned to keepReports")
		for _, rr := range l.Items {
			Expect(rr.Labels).To(HaveKeyWithValue(hooksv1alpha1.LabelBillingProvider, "billing"))
		}
		families, err := crmetrics.Registry.Gather()
		Expect(err).NotTo(HaveOccurred())
		var counted bool
		for _, f := range families {
			if f.GetName() == "settlement_reconciliation_discrepancies_total" {
				for _, m := range f.GetMetric() {
					if m.GetCounter().GetValue() > 0 {
						counted = true
					}
				}
			}
		}
		Expect(counted).To(BeTrue())
	})

	It("asks the provider about a settlement stuck Submitted and re-dispatches a stale event", func() {
		ns := reconcilingTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[0].JobCompletion.Sink = &hooksv1alpha1.JobSink{
				Type: hooksv1alpha1.JobSinkHTTP, URL: sink.URL(), AllowInsecureHTTP: true, DeferDeadline: &metav1.Duration{Duration: 10 * time.Minute}}
		})
		Expect(billing.SetDown(true)).To(Succeed())
		downed := true
		defer func() {
			if downed {
				_ = billing.SetDown(false)
			}
		}()
		sendOK(ns, "msg_stuck", jobEvent("job-stuck", 1, 1))
		d := finding(ns, hooksv1alpha1.DiscrepancySettlementStuck, func(hooksv1alpha1.Discrepancy) bool { return true })
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairAuthoritativeQuery))
		Expect(d.CarriedOut).To(BeTrue())
		d = finding(ns, hooksv1alpha1.DiscrepancyEventNotComplete, func(hooksv1alpha1.Discrepancy) bool { return true })
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairAutoRetry))
		Expect(d.CarriedOut).To(BeTrue())
		// A pass while the provider is down still reports the local findings and says
		// what it could not compare.
		Eventually(func() bool {
			var l hooksv1alpha1.ReconciliationReportList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			for _, rr := range l.Items {
				if rr.Status.Phase == hooksv1alpha1.ReportFailed && rr.Status.Discrepancies > 0 {
					return true
				}
			}
			return false
		}).Should(BeTrue())

		Expect(billing.SetDown(false)).To(Succeed())
		downed = false
		sink.Register("job-stuck")
		Eventually(settlementState(ns, "job-stuck")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Eventually(eventPhase(ns, "msg_stuck")).WithTimeout(time.Minute).Should(Equal(hooksv1alpha1.EventComplete))
		Expect(billing.Charges(key(ns, "job-stuck"))).To(Equal(1))
	})
})

var _ = Describe("retention (docs/design.md §8)", func() {
	It("deletes complete events after the provider's retention and never touches records", func() {
		ns := newTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			// Longer than the suite's 10s re-check of a Ready WebhookProvider, which is
			// when it shows the next sweep.
			wp.Spec.Retention = &hooksv1alpha1.RetentionSpec{
				Events: &metav1.Duration{Duration: 15 * time.Second}, ProviderRetryWindow: &metav1.Duration{Duration: time.Second}}
		})
		sendOK(ns, "msg_old", jobEvent("job-old", 1, 1))
		Eventually(eventPhase(ns, "msg_old")).Should(Equal(hooksv1alpha1.EventComplete))
		ev := event(ns, "msg_old")
		Expect(ev.Status.DeleteAfter).NotTo(BeNil())
		Expect(ev.Status.DeleteAfter.Time).To(BeTemporally("~", ev.Spec.ReceivedAt.Add(15*time.Second), time.Second))
		Eventually(func() *metav1.Time {
			wp := &hooksv1alpha1.WebhookProvider{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, wp)).To(Succeed())
			return wp.Status.NextRetentionSweep
		}).ShouldNot(BeNil())

		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(ev), &hooksv1alpha1.WebhookEvent{}))
		}).Should(BeTrue())
		Expect(settlementOf(ns, "job-old").Status.State).To(Equal(hooksv1alpha1.SettlementSettled))
		Expect(jobOf(ns, "job-old").Progress().State).To(Equal(hooksv1alpha1.JobCompletionApplied))

		// A late redelivery after retention is a new receipt, but charges nothing new.
		// It has the same name as the expired receipt, so it links to the same
		// records: no new job transition, no new charge.
		sendOK(ns, "msg_old", jobEvent("job-old", 1, 1))
		Consistently(func() int64 { return jobOf(ns, "job-old").Generation }).WithTimeout(2 * time.Second).Should(Equal(int64(1)))
		Expect(billing.Charges(key(ns, "job-old"))).To(Equal(1))
	})

	It("keeps events that are not complete", func() {
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Retention = &hooksv1alpha1.RetentionSpec{
				Events: &metav1.Duration{Duration: 2 * time.Second}, ProviderRetryWindow: &metav1.Duration{Duration: time.Second}}
			bp.Spec.CredentialsSecretRef.Name = "missing-token" // settlements wait: events stay incomplete
		})
		sendOK(ns, "msg_waiting", jobEvent("job-waiting", 1, 1))
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", "msg_waiting")},
				&hooksv1alpha1.WebhookEvent{})
		}).WithTimeout(5 * time.Second).Should(Succeed())
		Expect(event(ns, "msg_waiting").Status.Phase).NotTo(Equal(hooksv1alpha1.EventComplete))
		Expect(fmt.Sprint(event(ns, "msg_waiting").Status.DeleteAfter)).To(Equal("<nil>"))
	})
})
