package integration_test

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers/archiver"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	billingapi "github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fakestripe"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// The archive specs run the whole operator with the archive on — a real PostgreSQL
// started from the machine's binaries — and records archived one second after they
// finish, against the same API server and fake billing provider as the other specs.
// backToTheManagerWithoutArchive ends an archive suite: the suite's manager gives way to
// the default one (no archive), and the suite's archive and PostgreSQL server stop.
func backToTheManagerWithoutArchive(store *archive.Store, pg *pgtest.Server) {
	mgr.stop()
	mgr = startManager()
	if store != nil {
		store.Close()
	}
	if pg != nil {
		pg.Close()
	}
}

// startArchive starts a PostgreSQL with a migrated archive database, for an Ordered
// container's BeforeAll (backToTheManagerWithoutArchive, in its AfterAll, stops both).
func startArchive() (*pgtest.Server, *archive.Store) {
	GinkgoHelper()
	pg, err := pgtest.Start()
	Expect(err).NotTo(HaveOccurred())
	Expect(pg.CreateDatabase("archive")).To(Succeed())
	store, err := archive.Open(archive.Config{URL: pg.URL("archive"), StatementTimeout: 2 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	Expect(store.Migrate(ctx)).To(Succeed())
	return pg, store
}

var _ = Describe("the archive (docs/design.md §12)", Ordered, func() {
	var (
		pg    *pgtest.Server
		store *archive.Store
	)
	BeforeAll(func() {
		pg, store = startArchive()
		mgr.stop()
		mgr = startManager(managerOptions{store: store, archiveAfter: time.Second})
	})
	AfterAll(func() { backToTheManagerWithoutArchive(store, pg) })

	jobName := func(jobID string) string { return identity.JobCompletionName("inference", jobID) }
	stlName := func(jobID string) string {
		return identity.SettlementName("inference", identity.DefaultSettlementKey("inference", jobID))
	}
	// goneFromCluster waits until obj has left the cluster.
	goneFromCluster := func(ns, name string, obj client.Object) {
		GinkgoHelper()
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj))
		}).WithTimeout(45*time.Second).Should(BeTrue(), "%s/%s leaves the cluster", ns, name)
	}
	// settledAndArchived runs one job through the whole pipeline until all three of
	// its records are archived and gone from the cluster.
	settledAndArchived := func(ns, msgID, jobID string, version, tokens int) {
		GinkgoHelper()
		sendOK(ns, msgID, jobEvent(jobID, version, tokens))
		Eventually(settlementState(ns, jobID)).Should(Equal(hooksv1alpha1.SettlementSettled))
		goneFromCluster(ns, stlName(jobID), &hooksv1alpha1.BillingSettlement{})
		goneFromCluster(ns, jobName(jobID), &hooksv1alpha1.JobCompletion{})
		goneFromCluster(ns, identity.EventName(ns, "inference", msgID), &hooksv1alpha1.WebhookEvent{})
	}

	It("archives each kind once finished — a settlement only once a pass confirmed it — and only then removes it", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-arc-1", "job-arc-1", 1, 40)

		bs, err := store.Settlement(ctx, ns, stlName("job-arc-1"))
		Expect(err).NotTo(HaveOccurred())
		Expect(bs).NotTo(BeNil(), "the settlement is in the archive")
		Expect(bs.Status.State).To(Equal(hooksv1alpha1.SettlementSettled))
		Expect(condition(bs.Status.Conditions, hooksv1alpha1.ConditionReconciled).Status).To(Equal(metav1.ConditionTrue))
		Expect(bs.Spec.IdempotencyKey).To(Equal(identity.NamespacedIdempotencyKey(ns, key(ns, "job-arc-1"))))
		Expect(bs.Status.ProviderRef).NotTo(BeEmpty())
		Expect(bs.Status.SentTo).NotTo(BeNil())
		Expect(bs.DeletionTimestamp).To(BeNil(), "archived before it was deleted")

		jc, err := store.LatestJob(ctx, ns, "inference", "job-arc-1")
		Expect(err).NotTo(HaveOccurred())
		Expect(jc).NotTo(BeNil())
		Expect(jc.Progress().State).To(Equal(hooksv1alpha1.JobCompletionApplied))

		ev, err := store.Event(ctx, ns, "inference", "msg-arc-1")
		Expect(err).NotTo(HaveOccurred())
		Expect(ev).NotTo(BeNil())
		Expect(ev.Phase).To(Equal(string(hooksv1alpha1.EventComplete)))

		Expect(posts(billing.CallsFor(bs.Spec.IdempotencyKey))).To(Equal(1), "one POST, nothing since")
	})

	It("answers a redelivery of an archived event duplicate, and a different payload 409 with a quarantine record", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-arc-dup", "job-arc-dup", 1, 12)
		idem := identity.NamespacedIdempotencyKey(ns, key(ns, "job-arc-dup"))

		r := send(ns, "msg-arc-dup", jobEvent("job-arc-dup", 1, 12))
		Expect(r.Status).To(Equal(http.StatusOK))
		Expect(string(r.Body)).To(ContainSubstring(`"duplicate"`))
		var evs hooksv1alpha1.WebhookEventList
		Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
		Expect(evs.Items).To(BeEmpty(), "a duplicate answer writes nothing")

		r = send(ns, "msg-arc-dup", jobEvent("job-arc-dup", 1, 13))
		Expect(r.Status).To(Equal(http.StatusConflict))
		Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
		Expect(evs.Items).To(HaveLen(1))
		Expect(evs.Items[0].Spec.Quarantine).NotTo(BeNil())
		Expect(evs.Items[0].Spec.Quarantine.OriginalEvent).To(Equal(identity.EventName(ns, "inference", "msg-arc-dup")))
		Consistently(func() int { return posts(billing.CallsFor(idem)) }).WithTimeout(3 * time.Second).Should(Equal(1))
	})

	It("decides duplicates from the archive when it was down at receipt, and keeps every record while it is down", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-arc-down", "job-arc-down", 1, 7)
		idem := identity.NamespacedIdempotencyKey(ns, key(ns, "job-arc-down"))

		Expect(pg.Stop()).To(Succeed())
		stopped := true
		DeferCleanup(func() {
			if stopped {
				Expect(pg.StartAgain()).To(Succeed())
			}
		})
		// Receipt does not depend on the archive: both deliveries are stored and acknowledged.
		r := send(ns, "msg-arc-down", jobEvent("job-arc-down", 1, 7))
		Expect(r.Status).To(Equal(http.StatusOK), "a redelivery while the archive is down is stored, not refused")
		sendOK(ns, "msg-arc-new", jobEvent("job-arc-new", 1, 5))
		// Neither is dispatched while the archive cannot say whether it saw them.
		Eventually(func() string {
			c := condition(event(ns, "msg-arc-down").Status.Conditions, hooksv1alpha1.ConditionDispatched)
			if c == nil {
				return ""
			}
			return c.Reason
		}).Should(Equal(hooksv1alpha1.ReasonArchiveUnavailable))
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: jobName("job-arc-new")}, &hooksv1alpha1.JobCompletion{})
		}).WithTimeout(3 * time.Second).ShouldNot(Succeed())

		Expect(pg.StartAgain()).To(Succeed())
		stopped = false
		// The redelivery is decided a duplicate (its extra receipt removed, nothing
		// dispatched); the new event is dispatched, settled and archived.
		goneFromCluster(ns, identity.EventName(ns, "inference", "msg-arc-down"), &hooksv1alpha1.WebhookEvent{})
		Eventually(settlementState(ns, "job-arc-new")).Should(Equal(hooksv1alpha1.SettlementSettled))
		goneFromCluster(ns, stlName("job-arc-new"), &hooksv1alpha1.BillingSettlement{})
		Expect(posts(billing.CallsFor(idem))).To(Equal(1), "the archived charge was not made again")
		bs, err := store.Settlement(ctx, ns, stlName("job-arc-new"))
		Expect(err).NotTo(HaveOccurred())
		Expect(bs).NotTo(BeNil())
	})

	It("sends no settlement while the archive cannot say whether its key was archived", func() {
		ns := reconcilingTenant()
		Expect(pg.Stop()).To(Succeed())
		stopped := true
		DeferCleanup(func() {
			if stopped {
				Expect(pg.StartAgain()).To(Succeed())
			}
		})
		bs := handMade(ns, "arc-down/1", "cus_direct", 500, "USD")
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		Eventually(readyReason(bs)).Should(Equal(hooksv1alpha1.ReasonArchiveUnavailable))
		Consistently(func() int { return len(billing.CallsFor(bs.Spec.IdempotencyKey)) }).WithTimeout(2*time.Second).Should(BeZero(),
			"not even a lookup")
		Expect(pg.StartAgain()).To(Succeed())
		stopped = false
		Eventually(func() int { return len(billing.CallsFor(bs.Spec.IdempotencyKey)) }).WithTimeout(30 * time.Second).ShouldNot(BeZero())
	})

	// settledHere runs a job to Settled in a tenant whose passes are an hour apart (so
	// no pass confirms it by itself) and returns its settlement.
	settledHere := func(ns, msgID, jobID string) *hooksv1alpha1.BillingSettlement {
		GinkgoHelper()
		sendOK(ns, msgID, jobEvent(jobID, 1, 4))
		Eventually(settlementState(ns, jobID)).Should(Equal(hooksv1alpha1.SettlementSettled))
		return settlementOf(ns, jobID)
	}
	hourly := func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
		bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{Interval: &metav1.Duration{Duration: time.Hour}}
	}
	// confirm marks a settled settlement Reconciled, as a pass that found it at the
	// provider does.
	confirm := func(bs *hooksv1alpha1.BillingSettlement) {
		GinkgoHelper()
		bs = get(bs)
		base := bs.DeepCopy()
		// Set, not appended: a pass may have confirmed it already (the first pass runs
		// when the provider is created, and may come after the charge settled).
		apimeta.SetStatusCondition(&bs.Status.Conditions, metav1.Condition{Type: hooksv1alpha1.ConditionReconciled,
			Status: metav1.ConditionTrue, Reason: hooksv1alpha1.ReasonConfirmedByProvider, Message: "confirmed by the test",
			ObservedGeneration: bs.Generation})
		Expect(k8s.Status().Patch(ctx, bs, client.MergeFrom(base))).To(Succeed())
	}

	It("keeps a finished settlement in the cluster while the archive is down, then archives it", func() {
		ns := newTenant(hourly)
		bs := settledHere(ns, "msg-arc-kept", "job-arc-kept")
		Expect(pg.Stop()).To(Succeed())
		stopped := true
		DeferCleanup(func() {
			if stopped {
				Expect(pg.StartAgain()).To(Succeed())
			}
		})
		confirm(bs)
		Consistently(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}) }).
			WithTimeout(4*time.Second).Should(Succeed(), "nothing leaves the cluster while the archive is down")
		Expect(get(bs).DeletionTimestamp).To(BeNil())
		// Receipt does not depend on the archive either.
		Expect(send(ns, "msg-arc-kept-2", jobEvent("job-arc-kept-2", 1, 4)).Status).To(Equal(http.StatusOK))

		Expect(pg.StartAgain()).To(Succeed())
		stopped = false
		goneFromCluster(ns, bs.Name, &hooksv1alpha1.BillingSettlement{})
		got, err := store.Settlement(ctx, ns, bs.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).NotTo(BeNil())
		Expect(got.Status.ProviderRef).To(Equal(bs.Status.ProviderRef))
		Eventually(settlementState(ns, "job-arc-kept-2")).Should(Equal(hooksv1alpha1.SettlementSettled))
	})

	It("finishes an archival interrupted between insert and delete, and keeps a record whose archived row differs", func() {
		ns := newTenant(hourly)
		// Interrupted: the row is in the archive (the first half of an archival), the
		// object still in the cluster, as after a crash between insert and delete.
		crashed := settledHere(ns, "msg-arc-crash", "job-arc-crash")
		Expect(store.ArchiveSettlement(ctx, crashed)).To(Succeed())
		confirm(crashed)
		goneFromCluster(ns, crashed.Name, &hooksv1alpha1.BillingSettlement{})
		got, err := store.Settlement(ctx, ns, crashed.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.UID).To(Equal(crashed.UID), "one row, the one inserted before the crash")

		// A different row under the name (say, restored from elsewhere): the object is
		// never deleted, and a Warning says why.
		differs := settledHere(ns, "msg-arc-differs", "job-arc-differs")
		other := differs.DeepCopy()
		other.Status.ProviderRef = "st_elsewhere"
		Expect(store.ArchiveSettlement(ctx, other)).To(Succeed())
		confirm(differs)
		Eventually(func() bool {
			var l corev1.EventList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			for _, e := range l.Items {
				if e.Reason == hooksv1alpha1.ReasonArchiveConflict && e.InvolvedObject.Name == differs.Name {
					return true
				}
			}
			return false
		}).Should(BeTrue(), "a Warning names the conflict")
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKeyFromObject(differs), &hooksv1alpha1.BillingSettlement{})
		}).
			WithTimeout(3 * time.Second).Should(Succeed())
		Expect(get(differs).DeletionTimestamp).To(BeNil())
	})

	It("never archives a refused settlement that presented no key, so its corrected twin is sent", func() {
		ns := newTenant(hourly)
		k := identity.FieldsSettlementKey(ns, "inference", "inv-1")
		wrong := &hooksv1alpha1.BillingSettlement{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-stl-typo"},
			Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: fixtures.BillingProviderName, SettlementKey: k,
				IdempotencyKey: identity.NamespacedIdempotencyKey(ns, k), Type: hooksv1alpha1.SettlementCharge,
				Customer: "cus_inv", WebhookProvider: "inference", Amount: &hooksv1alpha1.Amount{Minor: 500, Currency: "USD"}},
		}
		Expect(k8s.Create(ctx, wrong)).To(Succeed())
		Eventually(readyReason(wrong)).Should(Equal(hooksv1alpha1.ReasonInvalidIdentity))
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKeyFromObject(wrong), &hooksv1alpha1.BillingSettlement{})
		}).
			WithTimeout(3*time.Second).Should(Succeed(), "kept for review, not archived")
		got, err := store.SettlementByKey(ctx, ns, k)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(BeNil(), "its keys are not reserved in the archive")

		right := wrong.DeepCopy()
		right.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: identity.SettlementNameFor("inference", k)}
		Expect(k8s.Create(ctx, right)).To(Succeed())
		Eventually(stateOf(right)).Should(Equal(hooksv1alpha1.SettlementSettled), "the corrected settlement is sent")
		Expect(posts(billing.CallsFor(right.Spec.IdempotencyKey))).To(Equal(1))
	})

	It("never charges again a keyFrom charge made before namespaced keys, once it is archived", func() {
		ns := newTenant(hourly, withLines)
		legacyOf := func(a, b string) *hooksv1alpha1.BillingSettlement {
			k, ok := identity.ParseSettlementKey(identity.FieldsSettlementKey(ns, "inference", a, b))
			Expect(ok).To(BeTrue())
			lk := k.LegacyKey()
			return &hooksv1alpha1.BillingSettlement{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.SettlementName("inference", lk),
					Finalizers: []string{hooksv1alpha1.FinalizerSettlementProtection}},
				Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: lk,
					IdempotencyKey: identity.IdempotencyKey(lk), Type: hooksv1alpha1.SettlementCharge, Customer: "cus_leg",
					WebhookProvider: "inference", Amount: &hooksv1alpha1.Amount{Minor: 100, Currency: "USD"}},
			}
		}
		archivedLegacy := legacyOf("inv", "1")
		Expect(k8s.Create(ctx, archivedLegacy)).To(Succeed())
		Eventually(stateOf(archivedLegacy)).Should(Equal(hooksv1alpha1.SettlementSettled))
		confirm(archivedLegacy)
		goneFromCluster(ns, archivedLegacy.Name, &hooksv1alpha1.BillingSettlement{})

		body := `{"type":"invoice.paid","data":{"customer":"cus_leg","lines":[{"a":"inv","b":"1","cents":100}]}}`
		sendOK(ns, "msg-after-upgrade", body)
		Eventually(func() hooksv1alpha1.OperationOutcome {
			ev := &hooksv1alpha1.WebhookEvent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", "msg-after-upgrade")}, ev); err != nil {
				return ""
			}
			if len(ev.Status.Operations) == 0 {
				return ""
			}
			return ev.Status.Operations[0].Outcome
		}).Should(Equal(hooksv1alpha1.OutcomeLinked), "linked to the archived legacy charge")
		newIdem := identity.NamespacedIdempotencyKey(ns, identity.FieldsSettlementKey(ns, "inference", "inv", "1"))
		Consistently(func() int { return posts(billing.CallsFor(newIdem)) }).WithTimeout(3*time.Second).Should(BeZero(),
			"the line charged before the upgrade is not charged again under its new key")
	})

	It("lets a never-sent settlement a person deleted go without archiving it; its event shows it deleted", func() {
		ns := newTenant(hourly, func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[1].Settlement.BillingProviderRef = "absent"
		})
		sendOK(ns, "msg-arc-absent", jobEvent("job-arc-absent", 1, 5))
		bs := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: stlName("job-arc-absent")}}
		Eventually(func() hooksv1alpha1.Exposure {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(bs), bs); err != nil {
				return ""
			}
			return bs.Status.Exposure
		}).Should(Equal(hooksv1alpha1.ExposureNone))
		Expect(k8s.Delete(ctx, bs)).To(Succeed())
		goneFromCluster(ns, bs.Name, &hooksv1alpha1.BillingSettlement{})
		got, err := store.Settlement(ctx, ns, bs.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(BeNil(), "not archived: it never presented its key")
		redispatch(ns, "msg-arc-absent")
		Eventually(eventPhase(ns, "msg-arc-absent")).Should(Equal(hooksv1alpha1.EventRequiresReconciliation))
		// The job stays in the cluster: it is billable and has no charge anywhere, which
		// the reconciliation pass reports (JobWithoutSettlement) only while it is here.
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: jobName("job-arc-absent")}, &hooksv1alpha1.JobCompletion{})
		}).WithTimeout(4 * time.Second).Should(Succeed())
	})

	It("archives a settlement an older operator wrote only once it has an exposure, and lets it go", func() {
		ns := newTenant(hourly)
		bs := handMade(ns, "legacy-exposure/1", "cus_legexp", 300, "USD")
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		Eventually(stateOf(bs)).Should(Equal(hooksv1alpha1.SettlementSettled))
		// As an older operator left it: no exposure field, confirmed by an older pass.
		cur := get(bs)
		base := cur.DeepCopy()
		cur.Status.Exposure = ""
		cur.Status.Conditions = append(cur.Status.Conditions, metav1.Condition{Type: hooksv1alpha1.ConditionReconciled,
			Status: metav1.ConditionTrue, Reason: hooksv1alpha1.ReasonConfirmedByProvider, Message: "confirmed by an older pass",
			LastTransitionTime: metav1.Now(), ObservedGeneration: cur.Generation})
		Expect(k8s.Status().Patch(ctx, cur, client.MergeFrom(base))).To(Succeed())
		Consistently(func() bool { return get(bs).DeletionTimestamp.IsZero() }).WithTimeout(3*time.Second).Should(BeTrue(),
			"not archived before its controller gave it an exposure")
		// Its controller's next look (at start, or on any change) fills the exposure in.
		cur = get(bs)
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Annotations = map[string]string{"example.com/touched": "yes"}
		Expect(k8s.Patch(ctx, cur, patch)).To(Succeed())
		goneFromCluster(ns, bs.Name, &hooksv1alpha1.BillingSettlement{})
		got, err := store.Settlement(ctx, ns, bs.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.Status.Exposure).To(Equal(hooksv1alpha1.ExposureConfirmed))
	})

	It("records which archive the cluster archives to, and holds any other database unavailable", func() {
		ns := newTenant()
		run := func(st *archive.Store) {
			mctx, stop := context.WithCancel(ctx)
			DeferCleanup(stop)
			go func() {
				defer GinkgoRecover()
				Expect((&archiver.Migrator{Archive: st, Client: k8s, Namespace: ns, ConfigMap: "operator-archive",
					Retry: 200 * time.Millisecond}).Start(mctx)).To(Succeed())
			}()
		}
		same, err := archive.Open(archive.Config{URL: pg.URL("archive")})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(same.Close)
		run(same)
		Eventually(same.Ready).Should(BeTrue(), "the first archive is recorded and used")
		id, err := same.Identity(ctx)
		Expect(err).NotTo(HaveOccurred())
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "operator-archive"}, cm)).To(Succeed())
		Expect(cm.Data[archiver.ArchiveIdentityKey]).To(Equal(id))

		// An empty database under another name (a typo, a restore, a lagging replica):
		// never taken for "nothing archived yet".
		Expect(pg.CreateDatabase("typo")).To(Succeed())
		other, err := archive.Open(archive.Config{URL: pg.URL("typo")})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(other.Close)
		run(other)
		Eventually(func() error { return other.Ping(ctx) }).Should(MatchError(ContainSubstring("not the archive this cluster archived to")))
		Consistently(other.Ready).WithTimeout(time.Second).Should(BeFalse())
		_, err = other.Event(ctx, ns, "inference", "anything")
		Expect(err).To(HaveOccurred(), "an unchecked archive answers nothing: callers wait instead of taking it for empty")
	})

	It("supersedes v1 after an archived v2 and charges nothing for it", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-arc-v2", "job-arc-order", 2, 30)
		idem := identity.NamespacedIdempotencyKey(ns, key(ns, "job-arc-order"))
		sendOK(ns, "msg-arc-v1", jobEvent("job-arc-order", 1, 99))
		Eventually(func() hooksv1alpha1.OperationOutcome {
			ev := &hooksv1alpha1.WebhookEvent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", "msg-arc-v1")}, ev); err != nil {
				return ""
			}
			for _, op := range ev.Status.Operations {
				if op.Type == hooksv1alpha1.OperationJobCompletion {
					return op.Outcome
				}
			}
			return ""
		}).Should(Equal(hooksv1alpha1.OutcomeSuperseded))
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: jobName("job-arc-order")}, &hooksv1alpha1.JobCompletion{})).
			NotTo(Succeed(), "no JobCompletion is created for an older version")
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: stlName("job-arc-order")}, &hooksv1alpha1.BillingSettlement{})).
			NotTo(Succeed(), "no settlement is created for an older version")
		Consistently(func() int { return posts(billing.CallsFor(idem)) }).WithTimeout(3 * time.Second).Should(Equal(1))
	})

	It("never sends a settlement created again for an archived key, even after the provider forgot the key", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-arc-again", "job-arc-again", 1, 21)
		archived, err := store.Settlement(ctx, ns, stlName("job-arc-again"))
		Expect(err).NotTo(HaveOccurred())
		billing.ForgetKeys()

		again := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: archived.Name,
			Labels: archived.Labels}, Spec: archived.Spec}
		Expect(k8s.Create(ctx, again)).To(Succeed())
		Eventually(readyReason(again)).Should(Equal(hooksv1alpha1.ReasonArchivedDuplicate))
		Expect(get(again).Status.State).To(Equal(hooksv1alpha1.SettlementFailed))
		Consistently(func() int { return posts(billing.CallsFor(archived.Spec.IdempotencyKey)) }).
			WithTimeout(3*time.Second).Should(Equal(1), "only the original POST, long before")
		// It waits for review: the archiver leaves it alone (archiving it would only
		// conflict with the original's row).
		Consistently(func() bool {
			var l corev1.EventList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			for _, e := range l.Items {
				if e.Reason == hooksv1alpha1.ReasonArchiveConflict {
					return true
				}
			}
			return false
		}).WithTimeout(3 * time.Second).Should(BeFalse())
		Expect(get(again).DeletionTimestamp).To(BeNil())
		// It may be deleted once reviewed: it moved nothing, the archive keeps the original.
		Expect(k8s.Delete(ctx, again)).To(Succeed())
		goneFromCluster(ns, again.Name, &hooksv1alpha1.BillingSettlement{})
		still, err := store.Settlement(ctx, ns, archived.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(still.UID).To(Equal(archived.UID))
	})

	It("bounds refunds of an archived charge by the refunds already archived", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-arc-refund", "job-arc-refund", 1, 10) // 10 tokens × 100 = 1000 minor
		orig, err := store.Settlement(ctx, ns, stlName("job-arc-refund"))
		Expect(err).NotTo(HaveOccurred())
		Expect(orig.Status.ChargedAmount).NotTo(BeNil())
		charged := orig.Status.ChargedAmount

		refund := func(part string, minor int64) *hooksv1alpha1.BillingSettlement {
			return compensation(ns, "arc-refund/"+part, hooksv1alpha1.SettlementRefund, orig, orig.Spec.Customer, minor, charged.Currency)
		}
		first := refund("1", charged.Minor-100)
		Expect(k8s.Create(ctx, first)).To(Succeed())
		Eventually(stateOf(first)).Should(Equal(hooksv1alpha1.SettlementSettled), "a refund of an archived charge is sent")
		// (stateOf reads "" once it is gone: it was Settled before, so it is archived now)
		goneFromCluster(ns, first.Name, &hooksv1alpha1.BillingSettlement{})

		second := refund("2", 200)
		Expect(k8s.Create(ctx, second)).To(Succeed())
		Eventually(readyReason(second)).Should(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))
		Expect(posts(billing.CallsFor(second.Spec.IdempotencyKey))).To(BeZero(), "refunds would exceed the charge: nothing sent (a lookup by key is fine)")
	})

	It("compares the provider with cluster ∪ archive: no archived record is unknown, an unknown one is", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-arc-rec", "job-arc-rec", 1, 3)
		// Passes run every 2 s, also while the charge was in flight (a pass may then
		// rightly report it ProviderSettledLocalPending and ask by key); only the
		// reports that start once it is archived are about an archived record.
		archivedAt := time.Now()
		// A record at the provider that neither the cluster nor the archive knows.
		foreign := handMade(ns, "arc-foreign/1", "cus_foreign", 77, "USD")
		importRecord(foreign, "st_foreign_arc", 77)

		d := finding(ns, hooksv1alpha1.DiscrepancyProviderRecordWithoutSettlement, func(d hooksv1alpha1.Discrepancy) bool {
			return d.ProviderRef == "st_foreign_arc"
		})
		Expect(d.Action).To(Equal(hooksv1alpha1.RepairManualReview))
		var l hooksv1alpha1.ReconciliationReportList
		lateReport := func(rr *hooksv1alpha1.ReconciliationReport) bool {
			return rr.CreationTimestamp.After(archivedAt.Add(time.Second)) && rr.Status.Phase == hooksv1alpha1.ReportCompleted
		}
		Eventually(func() bool {
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			for i := range l.Items {
				if lateReport(&l.Items[i]) {
					return true
				}
			}
			return false
		}).Should(BeTrue(), "a pass completes after the archival")
		archivedRef := ""
		if bs, _ := store.Settlement(ctx, ns, stlName("job-arc-rec")); bs != nil {
			archivedRef = bs.Status.ProviderRef
		}
		Expect(archivedRef).NotTo(BeEmpty())
		late := 0
		for i := range l.Items {
			rr := &l.Items[i]
			if !lateReport(rr) {
				continue
			}
			late++
			for _, item := range rr.Status.Items {
				Expect(item.ProviderRef).NotTo(Equal(archivedRef), "the archived settlement is never reported: %s", item.Message)
				Expect(strings.Contains(item.Object, "job-arc-rec") || strings.Contains(item.Message, "job-arc-rec")).To(BeFalse(),
					"the archived job and settlement are never missing: %s", item.Message)
			}
		}
		Expect(late).NotTo(BeZero(), "a pass ran after the archival")

		// A record under an archived key is compared with the archived settlement, not
		// waved through: a second record under the key is reported.
		archivedBS, err := store.Settlement(ctx, ns, stlName("job-arc-rec"))
		Expect(err).NotTo(HaveOccurred())
		billing.ForgetKeys()
		importRecord(archivedBS, "st_second_arc", 0)
		d = finding(ns, hooksv1alpha1.DiscrepancyAmountMismatch, func(d hooksv1alpha1.Discrepancy) bool {
			return d.ProviderRef == "st_second_arc"
		})
		Expect(d.Object).To(ContainSubstring("(archived)"))
	})

	It("reads an archived settlement once per provider record: later passes count it unchanged, a changed record is compared again", func() {
		// A long overlap lists the archived charge's record in every pass, as a
		// production pass lists the last 15 minutes every time.
		ns := reconcilingTenant(func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation.StuckAfter = &metav1.Duration{Duration: time.Hour}
		})
		settledAndArchived(ns, "msg-arc-once", "job-arc-once", 1, 3)
		archivedAt := time.Now()
		// completedSince returns the reports completed that started after t, oldest first.
		completedSince := func(t time.Time) []hooksv1alpha1.ReconciliationReport {
			var l hooksv1alpha1.ReconciliationReportList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			var out []hooksv1alpha1.ReconciliationReport
			for _, rr := range l.Items {
				if rr.CreationTimestamp.After(t.Add(time.Second)) && rr.Status.Phase == hooksv1alpha1.ReportCompleted {
					out = append(out, rr)
				}
			}
			sort.Slice(out, func(i, j int) bool { return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp) })
			return out
		}
		var rs []hooksv1alpha1.ReconciliationReport
		Eventually(func() int { rs = completedSince(archivedAt); return len(rs) }).
			WithTimeout(45*time.Second).Should(BeNumerically(">=", 3), "three passes after the archival")
		last := rs[len(rs)-1]
		Expect(last.Status.Examined).To(HaveKeyWithValue("ArchivedUnchanged", BeNumerically(">=", 1)),
			"the last pass counts the archived charge's record as compared before: %v", last.Status.Examined)
		Expect(last.Status.Examined["Archived"]).To(BeZero(),
			"the last pass read no archived settlement again for a record it compared before: %v", last.Status.Examined)
		archivedBS, err := store.Settlement(ctx, ns, stlName("job-arc-once"))
		Expect(err).NotTo(HaveOccurred())
		Expect(archivedBS).NotTo(BeNil())
		for _, item := range last.Status.Items { // the shared fake holds other specs' records too
			Expect(item.ProviderRef).NotTo(Equal(archivedBS.Status.ProviderRef), "nothing is reported about it: %s", item.Message)
		}

		// The provider's record changes: it is compared with the archived settlement again.
		// The shared fake holds the whole suite's records, and the hour-long overlap lists
		// them all: at the end of a full run a walk spans several passes (90 s: 45 s ran
		// out once there; alone, this spec takes 20 s in all).
		Expect(billing.SetStatus(archivedBS.Spec.SettlementKey, billingapi.StatusPending, "")).To(Succeed())
		changedAt := time.Now()
		Eventually(func() int32 {
			for _, rr := range completedSince(changedAt) {
				if n := rr.Status.Examined["Archived"]; n > 0 {
					return n
				}
			}
			return 0
		}).WithTimeout(90*time.Second).Should(BeNumerically(">=", 1), "a pass compares the changed record with the archive")
	})

	It("compares Stripe's meter event summaries with the usage of cluster ∪ archive: a total outside it is reported", func() {
		const key = "sk_test_usage_totals"
		fake, err := fakestripe.Start(fakestripe.Options{APIKey: key, Meters: []fakestripe.Meter{{ID: "mtr_tokens", EventName: "tokens_used"}}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
		ns := newTenantWithToken(key, stripeBilling(fake), func(bp *hooksv1alpha1.BillingProvider, _ *hooksv1alpha1.WebhookProvider) {
			bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{
				Interval: &metav1.Duration{Duration: 2 * time.Second}, StuckAfter: &metav1.Duration{Duration: time.Second}}
		})
		// A total covers whole minutes that ended (here 1s ago: the suite's lag; the clock
		// skew allowed is 1s): job A is sent early in a minute, so that it is archived,
		// and only in the archive, before the pass that compares its minute.
		Eventually(func() int { return time.Now().Second() }).WithTimeout(70*time.Second).WithPolling(100*time.Millisecond).
			Should(SatisfyAll(BeNumerically(">=", 2), BeNumerically("<", 6)), "early in a minute, past the 1s clock skew")
		minute := time.Now().Truncate(time.Minute)
		sendOK(ns, "msg-usage-a", jobEvent("job-usage-a", 1, 1523))
		Eventually(settlementState(ns, "job-usage-a")).Should(Equal(hooksv1alpha1.SettlementSettled))
		// Stripe drops job A's event after accepting it (its asynchronous validation: the
		// meter's error reports), and holds 2 units for job B's customer that nobody here sent.
		a := settlementOf(ns, "job-usage-a")
		Expect(fake.InvalidateMeterEvent(a.Spec.IdempotencyKey)).To(BeTrue())
		sendOK(ns, "msg-usage-b", jobEvent("job-usage-b", 1, 40))
		sendOK(ns, "msg-usage-c", jobEvent("job-usage-c", 1, 9)) // Stripe's total matches: no finding
		Eventually(settlementState(ns, "job-usage-b")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Eventually(settlementState(ns, "job-usage-c")).Should(Equal(hooksv1alpha1.SettlementSettled))
		fake.AddMeterEvent("tokens_used", "foreign-usage-b", "cus_job-usage-b", "2")
		goneFromCluster(ns, stlName("job-usage-a"), &hooksv1alpha1.BillingSettlement{})
		Expect(time.Now().Truncate(time.Minute)).To(Equal(minute), "job A was archived within the minute it was sent in")

		// usageFinding returns the finding about customer's total and the report it is in.
		usageFinding := func(customer string) (hooksv1alpha1.Discrepancy, *hooksv1alpha1.ReconciliationReport) {
			GinkgoHelper()
			var found *hooksv1alpha1.Discrepancy
			var in *hooksv1alpha1.ReconciliationReport
			Eventually(func() bool {
				var l hooksv1alpha1.ReconciliationReportList
				Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
				for i := range l.Items {
					for _, d := range l.Items[i].Status.Items {
						if d.Type == hooksv1alpha1.DiscrepancyUsageTotalMismatch && strings.Contains(d.ProviderRef, "customer "+customer+",") {
							found, in = &d, &l.Items[i]
							return true
						}
					}
				}
				return false
			}).WithTimeout(90*time.Second).WithPolling(200*time.Millisecond).Should(BeTrue(), "a report compares %s's total", customer)
			return *found, in
		}
		less, report := usageFinding("cus_job-usage-a")
		// The pass that compared the minute read all three totals, and job C's matched.
		Expect(report.Status.Examined).To(HaveKeyWithValue("UsageTotal", BeNumerically(">=", 3)))
		Expect(report.Status.Examined).To(HaveKeyWithValue("ArchivedUsage", BeNumerically(">=", 1)))
		for _, d := range report.Status.Items {
			Expect(d.ProviderRef).NotTo(ContainSubstring("cus_job-usage-c"), "a matching total is no finding: %s", d.Message)
		}
		Expect(less.Action).To(Equal(hooksv1alpha1.RepairManualReview))
		Expect(less.Object).To(Equal("BillingProvider/" + fixtures.BillingProviderName))
		Expect(less.Message).To(SatisfyAll(ContainSubstring("totals 0 for usage meter \"tokens\""),
			ContainSubstring("add up to 1523 (1 settled in the window"), ContainSubstring("less than")), "counted from the archive")
		more, _ := usageFinding("cus_job-usage-b")
		Expect(more.Message).To(SatisfyAll(ContainSubstring("totals 42 "), ContainSubstring("add up to 40 "), ContainSubstring("more than")))
		posts := 0
		for _, r := range fake.Requests() {
			if r.Method == http.MethodPost {
				posts++
			}
		}
		Expect(posts).To(Equal(3), "the comparison sends nothing: one meter event per job")
	})
})
