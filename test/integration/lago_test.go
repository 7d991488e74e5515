package integration_test

import (
	"encoding/json"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakelago"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// A job settled end to end through the whole operator with a Lago BillingProvider
// against the Lago fake (test/fakelago: Lago's default event pipeline), after
// duplicate deliveries and an event Lago stored whose reply never came: one event in
// Lago's books, confirmed by the reconciliation pass from Lago's listing.
var _ = Describe("a Lago billing provider", func() {
	lagoTenant := func(fake *fakelago.Server, mutate func(*hooksv1alpha1.BillingProvider)) string {
		GinkgoHelper()
		return newTenantWithToken(fakelago.DefaultAPIKey, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			lago, _ := fake.Provider()
			bp.Spec.Type, bp.Spec.Endpoint, bp.Spec.Lago = hooksv1alpha1.BillingProviderLago, fake.URL(), lago.Spec.Lago
			bp.Spec.RequestTimeout = fixtures.Duration(time.Second)
			mutate(bp)
		})
	}

	It("sends usage as one event under the settlement's key, whatever the deliveries and lost replies", func() {
		fake, err := fakelago.Start(fakelago.Options{HangFor: 5 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
		ns := lagoTenant(fake, func(bp *hooksv1alpha1.BillingProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second}}
		})

		// Lago stores the first event and the reply is lost past the request timeout.
		fake.Fail(adaptercontract.CommitThenTimeout, 1)
		sendOK(ns, "msg_lago_1", jobEvent("job-lago", 1, 1523))
		Expect(send(ns, "msg_lago_1", jobEvent("job-lago", 1, 1523)).Status).To(Equal(http.StatusOK), "a duplicate delivery")
		sendOK(ns, "msg_lago_2", jobEvent("job-lago", 1, 1523)) // the same job under another message id
		Eventually(settlementState(ns, "job-lago")).WithTimeout(60 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))

		bs := settlementOf(ns, "job-lago")
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1))
		events := fake.Events()
		Expect(events).To(HaveLen(1))
		Expect(events[0]).To(SatisfyAll(HaveField("TransactionID", bs.Spec.IdempotencyKey),
			HaveField("ExternalSubscriptionID", "cus_job-lago"), HaveField("Code", "llm_tokens")))
		Expect(string(events[0].Properties["tokens"])).To(Equal("1523"))
		Expect(bs.Status.ProviderRef).To(Equal(events[0].LagoID))
		Expect(fake.Requests()).To(ContainElement(SatisfyAll(HaveField("Method", http.MethodPost),
			HaveField("TransactionID", bs.Spec.IdempotencyKey), HaveField("Status", 0))), "the first reply was lost")

		// The pass lists Lago's events and confirms the settlement from what Lago holds.
		Eventually(func() string {
			if c := condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled); c != nil && c.Status == metav1.ConditionTrue {
				return c.Reason
			}
			return ""
		}).WithTimeout(60 * time.Second).Should(Equal(hooksv1alpha1.ReasonConfirmedByProvider))
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1), "the pass sent nothing")
	})

	It("never adopts another event Lago holds under the settlement's key: the 422 proves only that one exists", func() {
		fake, err := fakelago.Start(fakelago.Options{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
		ns := lagoTenant(fake, func(*hooksv1alpha1.BillingProvider) {})
		key := identity.NamespacedIdempotencyKey(ns, identity.JobSettlementKey(ns, "inference", "job-lago-held"))
		// Someone else's event under the key the operator will send, for the same
		// subscription, with another quantity.
		fake.Store(fakelago.Event{TransactionID: key, ExternalSubscriptionID: "cus_job-lago-held", Code: "llm_tokens",
			Properties: map[string]json.RawMessage{"tokens": json.RawMessage("9")}, Timestamp: time.Now()})

		sendOK(ns, "msg_lago_held", jobEvent("job-lago-held", 1, 1523))
		Eventually(settlementState(ns, "job-lago-held")).WithTimeout(60 * time.Second).
			Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		bs := settlementOf(ns, "job-lago-held")
		Expect(bs.Spec.IdempotencyKey).To(Equal(key))
		Expect(condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady).Reason).To(Equal(hooksv1alpha1.ReasonMismatchWithProvider))
		Expect(fake.Events()).To(HaveLen(1), "Lago ignored the operator's event; nothing else was stored")
		Consistently(func() int { return len(fake.Events()) }).WithTimeout(3 * time.Second).Should(Equal(1))
	})
})

