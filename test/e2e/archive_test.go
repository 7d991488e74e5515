//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/internal/extract"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/payload"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

// archNS is the archive specs' tenant. The replicas they run serve only it
// (--watch-namespaces), so nothing the other scenarios left in ns is archived, and
// the replicas are put back as the suite started them afterwards.
const archNS = "e2e-archive"

// leaseName is the manager's leader-election Lease (cmd/main.go).
const leaseName = "settlement-operator.hooks.settlement.dev"

// memoryLimit is the manager Deployment's memory limit (config/manager/manager.yaml).
const memoryLimit = 512 << 20

var _ = Describe("the archive on real processes (docs/design.md §12)", Ordered, func() {
	var (
		pg    *pgtest.Server
		store *archive.Store
		// db reads what the Store does not offer: which names are archived, counts.
		db          *pgxpool.Pool
		archiveArgs []string
		// archiving lists every replica started with the archive on, dead or alive,
		// for their logs.
		archiving   []*replica
		archivingMu sync.Mutex
	)
	startArchiving := func() *replica {
		GinkgoHelper()
		r := startReplica(archiveArgs...)
		archivingMu.Lock()
		archiving = append(archiving, r)
		archivingMu.Unlock()
		return r
	}

	BeforeAll(func() {
		var err error
		pg, err = pgtest.Start()
		Expect(err).NotTo(HaveOccurred(),
			"the archive specs need PostgreSQL's server binaries (initdb, pg_ctl, postgres: Debian's postgresql package, or PG_BIN); without them they fail, they never skip")
		Expect(pg.CreateDatabase("archive")).To(Succeed())
		url := pg.URL("archive")
		store, err = archive.Open(archive.Config{URL: url, MaxConns: 16, StatementTimeout: 30 * time.Second, ApplicationName: "e2e"})
		Expect(err).NotTo(HaveOccurred())
		Expect(store.Migrate(ctx)).To(Succeed())
		db, err = pgxpool.New(ctx, url)
		Expect(err).NotTo(HaveOccurred())

		By("configuring the archive tenant; passes every 2s, since only settlements a pass confirmed are archived")
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: archNS}})).To(Succeed())
		for _, sec := range fixtures.Secrets(archNS, billingToken, billing.URL()) {
			Expect(k8s.Create(ctx, sec)).To(Succeed())
		}
		bp := fixtures.BillingProvider(archNS, billing.URL())
		bp.Spec.Retry = &hooksv1alpha1.RetryPolicy{MaxAttempts: 200, MaxElapsed: fixtures.Duration(10 * time.Minute),
			InitialBackoff: fixtures.Duration(200 * time.Millisecond), MaxBackoff: fixtures.Duration(2 * time.Second)}
		bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{Interval: fixtures.Duration(2 * time.Second),
			StuckAfter: fixtures.Duration(time.Minute), EventStaleAfter: fixtures.Duration(2 * time.Minute), KeepReports: 5}
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		wp := fixtures.WebhookProvider(archNS)
		wp.Spec.Routes[0].Operations[0].JobCompletion.Sink = &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP, URL: sink.URL(), AllowInsecureHTTP: true}
		Expect(k8s.Create(ctx, wp)).To(Succeed())

		By("restarting both replicas with the archive on, records archived 2s after they finish")
		// Eight workers per controller (the archiver runs one controller per kind):
		// more archivals in flight at any moment, so a kill finds more of them
		// between insert and delete.
		archiveArgs = []string{"--archive-database-url", url, "--archive-after", "2s",
			"--watch-namespaces", archNS, "--max-concurrent-reconciles", "8"}
		stopAllReplicas()
		startTogether(2, startArchiving)
		Eventually(leader).ShouldNot(BeNil())
	})

	// A failing spec shows the ends of the archiving replicas' logs and of
	// PostgreSQL's (the suite removes its directory at the end).
	AfterEach(func() {
		if !CurrentSpecReport().Failed() {
			return
		}
		archivingMu.Lock()
		defer archivingMu.Unlock()
		for _, r := range archiving {
			b, _ := os.ReadFile(r.logPath)
			fmt.Fprintf(GinkgoWriter, "--- end of %s's log:\n%s\n", r.name, tail(string(b), 40))
		}
		if pg != nil {
			fmt.Fprintf(GinkgoWriter, "--- end of PostgreSQL's log:\n%s\n", tail(pg.Log(), 40))
		}
	})

	AfterAll(func() {
		// The replicas that follow serve every namespace: leave this tenant quiet.
		bp := &hooksv1alpha1.BillingProvider{}
		if k8s.Get(ctx, client.ObjectKey{Namespace: archNS, Name: fixtures.BillingProviderName}, bp) == nil {
			patch := client.MergeFrom(bp.DeepCopy())
			bp.Spec.Reconciliation.Interval = fixtures.Duration(time.Hour)
			_ = k8s.Patch(ctx, bp, patch)
		}
		By("putting the replicas back as the suite started them")
		stopAllReplicas()
		startTogether(2, func() *replica { return startReplica() })
		Eventually(leader).ShouldNot(BeNil())
		if db != nil {
			db.Close()
		}
		if store != nil {
			store.Close()
		}
		if pg != nil {
			pg.Close()
		}
	})

	// archivedNames returns which of names table holds in archNS.
	archivedNames := func(table string, names []string) (map[string]bool, error) {
		out := map[string]bool{}
		rows, err := db.Query(ctx, `SELECT DISTINCT name FROM `+table+` WHERE namespace = $1 AND name = ANY($2)`, archNS, names)
		if err != nil {
			return nil, err
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		for _, n := range found {
			out[n] = true
		}
		return out, nil
	}

	// overlap is what is both in the cluster and in the archive right now.
	type overlap struct {
		// notDeleted: archived, not yet deleted: an archival between insert and delete.
		notDeleted map[string][]string
		// releasing: settlements deleted and archived whose finalizer is not released yet.
		releasing []string
		// inCluster counts the archive tenant's records still in the cluster, by kind.
		inCluster map[string]int
	}
	scan := func() overlap {
		GinkgoHelper()
		o := overlap{notDeleted: map[string][]string{}, inCluster: map[string]int{}}
		var evs hooksv1alpha1.WebhookEventList
		var jcs hooksv1alpha1.JobCompletionList
		var stls hooksv1alpha1.BillingSettlementList
		lists := []struct {
			kind, table string
			list        client.ObjectList
			items       func() []metav1.Object
		}{
			{"WebhookEvent", "event_receipts", &evs, func() []metav1.Object {
				out := []metav1.Object{}
				for i := range evs.Items {
					out = append(out, &evs.Items[i])
				}
				return out
			}},
			{"JobCompletion", "job_completions", &jcs, func() []metav1.Object {
				out := []metav1.Object{}
				for i := range jcs.Items {
					out = append(out, &jcs.Items[i])
				}
				return out
			}},
			{"BillingSettlement", "settlements", &stls, func() []metav1.Object {
				out := []metav1.Object{}
				for i := range stls.Items {
					out = append(out, &stls.Items[i])
				}
				return out
			}},
		}
		for _, l := range lists {
			Expect(k8s.List(ctx, l.list, client.InNamespace(archNS))).To(Succeed())
			items := l.items()
			o.inCluster[l.kind] = len(items)
			names := make([]string, 0, len(items))
			for _, it := range items {
				names = append(names, it.GetName())
			}
			archived, err := archivedNames(l.table, names)
			Expect(err).NotTo(HaveOccurred())
			for _, it := range items {
				switch {
				case !archived[it.GetName()]:
				case it.GetDeletionTimestamp() == nil:
					o.notDeleted[l.kind] = append(o.notDeleted[l.kind], it.GetName())
				case l.kind == "BillingSettlement":
					o.releasing = append(o.releasing, it.GetName())
				}
			}
		}
		return o
	}

	// archivedRows counts the archive tenant's rows, all kinds.
	archivedRows := func() int {
		GinkgoHelper()
		var n int
		Expect(db.QueryRow(ctx, `SELECT (SELECT count(*) FROM event_receipts WHERE namespace = $1) +
			(SELECT count(*) FROM job_completions WHERE namespace = $1) + (SELECT count(*) FROM settlements WHERE namespace = $1)`,
			archNS).Scan(&n)).To(Succeed())
		return n
	}

	// progress says where the tenant's records in the cluster are, for the log.
	progress := func() string {
		var evs hooksv1alpha1.WebhookEventList
		var jcs hooksv1alpha1.JobCompletionList
		var stls hooksv1alpha1.BillingSettlementList
		if k8s.List(ctx, &evs, client.InNamespace(archNS)) != nil || k8s.List(ctx, &jcs, client.InNamespace(archNS)) != nil ||
			k8s.List(ctx, &stls, client.InNamespace(archNS)) != nil {
			return "(list failed)"
		}
		phases, states, jstates := map[string]int{}, map[string]int{}, map[string]int{}
		for _, e := range evs.Items {
			phases[string(e.Status.Phase)]++
		}
		for _, j := range jcs.Items {
			jstates[string(j.Status.State)]++
		}
		for _, b := range stls.Items {
			st := string(b.Status.State)
			if findCond(b.Status.Conditions, hooksv1alpha1.ConditionReconciled) == metav1.ConditionTrue {
				st += "+Reconciled"
			}
			if b.DeletionTimestamp != nil {
				st += "+Deleting"
			}
			states[st]++
		}
		return fmt.Sprintf("events %v, jobs %v, settlements %v, %d rows archived", phases, jstates, states, archivedRows())
	}

	// allArchived fails g until every job's event, completion and settlement is in the
	// archive and none of them is in the cluster any more.
	allArchived := func(g Gomega, eventIDs map[string]string) {
		var evNames, jcNames, stNames []string
		for id, job := range eventIDs {
			evNames = append(evNames, identity.EventName(archNS, "inference", id))
			jcNames = append(jcNames, identity.JobCompletionName("inference", job))
			stNames = append(stNames, identity.SettlementNameFor("inference", identity.JobSettlementKey(archNS, "inference", job)))
		}
		for _, k := range []struct {
			table string
			names []string
		}{{"event_receipts", evNames}, {"job_completions", jcNames}, {"settlements", stNames}} {
			got, err := archivedNames(k.table, k.names)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(len(got)).To(Equal(len(uniq(k.names))), "%s: archived", k.table)
		}
		o := scan()
		g.Expect(o.inCluster).To(Equal(map[string]int{"WebhookEvent": 0, "JobCompletion": 0, "BillingSettlement": 0}),
			"nothing left in the cluster; archived and still there: %v, deleted and releasing: %v", o.notDeleted, o.releasing)
	}

	// noArchiveConflict checks the live replicas' conflict counters, every archiving
	// replica's log (a killed one's counters died with it) and the tenant's Events.
	noArchiveConflict := func() {
		GinkgoHelper()
		for _, r := range liveReplicas() {
			for _, line := range metricLines(r, "settlement_archive_failures_total") {
				if strings.Contains(line, `reason="conflict"`) {
					Expect(strings.HasSuffix(line, " 0")).To(BeTrue(), "%s: %s", r.name, line)
				}
			}
		}
		archivingMu.Lock()
		logs := append([]*replica(nil), archiving...)
		archivingMu.Unlock()
		for _, r := range logs {
			b, err := os.ReadFile(r.logPath)
			Expect(err).NotTo(HaveOccurred())
			for _, line := range strings.Split(string(b), "\n") {
				Expect(line).NotTo(ContainSubstring("archive conflict"), "%s logged a conflict", r.name)
				Expect(line).NotTo(ContainSubstring(hooksv1alpha1.ReasonArchiveConflict), "%s logged a conflict", r.name)
			}
		}
		var l corev1.EventList
		Expect(k8s.List(ctx, &l, client.InNamespace(archNS))).To(Succeed())
		for _, e := range l.Items {
			Expect(e.Reason).NotTo(Equal(hooksv1alpha1.ReasonArchiveConflict), "%s: %s", e.InvolvedObject.Name, e.Message)
		}
	}

	// This is the crash the archive's design answers (§12: insert, read back, then
	// delete with preconditions; "a crash between any two steps loses nothing and
	// duplicates nothing"). The window between an archival's insert and its delete
	// is a few milliseconds, so it is hit by killing the leader at random moments
	// while hundreds of records are being archived, eight workers per kind; each kill
	// reports how many records it left archived but still in the cluster. Nothing
	// can make a kill land in the window every time, and this spec does not prove
	// it did: the count it prints says how often it was hit in this run.
	//
	// After each kill -9 the test deletes the dead leader's Lease, so the other
	// replica takes over within its 2s retry instead of the 15s lease: the dead
	// process can neither renew nor release it, so this only shortens the wait and
	// changes nothing the new leader finds (the leader-kill scenario waits the lease
	// out). That makes room for several kills within the suite's time budget.
	It("loses and duplicates nothing when the leader is killed -9 again and again mid-archival", func() {
		const jobs, kills = 300, 6
		r := newRun()
		r.namespace = archNS
		var wg sync.WaitGroup
		wg.Add(1)
		burstStart := time.Now()
		var burstTook time.Duration
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			r.burst("arckill", jobs, 8, nil)
			burstTook = time.Since(burstStart)
		}()

		By("waiting for the first settlement to be archived")
		Eventually(func() (int, error) {
			var n int
			err := db.QueryRow(ctx, `SELECT count(*) FROM settlements WHERE namespace = $1`, archNS).Scan(&n)
			return n, err
		}).WithTimeout(3*time.Minute).Should(BeNumerically(">", 0), "archival starts")

		var hits, interrupted, releasing int
		var summary []string
		var restarts sync.WaitGroup
		for k := 1; k <= kills; k++ {
			var l *replica
			Eventually(func() *replica { l = leader(); return l }).WithPolling(100 * time.Millisecond).ShouldNot(BeNil())
			time.Sleep(time.Second + rand.N(2*time.Second))
			// Then kill at the next moment a row appears in the archive: the leader has
			// just inserted a record, and is reading it back or about to delete it.
			archivedBefore := archivedRows()
			for deadline := time.Now().Add(3 * time.Second); archivedRows() == archivedBefore && time.Now().Before(deadline); {
				time.Sleep(2 * time.Millisecond)
			}
			killedAt := time.Now()
			l.kill()
			// No leader now until the Lease goes: the picture is frozen (but for API
			// requests the dead process had already sent).
			o := scan()
			n := len(o.notDeleted["WebhookEvent"]) + len(o.notDeleted["JobCompletion"]) + len(o.notDeleted["BillingSettlement"])
			interrupted += n
			releasing += len(o.releasing)
			if n > 0 {
				hits++
			}
			line := fmt.Sprintf("kill %d of %s (%d rows archived before): archived but not deleted: %d events, %d jobs, %d settlements; deleted, finalizer held: %d; in the cluster: %v",
				k, l.name, archivedBefore, len(o.notDeleted["WebhookEvent"]), len(o.notDeleted["JobCompletion"]),
				len(o.notDeleted["BillingSettlement"]), len(o.releasing), o.inCluster)
			summary = append(summary, line)
			fmt.Fprintln(GinkgoWriter, line+"\n  "+progress())
			deleteDeadLease(killedAt)
			restarts.Add(1)
			go func() {
				defer restarts.Done()
				defer GinkgoRecover()
				startArchiving()
			}()
		}
		restarts.Wait()
		wg.Wait()

		By("waiting until everything is archived and gone from the cluster")
		r.mu.Lock()
		accepted := map[string]string{}
		for id, job := range r.accepted {
			accepted[id] = job
		}
		statuses := fmt.Sprint(r.statuses)
		r.mu.Unlock()
		Expect(accepted).To(HaveLen(jobs), "every job acknowledged")
		quietStart := time.Now()
		lastProgress := time.Now()
		Eventually(func(g Gomega) {
			if time.Since(lastProgress) > 5*time.Second {
				lastProgress = time.Now()
				fmt.Fprintf(GinkgoWriter, "%s after the last kill: %s\n", time.Since(quietStart).Round(time.Second), progress())
			}
			allArchived(g, accepted)
		}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
		quietTook := time.Since(quietStart)
		o := scan()
		Expect(o.notDeleted).To(BeEmpty(), "once quiet, nothing is both in the cluster and in the archive")
		Expect(o.releasing).To(BeEmpty())

		By("checking every job against the ledger and the archive")
		ledger := map[string][]string{} // settlement key -> provider refs
		for _, rec := range billing.Records() {
			if k, ok := identity.ParseSettlementKey(rec.SettlementKey); ok && k.Namespace == archNS {
				ledger[rec.SettlementKey] = append(ledger[rec.SettlementKey], rec.ID)
			}
		}
		keys := map[string]bool{}
		for id, job := range accepted {
			key := identity.JobSettlementKey(archNS, "inference", job)
			keys[key] = true
			Expect(billing.Charges(key)).To(Equal(1), "one charge for %s", job)
			Expect(ledger[key]).To(HaveLen(1))

			bs, err := store.Settlement(ctx, archNS, identity.SettlementNameFor("inference", key))
			Expect(err).NotTo(HaveOccurred())
			Expect(bs).NotTo(BeNil(), "%s's settlement is archived", job)
			Expect(bs.Spec.SettlementKey).To(Equal(key))
			Expect(bs.Status.State).To(Equal(hooksv1alpha1.SettlementSettled), "%s", job)
			Expect(bs.Status.ProviderRef).To(Equal(ledger[key][0]), "%s: the archived settlement names the ledger's record", job)
			Expect(bs.DeletionTimestamp).To(BeNil(), "%s: archived before it was deleted", job)
			Expect(findCond(bs.Status.Conditions, hooksv1alpha1.ConditionReconciled)).To(Equal(metav1.ConditionTrue))

			jc, err := store.LatestJob(ctx, archNS, "inference", job)
			Expect(err).NotTo(HaveOccurred())
			Expect(jc).NotTo(BeNil())
			Expect(jc.Progress().State).To(Equal(hooksv1alpha1.JobCompletionApplied))
			Expect(jc.Spec.Completion.Version).To(Equal(int64(1)))
			v, _, applications := sink.Applied(job)
			Expect(v).To(Equal(int64(1)), "the sink has %s", job)
			Expect(applications).To(Equal(1), "the sink applied %s once", job)

			ev, err := store.Event(ctx, archNS, "inference", id)
			Expect(err).NotTo(HaveOccurred())
			Expect(ev).NotTo(BeNil())
			Expect(ev.Phase).To(Equal(string(hooksv1alpha1.EventComplete)))
		}
		for key := range ledger {
			Expect(keys[key]).To(BeTrue(), "charge %s belongs to an acknowledged job", key)
		}
		var rows int
		Expect(db.QueryRow(ctx, `SELECT count(*) FROM settlements WHERE namespace = $1`, archNS).Scan(&rows)).To(Succeed())
		Expect(rows).To(Equal(jobs), "one archived settlement per job")
		Expect(db.QueryRow(ctx, `SELECT count(*) FROM job_completions WHERE namespace = $1`, archNS).Scan(&rows)).To(Succeed())
		Expect(rows).To(Equal(jobs), "one archived completion per job")
		Expect(db.QueryRow(ctx, `SELECT count(*) FROM event_receipts WHERE namespace = $1`, archNS).Scan(&rows)).To(Succeed())
		Expect(rows).To(Equal(jobs), "one archived receipt per event")
		noArchiveConflict()

		report := fmt.Sprintf("archive under kill -9: %d jobs (burst %s), %d kills of the leader, %d of them with archivals interrupted between insert and delete (%d records in all; %d settlements caught between delete and finalizer release); quiet %s after the last kill; one charge per key, every settlement archived Settled with the ledger's reference, no conflict; sender statuses %s",
			jobs, burstTook.Round(time.Millisecond), kills, hits, interrupted, releasing, quietTook.Round(time.Second), statuses)
		AddReportEntry("archive kill -9", report+"\n"+strings.Join(summary, "\n"))
		fmt.Fprintln(GinkgoWriter, "ARCHIVE KILL OK —", report)
	})

	// The bound: a restart with 30,000 archived jobs is Ready within a minute,
	// under the Deployment's 512Mi. Archived records are not in the cluster, so nothing
	// is listed from the archive at start; this holds that. The seeded jobs are
	// copies of a real job the pipeline ran and archived (v2, settled, confirmed),
	// with every name, key, hash, UID and reference derived again for each copy and
	// the payload hash computed as the receiver computes it, so the archive holds
	// what 30,000 real jobs would have left, and the receiver and controllers must
	// recognise them.
	It("restarts Ready within a minute under the memory limit with 30,000 archived jobs, and still knows them", func() {
		const seeds, tokens, workers = 30000, 17, 8

		By("running template jobs (v2) through the pipeline until they are archived")
		tr := newRun()
		tr.namespace = archNS
		templates := map[string]string{}
		for i := range 3 {
			job := fmt.Sprintf("arctpl-%d", i)
			id := "msg_" + job
			Expect(tr.deliver(id, job, 2, jobEvent(job, 2, tokens), time.Minute)).To(Equal(http.StatusOK))
			templates[id] = job
		}
		Eventually(func(g Gomega) { allArchived(g, templates) }).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		const tpl = "arctpl-0"
		fe, err := store.Find(ctx, archNS, "msg_"+tpl)
		Expect(err).NotTo(HaveOccurred())
		Expect(fe.Events).To(HaveLen(1))
		fj, err := store.Find(ctx, archNS, tpl)
		Expect(err).NotTo(HaveOccurred())
		Expect(fj.Jobs).To(HaveLen(1))
		Expect(fj.Settlements).To(HaveLen(1))
		tplEv, tplJob, tplStl := fe.Events[0].Object, fj.Jobs[0].Object, fj.Settlements[0].Object
		Expect(tplStl.Status.State).To(Equal(hooksv1alpha1.SettlementSettled))
		Expect(tplJob.Spec.Completion.Version).To(Equal(int64(2)))

		wp := &hooksv1alpha1.WebhookProvider{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: archNS, Name: "inference"}, wp)).To(Succeed())
		x, err := extract.Compile(archNS, "inference", &wp.Spec)
		Expect(err).NotTo(HaveOccurred())
		// receive does what the receiver does with a delivery: identify it (event ID,
		// payload hash) and, with facts, extract what its route makes of it.
		receive := func(id, body string, facts bool) *extract.Event {
			doc, err := payload.Decode([]byte(body))
			Expect(err).NotTo(HaveOccurred())
			h := http.Header{}
			h.Set(wp.Spec.EventID.Header, id)
			ev, err := x.Identify(h, []byte(body), doc)
			Expect(err).NotTo(HaveOccurred())
			if facts {
				Expect(x.Facts(ev, doc)).To(Succeed())
			}
			return ev
		}
		Expect(receive("msg_"+tpl, jobEvent(tpl, 2, tokens), false).PayloadHash).To(Equal(tplEv.Spec.PayloadHash),
			"the payload hash computed here is the receiver's")

		tplJSON := map[string][]byte{}
		for kind, obj := range map[string]any{"event": &tplEv, "job": &tplJob, "settlement": &tplStl} {
			b, err := json.Marshal(obj)
			Expect(err).NotTo(HaveOccurred())
			tplJSON[kind] = b
		}
		// derived lists every string of a job's records that is a function of its
		// job ID (longest first, so no replacement cuts into another), the job ID last.
		derived := func(job string) []string {
			id := "msg_" + job
			key := identity.JobSettlementKey(archNS, "inference", job)
			return []string{
				identity.EventName(archNS, "inference", id), identity.JobCompletionName("inference", job),
				identity.SettlementNameFor("inference", key), identity.NamespacedIdempotencyKey(archNS, key),
				identity.JobSinkKey(archNS, "inference", job, 2), identity.Hash32(archNS, "inference", id),
				identity.Hash32(job), identity.Hash32(key), identity.IdempotencyKey(key),
				key, job,
			}
		}
		tplDerived := derived(tpl)
		// Every long hex run in the template is one of its derived strings (or inside
		// one): checked on the first copy, so nothing of the template's identity
		// survives in 30,000 copies unnoticed.
		hexRun := regexp.MustCompile(`[0-9a-f]{16,}`)

		var seeded atomic.Int64
		var next atomic.Int64
		seedStart := time.Now()
		var wg sync.WaitGroup
		By(fmt.Sprintf("seeding the archive with %d jobs (event, completion, settlement each), %d writers", seeds, workers))
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				for {
					i := int(next.Add(1)) - 1
					if i >= seeds {
						return
					}
					job := fmt.Sprintf("arcseed-%05d", i)
					id := "msg_" + job
					got := derived(job)
					var pairs []string
					for j, s := range tplDerived {
						pairs = append(pairs, jsonString(s), jsonString(got[j]))
					}
					pairs = append(pairs,
						string(tplEv.UID), string(uuid.NewUUID()), string(tplJob.UID), string(uuid.NewUUID()),
						string(tplStl.UID), string(uuid.NewUUID()),
						jsonString(tplStl.Status.ProviderRef), jsonString(fmt.Sprintf("seed_%s", identity.Hash32("ref", job)[:24])),
						jsonString(tplEv.Spec.PayloadHash), jsonString(receive(id, jobEvent(job, 2, tokens), false).PayloadHash))
					rep := strings.NewReplacer(pairs...)
					var ev hooksv1alpha1.WebhookEvent
					var jc hooksv1alpha1.JobCompletion
					var bs hooksv1alpha1.BillingSettlement
					for kind, into := range map[string]any{"event": &ev, "job": &jc, "settlement": &bs} {
						out := rep.Replace(string(tplJSON[kind]))
						if i == 0 {
							Expect(out).NotTo(ContainSubstring(tpl), "%s: the template's job ID is replaced", kind)
							for _, h := range hexRun.FindAllString(string(tplJSON[kind]), -1) {
								Expect(out).NotTo(ContainSubstring(h), "%s: template string %s is not derived again", kind, h)
							}
						}
						Expect(json.Unmarshal([]byte(out), into)).To(Succeed())
					}
					if i%100 == 0 {
						// The copy says what the receiver and controllers would have made of it.
						want := receive(id, jobEvent(job, 2, tokens), false)
						Expect(ev.Spec.EventID).To(Equal(id))
						Expect(ev.Spec.PayloadHash).To(Equal(want.PayloadHash))
						// An archived receipt keeps its identity, phase and outcomes, not the
						// facts the event proposed (migration 0002: each job version and
						// settlement has its own row): the copy, like its template, has none.
						Expect(ev.Spec.JobCompletions).To(BeEmpty())
						Expect(ev.Spec.Settlements).To(BeEmpty())
						Expect(jc.Spec.JobID).To(Equal(job))
						Expect(bs.Spec.JobID).To(Equal(job))
					}
					Expect(ev.Name).To(Equal(identity.EventName(archNS, "inference", id)))
					Expect(jc.Name).To(Equal(identity.JobCompletionName("inference", job)))
					Expect(bs.Name).To(Equal(identity.SettlementNameFor("inference", identity.JobSettlementKey(archNS, "inference", job))))
					Expect(bs.Spec.IdempotencyKey).To(Equal(identity.NamespacedIdempotencyKey(archNS, identity.JobSettlementKey(archNS, "inference", job))))
					Expect(store.ArchiveEvent(ctx, &ev)).To(Succeed())
					Expect(store.ArchiveJobCompletion(ctx, &jc)).To(Succeed())
					Expect(store.ArchiveSettlement(ctx, &bs)).To(Succeed())
					seeded.Add(1)
				}
			}()
		}
		wg.Wait()
		seedTook := time.Since(seedStart)
		Expect(seeded.Load()).To(Equal(int64(seeds)))
		var archivedJobs int
		Expect(db.QueryRow(ctx, `SELECT count(DISTINCT job_id) FROM job_completions WHERE namespace = $1`, archNS).Scan(&archivedJobs)).To(Succeed())
		Expect(archivedJobs).To(BeNumerically(">=", seeds))
		fmt.Fprintf(GinkgoWriter, "seeded %d jobs (%d rows) in %s; %d archived jobs in all\n", seeds, 3*seeds, seedTook.Round(time.Millisecond), archivedJobs)

		By("stopping both replicas and starting two again with the archive on")
		stopAllReplicas()
		samplers := []*rssSampler{}
		var samplersMu sync.Mutex
		fresh := startTogether(2, func() *replica {
			r := startArchiving()
			samplersMu.Lock()
			samplers = append(samplers, sampleRSS(r))
			samplersMu.Unlock()
			return r
		})
		for _, r := range fresh {
			Expect(r.readyAfter).To(BeNumerically("<", time.Minute), "%s Ready within a minute", r.name)
		}
		Eventually(leader).ShouldNot(BeNil())

		By("redelivering a sample of the archived events: duplicates, nothing written")
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
		sample := map[int]bool{}
		for len(sample) < 40 {
			sample[rng.IntN(seeds)] = true
		}
		// The receiver gives the archive ArchiveTimeout (300ms) and, when it does not
		// answer in time, stores the delivery by design (docs/design.md §12): a just
		// restarted replica's first PostgreSQL queries on a busy 2-core machine can
		// take longer (this spec failed once so, a fresh-clone CI on 2 Dec). Such an
		// answer must be a counted timeout, never a miss, and its extra receipt must be
		// removed by the event controller with nothing dispatched; every replica must
		// still answer some redelivery from the archive.
		n := 0
		stored := map[string]bool{}
		fromArchive := map[string]int{}
		for i := range sample {
			job := fmt.Sprintf("arcseed-%05d", i)
			rep := fresh[n%len(fresh)]
			n++
			timeoutsBefore := counterValue(rep, "settlement_receiver_archive_lookups_total", `result="error"`)
			resp, err := sender.Send(ctx, &http.Client{Timeout: 20 * time.Second}, sender.Delivery{
				URL: rep.receiverURL + identity.EndpointPath(archNS, "inference"), ID: "msg_" + job,
				Body: []byte(jobEvent(job, 2, tokens)), Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks},
				Secret: []byte(swhSecret)})
			Expect(err).NotTo(HaveOccurred())
			Expect(resp.Status).To(Equal(http.StatusOK), "%s: %s", job, resp.Body)
			if strings.Contains(resp.Body, `"duplicate"`) {
				fromArchive[rep.name]++
				continue
			}
			Expect(resp.Body).To(ContainSubstring(`"accepted"`), "%s: %s", job, resp.Body)
			Expect(counterValue(rep, "settlement_receiver_archive_lookups_total", `result="error"`)).To(BeNumerically(">", timeoutsBefore),
				"%s was stored although archived: only an archive lookup that timed out may store it (%s)", job, rep.name)
			stored[job] = true
		}
		for i := range sample {
			job := fmt.Sprintf("arcseed-%05d", i)
			key := client.ObjectKey{Namespace: archNS, Name: identity.EventName(archNS, "inference", "msg_"+job)}
			if !stored[job] {
				err := k8s.Get(ctx, key, &hooksv1alpha1.WebhookEvent{})
				Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a duplicate answer writes nothing (%s)", job)
				continue
			}
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, key, &hooksv1alpha1.WebhookEvent{}))
			}).WithTimeout(time.Minute).Should(BeTrue(), "the receipt stored after an archive timeout is removed as an archived duplicate (%s)", job)
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: archNS, Name: identity.JobCompletionName("inference", job)},
				&hooksv1alpha1.JobCompletion{})).NotTo(Succeed(), "%s: nothing dispatched", job)
			skey := identity.JobSettlementKey(archNS, "inference", job)
			Expect(billing.Charges(skey)).To(BeZero(), "no charge for %s", job)
			Expect(posts(billing.CallsFor(identity.NamespacedIdempotencyKey(archNS, skey)))).To(BeZero(), "nothing sent for %s", job)
		}
		fmt.Fprintf(GinkgoWriter, "redeliveries answered from the archive per replica: %v; stored after an archive timeout and removed: %d\n", fromArchive, len(stored))
		for _, r := range fresh {
			Expect(fromArchive[r.name]).To(BeNumerically(">", 0), "%s answered some redelivery from the archive", r.name)
		}

		By("sending v1 of archived v2 jobs: superseded, nothing charged")
		v1 := map[string]string{}
		for len(v1) < 10 {
			job := fmt.Sprintf("arcseed-%05d", rng.IntN(seeds))
			v1["msg_"+job+"_v1"] = job
		}
		vr := newRun()
		vr.namespace = archNS
		for id, job := range v1 {
			Expect(vr.deliver(id, job, 1, jobEvent(job, 1, tokens+5), time.Minute)).To(Equal(http.StatusOK))
		}
		for id, job := range v1 {
			var archived *hooksv1alpha1.WebhookEvent
			Eventually(func() (*hooksv1alpha1.WebhookEvent, error) {
				f, err := store.Find(ctx, archNS, id)
				if err != nil || len(f.Events) == 0 {
					return nil, err
				}
				archived = &f.Events[0].Object
				return archived, nil
			}).WithTimeout(time.Minute).ShouldNot(BeNil(), "%s finishes and is archived", id)
			Expect(archived.Status.Phase).To(Equal(hooksv1alpha1.EventComplete))
			for _, op := range archived.Status.Operations {
				if op.Type == hooksv1alpha1.OperationJobCompletion {
					Expect(op.Outcome).To(Equal(hooksv1alpha1.OutcomeSuperseded), "%s: %s", id, op.Message)
				}
			}
			key := identity.JobSettlementKey(archNS, "inference", job)
			Expect(billing.Charges(key)).To(BeZero(), "no charge for %s", job)
			Expect(posts(billing.CallsFor(identity.NamespacedIdempotencyKey(archNS, key)))).To(BeZero(), "nothing sent for %s", job)
			v, _, _ := sink.Applied(job)
			Expect(v).To(BeZero(), "%s never reached the sink", job)
			latest, err := store.LatestJob(ctx, archNS, "inference", job)
			Expect(err).NotTo(HaveOccurred())
			Expect(latest.Spec.Completion.Version).To(Equal(int64(2)), "%s stays at v2", job)
			bs, err := store.Settlement(ctx, archNS, identity.SettlementNameFor("inference", key))
			Expect(err).NotTo(HaveOccurred())
			Expect(bs.Status.ProviderRef).To(HavePrefix("seed_"), "%s keeps its one archived settlement", job)
		}
		// Let a few more passes run over the ledger and the archive before reading
		// the memory high-water mark.
		time.Sleep(5 * time.Second)
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: archNS, Name: identity.JobCompletionName("inference", "arcseed-00000")},
			&hooksv1alpha1.JobCompletion{})).NotTo(Succeed())
		noArchiveConflict()

		var lines []string
		for _, s := range samplers {
			peak, last, max := s.stop()
			Expect(peak).To(BeNumerically("<", memoryLimit), "%s: peak RSS (VmHWM) under the Deployment's 512Mi", s.r.name)
			lines = append(lines, fmt.Sprintf("%s: Ready after %s, peak RSS (VmHWM) %s, highest sampled %s, RSS at the end %s",
				s.r.name, s.r.readyAfter.Round(time.Millisecond), mib(peak), mib(max), mib(last)))
		}
		sort.Strings(lines)
		report := fmt.Sprintf("restart with %d archived jobs: seeded %d jobs (%d rows) in %s with %d writers; %s; 40 redeliveries: %d answered duplicate, %d stored after an archive timeout and removed unsent; 10 v1-after-archived-v2 superseded with no charge",
			archivedJobs, seeds, 3*seeds, seedTook.Round(time.Millisecond), workers, strings.Join(lines, "; "), 40-len(stored), len(stored))
		AddReportEntry("archive restart", report)
		fmt.Fprintln(GinkgoWriter, "ARCHIVE RESTART OK —", report)
	})
})

