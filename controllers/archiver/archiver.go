package archiver

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/archivewatermark"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// ControllerName prefixes the archiver's controllers (one per kind).
const ControllerName = "archiver"

// DefaultAfter is how long a finished record stays in the cluster before it is
// archived, when the manager's flag does not say.
const DefaultAfter = time.Hour

// Reconciler moves finished records from the cluster into the archive (docs/design.md
// §12): after After has passed since a record finished, it is inserted (idempotently),
// read back and compared, with the other records of its batch (batch.go), and only
// then deleted, with UID and resourceVersion preconditions so that exactly the
// archived version goes; an archived settlement's protection finalizer is removed by
// the archiver itself first (releaseProtection). A crash between any two
// steps loses nothing (the object is still there) and duplicates nothing (the insert
// of the same content is a no-op). What is not finished — dead-lettered, in need of
// reconciliation, quarantined, in flight — stays until a human or the operator
// finishes it.
type Reconciler struct {
	client.Client
	Archive  *archive.Store
	Recorder recorder.EventRecorder
	// Watermark is moved past each archived record before the record is deleted, so
	// that an archive restored to before it is found behind (nil: not kept).
	Watermark *archivewatermark.Keeper
	// After is how long a finished record stays (DefaultArchiveAfter when zero).
	After time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
	// MaxConcurrentReconciles per kind: at least the batch size (batch.go), so that
	// one kind alone can fill a batch.
	MaxConcurrentReconciles int
	// BatchSize and BatchLinger: a batch flushes once it holds BatchSize records, or
	// BatchLinger after its first (DefaultBatchSize, DefaultBatchLinger when zero).
	BatchSize   int
	BatchLinger time.Duration

	batch *batcher
	// released remembers what a report confirmed of each settlement the archiver has
	// released and not yet seen deleted (confirmations.go).
	released releasedConfirmations
	// at, when set, is called at each moment an archival is interrupted by the tests
	// (a kill -9 of the archiving process, a concurrent write), with the record when
	// there is one; nil in production.
	at func(moment, client.Object)
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=jobcompletions,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=reconciliationreports,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingproviders,verbs=get;list;watch

// finished says whether a record is done and since when ("" reason when it is).
func finished(obj client.Object) (bool, time.Time) {
	readySince := func(conds []metav1.Condition, t string) time.Time {
		if c := meta.FindStatusCondition(conds, t); c != nil {
			return c.LastTransitionTime.Time
		}
		return time.Time{}
	}
	switch o := obj.(type) {
	case *hooksv1alpha1.WebhookEvent:
		if o.Spec.Quarantine != nil || o.Status.ObservedGeneration != o.Generation {
			return false, time.Time{}
		}
		if o.Status.Phase != hooksv1alpha1.EventComplete && o.Status.Phase != hooksv1alpha1.EventIgnored {
			return false, time.Time{}
		}
		return true, laterOf(o.Spec.ReceivedAt.Time, readySince(o.Status.Conditions, hooksv1alpha1.ConditionReady))
	case *hooksv1alpha1.JobCompletion:
		// Progress, not Status: a job without a sink is applied by its creation and
		// has no status written.
		st := o.Progress()
		if st.ObservedGeneration != o.Generation {
			return false, time.Time{}
		}
		switch st.State {
		case hooksv1alpha1.JobCompletionApplied:
			// No newer version pending: the applied version is the one proposed.
			if st.AppliedVersion == nil || *st.AppliedVersion != o.Spec.Completion.Version {
				return false, time.Time{}
			}
		case hooksv1alpha1.JobCompletionFailed:
		default:
			return false, time.Time{}
		}
		return true, laterOf(o.CreationTimestamp.Time, readySince(st.Conditions, hooksv1alpha1.ConditionReady))
	case *hooksv1alpha1.BillingSettlement:
		st := &o.Status
		// Not while it holds money, not before its controller gave it an exposure (an
		// older operator's record: the content archived must be what it will say on its
		// way out), and not while a replay or a reconcile request waits to be acted on.
		if st.ObservedGeneration != o.Generation || settlement.HoldsMoney(st) || st.Exposure == "" || requestPending(o) {
			return false, time.Time{}
		}
		switch st.State {
		case hooksv1alpha1.SettlementSettled:
			// Settled and confirmed by a reconciliation pass (itself, or a report of it
			// the reconcile applied first: confirmations.go).
			if !meta.IsStatusConditionTrue(st.Conditions, hooksv1alpha1.ConditionReconciled) {
				return false, time.Time{}
			}
			return true, laterOf(timeOf(st.SettledAt), readySince(st.Conditions, hooksv1alpha1.ConditionReconciled))
		case hooksv1alpha1.SettlementFailed:
			// Refused by the provider, nothing charged. A dead-lettered one waits for its
			// replay; one that never presented its key anywhere (an invalid identity, a
			// refused duplicate of an archived settlement) waits for review: archiving it
			// would reserve keys it never used.
			if meta.IsStatusConditionTrue(st.Conditions, hooksv1alpha1.ConditionDeadLettered) || settlement.NeverSent(o) {
				return false, time.Time{}
			}
			return true, laterOf(o.CreationTimestamp.Time, readySince(st.Conditions, hooksv1alpha1.ConditionReady))
		}
	}
	return false, time.Time{}
}

// requestPending reports a replay or reconcile request its controller has not acted on.
func requestPending(bs *hooksv1alpha1.BillingSettlement) bool {
	if t := bs.Annotations[hooksv1alpha1.AnnotationReplay]; t != "" && (bs.Status.Replay == nil || bs.Status.Replay.LastToken != settlement.TruncateToken(t)) {
		return true
	}
	if t := bs.Annotations[hooksv1alpha1.AnnotationReconcileRequest]; t != "" && bs.Status.ReconcileRequest != settlement.TruncateToken(t) {
		return true
	}
	return false
}

func timeOf(t *metav1.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (a *Reconciler) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *Reconciler) after() time.Duration {
	if a.After > 0 {
		return a.After
	}
	return DefaultAfter
}

// held says why a finished record must still stay in the cluster ("" when it may go):
// the reconciliation pass reads the cluster, so a record whose counterpart it still
// has to compare it with stays until that comparison is over.
type held func(ctx context.Context, obj client.Object) (string, error)

// jobHeld keeps a JobCompletion while its job's charge is still in the cluster (the
// pass compares the two), and while a succeeded job of a billable provider has no
// charge anywhere (the pass reports it as JobWithoutSettlement until someone acts).
func (a *Reconciler) jobHeld(ctx context.Context, obj client.Object) (string, error) {
	jc := obj.(*hooksv1alpha1.JobCompletion)
	name := identity.SettlementName(jc.Spec.Provider, identity.DefaultSettlementKey(jc.Spec.Provider, jc.Spec.JobID))
	err := a.Get(ctx, types.NamespacedName{Namespace: jc.Namespace, Name: name}, &hooksv1alpha1.BillingSettlement{})
	if err == nil {
		return "its charge is still in the cluster", nil
	}
	if !apierrors.IsNotFound(err) {
		return "", err
	}
	got, err := lookup(ctx, func(ctx context.Context) (*hooksv1alpha1.BillingSettlement, error) {
		return a.Archive.Settlement(ctx, jc.Namespace, name)
	})
	metrics.NoteArchive("BillingSettlement", err)
	if err != nil || got != nil {
		return "", err
	}
	if jc.Spec.Completion.State != hooksv1alpha1.JobSucceeded {
		return "", nil
	}
	var wp hooksv1alpha1.WebhookProvider
	if err := a.Get(ctx, types.NamespacedName{Namespace: jc.Namespace, Name: jc.Spec.Provider}, &wp); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	if chargesJobs(&wp) {
		return "a billable job without a charge, reported by the reconciliation pass", nil
	}
	return "", nil
}

// chargesJobs reports whether a webhook provider charges one settlement per job.
func chargesJobs(wp *hooksv1alpha1.WebhookProvider) bool {
	for _, route := range wp.Spec.Routes {
		for _, op := range route.Operations {
			if s := op.Settlement; s != nil && len(s.KeyFrom) == 0 && s.JobID != "" {
				return true
			}
		}
	}
	return false
}

// settlementHeld keeps a settled charge for a job that did not succeed and that no
// compensation reverses: the pass reports it for a refund until someone decides.
func (a *Reconciler) settlementHeld(ctx context.Context, obj client.Object) (string, error) {
	bs := obj.(*hooksv1alpha1.BillingSettlement)
	if bs.Status.State != hooksv1alpha1.SettlementSettled || bs.Spec.JobID == "" || bs.Spec.WebhookProvider == "" ||
		(bs.Spec.Type != "" && bs.Spec.Type != hooksv1alpha1.SettlementCharge) || len(bs.Status.ReversedBy) > 0 {
		return "", nil
	}
	var jc hooksv1alpha1.JobCompletion
	err := a.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: identity.JobCompletionName(bs.Spec.WebhookProvider, bs.Spec.JobID)}, &jc)
	if apierrors.IsNotFound(err) {
		got, aerr := lookup(ctx, func(ctx context.Context) (*hooksv1alpha1.JobCompletion, error) {
			return a.Archive.LatestJob(ctx, bs.Namespace, bs.Spec.WebhookProvider, bs.Spec.JobID)
		})
		metrics.NoteArchive("JobCompletion", aerr)
		if aerr != nil || got == nil {
			return "", aerr
		}
		jc, err = *got, nil
	}
	if err != nil {
		return "", err
	}
	if jc.Spec.Completion.State != hooksv1alpha1.JobSucceeded {
		return "charged for a job that ended " + string(jc.Spec.Completion.State) + " and no compensation reverses it", nil
	}
	return "", nil
}

