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
	billingapi "github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// A provider whose list since the mark is longer than one pass may walk (more records
// than maxListPages pages) used to be walked from the same start by every pass: the
// mark never advanced, and every settlement past the cut was confirmed by a lookup of
// its own, one GET per settlement per pass. The 15,000-event archive bench hit it at
// 10 events/s (5,000 records per pass, a 15-minute overlap: 9,000).
var _ = Describe("a provider list longer than one pass may walk (docs/design.md §7)", Ordered, func() {
	BeforeAll(func() {
		mgr.stop()
		mgr = startManager(managerOptions{maxListPages: 2})
	})
	AfterAll(func() {
		mgr.stop()
		mgr = startManager()
	})

	It("goes on where the last pass stopped, confirms settlements from the list, and advances the mark", func() {
		// Another namespace's records fill the shared ledger beyond two pages, whatever
		// earlier specs left there.
		for i := range 300 {
			sk := identity.JobSettlementKey("walk-elsewhere", "inference", fmt.Sprintf("job-%d", i))
			Expect(billing.Import(billingapi.Record{ID: fmt.Sprintf("pay_walk_%d", i), Status: billingapi.StatusSettled,
				SettlementKey: sk, IdempotencyKey: identity.IdempotencyKey(sk), Customer: "cus_elsewhere",
				Type: billingapi.TypeCharge, Amount: &billingapi.Amount{Minor: 1, Currency: "USD"}, CreatedAt: time.Now()})).To(Succeed())
		}
		ns := reconcilingTenant()
		jobs := []string{"job-walk-1", "job-walk-2", "job-walk-3"}
		for i, job := range jobs {
			sendOK(ns, fmt.Sprintf("msg_walk_%d", i), jobEvent(job, 1, 3))
		}
		gets := func(job string) int {
			n := 0
			for _, c := range billing.CallsFor(settlementOf(ns, job).Spec.IdempotencyKey) {
				if c.Method == http.MethodGet {
					n++
				}
			}
			return n
		}
		before := map[string]int{}
		for _, job := range jobs {
			Eventually(settlementState(ns, job)).Should(Equal(hooksv1alpha1.SettlementSettled))
			// A pass that lists the record in the moment between the provider's answer
			// and the settlement's Settled status asks the settlement to look itself up:
			// those GETs are not the walk's.
			before[job] = gets(job)
		}

		Eventually(func() *metav1.Time {
			bp := &hooksv1alpha1.BillingProvider{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "billing"}, bp)).To(Succeed())
			return bp.Status.ProviderListedUntil
		}).WithTimeout(time.Minute).ShouldNot(BeNil(), "a walk cut by the page limit is finished by the next passes")
		for _, job := range jobs {
			Eventually(func() metav1.ConditionStatus {
				c := condition(settlementOf(ns, job).Status.Conditions, hooksv1alpha1.ConditionReconciled)
				if c == nil {
					return ""
				}
				return c.Status
			}).WithTimeout(time.Minute).Should(Equal(metav1.ConditionTrue), job)
			Expect(gets(job)).To(Equal(before[job]), "%s is confirmed from the list, not looked up one by one", job)
			Expect(posts(billing.CallsFor(settlementOf(ns, job).Spec.IdempotencyKey))).To(Equal(1), job)
		}
	})
})