// The same, for an organization on Lago's ClickHouse pipeline (test/fakelago with
// Pipeline ClickHouse): events are ingested asynchronously, a lookup's "not found"
// proves nothing, and a reused transaction_id is stored and billed again — so a lost
// answer is never resent, and is settled only once Lago shows the event.
var _ = Describe("a Lago billing provider on the ClickHouse pipeline", func() {
	clickHouseTenant := func(fake *fakelago.Server, mutate ...func(*hooksv1alpha1.BillingProvider)) string {
		GinkgoHelper()
		return newTenantWithToken(fakelago.DefaultAPIKey, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			lago, _ := fake.Provider()
			bp.Spec.Type, bp.Spec.Endpoint, bp.Spec.Lago = hooksv1alpha1.BillingProviderLago, fake.URL(), lago.Spec.Lago
			bp.Spec.RequestTimeout = fixtures.Duration(time.Second)
			Expect(bp.Spec.Lago.EventPipeline).To(Equal(hooksv1alpha1.LagoPipelineClickHouse))
			for _, m := range mutate {
				m(bp)
			}
		})
	}
	startClickHouse := func() *fakelago.Server {
		GinkgoHelper()
		fake, err := fakelago.Start(fakelago.Options{HangFor: 5 * time.Second, Pipeline: fakelago.ClickHouse})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
		return fake
	}
	posts := func(fake *fakelago.Server, key string) int {
		n := 0
		for _, r := range fake.Requests() {
			if r.Method == http.MethodPost && r.TransactionID == key {
				n++
			}
		}
		return n
	}
	lookedUp := func(fake *fakelago.Server, key string, status int) bool {
		for _, r := range fake.Requests() {
			if r.Method == http.MethodGet && r.Path == fakelago.EscapedEventPath(key) && r.Status == status {
				return true
			}
		}
		return false
	}

	It("finds an event whose answer was lost once Lago has ingested it, and adopts it: one event, never resent", func() {
		fake := startClickHouse()
		ns := clickHouseTenant(fake, func(bp *hooksv1alpha1.BillingProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second}}
		})
		// Lago takes the event onto Kafka, the reply is lost, and ClickHouse ingests it
		// only seconds later: the first lookup finds nothing, which proves nothing.
		fake.SetIngestDelay(5 * time.Second)
		fake.Fail(adaptercontract.CommitThenTimeout, 1)
		sendOK(ns, "msg_lago_ch_hang", jobEvent("job-lago-ch-hang", 1, 77))
		Expect(send(ns, "msg_lago_ch_hang", jobEvent("job-lago-ch-hang", 1, 77)).Status).To(Equal(http.StatusOK), "a duplicate delivery")
		sendOK(ns, "msg_lago_ch_hang_2", jobEvent("job-lago-ch-hang", 1, 77)) // the same job under another message id
		Eventually(settlementState(ns, "job-lago-ch-hang")).WithTimeout(90 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-lago-ch-hang")
		key := bs.Spec.IdempotencyKey
		Expect(bs.Status.Attempts).To(Equal(int32(1)), "found by the lookup, never sent again")
		Expect(posts(fake, key)).To(Equal(1), "one POST: the lost answer was asked about, not resent")
		Expect(lookedUp(fake, key, http.StatusNotFound)).To(BeTrue(), "a lookup before the ingest found nothing, and nothing was resent on it")
		Expect(lookedUp(fake, key, http.StatusOK)).To(BeTrue(), "the lookup after the ingest found it")
		Expect(bs.Status.ProviderRef).To(Equal("event:"+key), "ClickHouse keeps no Lago id: the event is named by its transaction_id")
		Expect(fake.Effects(key)).To(Equal(1))
		Expect(fake.Events()).To(ConsistOf(SatisfyAll(HaveField("TransactionID", key),
			HaveField("ExternalSubscriptionID", "cus_job-lago-ch-hang"), HaveField("Code", "llm_tokens"))))
		// The pass lists the ingested event (no Lago id: named by its transaction_id) and
		// confirms the settlement from it.
		Eventually(func() string {
			if c := condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled); c != nil && c.Status == metav1.ConditionTrue {
				return c.Reason
			}
			return ""
		}).WithTimeout(60 * time.Second).Should(Equal(hooksv1alpha1.ReasonConfirmedByProvider))
		Expect(fake.Effects(key)).To(Equal(1), "the pass sent nothing")
		Expect(posts(fake, key)).To(Equal(1))
	})

	It("waits in RequiresReconciliation while Lago does not show a lost event, never resending; adopts it once ingested", func() {
		fake := startClickHouse()
		ns := clickHouseTenant(fake)
		fake.SetIngestDelay(time.Hour) // Lago has taken it onto Kafka, ClickHouse has not ingested it yet
		fake.Fail(adaptercontract.CommitThenTimeout, 1)
		sendOK(ns, "msg_lago_ch_unseen", jobEvent("job-lago-ch-unseen", 1, 42))
		Eventually(settlementState(ns, "job-lago-ch-unseen")).WithTimeout(120 * time.Second).
			Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		bs := settlementOf(ns, "job-lago-ch-unseen")
		key := bs.Spec.IdempotencyKey
		ready := condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady)
		Expect(ready.Reason).To(Equal(hooksv1alpha1.ReasonNotDeduplicated))
		Expect(ready.Message).To(SatisfyAll(ContainSubstring("never sends it again"), ContainSubstring(key),
			ContainSubstring("/api/v1/events/"+key), ContainSubstring("cus_job-lago-ch-unseen"), Not(ContainSubstring("listing"))),
			"it says which event to look for, and where; Lago was asked by key, not by a listing")
		Expect(bs.Status.Attempts).To(Equal(int32(1)))
		Expect(lookedUp(fake, key, http.StatusNotFound)).To(BeTrue(), "Lago was asked by key, and did not show it")
		Consistently(func() int { return fake.Effects(key) }).WithTimeout(5*time.Second).Should(Equal(1),
			"one event in Lago's books, never two")
		Expect(posts(fake, key)).To(Equal(1))

		// ClickHouse ingests it; a reconcile request looks it up again and adopts it.
		fake.IngestNow()
		got := &hooksv1alpha1.BillingSettlement{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)).To(Succeed())
		patch := client.MergeFrom(got.DeepCopy())
		metav1.SetMetaDataAnnotation(&got.ObjectMeta, hooksv1alpha1.AnnotationReconcileRequest, "ingested-now")
		Expect(k8s.Patch(ctx, got, patch)).To(Succeed())
		Eventually(settlementState(ns, "job-lago-ch-unseen")).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		settled := settlementOf(ns, "job-lago-ch-unseen")
		Expect(settled.Status.ProviderRef).To(Equal("event:" + key))
		Expect(settled.Status.Attempts).To(Equal(int32(1)))
		Expect(fake.Effects(key)).To(Equal(1))
		Expect(posts(fake, key)).To(Equal(1), "never resent, before or after the reconcile request")
	})

	It("does not report a settled charge while Lago has not ingested it yet: it waits, and is reported only once stuckAfter has passed", func() {
		fake := startClickHouse()
		ns := clickHouseTenant(fake, func(bp *hooksv1alpha1.BillingProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: 25 * time.Second}}
		})
		// Lago answers 200 at once and ClickHouse ingests the event an hour later: the
		// charge is settled on Lago's answer, and passes run while it is not visible.
		fake.SetIngestDelay(time.Hour)
		sendOK(ns, "msg_lago_ch_lag", jobEvent("job-lago-ch-lag", 1, 31))
		Eventually(settlementState(ns, "job-lago-ch-lag")).WithTimeout(60 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-lago-ch-lag")
		settledAt := bs.Status.SettledAt.Time
		reportsAbout := func() (waiting int32, reported []string) {
			var l hooksv1alpha1.ReconciliationReportList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			for _, rr := range l.Items {
				waiting += rr.Status.Examined["SettlementNotYetVisible"]
				for _, d := range rr.Status.Items {
					if d.Object == "BillingSettlement/"+bs.Name {
						reported = append(reported, rr.CreationTimestamp.Format(time.RFC3339)+" "+d.Message)
					}
				}
			}
			return waiting, reported
		}
		// Inside stuckAfter: passes report nothing, and count it as not visible yet.
		for time.Since(settledAt) < 15*time.Second {
			_, reported := reportsAbout()
			Expect(reported).To(BeEmpty(), "a charge Lago has not ingested yet is not a discrepancy inside stuckAfter")
			time.Sleep(time.Second)
		}
		Expect(reportsAbout()).To(BeNumerically(">=", 2), "passes ran while Lago had not ingested it, and counted it")
		Expect(get(bs).Status.Conditions).NotTo(ContainElement(SatisfyAll(HaveField("Type", hooksv1alpha1.ConditionReconciled),
			HaveField("Status", metav1.ConditionTrue))), "not confirmed either: the archiver keeps it")

		// Past stuckAfter it is reported, saying it was never seen.
		d := finding(ns, hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown, func(d hooksv1alpha1.Discrepancy) bool {
			return d.Object == "BillingSettlement/"+bs.Name
		})
		Expect(d.Message).To(ContainSubstring("not visible"))
		Expect(fake.Effects(bs.Spec.IdempotencyKey)).To(Equal(1), "nothing was sent by the passes")
	})
})
