package integration_test

import (
	"fmt"
	"net/http"
	"sort"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
)

// Metronome lists no events by time: a pass confirms each settled charge by an events
// search of its own, and Metronome rate limits that search heavily. A rate-limited
// search used to fail the whole pass, and every pass searched every settled charge of
// its window again, so at volume nothing was ever confirmed (docs/design.md §7,
// "Lookups by key").

// lookupReports are the ns's reconciliation reports, oldest first.
func lookupReports(ns string) []hooksv1alpha1.ReconciliationReport {
	GinkgoHelper()
	var l hooksv1alpha1.ReconciliationReportList
	Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Spec.WindowEnd.Before(&l.Items[j].Spec.WindowEnd) })
	return l.Items
}

// reconciledTrue says whether bs carries Reconciled=True.
func reconciledTrue(bs *hooksv1alpha1.BillingSettlement) func() bool {
	return func() bool {
		c := condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled)
		return c != nil && c.Status == metav1.ConditionTrue
	}
}

// settleMetronomeJobs sends one completion per job after the tenant's first pass, and
// returns the settlements, oldest settled first.
func settleMetronomeJobs(ns string, jobs ...string) []*hooksv1alpha1.BillingSettlement {
	GinkgoHelper()
	Eventually(func() int { return len(lookupReports(ns)) }).WithTimeout(30*time.Second).Should(BeNumerically(">=", 1),
		"the first pass, which has nothing to ask")
	for i, job := range jobs {
		sendOK(ns, fmt.Sprintf("msg_%s", job), fmt.Sprintf(`{"type":"job.completed","data":{"job_id":%q,"version":1,"state":"succeeded","customer":"cus_%s","tokens":%d,"completed_at":%q}}`,
			job, job, 10+i, time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)))
	}
	var out []*hooksv1alpha1.BillingSettlement
	for _, job := range jobs {
		Eventually(settlementState(ns, job)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		out = append(out, settlementOf(ns, job))
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Status.SettledAt.Equal(out[j].Status.SettledAt) {
			return out[i].Status.SettledAt.Before(out[j].Status.SettledAt)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// noneUnknown checks that no report of ns calls a settlement unknown to the provider.
func noneUnknown(ns string) {
	GinkgoHelper()
	for _, rr := range lookupReports(ns) {
		for _, c := range rr.Status.ByType {
			Expect(c.Type).NotTo(Equal(hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown), "%s: a settlement not asked is not unknown", rr.Name)
		}
	}
}

var _ = Describe("lookups by key in a reconciliation pass (docs/design.md §7)", func() {
	It("stops a pass's searches at a 429 without failing it, asks the rest after Retry-After, and never asks a confirmed one again", func() {
		fake, err := fakemetronome.Start(fakemetronome.Options{RetryAfter: time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
		const interval = 8 * time.Second
		ns := metronomeTenant(fake, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{Interval: &metav1.Duration{Duration: interval}}
		})
		fake.FailSearchAfter(1, http.StatusTooManyRequests, 1) // the second search of the pass that asks them
		settled := settleMetronomeJobs(ns, "job-limit-a", "job-limit-b", "job-limit-c")

		// The pass that met the 429: completed, one confirmed, two waiting.
		var limited hooksv1alpha1.ReconciliationReport
		Eventually(func() int32 {
			for _, rr := range lookupReports(ns) {
				if rr.Status.Examined["SettlementLookupDeferred"] > 0 {
					limited = rr
					return rr.Status.Examined["SettlementLookupDeferred"]
				}
			}
			return 0
		}).WithTimeout(time.Minute).Should(Equal(int32(2)))
		Expect(limited.Status.Phase).To(Equal(hooksv1alpha1.ReportCompleted), "a rate-limited search does not fail the pass")
		Expect(limited.Status.Examined).To(HaveKeyWithValue("SettlementLookedUp", int32(1)))
		Expect(condition(limited.Status.Conditions, hooksv1alpha1.ConditionReady).Message).To(ContainSubstring("2 lookups wait"))
		oldest := get(settled[0])
		Expect(reconciledTrue(oldest)()).To(BeTrue(), "the oldest settled is asked first")
		Expect(oldest.Status.LastReconciledAt.Time).To(BeTemporally("==", limited.Spec.WindowEnd.Time))
		for _, bs := range settled[1:] {
			Expect(reconciledTrue(bs)()).To(BeFalse(), "%s was not asked: it stays unconfirmed", bs.Name)
		}

		// The next pass comes after Retry-After, not the interval, and asks only those two.
		for _, bs := range settled {
			Eventually(reconciledTrue(bs)).WithTimeout(30*time.Second).Should(BeTrue(), bs.Name)
		}
		// A report is created when its pass starts and written when it ends.
		completedAfter := func(after hooksv1alpha1.ReconciliationReport) func() hooksv1alpha1.ReconciliationReport {
			return func() hooksv1alpha1.ReconciliationReport {
				for _, rr := range lookupReports(ns) {
					if rr.Spec.WindowEnd.After(after.Spec.WindowEnd.Time) {
						return rr
					}
				}
				return hooksv1alpha1.ReconciliationReport{}
			}
		}
		var next hooksv1alpha1.ReconciliationReport
		Eventually(completedAfter(limited)).WithTimeout(30 * time.Second).Should(HaveField("Status.Phase", hooksv1alpha1.ReportCompleted))
		next = completedAfter(limited)()
		Expect(next.Spec.WindowEnd.Sub(limited.Status.CompletedAt.Time)).To(BeNumerically("<", interval/2),
			"requeued after Metronome's Retry-After (1s)")
		Expect(next.Status.Examined).To(SatisfyAll(HaveKeyWithValue("SettlementLookedUp", int32(2)),
			HaveKeyWithValue("SettlementAlreadyConfirmed", int32(1)), Not(HaveKey("SettlementLookupDeferred"))))

		// A pass after them asks nothing: each charge was searched once in all.
		Eventually(completedAfter(next)).WithTimeout(30 * time.Second).Should(HaveField("Status.Phase", hooksv1alpha1.ReportCompleted))
		Expect(completedAfter(next)().Status.Examined).To(SatisfyAll(HaveKeyWithValue("SettlementAlreadyConfirmed", int32(3)),
			Not(HaveKey("SettlementLookedUp"))))
		for _, bs := range settled {
			Expect(fake.SearchesFor(bs.Spec.IdempotencyKey)).To(Equal(1), "%s is asked once overall", bs.Name)
		}
		Expect(fake.Searches()).To(Equal(4), "three answered searches and the refused one")
		noneUnknown(ns)
	})
})

var _ = Describe("a pass's lookup budget (docs/design.md §7)", Ordered, func() {
	BeforeAll(func() {
		mgr.stop()
		mgr = startManager(managerOptions{maxLookups: 2})
	})
	AfterAll(func() {
		mgr.stop()
		mgr = startManager()
	})

	It("asks at most the budget per pass; the rest wait, oldest first, for the next pass, even past the window's overlap", func() {
		fake, err := fakemetronome.Start(fakemetronome.Options{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
		// An overlap of 1s: the one that waits settled before the next pass's window
		// would start, were the mark not held back for it.
		ns := metronomeTenant(fake, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{Interval: &metav1.Duration{Duration: 5 * time.Second},
				StuckAfter: &metav1.Duration{Duration: time.Second}}
		})
		settled := settleMetronomeJobs(ns, "job-budget-a", "job-budget-b", "job-budget-c")

		var cut hooksv1alpha1.ReconciliationReport
		Eventually(func() bool {
			for _, rr := range lookupReports(ns) {
				if rr.Status.Examined["SettlementLookupDeferred"] > 0 {
					cut = rr
					return true
				}
			}
			return false
		}).WithTimeout(time.Minute).Should(BeTrue())
		Expect(cut.Status.Phase).To(Equal(hooksv1alpha1.ReportCompleted))
		Expect(cut.Status.Examined).To(SatisfyAll(HaveKeyWithValue("SettlementLookedUp", int32(2)),
			HaveKeyWithValue("SettlementLookupDeferred", int32(1))))
		newest := settled[len(settled)-1]
		Expect(reconciledTrue(newest)()).To(BeFalse(), "the newest waits; the two oldest were asked")
		for _, bs := range settled[:2] {
			Expect(reconciledTrue(bs)()).To(BeTrue(), bs.Name)
		}
		Eventually(reconciledTrue(newest)).WithTimeout(30 * time.Second).Should(BeTrue())
		for _, bs := range settled {
			Expect(fake.SearchesFor(bs.Spec.IdempotencyKey)).To(Equal(1), bs.Name)
		}
		noneUnknown(ns)
	})
})

// With the archive on, a pass confirms in its report, not on the settlement: the next
// pass reads that confirmation and does not ask again.
var _ = Describe("lookups by key with the archive on (docs/design.md §7, §12)", Ordered, func() {
	var (
		pg    *pgtest.Server
		store *archive.Store
	)
	BeforeAll(func() {
		pg, store = startArchive()
		mgr.stop()
		// Archived an hour after they are confirmed: they stay for the passes to see.
		mgr = startManager(managerOptions{store: store, archiveAfter: time.Hour})
	})
	AfterAll(func() { backToTheManagerWithoutArchive(store, pg) })

	It("does not ask again about a settlement a kept report confirmed at its current version", func() {
		fake, err := fakemetronome.Start(fakemetronome.Options{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
		ns := metronomeTenant(fake, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{Interval: &metav1.Duration{Duration: 3 * time.Second}}
		})
		settled := settleMetronomeJobs(ns, "job-kept-a", "job-kept-b")
		var confirmedIn string
		Eventually(func() string {
			for _, rr := range lookupReports(ns) {
				var versions []string
				if c := rr.Status.Confirmed; c != nil {
					for _, g := range c.ByReason {
						versions = append(versions, g.Settlements...)
					}
				}
				if len(versions) > 0 {
					Expect(versions).To(ConsistOf(confirmation.Version(get(settled[0])), confirmation.Version(get(settled[1]))),
						"one pass confirms both, at their current versions")
					confirmedIn = rr.Name
				}
			}
			return confirmedIn
		}).WithTimeout(time.Minute).ShouldNot(BeEmpty())
		// Two passes later: both counted as already confirmed, neither asked again.
		Eventually(func() int {
			n := 0
			for _, rr := range lookupReports(ns) {
				if rr.Name > confirmedIn && rr.Status.Examined["SettlementAlreadyConfirmed"] == 2 {
					n++
				}
			}
			return n
		}).WithTimeout(time.Minute).Should(BeNumerically(">=", 2))
		for _, bs := range settled {
			Expect(reconciledTrue(bs)()).To(BeFalse(), "%s is confirmed in the report, not on itself", bs.Name)
			Expect(fake.SearchesFor(bs.Spec.IdempotencyKey)).To(Equal(1), "%s is asked once", bs.Name)
		}
		noneUnknown(ns)
	})
})