// stopAllReplicas stops every live replica as a rollout does (SIGTERM), all at once.
func stopAllReplicas() {
	var wg sync.WaitGroup
	for _, r := range liveReplicas() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.stop()
		}()
	}
	wg.Wait()
}

// deleteDeadLease deletes the leader-election Lease if nobody renewed it since
// killedAt (its holder is dead), so that a live replica takes over without waiting
// the lease out; a Lease a live leader renewed is left alone.
func deleteDeadLease(killedAt time.Time) {
	GinkgoHelper()
	lease := &coordinationv1.Lease{}
	err := k8s.Get(ctx, client.ObjectKey{Namespace: leaderNS, Name: leaseName}, lease)
	if apierrors.IsNotFound(err) {
		return
	}
	Expect(err).NotTo(HaveOccurred())
	if lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(killedAt) {
		return
	}
	rv := lease.ResourceVersion
	err = k8s.Delete(ctx, lease, client.Preconditions{ResourceVersion: &rv})
	if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		Expect(err).NotTo(HaveOccurred())
	}
}

// startTogether starts n replicas at once with start and returns them once all are Ready.
func startTogether(n int, start func() *replica) []*replica {
	GinkgoHelper()
	out := make([]*replica, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			out[i] = start()
		}()
	}
	wg.Wait()
	for _, r := range out {
		Expect(r).NotTo(BeNil(), "every replica started")
	}
	return out
}

