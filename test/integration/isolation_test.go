package integration_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// startTarpit starts a billing provider that never answers, held until the spec ends.
func startTarpit() *fakebilling.Tarpit {
	GinkgoHelper()
	t, err := fakebilling.StartTarpit()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(t.Close)
	return t
}

// settledCount counts the settled settlements of a tenant's jobs job-0..job-(n-1).
func settledCount(ns string, n int) func() int {
	return func() int {
		settled := 0
		for i := range n {
			if settlementState(ns, fmt.Sprintf("job-%d", i))() == hooksv1alpha1.SettlementSettled {
				settled++
			}
		}
		return settled
	}
}

// A provider that accepts connections and never answers used to hold every
// settlement worker (each call lasts its requestTimeout, and its settlements were
// retried as fast as any other) and the BillingProvider controller's pass: another
// tenant's charges, whose provider answers at once, waited until the tarpit closed,
// and the tarpit's BillingProvider never said why.
var _ = Describe("a billing provider that never answers (docs/design.md §5.4)", Ordered, func() {
	const workers, tarpitCharges, charges = 4, 8, 10
	BeforeAll(func() {
		mgr.stop()
		mgr = startManager(managerOptions{settlementWorkers: workers})
	})
	AfterAll(func() {
		mgr.stop()
		mgr = startManager()
	})

	It("delays no other tenant's charges, and its BillingProvider says it does not answer", func() {
		pit := startTarpit()
		slow := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Name = fixtures.BillingProviderName
			bp.Spec.Endpoint = pit.URL()
			bp.Spec.RequestTimeout = fixtures.Duration(time.Minute) // the most a provider may take
		})
		for i := range tarpitCharges {
			sendOK(slow, fmt.Sprintf("msg_pit_%d", i), jobEvent(fmt.Sprintf("job-%d", i), 1, 100))
		}
		// The tarpit's settlements are being sent: calls that last a minute each.
		Eventually(func() int {
			sent := 0
			for i := range tarpitCharges {
				if settlementState(slow, fmt.Sprintf("job-%d", i))() == hooksv1alpha1.SettlementSubmitted {
					sent++
				}
			}
			return sent
		}).Should(BeNumerically(">=", 1))

		ns := newTenant()
		for i := range charges {
			sendOK(ns, fmt.Sprintf("msg_%d", i), jobEvent(fmt.Sprintf("job-%d", i), 1, 100))
		}
		// Alone, these settle in about a second; a tarpit's minute-long calls must
		// not stand in their way.
		Eventually(settledCount(ns, charges)).WithTimeout(30*time.Second).Should(Equal(charges),
			"the other tenant's charges settle while the tarpit holds its calls")
		for i := range charges {
			Expect(billing.Charges(key(ns, fmt.Sprintf("job-%d", i)))).To(Equal(1))
		}
		// The tarpit's settlements take turns for its share of the workers (1 of 4):
		// one call at a time, a minute each, so within the first two minutes at most
		// two were sent. The others wait exactly as they were: no attempt, no bracket.
		sent := 0
		for i := range tarpitCharges {
			bs := settlementOf(slow, fmt.Sprintf("job-%d", i))
			if bs.Status.Attempts > 0 {
				sent++
				continue
			}
			Expect(bs.Status.FirstSubmittedAt).To(BeNil(), "a waiting settlement wrote no bracket")
			Expect(bs.Status.Exposure).NotTo(Equal(hooksv1alpha1.ExposurePossible), "a waiting settlement wrote no bracket")
			Expect(bs.Status.State).To(Equal(hooksv1alpha1.SettlementPending))
		}
		Expect(sent).To(BeNumerically("<=", 2), "the tarpit's settlements hold one worker at a time")

		Eventually(billingProviderCondition(slow, hooksv1alpha1.ConditionReady)).WithTimeout(2 * time.Minute).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", hooksv1alpha1.ReasonProviderNotAnswering),
			HaveField("Message", ContainSubstring("1m0s"))))
		Expect(billingProviderCondition(slow, hooksv1alpha1.ConditionProviderHealthy)()).To(
			HaveField("Reason", hooksv1alpha1.ReasonProviderNotAnswering))
		Expect(settledCount(slow, tarpitCharges)()).To(BeZero(), "nothing the tarpit never answered is settled")
	})
})
