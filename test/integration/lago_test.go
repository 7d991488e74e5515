package integration_test

import (
	"encoding/json"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
