package archiver

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers/billingsettlement"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivewatermark"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// newManager is a manager caching only the given namespaces.
func newManager(t *testing.T, namespaces ...string) ctrl.Manager {
	t.Helper()
	byNS := map[string]cache.Config{}
	for _, ns := range namespaces {
		byNS[ns] = cache.Config{}
	}
	m, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: testenv.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Cache: cache.Options{DefaultNamespaces: byNS},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// start runs m until the test ends.
func start(t *testing.T, m ctrl.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// newWatermark creates the archive's identity ConfigMap in a namespace of its own and
// a Keeper for it.
func newWatermark(t *testing.T, store *archive.Store, c client.Client) (*archivewatermark.Keeper, string) {
	t.Helper()
	ns := newNamespace(t, "operator")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "archive"}, Data: map[string]string{ArchiveIdentityKey: "x"}}
	if err := k8s.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	return &archivewatermark.Keeper{Client: c, Archive: store, Namespace: ns, ConfigMap: "archive"}, ns
}

// What archiving a finished record costs the API server and the archive, counted by
// the API server (apiserver_request_total) and by PostgreSQL's statement log, with the
// BillingSettlement controller running as in production. An event or a job is one
// DELETE; a settlement is one metadata PATCH (its protection finalizer, removed by the
// archiver from exactly the version it archived) and one DELETE — nothing for the
// deletion path to archive again, no status write, no refused write; the watermark's
// ConfigMap is written once per batch, and each table takes one INSERT and one
// read-back per batch.
func TestArchivalWritesPerRecord(t *testing.T) {
	ctx := context.Background()
	const n = 60
	ns := newNamespace(t, "writes")
	_, store, statements := newDatabase(t)
	evs, jcs, bss := finishedRecords(t, ns, n)

	m := newManager(t, ns)
	keeper, _ := newWatermark(t, store, k8s)
	if err := (&billingsettlement.Reconciler{Client: m.GetClient(), APIReader: m.GetAPIReader(), Recorder: m.GetEventRecorder("billingsettlement"),
		Archive: store, Watermark: keeper, MaxConcurrentReconciles: 4}).SetupWithManager(m); err != nil {
		t.Fatal(err)
	}
	start(t, m)
	// The settlement controller's own first look (no BillingProvider here: it says so
	// in each settlement's status) is over before anything is counted.
	last, quiet := apiWrites(t), 0
	eventually(t, 2*time.Minute, "the settlement controller goes quiet", func() (bool, error) {
		time.Sleep(time.Second)
		now := apiWrites(t)
		if len(since(now, last)) == 0 {
			quiet++
		} else {
			quiet = 0
		}
		last = now
		return quiet >= 3, nil
	})
	for _, bs := range bss {
		var got hooksv1alpha1.BillingSettlement
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(bs), &got); err != nil {
			t.Fatal(err)
		}
		if done, _ := finished(&got); !done {
			t.Fatalf("settlement %s is no longer finished after its controller looked: %+v", bs.Name, got.Status)
		}
	}
	before := apiWrites(t)
	statements()

	am := newManager(t, ns)
	if err := (&Reconciler{Client: am.GetClient(), Archive: store, Watermark: keeper, After: time.Nanosecond,
		Recorder: am.GetEventRecorder(ControllerName)}).SetupWithManager(am); err != nil {
		t.Fatal(err)
	}
	start(t, am)
	eventually(t, 3*time.Minute, "every record archived and gone from the cluster", func() (bool, error) {
		for _, l := range []client.ObjectList{&hooksv1alpha1.WebhookEventList{}, &hooksv1alpha1.JobCompletionList{}, &hooksv1alpha1.BillingSettlementList{}} {
			if err := k8s.List(ctx, l, client.InNamespace(ns)); err != nil {
				return false, err
			}
			if n := len(mustItems(l)); n > 0 {
				return false, fmt.Errorf("%T: %d left", l, n)
			}
		}
		return true, nil
	})
	// The deletion path of the settlement controller runs after the DELETE it answers.
	time.Sleep(2 * time.Second)
	writes := since(apiWrites(t), before)
	stmts := statements()
	var lines []string
	for k, v := range writes {
		lines = append(lines, fmt.Sprintf("%s: %.2f per record of its kind (%g)", k, v/n, v))
	}
	for k, v := range stmts {
		lines = append(lines, fmt.Sprintf("PostgreSQL %s: %.2f per record (%d)", k, float64(v)/(3*n), v))
	}
	sort.Strings(lines)
	t.Logf("archiving %d records of each kind:\n\t%s", n, joinLines(lines))

	for _, o := range evs {
		assertArchived(t, store, o)
	}
	for _, o := range jcs {
		assertArchived(t, store, o)
	}
	for _, o := range bss {
		assertArchived(t, store, o)
	}
	want := map[string]float64{"webhookevents DELETE": n, "jobcompletions DELETE": n, "billingsettlements DELETE": n, "billingsettlements PATCH": n}
	for k, v := range writes {
		switch {
		case strings.HasPrefix(k, "leases "):
			// The API server's own identity lease, renewed on its clock.
		case k == "configmaps PUT":
			if v > n/4 {
				t.Errorf("the watermark was written %g times for %d records: want once per batch", v, 3*n)
			}
		case want[k] != v:
			t.Errorf("%s: %g writes for %d records, want %g", k, v, n, want[k])
		}
	}
	for k, v := range want {
		if writes[k] != v {
			t.Errorf("%s: %g writes for %d records, want %g", k, writes[k], n, v)
		}
	}
	if got := stmts["INSERT INTO settlements"]; got > n/4 {
		t.Errorf("%d INSERTs into settlements for %d settlements: want one per batch, and none again on the way out", got, n)
	}
	if got := stmts["INSERT INTO event_receipts"] + stmts["INSERT INTO job_completions"]; got > n/2 {
		t.Errorf("%d INSERTs of events and jobs for %d each: want one per batch", got, n)
	}
}

