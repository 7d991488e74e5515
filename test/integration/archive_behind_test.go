package integration_test

import (
	"encoding/json"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers/archiver"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/internal/archivewatermark"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// startWithWatermark starts a manager (a new process's worth: its own keeper and
// migrator) that archives to store and keeps the watermark in ns/cm, checked every second.
func startWithWatermark(store *archive.Store, ns, cm string) *runningManager {
	GinkgoHelper()
	keeper := &archivewatermark.Keeper{Client: k8s, Archive: store, Namespace: ns, ConfigMap: cm}
	return startManager(managerOptions{store: store, archiveAfter: time.Second, watermark: keeper,
		migrator: &archiver.Migrator{Archive: store, Client: k8s, Namespace: ns, ConfigMap: cm,
			Retry: time.Second, Watermark: keeper, CheckEvery: time.Second}})
}

// An archive restored from an older copy keeps its identity row; the cluster's
// watermark finds it behind, and a charge it lost is not POSTed again on redelivery.
var _ = Describe("an archive behind the cluster (docs/design.md §12)", Ordered, func() {
	var (
		pg     *pgtest.Server
		store  *archive.Store
		opNS   string
		cmName = "settlement-operator-archive"
	)
	BeforeAll(func() {
		var err error
		pg, err = pgtest.Start()
		Expect(err).NotTo(HaveOccurred())
		Expect(pg.CreateDatabase("archive")).To(Succeed())
		store, err = archive.Open(archive.Config{URL: pg.URL("archive"), StatementTimeout: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "operator-"}}
		Expect(k8s.Create(ctx, ns)).To(Succeed())
		opNS = ns.Name
		mgr.stop()
		mgr = startWithWatermark(store, opNS, cmName)
	})
	AfterAll(func() { backToTheManagerWithoutArchive(store, pg) })

	stlName := func(jobID string) string {
		return identity.SettlementName("inference", identity.DefaultSettlementKey("inference", jobID))
	}
	gone := func(ns, name string, obj client.Object) {
		GinkgoHelper()
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj))
		}).WithTimeout(45*time.Second).Should(BeTrue(), "%s/%s leaves the cluster", ns, name)
	}
	settledAndArchived := func(ns, msgID, jobID string, tokens int) {
		GinkgoHelper()
		sendOK(ns, msgID, jobEvent(jobID, 1, tokens))
		Eventually(settlementState(ns, jobID)).Should(Equal(hooksv1alpha1.SettlementSettled))
		gone(ns, stlName(jobID), &hooksv1alpha1.BillingSettlement{})
		gone(ns, identity.JobCompletionName("inference", jobID), &hooksv1alpha1.JobCompletion{})
		gone(ns, identity.EventName(ns, "inference", msgID), &hooksv1alpha1.WebhookEvent{})
	}
	watermark := func() archive.Mark {
		var cm corev1.ConfigMap
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: cmName}, &cm); err != nil {
			return archive.Mark{}
		}
		var m archive.Mark
		_ = json.Unmarshal([]byte(cm.Data[archivewatermark.Key]), &m)
		return m
	}
	eventOn := func(ns, name, reason string) func() bool {
		return func() bool {
			var l corev1.EventList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			for _, e := range l.Items {
				if e.Reason == reason && e.InvolvedObject.Name == name {
					return true
				}
			}
			return false
		}
	}

	It("finds an archive restored from a copy of its data directory behind, and looks a lost key up before any POST", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-wm-0", "job-wm-0", 3)
		Eventually(watermark).ShouldNot(BeZero(), "the watermark covers what left the cluster")

		// The backup: a copy of the archive's data directory.
		Expect(pg.Stop()).To(Succeed())
		backup, err := pg.CopyData()
		Expect(err).NotTo(HaveOccurred())
		Expect(pg.StartAgain()).To(Succeed())
		before := watermark()

		// A charge settled, archived and gone from the cluster after the backup.
		settledAndArchived(ns, "msg-wm-1", "job-wm-1", 9)
		idem := identity.NamespacedIdempotencyKey(ns, key(ns, "job-wm-1"))
		Expect(posts(billing.CallsFor(idem))).To(Equal(1))
		Expect(watermark().Seq).To(BeNumerically(">", before.Seq), "the watermark covers the charge before it left")
		Expect(store.Behind()).To(BeEmpty())

		// The restore: the archive as it was at the backup, with the same identity.
		Expect(pg.Stop()).To(Succeed())
		pg.WaitGone(10 * time.Second)
		Expect(pg.RestoreData(backup)).To(Succeed())
		Expect(pg.StartAgain()).To(Succeed())

		// ArchiveBehind: the process state, the metric's source, a Warning on the ConfigMap.
		Eventually(store.Behind).WithTimeout(30 * time.Second).Should(ContainSubstring("lacks row"))
		Eventually(eventOn(opNS, cmName, hooksv1alpha1.ReasonArchiveBehind)).WithTimeout(30*time.Second).Should(BeTrue(),
			"a Warning ArchiveBehind on the identity ConfigMap")
		got, err := store.Settlement(ctx, ns, stlName("job-wm-1"))
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(BeNil(), "the restored archive lost the charge")

		// The event is redelivered: the archive cannot say it saw it, so it is accepted
		// and dispatched — and its settlement asks the provider by key before any POST.
		calls := len(billing.CallsFor(idem))
		r := send(ns, "msg-wm-1", jobEvent("job-wm-1", 1, 9))
		Expect(r.Status).To(Equal(http.StatusOK))
		Eventually(settlementState(ns, "job-wm-1")).WithTimeout(45 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		Consistently(func() int { return posts(billing.CallsFor(idem)) }).WithTimeout(3*time.Second).Should(Equal(1),
			"no second POST of the lost key")
		since := billing.CallsFor(idem)[calls:]
		Expect(since).NotTo(BeEmpty())
		Expect(since[0].Method).To(Equal(http.MethodGet), "a lookup by key first: %+v", since)
		Eventually(eventOn(ns, stlName("job-wm-1"), hooksv1alpha1.ReasonArchiveBehind)).Should(BeTrue(),
			"the settlement says why it was looked up first")

		// The state lasts: the watermark does not move past the lost row.
		Consistently(store.Behind).WithTimeout(3 * time.Second).ShouldNot(BeEmpty())

		// A person confirms (after finding the gap): the watermark is removed, the state clears.
		var cm corev1.ConfigMap
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: cmName}, &cm)).To(Succeed())
		delete(cm.Data, archivewatermark.Key)
		Expect(k8s.Update(ctx, &cm)).To(Succeed())
		Eventually(store.Behind).WithTimeout(30 * time.Second).Should(BeEmpty())
		Eventually(eventOn(opNS, cmName, hooksv1alpha1.ReasonArchiveBehindConfirmed)).Should(BeTrue())
	})
	It("finds it behind when the operator starts against an archive restored while it was down", func() {
		ns := reconcilingTenant()
		settledAndArchived(ns, "msg-wm-2", "job-wm-2", 4)
		Expect(pg.Stop()).To(Succeed())
		backup, err := pg.CopyData()
		Expect(err).NotTo(HaveOccurred())
		Expect(pg.StartAgain()).To(Succeed())
		settledAndArchived(ns, "msg-wm-3", "job-wm-3", 6)
		idem := identity.NamespacedIdempotencyKey(ns, key(ns, "job-wm-3"))
		Expect(posts(billing.CallsFor(idem))).To(Equal(1))
		lost := watermark()
		Expect(lost.Name).NotTo(BeEmpty())

		// The operator goes down; the archive is restored; a new operator process starts.
		mgr.stop()
		Expect(pg.Stop()).To(Succeed())
		pg.WaitGone(10 * time.Second)
		Expect(pg.RestoreData(backup)).To(Succeed())
		Expect(pg.StartAgain()).To(Succeed())
		store.Close()
		store, err = archive.Open(archive.Config{URL: pg.URL("archive"), StatementTimeout: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		mgr = startWithWatermark(store, opNS, cmName)

		Eventually(store.Behind).WithTimeout(30 * time.Second).Should(ContainSubstring("lacks row"))
		calls := len(billing.CallsFor(idem))
		Expect(send(ns, "msg-wm-3", jobEvent("job-wm-3", 1, 6)).Status).To(Equal(http.StatusOK))
		Eventually(settlementState(ns, "job-wm-3")).WithTimeout(45 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))
		Consistently(func() int { return posts(billing.CallsFor(idem)) }).WithTimeout(3*time.Second).Should(Equal(1),
			"no second POST of the lost key")
		since := billing.CallsFor(idem)[calls:]
		Expect(since).NotTo(BeEmpty())
		Expect(since[0].Method).To(Equal(http.MethodGet), "a lookup by key first: %+v", since)
		Expect(watermark()).To(Equal(lost), "the watermark does not move while the archive is behind")
	})
})
