package integration_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing/openmeterbilling"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakeopenmeter"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// startFakeOpenMeter starts an OpenMeter fake deduplicating for dedup (0: not at all,
// a self-hosted install's default), closed when the spec ends.
func startFakeOpenMeter(dedup time.Duration) *fakeopenmeter.Server {
	GinkgoHelper()
	fake, err := fakeopenmeter.Start(fakeopenmeter.Options{Token: fakeopenmeter.Token, Deduplication: dedup})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(fake.Close)
	return fake
}

// openMeterTenantOn makes a tenant whose BillingProvider is the fake's OpenMeter
// provider (usage meter tokens as events of type prompt.tokens).
func openMeterTenantOn(fake *fakeopenmeter.Server, mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
	GinkgoHelper()
	want, token := fake.Provider()
	return newTenantWithToken(token, append([]func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider){
		func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Type, bp.Spec.Endpoint, bp.Spec.AllowInsecureHTTP = want.Spec.Type, want.Spec.Endpoint, true
			bp.Spec.RequestTimeout = fixtures.Duration(time.Second)
			bp.Spec.OpenMeter = want.Spec.OpenMeter
		}}, mutate...)...)
}

// Settling a job end to end through the whole operator against the OpenMeter fake,
// where a resend is new usage unless the install deduplicates (docs/design.md §13,
// §14): one event in the fake's books whatever happens.
var _ = Describe("an OpenMeter billing provider", func() {
	It("reports usage as one event under the settlement's key, after duplicate deliveries; the pass confirms it by listing", func() {
		fake := startFakeOpenMeter(0)
		ns := openMeterTenantOn(fake, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second}}
		})
		for range 3 {
			sendOK(ns, "msg_om_usage", jobEvent("job-om", 1, 1523))
		}
		Eventually(settlementState(ns, "job-om")).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-om")
		Expect(bs.Status.ProviderRef).To(Equal(openmeterbilling.EventRef(bs.Spec.IdempotencyKey)))
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
		Expect(fake.Events()).To(ConsistOf(SatisfyAll(HaveField("Event.ID", bs.Spec.IdempotencyKey),
			HaveField("Event.Subject", "cus_job-om"), HaveField("Event.Type", fakeopenmeter.EventType))))
		Eventually(func() string {
			if c := condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled); c != nil && c.Status == metav1.ConditionTrue {
				return c.Reason
			}
			return ""
		}).WithTimeout(30*time.Second).Should(Equal(hooksv1alpha1.ReasonConfirmedByProvider), "the event is listed and matches field by field")
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1), "the pass sent nothing")
	})

	It("dates the event at the job's completion, and refuses one OpenMeter could no longer list", func() {
		fake := startFakeOpenMeter(0)
		ns := openMeterTenantOn(fake, func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[0].JobCompletion.CompletedAt = ".data.completed_at"
		})
		job := func(id string, at time.Time) {
			sendOK(ns, "msg_"+id, fmt.Sprintf(
				`{"type":"job.completed","data":{"job_id":%q,"version":1,"state":"succeeded","customer":"cus_%s","tokens":9,"completed_at":%q}}`,
				id, id, at.Format(time.RFC3339)))
		}
		at := time.Now().Add(-3 * time.Hour).UTC().Truncate(time.Second)
		job("job-om-dated", at)
		Eventually(settlementState(ns, "job-om-dated")).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-om-dated")
		Expect(fake.Events()).To(ContainElement(SatisfyAll(HaveField("Event.ID", bs.Spec.IdempotencyKey),
			HaveField("Event.Time", at.Format(time.RFC3339Nano)))), "dated at the job's completion, not at receipt")

		job("job-om-old", time.Now().Add(-40*24*time.Hour).UTC().Truncate(time.Second))
		Eventually(settlementState(ns, "job-om-old")).Should(Equal(hooksv1alpha1.SettlementFailed))
		old := settlementOf(ns, "job-om-old")
		Expect(condition(old.Status.Conditions, hooksv1alpha1.ConditionReady).Message).To(ContainSubstring("more than 32 days ago"))
		Expect(fake.Effects(old.Spec.IdempotencyKey)).To(BeZero(), "refused before anything was sent")
	})

	It("without deduplication, finds an event whose answer was lost by listing it, and adopts it: one event", func() {
		fake := startFakeOpenMeter(0)
		ns := openMeterTenantOn(fake)
		fake.Fail(adaptercontract.CommitThenTimeout, 1)
		sendOK(ns, "msg_om_hang", jobEvent("job-om-hang", 1, 77))
		Eventually(settlementState(ns, "job-om-hang")).WithTimeout(60 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-om-hang")
		Expect(bs.Status.Attempts).To(Equal(int32(1)), "found by the listing, never sent again")
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
	})

	It("without deduplication, waits in RequiresReconciliation when the listing does not show a lost event, never resending; adopts it once listed", func() {
		fake := startFakeOpenMeter(0)
		ns := openMeterTenantOn(fake)
		fake.SetListingDelay(time.Hour) // OpenMeter has accepted it, but not ingested it yet
		fake.Fail(adaptercontract.CommitThenTimeout, 1)
		sendOK(ns, "msg_om_unlisted", jobEvent("job-om-unlisted", 1, 42))
		Eventually(settlementState(ns, "job-om-unlisted")).WithTimeout(120 * time.Second).
			Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		bs := settlementOf(ns, "job-om-unlisted")
		ready := condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady)
		Expect(ready.Reason).To(Equal(hooksv1alpha1.ReasonNotDeduplicated))
		Expect(ready.Message).To(SatisfyAll(ContainSubstring("never sends it again"), ContainSubstring(bs.Spec.IdempotencyKey)))
		Expect(bs.Status.Attempts).To(Equal(int32(1)))
		Consistently(func() int { return fake.Effects(bs.Spec.IdempotencyKey) }).WithTimeout(5*time.Second).Should(Equal(1),
			"one event in OpenMeter's books, never two")

		// OpenMeter ingests it; a reconcile request lists it again and adopts it.
		fake.IngestNow()
		got := &hooksv1alpha1.BillingSettlement{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)).To(Succeed())
		patch := client.MergeFrom(got.DeepCopy())
		metav1.SetMetaDataAnnotation(&got.ObjectMeta, hooksv1alpha1.AnnotationReconcileRequest, "listed-now")
		Expect(k8s.Patch(ctx, got, patch)).To(Succeed())
		Eventually(settlementState(ns, "job-om-unlisted")).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(settlementOf(ns, "job-om-unlisted").Status.ProviderRef).To(Equal(openmeterbilling.EventRef(bs.Spec.IdempotencyKey)))
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
	})

	It("with deduplication, resends a lost event under the same id inside the window: OpenMeter drops the copy, one event", func() {
		fake := startFakeOpenMeter(time.Hour)
		ns := openMeterTenantOn(fake)
		fake.SetListingDelay(time.Hour)
		fake.Fail(adaptercontract.CommitThenTimeout, 1)
		sendOK(ns, "msg_om_dedup", jobEvent("job-om-dedup", 1, 9))
		Eventually(settlementState(ns, "job-om-dedup")).WithTimeout(60 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-om-dedup")
		Expect(bs.Status.Attempts).To(BeNumerically(">=", 2), "the lost answer was asked for by sending again")
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
	})
})