// archiveOne is one kind's reconcile: once its record is ready it waits for its
// batch (batch.go) to archive, read back and cover it, then deletes it.
func (a *Reconciler) archiveOne(kind string, newObj func() client.Object, record func(client.Object) archive.Record,
	hold held) reconcile.Func {
	return func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		obj := newObj()
		if err := a.Get(ctx, req.NamespacedName, obj); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		if !obj.GetDeletionTimestamp().IsZero() {
			return ctrl.Result{}, nil // on its way out: the finalizer path archives it
		}
		if err := a.confirmFromReport(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
		done, since := finished(obj)
		if !done {
			return ctrl.Result{}, nil // its next change brings it back
		}
		if wait := since.Add(a.after()).Sub(a.now()); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		if hold != nil {
			why, err := hold(ctx, obj)
			if err != nil {
				return ctrl.Result{RequeueAfter: archivelookup.RetryInterval}, nil
			}
			if why != "" {
				log.FromContext(ctx).V(1).Info("finished, kept in the cluster", "kind", kind, "why", why)
				return ctrl.Result{RequeueAfter: a.after()}, nil
			}
		}
		out := a.batch.archive(ctx, record(obj))
		if ctx.Err() != nil {
			// Shutting down or no longer the leader: nothing failed, the record stays
			// for the next reconcile (its batch's outcome, whatever it was, is safe).
			return ctrl.Result{}, nil
		}
		err := out.err
		metrics.NoteArchive(kind, err)
		if archive.IsConflict(err) {
			a.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonArchiveConflict, "Archive",
				"not archived, kept in the cluster: %s", conditions.TruncateMessage(err.Error()))
			log.FromContext(ctx).Error(err, "archive conflict: the record stays in the cluster", "kind", kind)
			return ctrl.Result{RequeueAfter: 10 * time.Minute}, nil
		}
		if err != nil {
			log.FromContext(ctx).Info("archive unavailable; the record stays in the cluster", "kind", kind, "error", err.Error())
			return ctrl.Result{RequeueAfter: archivelookup.RetryInterval}, nil
		}
		if out.notCovered != nil {
			log.FromContext(ctx).Info("archive watermark not written; the record stays in the cluster", "kind", kind, "error", out.notCovered.Error())
			return ctrl.Result{RequeueAfter: archivelookup.RetryInterval}, nil
		}
		if bs, ok := obj.(*hooksv1alpha1.BillingSettlement); ok {
			protected := controllerutil.ContainsFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection)
			// Before the release: the version it writes is one no report names.
			a.released.remember(bs)
			released, err := a.releaseProtection(ctx, bs)
			if err != nil || !released {
				return ctrl.Result{}, err // changed since it was archived: its change brings it back
			}
			if protected && a.at != nil {
				a.at(momentReleased, bs)
			}
		}
		uid, rv := obj.GetUID(), obj.GetResourceVersion()
		err = a.Delete(ctx, obj, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		if err == nil || apierrors.IsNotFound(err) {
			a.released.forget(obj.GetUID())
		}
		switch {
		case apierrors.IsNotFound(err):
			return ctrl.Result{}, nil
		case apierrors.IsConflict(err):
			// Changed since it was archived: look at the new version (archiving it
			// again is a no-op if it says the same, a conflict if it does not).
			return ctrl.Result{Requeue: true}, nil
		case err != nil:
			return ctrl.Result{}, fmt.Errorf("delete archived %s %s: %w", kind, req.NamespacedName, err)
		}
		metrics.ArchivedRecords.WithLabelValues(kind).Inc()
		return ctrl.Result{}, nil
	}
}