// counterValue sums the replica's samples of the metric name whose labels contain
// label ("" for all); 0 when the replica does not expose it yet.
func counterValue(r *replica, name, label string) float64 {
	GinkgoHelper()
	var sum float64
	for _, line := range metricLines(r, name) {
		if !strings.Contains(line, label) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		Expect(err).NotTo(HaveOccurred(), "%s: %s", r.name, line)
		sum += v
	}
	return sum
}

// metricLines returns the replica's metric lines whose name is name.
func metricLines(r *replica, name string) []string {
	resp, err := http.Get(r.metricsURL)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			out = append(out, line)
		}
	}
	return out
}

// rssSampler reads a replica's resident memory from /proc every 100ms.
type rssSampler struct {
	r      *replica
	pid    int
	max    atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
}

func sampleRSS(r *replica) *rssSampler {
	c, cancel := context.WithCancel(ctx)
	s := &rssSampler{r: r, pid: r.cmd.Process.Pid, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			if _, rss, err := procMemory(s.pid); err == nil && rss > s.max.Load() {
				s.max.Store(rss)
			}
			select {
			case <-c.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return s
}

// stop returns the kernel's high-water mark of the process's RSS (VmHWM), its RSS now
// and the highest RSS sampled.
func (s *rssSampler) stop() (peak, now, sampled int64) {
	GinkgoHelper()
	s.cancel()
	<-s.done
	peak, now, err := procMemory(s.pid)
	Expect(err).NotTo(HaveOccurred(), "%s is still running", s.r.name)
	return peak, now, s.max.Load()
}

// procMemory reads VmHWM and VmRSS (bytes) from /proc/<pid>/status.
func procMemory(pid int) (hwm, rss int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			hwm = kb << 10
		case "VmRSS:":
			rss = kb << 10
		}
	}
	if hwm == 0 || rss == 0 {
		return 0, 0, fmt.Errorf("no VmHWM/VmRSS in /proc/%d/status", pid)
	}
	return hwm, rss, nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// jsonString is s as it appears inside a JSON string (escaped, without the quotes).
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

func findCond(conds []metav1.Condition, t string) metav1.ConditionStatus {
	for _, c := range conds {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func posts(calls []fakebilling.Call) int { return fakebilling.Posts(calls) }

func uniq(s []string) map[string]bool {
	out := map[string]bool{}
	for _, v := range s {
		out[v] = true
	}
	return out
}