func joinLines(lines []string) string {
	out := ""
	for i, l := range lines {
		if i > 0 {
			out += "\n\t"
		}
		out += l
	}
	return out
}

func mustItems(l client.ObjectList) []client.Object {
	var out []client.Object
	switch l := l.(type) {
	case *hooksv1alpha1.WebhookEventList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *hooksv1alpha1.JobCompletionList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *hooksv1alpha1.BillingSettlementList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	}
	return out
}

// assertArchived checks that obj is gone from the cluster and in the archive exactly
// once, reading back as what the cluster held.
func assertArchived(t *testing.T, store *archive.Store, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object)); !apierrors.IsNotFound(err) {
		t.Errorf("%s still in the cluster (%v)", obj.GetName(), err)
	}
	switch o := obj.(type) {
	case *hooksv1alpha1.WebhookEvent:
		got, err := store.Event(ctx, o.Namespace, o.Spec.Provider, o.Spec.EventID)
		if err != nil || got == nil || got.UID != string(o.UID) || got.Phase != string(o.Status.Phase) {
			t.Errorf("event %s: archived %+v (%v)", o.Name, got, err)
		}
	case *hooksv1alpha1.JobCompletion:
		got, err := store.LatestJob(ctx, o.Namespace, o.Spec.Provider, o.Spec.JobID)
		if err != nil || got == nil || archive.JobContentHash(got) != archive.JobContentHash(o) {
			t.Errorf("job %s: archived %+v (%v)", o.Name, got, err)
		}
	case *hooksv1alpha1.BillingSettlement:
		got, err := store.Settlement(ctx, o.Namespace, o.Name)
		if err != nil || got == nil || archive.SettlementContentHash(got) != archive.SettlementContentHash(o) {
			t.Errorf("settlement %s: archived %+v (%v)", o.Name, got, err)
		} else if got.DeletionTimestamp != nil {
			t.Errorf("settlement %s was archived on its way out, not before its deletion", o.Name)
		}
	}
}

// The settlement controller puts the protection finalizer back on any settlement it
// sees without one. Should it do so between the archiver's release and its DELETE
// (here with the settlement controller's own patch, at that moment every time, the
// first time for each settlement), the DELETE is refused, and the settlement is
// archived again (a no-op), its finalizer removed again and deleted: gone from the
// cluster, in the archive once, nothing written to its status.
func TestReleaseRacedByTheFinalizerComingBack(t *testing.T) {
	ctx := context.Background()
	const n = 10
	ns := newNamespace(t, "race")
	_, store, _ := newDatabase(t)
	_, _, bss := finishedRecords(t, ns, n)
	keeper, _ := newWatermark(t, store, k8s)
	am := newManager(t, ns)
	r := &Reconciler{Client: am.GetClient(), Archive: store, Watermark: keeper, After: time.Nanosecond,
		Recorder: am.GetEventRecorder(ControllerName)}
	var released map[string]int
	var mu *sync.Mutex
	r.at, released, mu = finalizerBackOnFirstRelease(t)
	if err := r.SetupWithManager(am); err != nil {
		t.Fatal(err)
	}
	before := apiWrites(t)
	start(t, am)
	eventually(t, 2*time.Minute, "every settlement archived and gone", func() (bool, error) {
		var l hooksv1alpha1.BillingSettlementList
		if err := k8s.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false, err
		}
		return len(l.Items) == 0, fmt.Errorf("%d left", len(l.Items))
	})
	for _, bs := range bss {
		assertArchived(t, store, bs)
	}
	writes := since(apiWrites(t), before)
	t.Logf("writes: %v", writes)
	mu.Lock()
	defer mu.Unlock()
	for _, bs := range bss {
		if released[bs.Name] != 2 {
			t.Errorf("%s's finalizer removed %d times, want twice (once more after it came back)", bs.Name, released[bs.Name])
		}
	}
	// At least one per settlement whose finalizer came back; one more when the
	// reconcile that follows still reads the released version from its cache.
	if got := writes["billingsettlements DELETE refused"]; got < n {
		t.Errorf("%g DELETEs refused, want at least %d (one per settlement whose finalizer came back)", got, n)
	}
	if got := writes["billingsettlements/status PATCH"]; got != 0 {
		t.Errorf("%g status writes, want none", got)
	}
}

// finalizerBackOnFirstRelease is an archiver hook that puts the protection finalizer
// back on each settlement right after the archiver's first release of it, as the
// settlement controller may, and counts the releases per settlement (read under mu).
func finalizerBackOnFirstRelease(t *testing.T) (func(moment, client.Object), map[string]int, *sync.Mutex) {
	ctx := context.Background()
	mu := &sync.Mutex{}
	released := map[string]int{}
	return func(m moment, obj client.Object) {
		if m != momentReleased {
			return
		}
		mu.Lock()
		released[obj.GetName()]++
		first := released[obj.GetName()] == 1
		mu.Unlock()
		if !first {
			return
		}
		var bs hooksv1alpha1.BillingSettlement
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), &bs); err != nil {
			t.Errorf("get %s: %v", obj.GetName(), err)
			return
		}
		patch := client.MergeFrom(bs.DeepCopy())
		controllerutil.AddFinalizer(&bs, hooksv1alpha1.FinalizerSettlementProtection)
		if err := k8s.Patch(ctx, &bs, patch); err != nil {
			t.Errorf("put the finalizer back on %s: %v", obj.GetName(), err)
		}
	}, released, mu
}