// releaseProtection removes the protection finalizer of a settlement the archiver has
// archived, read back and covered, from exactly that version (the patch carries its
// resourceVersion), so that the DELETE that follows removes it at once: nothing is
// left for the settlement controller's deletion path, which would archive it again
// and write its status only to let it go. A settlement changed since it was read is
// left as it is (false): the change brings it back to its reconciles. The DELETE then
// names the version this patch wrote; should anything change the settlement in
// between — the settlement controller putting the finalizer back on a settlement it
// sees without one, a replay — the DELETE is refused and the settlement comes back
// here. Unprotected for that moment, it is already archived and covered: a deletion
// by anyone else then (its namespace's) loses nothing.
func (a *Reconciler) releaseProtection(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) (bool, error) {
	if !controllerutil.ContainsFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection) {
		return true, nil
	}
	patch := client.MergeFromWithOptions(bs.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection)
	err := a.Patch(ctx, bs, patch)
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("release the protection of archived billingsettlement %s/%s: %w", bs.Namespace, bs.Name, err)
	}
	return true, nil
}

// finishedPredicate passes only records that are finished (and not on their way out),
// but not the archiver's own release of a settlement's protection finalizer: the
// DELETE that follows it is already on its way, and a reconcile of the change would
// archive the settlement again only to find it gone. (Should that DELETE be refused,
// the reconcile that sent it asks for the settlement again itself; after a restart
// in between, the initial list brings it back.)
var finishedPredicate = predicate.And(predicate.NewPredicateFuncs(func(obj client.Object) bool {
	done, _ := finished(obj)
	return done && obj.GetDeletionTimestamp().IsZero()
}), predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	return !releasedProtection(e.ObjectOld, e.ObjectNew)
}})

