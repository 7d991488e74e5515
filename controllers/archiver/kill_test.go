package archiver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivewatermark"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The archiving process of the kill -9 test is this test binary run again with
// childEnv set to the crash point ("none": archive everything and run until stopped)
// and the places below in its environment. It runs the archiver alone, as the leader
// would, and, at the crash point of its first batch, kills itself with SIGKILL: a real
// kill -9 of a real process, at a moment chosen by a hook (Reconciler.at) rather
// than by luck.
const (
	childEnv           = "ARCHIVER_TEST_CHILD"
	childKubeconfigEnv = "ARCHIVER_TEST_KUBECONFIG"
	childDatabaseEnv   = "ARCHIVER_TEST_DATABASE"
	childNamespaceEnv  = "ARCHIVER_TEST_NAMESPACE"
	childOperatorEnv   = "ARCHIVER_TEST_OPERATOR_NAMESPACE"
	// childBatch is the child's batch size: a kill in the first batch leaves the
	// records of later batches not archived at all.
	childBatch = 25
)

func runChild() int {
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "archiving process:", err)
		return 2
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv(childKubeconfigEnv))
	if err != nil {
		return fail(err)
	}
	ns, opNS := os.Getenv(childNamespaceEnv), os.Getenv(childOperatorEnv)
	ctx := ctrl.SetupSignalHandler()
	m, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: testenv.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}})
	if err != nil {
		return fail(err)
	}
	store, err := archive.Open(archive.Config{URL: os.Getenv(childDatabaseEnv)})
	if err != nil {
		return fail(err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(err)
	}
	direct, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		return fail(err)
	}
	keeper := &archivewatermark.Keeper{Client: direct, Archive: store, Namespace: opNS, ConfigMap: "archive"}
	// As the Migrator does before archival starts: the archive is compared with the
	// watermark the last process left.
	if err := keeper.Check(ctx); err != nil {
		return fail(err)
	}
	r := &Reconciler{Client: m.GetClient(), Archive: store, Watermark: keeper, After: time.Nanosecond,
		Recorder: m.GetEventRecorder(ControllerName), BatchSize: childBatch}
	if point := os.Getenv(childEnv); point != "none" {
		r.at = func(m moment, _ client.Object) {
			if string(m) == point {
				fmt.Fprintln(os.Stderr, "archiving process: kill -9 at", point)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
	}
	if err := r.SetupWithManager(m); err != nil {
		return fail(err)
	}
	if err := m.Start(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// archivingProcess is a running child.
type archivingProcess struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startArchiving(t *testing.T, point, kubeconfig, database, ns, opNS string) *archivingProcess {
	t.Helper()
	log := filepath.Join(t.TempDir(), "archiver.log")
	out, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+point, childKubeconfigEnv+"="+kubeconfig, childDatabaseEnv+"="+database,
		childNamespaceEnv+"="+ns, childOperatorEnv+"="+opNS)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &archivingProcess{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			b, _ := os.ReadFile(log)
			lines := strings.Split(string(b), "\n")
			t.Logf("end of the archiving process's log:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return p
}

// deletionWatch watches the records of ns leave the cluster and checks, for each, that
// its row was in the archive and the watermark covered it when it went.
type deletionWatch struct {
	mu         sync.Mutex
	deleted    map[string]bool
	violations []string
}

func watchDeletions(t *testing.T, ns, opNS string, db *pgxpool.Pool) *deletionWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	d := &deletionWatch{deleted: map[string]bool{}}
	for table, list := range map[string]client.ObjectList{"event_receipts": &hooksv1alpha1.WebhookEventList{},
		"job_completions": &hooksv1alpha1.JobCompletionList{}, "settlements": &hooksv1alpha1.BillingSettlementList{}} {
		w, err := wc.Watch(ctx, list, client.InNamespace(ns))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer w.Stop()
			for ev := range w.ResultChan() {
				if ev.Type != watch.Deleted {
					continue
				}
				obj := ev.Object.(client.Object)
				why := d.check(ctx, db, opNS, table, obj)
				d.mu.Lock()
				d.deleted[table+"/"+obj.GetName()] = true
				if why != "" {
					d.violations = append(d.violations, fmt.Sprintf("%s %s: %s", table, obj.GetName(), why))
				}
				d.mu.Unlock()
			}
		}()
	}
	return d
}

func (d *deletionWatch) check(ctx context.Context, db *pgxpool.Pool, opNS, table string, obj client.Object) string {
	var seq int64
	err := db.QueryRow(ctx, `SELECT seq FROM `+table+` WHERE namespace = $1 AND name = $2`, obj.GetNamespace(), obj.GetName()).Scan(&seq)
	if err == pgx.ErrNoRows {
		return "deleted without its row in the archive"
	}
	if err != nil {
		return "could not be checked: " + err.Error()
	}
	if m := readWatermark(ctx, opNS); m.Seq < seq {
		return fmt.Sprintf("deleted while the watermark (%s) did not cover its row (seq %d)", m, seq)
	}
	return ""
}

func (d *deletionWatch) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.deleted)
}

func readWatermark(ctx context.Context, opNS string) archive.Mark {
	var cm corev1.ConfigMap
	var m archive.Mark
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: "archive"}, &cm); err != nil {
		return m
	}
	if v := cm.Data[archivewatermark.Key]; v != "" {
		_ = json.Unmarshal([]byte(v), &m)
	}
	return m
}

