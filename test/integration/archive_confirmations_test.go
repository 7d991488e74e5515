package integration_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// With the archive on, a reconciliation pass confirms settled settlements in its
// report, not on each settlement (docs/design.md §7, §12): the archiver takes a
// settlement confirmed there at exactly its current version, and writes the
// confirmation into the copy it archives.
var _ = Describe("confirmations in the report, with the archive on (docs/design.md §7, §12)", Ordered, func() {
	var (
		pg    *pgtest.Server
		store *archive.Store
	)
	BeforeAll(func() {
		pg, store = startArchive()
		mgr.stop()
		mgr = startManager(managerOptions{store: store, archiveAfter: 2 * time.Second})
	})
	AfterAll(func() { backToTheManagerWithoutArchive(store, pg) })

	stlName := func(jobID string) string {
		return identity.SettlementName("inference", identity.DefaultSettlementKey("inference", jobID))
	}
	gone := func(ns, name string) {
		GinkgoHelper()
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &hooksv1alpha1.BillingSettlement{}))
		}).WithTimeout(60*time.Second).Should(BeTrue(), "%s/%s leaves the cluster", ns, name)
	}
	// archivedRow reads the settlements row's reconciled column and the archived object.
	archivedRow := func(ns, name string) (bool, *hooksv1alpha1.BillingSettlement) {
		GinkgoHelper()
		conn, err := pgx.Connect(ctx, pg.URL("archive"))
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = conn.Close(ctx) }()
		var reconciled bool
		Expect(conn.QueryRow(ctx, "SELECT reconciled FROM settlements WHERE namespace = $1 AND name = $2", ns, name).Scan(&reconciled)).To(Succeed())
		bs, err := store.Settlement(ctx, ns, name)
		Expect(err).NotTo(HaveOccurred())
		Expect(bs).NotTo(BeNil())
		return reconciled, bs
	}
	settled := func(ns, msgID, jobID string) *hooksv1alpha1.BillingSettlement {
		GinkgoHelper()
		sendOK(ns, msgID, jobEvent(jobID, 1, 4))
		Eventually(settlementState(ns, jobID)).Should(Equal(hooksv1alpha1.SettlementSettled))
		return settlementOf(ns, jobID)
	}
	// writeReport writes a report of the tenant's provider as a pass does, confirming
	// the given versions ("<uid>/<resourceVersion>") for reason ConfirmedByProvider.
	writeReport := func(ns, name, providerUID string, at time.Time, versions ...string) *hooksv1alpha1.ReconciliationReport {
		GinkgoHelper()
		rr := &hooksv1alpha1.ReconciliationReport{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
				Labels: map[string]string{hooksv1alpha1.LabelBillingProvider: fixtures.BillingProviderName}},
			Spec: hooksv1alpha1.ReconciliationReportSpec{BillingProviderRef: fixtures.BillingProviderName,
				WindowStart: metav1.NewTime(at.Add(-time.Hour)), WindowEnd: metav1.NewTime(at)},
		}
		Expect(k8s.Create(ctx, rr)).To(Succeed())
		base := rr.DeepCopy()
		rr.Status.Phase = hooksv1alpha1.ReportCompleted
		rr.Status.Confirmed = &hooksv1alpha1.SettlementConfirmations{BillingProviderUID: providerUID,
			ByReason: []hooksv1alpha1.ConfirmationGroup{{Reason: hooksv1alpha1.ReasonConfirmedByProvider, Settlements: versions}}}
		Expect(k8s.Status().Patch(ctx, rr, client.MergeFrom(base))).To(Succeed())
		return rr
	}
	version := func(bs *hooksv1alpha1.BillingSettlement) string {
		return hooksv1alpha1.ConfirmedVersion(string(bs.UID), bs.ResourceVersion)
	}
	providerUID := func(ns string) string {
		GinkgoHelper()
		var bp hooksv1alpha1.BillingProvider
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fixtures.BillingProviderName}, &bp)).To(Succeed())
		return string(bp.UID)
	}
	hourly := func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
		bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{Interval: &metav1.Duration{Duration: time.Hour}}
	}

	// changedSinceConfirmed settles a charge, changes it after a pass confirmed it (a
	// report written as a pass does names the version before the change), and returns
	// it with that report.
	changedSinceConfirmed := func(ns, msgID, jobID, report string) (*hooksv1alpha1.BillingSettlement, *hooksv1alpha1.ReconciliationReport) {
		GinkgoHelper()
		bs := settled(ns, msgID, jobID)
		confirmedVersion := version(bs)
		base := bs.DeepCopy()
		bs.Labels = map[string]string{"touched": "after-the-pass"}
		Expect(k8s.Patch(ctx, bs, client.MergeFrom(base))).To(Succeed())
		return bs, writeReport(ns, report, providerUID(ns), time.Now(), confirmedVersion)
	}
	// walkedPastEvery has the provider's list walked past everything settled so far (the
	// next passes list nothing of it) and its passes come every interval from now.
	walkedPastEvery := func(ns string, interval time.Duration) {
		GinkgoHelper()
		var bp hooksv1alpha1.BillingProvider
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fixtures.BillingProviderName}, &bp)).To(Succeed())
		sbase := bp.DeepCopy()
		past := metav1.NewTime(time.Now().Add(time.Hour))
		bp.Status.ProviderListedUntil = &past
		Expect(k8s.Status().Patch(ctx, &bp, client.MergeFrom(sbase))).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fixtures.BillingProviderName}, &bp)).To(Succeed())
		base := bp.DeepCopy()
		bp.Spec.Reconciliation.Interval = &metav1.Duration{Duration: interval}
		Expect(k8s.Patch(ctx, &bp, client.MergeFrom(base))).To(Succeed())
	}

	// pendingInAReport is a tenant of its own keeping one report, whose settled charge
	// is confirmed only by a report written as a pass does, with the archive down (the
	// confirmation waits in the report) and the tenant's provider down (its passes
	// confirm nothing); archiveUp starts the archive again.
	pendingInAReport := func(msgID, jobID, report string) (string, *hooksv1alpha1.BillingSettlement, *hooksv1alpha1.ReconciliationReport, func()) {
		GinkgoHelper()
		own, err := fakebilling.Start(fakebilling.Options{Token: billingToken, UsagePrice: 100})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = own.Close() })
		ns := newTenant(hourly, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Endpoint = own.URL()
			bp.Spec.Reconciliation.KeepReports = 1
		})
		bs := settled(ns, msgID, jobID)
		Expect(pg.Stop()).To(Succeed())
		stopped := true
		DeferCleanup(func() {
			if stopped {
				Expect(pg.StartAgain()).To(Succeed())
			}
		})
		rr := writeReport(ns, report, providerUID(ns), time.Now().Add(-time.Minute), version(bs))
		Expect(own.SetDown(true)).To(Succeed())
		return ns, bs, rr, func() {
			GinkgoHelper()
			Expect(pg.StartAgain()).To(Succeed())
			stopped = false
		}
	}
	// shortenPasses has the tenant's provider pass every 2 s (it keeps one report: its own).
	shortenPasses := func(ns string) {
		GinkgoHelper()
		var bp hooksv1alpha1.BillingProvider
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fixtures.BillingProviderName}, &bp)).To(Succeed())
		base := bp.DeepCopy()
		bp.Spec.Reconciliation.Interval = &metav1.Duration{Duration: 2 * time.Second}
		Expect(k8s.Patch(ctx, &bp, client.MergeFrom(base))).To(Succeed())
	}

	It("writes no settlement for a pass's confirmations, and archives every settlement confirmed", func() {
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second},
				EventStaleAfter: &metav1.Duration{Duration: time.Second}, KeepReports: 20,
			}
		})
		// Every write of a settlement, as the API server sends it to a watch.
		wc, err := client.NewWithWatch(cfg, client.Options{Scheme: k8s.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		w, err := wc.Watch(ctx, &hooksv1alpha1.BillingSettlementList{}, client.InNamespace(ns))
		Expect(err).NotTo(HaveOccurred())
		defer w.Stop()
		var (
			mu            sync.Mutex
			writes, marks int
			marked        = map[string]bool{}
		)
		go func() {
			defer GinkgoRecover()
			for e := range w.ResultChan() {
				bs, ok := e.Object.(*hooksv1alpha1.BillingSettlement)
				if !ok || e.Type != watch.Modified {
					continue
				}
				mu.Lock()
				writes++
				// A write that marks it: the condition or lastReconciledAt appear.
				if !marked[bs.Name] && (apimeta.FindStatusCondition(bs.Status.Conditions, hooksv1alpha1.ConditionReconciled) != nil ||
					bs.Status.LastReconciledAt != nil) {
					marked[bs.Name] = true
					marks++
				}
				mu.Unlock()
			}
		}()

		const n = 5
		uids := map[string]string{}
		for i := range n {
			jobID := fmt.Sprintf("job-conf-%d", i)
			sendOK(ns, fmt.Sprintf("msg-conf-%d", i), jobEvent(jobID, 1, 3+i))
		}
		for i := range n {
			jobID := fmt.Sprintf("job-conf-%d", i)
			Eventually(settlementState(ns, jobID)).Should(Equal(hooksv1alpha1.SettlementSettled))
			uids[stlName(jobID)] = string(settlementOf(ns, jobID).UID)
		}
		for name := range uids {
			gone(ns, name)
		}
		mu.Lock()
		Expect(marks).To(BeZero(), "settlement writes that marked it Reconciled (of %d settlement writes in all)", writes)
		mu.Unlock()
		// Some report of the provider confirms each, by UID and version.
		confirmedIn := map[string]string{}
		Eventually(func() int {
			var l hooksv1alpha1.ReconciliationReportList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			for _, rr := range l.Items {
				if rr.Status.Confirmed == nil {
					continue
				}
				for _, g := range rr.Status.Confirmed.ByReason {
					for _, v := range g.Settlements {
						for name, uid := range uids {
							if strings.HasPrefix(v, uid+"/") {
								confirmedIn[name] = rr.Name
							}
						}
					}
				}
			}
			return len(confirmedIn)
		}).WithTimeout(60*time.Second).Should(Equal(n), "a report confirms every settlement")
		for name := range uids {
			reconciled, bs := archivedRow(ns, name)
			Expect(reconciled).To(BeTrue(), "the archived row says it was confirmed")
			c := condition(bs.Status.Conditions, hooksv1alpha1.ConditionReconciled)
			Expect(c).NotTo(BeNil())
			Expect(c.Status).To(Equal(metav1.ConditionTrue))
			Expect(c.Reason).To(Equal(hooksv1alpha1.ReasonConfirmedByProvider))
			Expect(c.Message).To(ContainSubstring("ReconciliationReport " + fixtures.BillingProviderName + "-"))
			Expect(c.Message).To(ContainSubstring(bs.Status.ProviderRef))
			Expect(bs.Status.LastReconciledAt).NotTo(BeNil())
		}
	})

	It("does not archive a settlement changed after the pass confirmed it, until a report confirms the version it has", func() {
		ns := newTenant(hourly)
		bs := settled(ns, "msg-conf-changed", "job-conf-changed")
		confirmedVersion := version(bs)
		// Changed after the pass compared it.
		base := bs.DeepCopy()
		bs.Labels = map[string]string{"touched": "after-the-pass"}
		Expect(k8s.Patch(ctx, bs, client.MergeFrom(base))).To(Succeed())
		writeReport(ns, "conf-old-version", providerUID(ns), time.Now(), confirmedVersion)
		Consistently(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}) }).
			WithTimeout(8*time.Second).Should(Succeed(), "a confirmation of another version confirms nothing")

		rr := writeReport(ns, "conf-this-version", providerUID(ns), time.Now(), version(get(bs)))
		gone(ns, bs.Name)
		reconciled, archived := archivedRow(ns, bs.Name)
		Expect(reconciled).To(BeTrue())
		Expect(condition(archived.Status.Conditions, hooksv1alpha1.ConditionReconciled).Message).To(ContainSubstring(rr.Name))
	})

	It("has the next pass ask again about a settlement changed since its confirmation, though it settled before the window", func() {
		ns := newTenant(hourly, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation.StuckAfter = &metav1.Duration{Duration: time.Second}
		})
		bs, old := changedSinceConfirmed(ns, "msg-conf-again", "job-conf-again", "conf-before-the-change")
		lookups := len(billing.CallsFor(bs.Spec.IdempotencyKey))
		// The provider's list was walked past it, and a pass comes now.
		walkedPastEvery(ns, 2*time.Second)

		gone(ns, bs.Name)
		Expect(len(billing.CallsFor(bs.Spec.IdempotencyKey))).To(BeNumerically(">", lookups), "the pass asked the provider by key")
		Expect(posts(billing.CallsFor(bs.Spec.IdempotencyKey))).To(Equal(1), "one POST, nothing since")
		reconciled, archived := archivedRow(ns, bs.Name)
		Expect(reconciled).To(BeTrue())
		msg := condition(archived.Status.Conditions, hooksv1alpha1.ConditionReconciled).Message
		Expect(msg).To(ContainSubstring("ReconciliationReport " + fixtures.BillingProviderName + "-"))
		Expect(msg).NotTo(ContainSubstring(old.Name))
	})

	It("asks again about a settlement changed since its confirmation whose lookups wait past keepReports passes and a restart", func() {
		own, err := fakebilling.Start(fakebilling.Options{Token: billingToken, UsagePrice: 100})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = own.Close() })
		ns := newTenant(hourly, func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Endpoint = own.URL()
			bp.Spec.Reconciliation.StuckAfter = &metav1.Duration{Duration: time.Second}
			bp.Spec.Reconciliation.KeepReports = 1
		})
		bs, old := changedSinceConfirmed(ns, "msg-conf-waited", "job-conf-waited", "conf-waited-old")
		// Its lookups are rate limited; the provider's list was walked past it, and
		// passes come every 2 s.
		own.FailNextLookups(1000, http.StatusTooManyRequests)
		walkedPastEvery(ns, 2*time.Second)

		// Passes go on (one report kept) while its lookup waits: the report confirming
		// the old version is kept past keepReports, since it is what has a pass ask.
		var waited hooksv1alpha1.ReconciliationReport
		Eventually(func() int32 {
			for _, rr := range lookupReports(ns) {
				if rr.Name != old.Name && rr.Status.Phase == hooksv1alpha1.ReportCompleted && rr.Status.Examined["SettlementLookupDeferred"] > 0 {
					waited = rr
				}
			}
			return waited.Status.Examined["SettlementLookupDeferred"]
		}).WithTimeout(60*time.Second).Should(Equal(int32(1)), "its lookup waits")
		Eventually(func() []string {
			var names []string
			for _, rr := range lookupReports(ns) {
				if rr.Spec.WindowEnd.After(waited.Spec.WindowEnd.Time) && rr.Status.Phase == hooksv1alpha1.ReportCompleted {
					names = append(names, rr.Name)
				}
			}
			return names
		}).WithTimeout(60*time.Second).ShouldNot(BeEmpty(), "a pass after it, which pruned")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(old), &hooksv1alpha1.ReconciliationReport{})).To(Succeed(),
			"the report confirming the old version is kept while the lookup waits")

		// A restart forgets what the passes remembered, and the first passes after it
		// fail before they get to their lookups (the provider's list fails): pruning
		// then goes by what is stored, and the kept report still says it must be asked.
		own.FailNextLists(2, http.StatusServiceUnavailable)
		mgr.stop()
		restarted := time.Now()
		mgr = startManager(managerOptions{store: store, archiveAfter: 2 * time.Second})
		Eventually(func() int {
			failed := 0
			for _, rr := range lookupReports(ns) {
				if rr.Spec.WindowEnd.After(restarted) && rr.Status.Phase == hooksv1alpha1.ReportFailed {
					failed++
				}
			}
			return failed
		}).WithTimeout(60*time.Second).Should(BeNumerically(">=", 1), "a pass after the restart failed at the list")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(old), &hooksv1alpha1.ReconciliationReport{})).To(Succeed(),
			"the report confirming the old version is kept by a pass that did not get to its lookups")
		own.ClearLookupFaults()
		gone(ns, bs.Name)
		Expect(posts(own.CallsFor(bs.Spec.IdempotencyKey))).To(Equal(1), "one POST, nothing since")
		reconciled, _ := archivedRow(ns, bs.Name)
		Expect(reconciled).To(BeTrue())
	})

	It("relies on no pruned report, nor on one of another provider under the same name", func() {
		ns := newTenant(hourly)
		bs := settled(ns, "msg-conf-pruned", "job-conf-pruned")
		rr := writeReport(ns, "conf-pruned", providerUID(ns), time.Now(), version(bs))
		Expect(k8s.Delete(ctx, rr)).To(Succeed())
		writeReport(ns, "conf-other-provider", "0b5e7c1e-0000-4000-8000-000000000000", time.Now(), version(bs))
		Consistently(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}) }).
			WithTimeout(8*time.Second).Should(Succeed(), "neither confirms it")
		Expect(condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled)).To(BeNil())

		writeReport(ns, "conf-kept", providerUID(ns), time.Now(), version(get(bs)))
		gone(ns, bs.Name)
	})

	It("marks a settlement itself when the report confirming it is pruned before it was archived", func() {
		ns, bs, rr, archiveUp := pendingInAReport("msg-conf-prune", "job-conf-prune", "conf-to-prune")
		shortenPasses(ns)
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(rr), &hooksv1alpha1.ReconciliationReport{}))
		}).WithTimeout(30*time.Second).Should(BeTrue(), "the report is pruned")
		Eventually(func() string {
			c := condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled)
			if c == nil || c.Status != metav1.ConditionTrue {
				return ""
			}
			return c.Message
		}).WithTimeout(30*time.Second).Should(ContainSubstring(rr.Name), "its confirmation is kept on the settlement itself")

		archiveUp()
		gone(ns, bs.Name)
	})

	It("keeps a report past keepReports while a confirmation of it cannot be marked on its settlement", func() {
		ns, bs, rr, archiveUp := pendingInAReport("msg-conf-held", "job-conf-held", "conf-held")

		// Every status write of this tenant's settlements refused, as an admission policy
		// or a webhook of the cluster might.
		policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "refuse-settlement-status-" + ns},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
						Rule: admissionregistrationv1.Rule{APIGroups: []string{hooksv1alpha1.GroupVersion.Group},
							APIVersions: []string{"*"}, Resources: []string{"billingsettlements/status"}}}}}},
				Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "status writes refused by the test"}},
			},
		}
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
				MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
					MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}},
		}
		Expect(k8s.Create(ctx, policy)).To(Succeed())
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		DeferCleanup(func() {
			_ = client.IgnoreNotFound(k8s.Delete(ctx, binding))
			_ = client.IgnoreNotFound(k8s.Delete(ctx, policy))
		})
		Eventually(func() error {
			probe := get(bs)
			base := probe.DeepCopy()
			probe.Status.ProviderStatus += "-probe"
			return k8s.Status().Patch(ctx, probe, client.MergeFrom(base), client.DryRunAll)
		}).WithTimeout(30*time.Second).Should(HaveOccurred(), "the policy refuses status writes")

		shortenPasses(ns)
		Eventually(func() int {
			var l hooksv1alpha1.ReconciliationReportList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			return len(l.Items)
		}).WithTimeout(30*time.Second).Should(BeNumerically(">=", 2), "a pass wrote its own report")
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKeyFromObject(rr), &hooksv1alpha1.ReconciliationReport{})
		}).WithTimeout(10*time.Second).Should(Succeed(), "the report stays while its confirmation is kept nowhere else")

		Expect(k8s.Delete(ctx, binding)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(rr), &hooksv1alpha1.ReconciliationReport{}))
		}).WithTimeout(60*time.Second).Should(BeTrue(), "pruned once the mark is written")
		Eventually(func() string {
			c := condition(get(bs).Status.Conditions, hooksv1alpha1.ConditionReconciled)
			if c == nil || c.Status != metav1.ConditionTrue {
				return ""
			}
			return c.Message
		}).WithTimeout(30*time.Second).Should(ContainSubstring(rr.Name), "its confirmation is kept on the settlement itself")
		archiveUp()
		gone(ns, bs.Name)
	})
})