// releasedProtection reports an update that only took the protection finalizer off.
func releasedProtection(old, new client.Object) bool {
	return controllerutil.ContainsFinalizer(old, hooksv1alpha1.FinalizerSettlementProtection) &&
		!controllerutil.ContainsFinalizer(new, hooksv1alpha1.FinalizerSettlementProtection) &&
		old.GetGeneration() == new.GetGeneration() && maps.Equal(old.GetAnnotations(), new.GetAnnotations())
}

// SetupWithManager registers one controller per archived kind, and the batcher they
// share.
func (a *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	a.batch = newBatcher(a.Archive, a.Watermark.Cover, a.BatchSize, a.BatchLinger)
	a.batch.at = a.at
	if err := mgr.Add(a.batch); err != nil {
		return err
	}
	kinds := []struct {
		name   string
		obj    func() client.Object
		record func(client.Object) archive.Record
		hold   held
	}{
		{"WebhookEvent", func() client.Object { return &hooksv1alpha1.WebhookEvent{} },
			func(o client.Object) archive.Record { return archive.EventRecord(o.(*hooksv1alpha1.WebhookEvent)) }, nil},
		{"JobCompletion", func() client.Object { return &hooksv1alpha1.JobCompletion{} },
			func(o client.Object) archive.Record { return archive.JobRecord(o.(*hooksv1alpha1.JobCompletion)) }, a.jobHeld},
		{"BillingSettlement", func() client.Object { return &hooksv1alpha1.BillingSettlement{} },
			func(o client.Object) archive.Record {
				return archive.SettlementRecord(o.(*hooksv1alpha1.BillingSettlement))
			}, a.settlementHeld},
	}
	for _, k := range kinds {
		b := ctrl.NewControllerManagedBy(mgr).
			Named(ControllerName+"-"+lower(k.name)).
			For(k.obj(), builder.WithPredicates(finishedPredicate)).
			WithOptions(controller.Options{MaxConcurrentReconciles: a.workers()})
		if k.name == "JobCompletion" {
			// A job waits for its charge to leave: its leaving lets the job go.
			b = b.Watches(&hooksv1alpha1.BillingSettlement{}, handler.EnqueueRequestsFromMapFunc(
				func(_ context.Context, o client.Object) []reconcile.Request {
					bs := o.(*hooksv1alpha1.BillingSettlement)
					if bs.Spec.JobID == "" || bs.Spec.WebhookProvider == "" {
						return nil
					}
					return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: bs.Namespace,
						Name: identity.JobCompletionName(bs.Spec.WebhookProvider, bs.Spec.JobID)}}}
				}), builder.WithPredicates(predicate.Funcs{
				CreateFunc: func(event.CreateEvent) bool { return false },
				UpdateFunc: func(event.UpdateEvent) bool { return false },
				DeleteFunc: func(event.DeleteEvent) bool { return true },
			}))
		}
		if k.name == "BillingSettlement" {
			// A settlement a pass confirmed in its report is taken when the report is written.
			var err error
			if b, err = a.watchConfirmations(mgr, b); err != nil {
				return err
			}
		}
		if err := b.Complete(a.archiveOne(k.name, k.obj, k.record, k.hold)); err != nil {
			return err
		}
	}
	return nil
}

// workers is each kind's number of reconciles at once: enough for one kind alone to
// fill a batch (a reconcile waits for its batch), and at least MaxConcurrentReconciles.
func (a *Reconciler) workers() int {
	size := a.BatchSize
	if size <= 0 {
		size = DefaultBatchSize
	}
	return max(a.MaxConcurrentReconciles, size)
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// DefaultLookupConcurrency is how many of the archiver's held checks may read the
// archive at once. The archiver runs a hundred workers per kind, and a batch of
// settlements leaving sends a hundred jobs to ask the archive for their charge at
// once; the settlement controller's pre-submit check shares the pool and fails closed
// without a connection, so these checks queue here, not in the pool.
const DefaultLookupConcurrency = 2

// lookupSlots holds the archiver's held checks to DefaultLookupConcurrency at once.
var lookupSlots = make(chan struct{}, DefaultLookupConcurrency)

// lookup runs one held check's archive read in a slot.
func lookup[T any](ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	select {
	case lookupSlots <- struct{}{}:
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
	defer func() { <-lookupSlots }()
	return read(ctx)
}
