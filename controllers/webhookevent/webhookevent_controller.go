package webhookevent

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

// ControllerName names the controller in logs and metrics.
const ControllerName = "webhookevent"

// Reconciler dispatches an event's facts to their records — one
// JobCompletion per job, one BillingSettlement per settlement key — creating or
// linking each, and mirrors the children's states into the event's status. Children
// have no ownerReference to the event: financial records must outlive it (§1.4).
type Reconciler struct {
	client.Client
	// APIReader reads a child live after an AlreadyExists the cache has not seen yet.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// Now is the clock (time.Now).
	Now func() time.Time
	// MaxConcurrentReconciles is how many records are worked on at once (1): calls to
	// slow peers must not queue every other record behind them.
	MaxConcurrentReconciles int
	// StatusDelay is how long after receipt a newly dispatched event whose operations
	// are all under way and none has gone wrong waits before its status is written
	// (docs/design.md §5.1): an event whose children finish within it gets one status write,
	// the finished one, instead of two. Zero writes the decision at once.
	StatusDelay time.Duration
	// held keeps what each held first dispatch decided (holdDecision).
	held heldDecisions
	// Archive, when set, holds the records that left the cluster (docs/design.md §12):
	// a new event is checked against the archived receipts before anything is
	// dispatched, and a child missing from the cluster is looked up there before it is
	// created or taken for deleted. Retention then leaves complete events to the
	// archiver.
	Archive *archive.Store
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=jobcompletions,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders,verbs=get;list;watch

// Reconcile dispatches one event.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ev hooksv1alpha1.WebhookEvent
	if err := r.Get(ctx, req.NamespacedName, &ev); err != nil {
		if apierrors.IsNotFound(err) {
			r.held.drop(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := ev.DeepCopy()
	ev.Status.ObservedGeneration = ev.Generation
	if len(ev.Status.Operations) == 0 {
		// A first dispatch whose write was held: go on from what it decided.
		ev.Status.Operations = r.held.get(req.NamespacedName, ev.UID)
	}

	if token, ok := replayRequested(&ev); ok {
		if err := r.replay(ctx, &ev, token); err != nil {
			return ctrl.Result{}, err
		}
	}

	var err error
	jobs, stls, unmapped := facts(&ev)
	switch {
	case ev.Spec.Quarantine != nil:
		r.quarantined(&ev)
	case len(jobs) == 0 && len(stls) == 0 && len(unmapped) == 0:
		// A stored unrouted event is deduplicated across the archive like any other.
		if res, gone, cerr := r.checkArchivedReceipt(ctx, &ev); gone || cerr != nil || !res.IsZero() {
			if !gone {
				if wres, perr := r.writeStatus(ctx, &ev, before); perr != nil || !wres.IsZero() {
					return wres, perr
				}
			}
			return res, cerr
		}
		if mappedByReplay(&ev) != "" {
			// A replay mapped every unmapped state to Ignored: nothing is left of them.
			ev.Status.Operations = nil
		}
		ev.Status.Phase = hooksv1alpha1.EventIgnored
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue,
			hooksv1alpha1.ReasonAllOperationsDone, "nothing to do: no route matched the event type, or its route's job states are Ignored (spec.states); stored for the record only")
	default:
		var res ctrl.Result
		var gone bool
		if res, gone, err = r.checkArchivedReceipt(ctx, &ev); gone || err != nil || !res.IsZero() {
			if !gone {
				if wres, perr := r.writeStatus(ctx, &ev, before); perr != nil || !wres.IsZero() {
					return wres, perr
				}
			}
			return res, err
		}
		err = r.dispatch(ctx, &ev)
		derivePhase(&ev)
		if wait := r.holdDecision(before, &ev); err == nil && wait > 0 {
			r.held.put(req.NamespacedName, ev.UID, ev.Status.Operations)
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}

	var res ctrl.Result
	if err == nil {
		var expired bool
		if res, expired, err = r.retention(ctx, &ev); expired {
			return ctrl.Result{}, err
		}
	}
	if wres, perr := r.writeStatus(ctx, &ev, before); perr != nil || !wres.IsZero() {
		return wres, perr
	}
	if err == nil && waitsForNewer(&ev) && (res.RequeueAfter == 0 || res.RequeueAfter > newerWaitRetry) {
		res.RequeueAfter = newerWaitRetry
	}
	return res, err
}

// staleCacheRetry is how soon an event whose status write met a newer version is
// reconciled again: long enough for the cache to catch up with that version.
const staleCacheRetry = 100 * time.Millisecond

// writeStatus patches the event's status with the resourceVersion it was computed
// from. A conflict means the cache had not yet seen the previous write (or a replay
// annotation came in): the event is redone shortly from a fresh copy, which is not an
// error for on-call to see in the log.
func (r *Reconciler) writeStatus(ctx context.Context, ev, before *hooksv1alpha1.WebhookEvent) (ctrl.Result, error) {
	if _, err := statuspatch.Patch(ctx, r.Client, ev, before, true); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: staleCacheRetry}, nil
		}
		return ctrl.Result{}, err
	}
	if len(ev.Status.Operations) > 0 {
		r.held.drop(client.ObjectKeyFromObject(ev)) // the status holds the decision now
	}
	return ctrl.Result{}, nil
}