// A kill -9 of the archiving process in the middle of a batch — once every row of the
// batch is inserted and read back but the watermark not moved, once the watermark
// covers the batch but nothing is deleted, once a settlement's protection finalizer is
// removed but its DELETE not sent — loses and duplicates nothing: the process
// started again archives every record (the rows already there are found and read back,
// not inserted twice), each is in PostgreSQL exactly once and reads back as what the
// cluster held, and each left the cluster only once its row was there and the
// watermark covered it.
func TestKillDuringBatch(t *testing.T) {
	for _, point := range []moment{momentReadBack, momentCovered, momentReleased} {
		t.Run(strings.ReplaceAll(string(point), " ", "-"), func(t *testing.T) {
			ctx := context.Background()
			const n = 40
			ns := newNamespace(t, "kill")
			url, store, _ := newDatabase(t)
			db, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(db.Close)
			_, opNS := newWatermark(t, store, k8s)
			kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
			if err := testenv.WriteKubeconfig(kubeconfig, cfg, "archiver-test", ""); err != nil {
				t.Fatal(err)
			}
			evs, jcs, bss := finishedRecords(t, ns, n)
			deletions := watchDeletions(t, ns, opNS, db)
			rows := func() (total int, maxSeq int64) {
				t.Helper()
				err := db.QueryRow(ctx, `SELECT count(*), coalesce(max(seq), 0) FROM (
					SELECT seq FROM event_receipts WHERE namespace = $1 UNION ALL
					SELECT seq FROM job_completions WHERE namespace = $1 UNION ALL
					SELECT seq FROM settlements WHERE namespace = $1) r`, ns).Scan(&total, &maxSeq)
				if err != nil {
					t.Fatal(err)
				}
				return total, maxSeq
			}

			first := startArchiving(t, string(point), kubeconfig, url, ns, opNS)
			select {
			case <-first.done:
			case <-time.After(2 * time.Minute):
				t.Fatal("the archiving process did not reach the crash point")
			}
			ws, ok := first.cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the archiving process ended with %v, want killed by SIGKILL at %q", first.cmd.ProcessState, point)
			}
			inserted, maxSeq := rows()
			if inserted == 0 {
				t.Fatal("no row in the archive after the kill")
			}
			m := readWatermark(ctx, opNS)
			switch point {
			case momentReadBack, momentCovered:
				// Nothing of the first batch, and so nothing at all, was deleted.
				if inserted > childBatch {
					t.Fatalf("%d rows in the archive after the kill: want the first batch's (1 to %d)", inserted, childBatch)
				}
				for _, l := range []client.ObjectList{&hooksv1alpha1.WebhookEventList{}, &hooksv1alpha1.JobCompletionList{}, &hooksv1alpha1.BillingSettlementList{}} {
					if err := k8s.List(ctx, l, client.InNamespace(ns)); err != nil {
						t.Fatal(err)
					}
					for _, o := range mustItems(l) {
						if !o.GetDeletionTimestamp().IsZero() {
							t.Errorf("%s is being deleted after the kill", o.GetName())
						}
					}
					if got := len(mustItems(l)); got != n {
						t.Fatalf("%T: %d records in the cluster after the kill, want all %d", l, got, n)
					}
				}
				if point == momentReadBack && !m.IsZero() {
					t.Fatalf("the watermark moved (%s) before the kill that preceded its write", m)
				}
				if point == momentCovered && m.Seq != maxSeq {
					t.Fatalf("the watermark is at %s, want the batch's last row (seq %d)", m, maxSeq)
				}
			case momentReleased:
				// Other records of the batch may be gone already (their deletes run
				// concurrently; the deletion watch checks each); the settlement the kill
				// caught is archived, covered, unprotected and still there.
				var l hooksv1alpha1.BillingSettlementList
				if err := k8s.List(ctx, &l, client.InNamespace(ns)); err != nil {
					t.Fatal(err)
				}
				released := 0
				for _, bs := range l.Items {
					if controllerutil.ContainsFinalizer(&bs, hooksv1alpha1.FinalizerSettlementProtection) {
						continue
					}
					released++
					var seq int64
					if err := db.QueryRow(ctx, `SELECT seq FROM settlements WHERE namespace = $1 AND name = $2`, ns, bs.Name).Scan(&seq); err != nil {
						t.Fatalf("settlement %s lost its finalizer without its row in the archive: %v", bs.Name, err)
					}
					if seq > m.Seq {
						t.Fatalf("settlement %s lost its finalizer while the watermark (%s) did not cover its row (seq %d)", bs.Name, m, seq)
					}
				}
				if released == 0 {
					t.Fatal("no settlement without its finalizer after a kill between its release and its DELETE")
				}
			}
			t.Logf("killed -9 at %q: %d rows inserted and read back, %d of %d records deleted, watermark %s", point, inserted, deletions.count(), 3*n, m)

			second := startArchiving(t, "none", kubeconfig, url, ns, opNS)
			eventually(t, 2*time.Minute, "the process started again archives every record", func() (bool, error) {
				return deletions.count() == 3*n, fmt.Errorf("%d of %d deleted", deletions.count(), 3*n)
			})
			_ = second.cmd.Process.Signal(syscall.SIGTERM)
			<-second.done

			for _, o := range evs {
				assertArchived(t, store, o)
			}
			for _, o := range jcs {
				assertArchived(t, store, o)
			}
			for _, o := range bss {
				assertArchived(t, store, o)
			}
			total, maxSeq := rows()
			if total != 3*n {
				t.Errorf("%d rows for %d records: want each exactly once", total, 3*n)
			}
			if m := readWatermark(ctx, opNS); m.Seq != maxSeq {
				t.Errorf("the watermark is at %s, want the last row archived (seq %d)", m, maxSeq)
			}
			deletions.mu.Lock()
			defer deletions.mu.Unlock()
			for _, v := range deletions.violations {
				t.Error(v)
			}
		})
	}
}