// DefaultEventStatusDelay is the manager's default StatusDelay: most charges settle
// well within it, and an event whose charge takes longer shows Dispatching after it.
const DefaultEventStatusDelay = 5 * time.Second

// heldDecisions keeps, in memory, the operations a first dispatch decided while its
// Status write is held, so the reconcile that writes them goes on from that decision
// rather than deciding again: a child deleted in the meantime is then seen as deleted
// (and not created again, §5.1), and the archive is not asked twice. Only a restart
// inside the hold loses it; the next leader decides again from the children.
// Entries go when the status is written or the event is gone (a manager that loses
// its leadership exits), so the map holds the events inside their hold: rate × delay.
type heldDecisions struct {
	mu      sync.Mutex
	byEvent map[types.NamespacedName]heldDecision
}

type heldDecision struct {
	uid types.UID
	ops []hooksv1alpha1.OperationStatus
}

func (h *heldDecisions) put(key types.NamespacedName, uid types.UID, ops []hooksv1alpha1.OperationStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byEvent == nil {
		h.byEvent = map[types.NamespacedName]heldDecision{}
	}
	h.byEvent[key] = heldDecision{uid: uid, ops: slices.Clone(ops)}
}

// get returns a copy of what is held for the event with this UID; nil when nothing is.
func (h *heldDecisions) get(key types.NamespacedName, uid types.UID) []hooksv1alpha1.OperationStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.byEvent[key]
	if !ok || d.uid != uid {
		return nil
	}
	return slices.Clone(d.ops)
}

// drop forgets what was held for the event: its status holds it now, or it is gone.
func (h *heldDecisions) drop(key types.NamespacedName) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.byEvent, key)
}

// holdDecision says how much longer a first dispatch's status may wait unwritten
// (0: write it now). It waits only while nothing was recorded before, every operation
// is decided and under way (no Pending outcome, nothing failing or ambiguous: those
// are written at once, for on-call), and the event is younger than StatusDelay. The
// children are then the record of what was decided: they exist with this event as
// their source, so the next reconcile (the last child finishing, or the delay
// running out) derives the same outcomes from them and writes them with the result.
func (r *Reconciler) holdDecision(before, ev *hooksv1alpha1.WebhookEvent) time.Duration {
	if r.StatusDelay <= 0 || len(before.Status.Operations) > 0 || ev.Status.Phase != hooksv1alpha1.EventDispatching {
		return 0
	}
	for _, op := range ev.Status.Operations {
		if op.Outcome == hooksv1alpha1.OutcomePending {
			return 0
		}
	}
	return r.StatusDelay - r.now().Sub(ev.CreationTimestamp.Time)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) quarantined(ev *hooksv1alpha1.WebhookEvent) {
	ev.Status.Phase = hooksv1alpha1.EventQuarantined
	conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
		hooksv1alpha1.ReasonConflictingEventReuse,
		fmt.Sprintf("event ID %q was delivered again with a different payload than %s; this delivery has no effect and needs review",
			ev.Spec.EventID, ev.Spec.Quarantine.OriginalEvent))
}

// SetupWithManager registers the controller and its index.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := IndexEvents(mgr); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&hooksv1alpha1.WebhookEvent{}, builder.WithPredicates(notOnlyStatus())).
		Watches(&hooksv1alpha1.JobCompletion{}, r.childHandler(childHealthOfJob)).
		Watches(&hooksv1alpha1.BillingSettlement{}, r.childHandler(childHealthOfSettlement)).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1)}).
		Complete(r)
}
