package webhookevent

import (
	"github.com/settlement-operator/settlement-operator/internal/index"

	"github.com/settlement-operator/settlement-operator/internal/archivelookup"

	"github.com/settlement-operator/settlement-operator/internal/metrics"

	"github.com/settlement-operator/settlement-operator/internal/settlement"

	"github.com/settlement-operator/settlement-operator/internal/statuspatch"

	"github.com/settlement-operator/settlement-operator/internal/conditions"

	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/identity"
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

	var err error
	switch {
	case ev.Spec.Quarantine != nil:
		r.quarantined(&ev)
	case len(ev.Spec.JobCompletions) == 0 && len(ev.Spec.Settlements) == 0:
		// A stored unrouted event is deduplicated across the archive like any other.
		if res, gone, cerr := r.checkArchivedReceipt(ctx, &ev); gone || cerr != nil || !res.IsZero() {
			if !gone {
				if wres, perr := r.writeStatus(ctx, &ev, before); perr != nil || !wres.IsZero() {
					return wres, perr
				}
			}
			return res, cerr
		}
		ev.Status.Phase = hooksv1alpha1.EventIgnored
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue,
			hooksv1alpha1.ReasonAllOperationsDone, "no route matched the event type; stored for the record only")
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

// Get returns a copy of what is held for the event with this UID; nil when nothing is.
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

// defaultEventRetention applies when a provider predates the retention field.
const defaultEventRetention = 7 * 24 * time.Hour

// retention deletes a complete event once its provider's retention has passed since
// receipt (docs/design.md §8): by then the sender can no longer retry it, so its dedup record
// is no longer needed. Events that are not complete, including quarantined ones, are
// kept for the reconciliation pass and for review. Children are never touched.
func (r *Reconciler) retention(ctx context.Context, ev *hooksv1alpha1.WebhookEvent) (ctrl.Result, bool, error) {
	if r.Archive != nil || ev.Status.Phase != hooksv1alpha1.EventComplete && ev.Status.Phase != hooksv1alpha1.EventIgnored {
		// With an archive, complete events leave through the archiver (their receipt
		// keeps deduplicating from there); without one, retention deletes them.
		ev.Status.DeleteAfter = nil
		return ctrl.Result{}, false, nil
	}
	keep := defaultEventRetention
	var wp hooksv1alpha1.WebhookProvider
	if err := r.Get(ctx, types.NamespacedName{Namespace: ev.Namespace, Name: ev.Spec.Provider}, &wp); err == nil {
		if rs := wp.Spec.Retention; rs != nil {
			keep = settlement.DurationOr(rs.Events, keep)
		}
	} else if !apierrors.IsNotFound(err) {
		return ctrl.Result{}, false, fmt.Errorf("get webhookprovider %s: %w", ev.Spec.Provider, err)
	}
	deleteAfter := ev.Spec.ReceivedAt.Add(keep)
	t := metav1.NewTime(deleteAfter)
	ev.Status.DeleteAfter = &t
	now := r.now()
	if now.Before(deleteAfter) {
		return ctrl.Result{RequeueAfter: deleteAfter.Sub(now)}, false, nil
	}
	// Preconditions: delete exactly the version we judged complete.
	err := r.Delete(ctx, ev, client.Preconditions{UID: &ev.UID, ResourceVersion: &ev.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, true, fmt.Errorf("delete expired webhookevent %s: %w", ev.Name, err)
	}
	metrics.EventsExpired.Inc()
	return ctrl.Result{}, true, nil
}

// checkArchivedReceipt decides, before an event's first dispatch, whether the archive
// already holds its event ID (the receiver stores a delivery even when the archive is
// down, or when its cache still had the original moments before it was archived): the
// same payload is a duplicate, and this extra receipt is removed; another payload is a
// conflicting reuse, recorded as a quarantine record as the receiver would, and this
// receipt is removed. Nothing is dispatched for either. While the archive does not
// answer, the event waits (condition Dispatched=False, reason ArchiveUnavailable).
// gone reports that the event was deleted.
func (r *Reconciler) checkArchivedReceipt(ctx context.Context, ev *hooksv1alpha1.WebhookEvent) (ctrl.Result, bool, error) {
	if r.Archive == nil || len(ev.Status.Operations) > 0 || ev.Status.Phase != "" && ev.Status.Phase != hooksv1alpha1.EventReceived {
		return ctrl.Result{}, false, nil
	}
	prior, err := r.Archive.Event(ctx, ev.Namespace, ev.Spec.Provider, ev.Spec.EventID)
	metrics.NoteArchive("WebhookEvent", err)
	if err != nil {
		ev.Status.Phase = hooksv1alpha1.EventReceived
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionDispatched, metav1.ConditionFalse,
			hooksv1alpha1.ReasonArchiveUnavailable, "waiting for the archive: it must say whether this event ID was received before anything is dispatched")
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			hooksv1alpha1.ReasonArchiveUnavailable, "waiting for the archive before dispatch")
		return ctrl.Result{RequeueAfter: archivelookup.RetryInterval}, false, nil
	}
	if prior == nil || prior.UID == string(ev.UID) {
		return ctrl.Result{}, false, nil
	}
	if prior.PayloadHash != ev.Spec.PayloadHash {
		q := &hooksv1alpha1.WebhookEvent{
			ObjectMeta: metav1.ObjectMeta{Namespace: ev.Namespace, Name: identity.QuarantineName(prior.Name, ev.Spec.PayloadHash),
				Labels: map[string]string{hooksv1alpha1.LabelProvider: ev.Spec.Provider}},
			Spec: hooksv1alpha1.WebhookEventSpec{Provider: ev.Spec.Provider, EventID: ev.Spec.EventID, EventType: ev.Spec.EventType,
				Sequence: ev.Spec.Sequence, PayloadHash: ev.Spec.PayloadHash, ReceivedAt: ev.Spec.ReceivedAt,
				Quarantine: &hooksv1alpha1.QuarantineInfo{OriginalEvent: prior.Name, OriginalPayloadHash: prior.PayloadHash}},
		}
		switch err := r.Create(ctx, q); {
		case err == nil:
			r.Recorder.Eventf(q, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonConflictingEventReuse, "Quarantine",
				"event ID of archived %s was delivered again with a different payload; quarantined as %s", prior.Name, q.Name)
		case !apierrors.IsAlreadyExists(err):
			return ctrl.Result{}, false, fmt.Errorf("create quarantine record %s: %w", q.Name, err)
		}
	}
	// The archive holds this event's receipt (and the quarantine record, if any, holds
	// this delivery): the extra receipt goes, exactly the version judged here.
	uid, rv := ev.UID, ev.ResourceVersion
	if err := r.Delete(ctx, ev, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, false, fmt.Errorf("delete duplicate of archived event %s: %w", ev.Name, err)
	}
	metrics.ArchivedDuplicates.WithLabelValues("WebhookEvent").Inc()
	return ctrl.Result{}, true, nil
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

// dispatch creates or links every child and records each operation's outcome once:
// an outcome is a fact about what this event did, so it is never recomputed (a later
// newer version must not turn this event's "Created" into "Superseded"). Only the
// mirrored child state is refreshed.
func (r *Reconciler) dispatch(ctx context.Context, ev *hooksv1alpha1.WebhookEvent) error {
	recorded := map[string]hooksv1alpha1.OperationStatus{}
	for _, op := range ev.Status.Operations {
		recorded[string(op.Type)+"/"+op.Key] = op
	}
	var ops []hooksv1alpha1.OperationStatus
	var errs []error
	// firstSeen holds the jobs whose JobCompletion this reconcile created: they were
	// never seen, so their default-key settlement cannot have been sent before.
	firstSeen := map[string]string{}
	for i := range ev.Spec.JobCompletions {
		f := &ev.Spec.JobCompletions[i]
		op, created, err := r.jobCompletion(ctx, ev, f, recorded[string(hooksv1alpha1.OperationJobCompletion)+"/"+f.JobID])
		if created != "" {
			firstSeen[f.JobID] = created
		}
		errs = append(errs, err)
		ops = append(ops, withError(op, err))
	}
	superseded, undecided := map[string]bool{}, map[string]bool{}
	// reported is the version of each job this event reports: its settlement is the
	// job's charge only while no newer version exists.
	reported := map[string]int64{}
	completedAt := map[string]*metav1.Time{} // of the version reported
	for _, f := range ev.Spec.JobCompletions {
		if v, seen := reported[f.JobID]; !seen || f.Version > v {
			reported[f.JobID], completedAt[f.JobID] = f.Version, f.CompletedAt
		}
	}
	for _, op := range ops {
		switch op.Outcome {
		case hooksv1alpha1.OutcomeSuperseded:
			superseded[op.Key] = true
		case hooksv1alpha1.OutcomePending:
			undecided[op.Key] = true
		}
	}
	for i := range ev.Spec.Settlements {
		f := &ev.Spec.Settlements[i]
		if f.JobID != "" && undecided[f.JobID] {
			// Whether this settlement conflicts depends on whether the job's completion
			// is superseded: decide (once, for good) after that is known.
			ops = append(ops, hooksv1alpha1.OperationStatus{Type: hooksv1alpha1.OperationBillingSettlement,
				Key: f.SettlementKey, Outcome: hooksv1alpha1.OutcomePending,
				Message: "waiting until the job's completion is recorded"})
			continue
		}
		job := jobReport{id: f.JobID, superseded: f.JobID != "" && superseded[f.JobID]}
		job.version, job.reported = reported[f.JobID]
		job.firstSeen, job.completedAt = firstSeen[f.JobID], completedAt[f.JobID]
		op, err := r.settlement(ctx, ev, f, recorded[string(hooksv1alpha1.OperationBillingSettlement)+"/"+f.SettlementKey], job)
		errs = append(errs, err)
		ops = append(ops, withError(op, err))
	}
	ev.Status.Operations = ops
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// childDeleted keeps the recorded outcome of a child someone deleted after it was
// dispatched. It is never re-created: deleting a record is a human decision, and
// re-creating a settlement would charge what they chose not to (the reconciliation
// pass reports the gap instead).
func childDeleted(prev hooksv1alpha1.OperationStatus) hooksv1alpha1.OperationStatus {
	prev.State = stateDeleted
	prev.Message = "the record was deleted after dispatch and is not re-created"
	return prev
}

// stateDeleted is mirrored for a child deleted after dispatch.
const stateDeleted = "Deleted"

// withError shows why an operation is still pending (an API error, a quota, a
// refused create) instead of leaving "n of m done" unexplained.
func withError(op hooksv1alpha1.OperationStatus, err error) hooksv1alpha1.OperationStatus {
	if err != nil {
		op.Message = conditions.TruncateMessage("not dispatched yet: " + err.Error())
	}
	return op
}

func final(o hooksv1alpha1.OperationOutcome) bool {
	return o != "" && o != hooksv1alpha1.OutcomePending && o != hooksv1alpha1.OutcomeFailed
}

// jobCompletion creates, advances or links the job's JobCompletion. created is
// "<name>/<uid>" when this call created it (the job was never seen before).
func (r *Reconciler) jobCompletion(ctx context.Context, ev *hooksv1alpha1.WebhookEvent,
	f *hooksv1alpha1.JobCompletionFacts, prev hooksv1alpha1.OperationStatus) (hooksv1alpha1.OperationStatus, string, error) {
	name := identity.JobCompletionName(ev.Spec.Provider, f.JobID)
	op := hooksv1alpha1.OperationStatus{Type: hooksv1alpha1.OperationJobCompletion, Key: f.JobID, Child: name,
		Outcome: hooksv1alpha1.OutcomePending}
	key := types.NamespacedName{Namespace: ev.Namespace, Name: name}
	proposed := hooksv1alpha1.Completion{Version: f.Version, State: f.State, CompletedAt: f.CompletedAt,
		Usage: f.Usage, SourceEvent: ev.Name}

	var jc hooksv1alpha1.JobCompletion
	err := r.Get(ctx, key, &jc)
	archived := false
	if apierrors.IsNotFound(err) && final(prev.Outcome) {
		// The cache may not have seen a child created moments ago: confirm live.
		if err = r.APIReader.Get(ctx, key, &jc); apierrors.IsNotFound(err) {
			// Archived is not deleted: mirror the archived record.
			got, aerr := r.archivedJob(ctx, ev, f.JobID)
			if aerr != nil {
				return op, "", aerr
			}
			if got == nil {
				return childDeleted(prev), "", nil
			}
			jc, err, archived = *got, nil, true
		}
	}
	if apierrors.IsNotFound(err) && r.Archive != nil {
		// The job may have been completed and archived: its archived version counts
		// for ordering as if it were still here. Only a newer version creates it anew
		// (never as a first sighting: its charge may have been made).
		got, aerr := r.archivedJob(ctx, ev, f.JobID)
		if aerr != nil {
			return op, "", aerr
		}
		if got != nil && got.Spec.Completion.Version >= f.Version {
			jc, err, archived = *got, nil, true
		} else if got != nil {
			created, cerr := r.createJob(ctx, ev, f, name, proposed)
			if cerr != nil {
				return op, "", cerr
			}
			if created {
				op.Outcome = hooksv1alpha1.OutcomeCreated
				op.Message = fmt.Sprintf("version %d replaces archived version %d", f.Version, got.Spec.Completion.Version)
				op.State = string(hooksv1alpha1.JobCompletionPending)
				return op, "", nil
			}
			err = r.APIReader.Get(ctx, key, &jc) // created concurrently
		}
	}
	if apierrors.IsNotFound(err) {
		jc = *newJobCompletion(ev, f, name, proposed)
		err = r.Create(ctx, &jc)
		if err == nil {
			op.Outcome, op.Message = hooksv1alpha1.OutcomeCreated, fmt.Sprintf("version %d", f.Version)
			op.State = string(hooksv1alpha1.JobCompletionPending)
			return op, jc.Name + "/" + string(jc.UID), nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return op, "", fmt.Errorf("create jobcompletion %s: %w", name, err)
		}
		// Created concurrently by another event: read it live and compare.
		err = r.APIReader.Get(ctx, key, &jc)
	}
	if err != nil {
		return op, "", fmt.Errorf("get jobcompletion %s: %w", name, err)
	}
	op.State = mirroredJobState(&jc)
	if archived && f.Version == jc.Spec.Completion.Version && !sameCompletion(jc.Spec.Completion, proposed) && !final(prev.Outcome) {
		op.Outcome = hooksv1alpha1.OutcomeConflict
		op.Message = fmt.Sprintf("version %d was already reported by %s (archived) with different content", f.Version, jc.Spec.Completion.SourceEvent)
		return op, "", nil
	}
	if archived && !final(prev.Outcome) {
		// Never updated in place: the archived record is final.
		switch {
		case f.Version < jc.Spec.Completion.Version:
			op.Outcome = hooksv1alpha1.OutcomeSuperseded
			op.State = string(hooksv1alpha1.JobCompletionSuperseded)
			op.Message = fmt.Sprintf("version %d is older than archived version %d from %s; the job does not move backward",
				f.Version, jc.Spec.Completion.Version, jc.Spec.Completion.SourceEvent)
		case jc.Spec.Completion.SourceEvent == ev.Name:
			op.Outcome, op.Message = hooksv1alpha1.OutcomeCreated, fmt.Sprintf("version %d (archived)", f.Version)
		default:
			op.Outcome, op.Message = hooksv1alpha1.OutcomeLinked, fmt.Sprintf("version %d (archived)", f.Version)
		}
		return op, "", nil
	}
	if f.Version < jc.Spec.Completion.Version {
		// A newer version replaced this event's: what happens to that one is not this
		// event's story (its sink failing must not make this event PartiallyFailed).
		op.State = string(hooksv1alpha1.JobCompletionSuperseded)
	}
	if final(prev.Outcome) {
		op.Outcome, op.Message = prev.Outcome, prev.Message
		return op, "", nil
	}

	current := jc.Spec.Completion
	switch {
	case f.Version > current.Version:
		// The guarded transition: only a greater version replaces the proposal, and the
		// Update carries our resourceVersion, so a concurrent proposal makes us re-read
		// and compare again instead of overwriting (CEL refuses a lower one as well).
		jc.Spec.Completion = proposed
		jc.Spec.Sink = f.Sink.DeepCopy()
		if err := r.Update(ctx, &jc); err != nil {
			return op, "", fmt.Errorf("propose version %d to jobcompletion %s: %w", f.Version, name, err)
		}
		op.Outcome = hooksv1alpha1.OutcomeCreated
		op.Message = fmt.Sprintf("version %d replaces version %d", f.Version, current.Version)
		op.State = string(hooksv1alpha1.JobCompletionPending)
	case f.Version < current.Version:
		op.Outcome = hooksv1alpha1.OutcomeSuperseded
		op.Message = fmt.Sprintf("version %d is older than version %d from %s; the job does not move backward",
			f.Version, current.Version, current.SourceEvent)
		r.Recorder.Eventf(&jc, ev, corev1.EventTypeNormal, hooksv1alpha1.ReasonVersionSuperseded, "Supersede",
			"version %d from %s is older than version %d; ignored", f.Version, ev.Name, current.Version)
	case sameCompletion(current, proposed):
		op.Outcome = hooksv1alpha1.OutcomeLinked
		if current.SourceEvent == ev.Name {
			op.Outcome = hooksv1alpha1.OutcomeCreated
		}
		op.Message = fmt.Sprintf("version %d", f.Version)
	default:
		op.Outcome = hooksv1alpha1.OutcomeConflict
		op.Message = fmt.Sprintf("version %d was already reported by %s with different content", f.Version, current.SourceEvent)
		r.Recorder.Eventf(&jc, ev, corev1.EventTypeWarning, hooksv1alpha1.ReasonVersionConflict, "Conflict",
			"%s reports version %d with different content than %s", ev.Name, f.Version, current.SourceEvent)
	}
	return op, "", nil
}

// archivedJob is the job's archived completion with the highest version (nil without
// an archive or when it holds none).
func (r *Reconciler) archivedJob(ctx context.Context, ev *hooksv1alpha1.WebhookEvent, jobID string) (*hooksv1alpha1.JobCompletion, error) {
	if r.Archive == nil {
		return nil, nil
	}
	got, err := r.Archive.LatestJob(ctx, ev.Namespace, ev.Spec.Provider, jobID)
	metrics.NoteArchive("JobCompletion", err)
	if err != nil {
		return nil, fmt.Errorf("%w: look up job %q: %v", archivelookup.ErrUnavailable, jobID, err)
	}
	return got, nil
}

// createJob creates a job's JobCompletion; false when it exists already.
func (r *Reconciler) createJob(ctx context.Context, ev *hooksv1alpha1.WebhookEvent, f *hooksv1alpha1.JobCompletionFacts,
	name string, proposed hooksv1alpha1.Completion) (bool, error) {
	jc := newJobCompletion(ev, f, name, proposed)
	err := r.Create(ctx, jc)
	if apierrors.IsAlreadyExists(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create jobcompletion %s: %w", name, err)
	}
	return true, nil
}

func newJobCompletion(ev *hooksv1alpha1.WebhookEvent, f *hooksv1alpha1.JobCompletionFacts, name string,
	proposed hooksv1alpha1.Completion) *hooksv1alpha1.JobCompletion {
	return &hooksv1alpha1.JobCompletion{
		ObjectMeta: metav1.ObjectMeta{Namespace: ev.Namespace, Name: name, Labels: map[string]string{
			hooksv1alpha1.LabelProvider: ev.Spec.Provider,
			hooksv1alpha1.LabelJob:      identity.Hash32(f.JobID),
			hooksv1alpha1.LabelEvent:    settlement.EventHash(ev),
		}},
		Spec: hooksv1alpha1.JobCompletionSpec{Provider: ev.Spec.Provider, JobID: f.JobID, Completion: proposed,
			Sink: f.Sink.DeepCopy()},
	}
}

// sameCompletion compares the facts of a completion, not who reported them.
func sameCompletion(a, b hooksv1alpha1.Completion) bool {
	a.SourceEvent, b.SourceEvent = "", ""
	return equality.Semantic.DeepEqual(a, b)
}

// jobReport is what an event says about the job a settlement charges for.
type jobReport struct {
	id string
	// superseded: the event's completion of the job was recorded as Superseded.
	superseded bool
	// reported: the event reports a completion of the job, of version.
	reported bool
	version  int64
	// firstSeen is "<name>/<uid>" of the job's JobCompletion when this reconcile
	// created it (the job was never seen): its default-key settlement then carries
	// it as its fresh-for-job annotation and is sent without a lookup first.
	firstSeen string
	// completedAt is when the reported completion happened, if the sender said: a
	// usage settlement of the job carries it (spec.occurredAt).
	completedAt *metav1.Time
}

// newerCompletion returns the job's current completion version when it is newer than
// the one this event reports (0, false otherwise). A job's charge follows its highest
// version: an older completion must never create it, and its other usage is not a
// conflict. The JobCompletion is read live, because a newer version proposed moments
// ago (perhaps by an event whose own settlement create is failing) may not be in the
// cache yet.
func (r *Reconciler) newerCompletion(ctx context.Context, ev *hooksv1alpha1.WebhookEvent, job jobReport) (int64, bool, error) {
	if !job.reported || job.id == "" {
		return 0, false, nil
	}
	var jc hooksv1alpha1.JobCompletion
	name := identity.JobCompletionName(ev.Spec.Provider, job.id)
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ev.Namespace, Name: name}, &jc); err != nil {
		if !apierrors.IsNotFound(err) {
			return 0, false, fmt.Errorf("get jobcompletion %s: %w", name, err)
		}
		got, aerr := r.archivedJob(ctx, ev, job.id)
		if aerr != nil || got == nil {
			return 0, false, aerr
		}
		jc = *got
	}
	current := jc.Spec.Completion.Version
	return current, current > job.version, nil
}

// waitingForNewer begins the message of a job's settlement operation that waits for a
// newer completion of the job to be dispatched.
const waitingForNewer = "waiting: "

// newerWaitRetry is how soon an event waiting for a newer completion to be dispatched
// looks again even if nothing it watches changes (the newer event may be deleted, or
// removed as a duplicate of an archived receipt, without ever touching the job).
const newerWaitRetry = 30 * time.Second

// newerReceived is the highest version of job that another event reports whose
// completion of the job has not been decided yet (its operation for the job is missing
// or not final: not dispatched, or its proposal failed and is retried), when it is newer
// than this event's, and that event's name (0 otherwise). An event whose operation is
// decided has proposed its version to the JobCompletion (or been superseded, or
// conflicts), which newerCompletion reads. It reads the cache: an event acknowledged
// before this one was received is in it, as one watch delivers creates in order.
func (r *Reconciler) newerReceived(ctx context.Context, ev *hooksv1alpha1.WebhookEvent, job jobReport) (int64, string, error) {
	if !job.reported || job.id == "" {
		return 0, "", nil
	}
	var l hooksv1alpha1.WebhookEventList
	if err := r.List(ctx, &l, client.InNamespace(ev.Namespace),
		client.MatchingFields{index.EventChildren: identity.JobCompletionName(ev.Spec.Provider, job.id)}); err != nil {
		return 0, "", fmt.Errorf("list events of job %q: %w", job.id, err)
	}
	var newest int64
	var by string
	for i := range l.Items {
		o := &l.Items[i]
		if o.Name == ev.Name || o.Spec.Provider != ev.Spec.Provider || o.Spec.Quarantine != nil || o.DeletionTimestamp != nil {
			continue
		}
		decided := false
		for _, op := range o.Status.Operations {
			if op.Type == hooksv1alpha1.OperationJobCompletion && op.Key == job.id && final(op.Outcome) {
				decided = true
			}
		}
		if decided {
			continue
		}
		for _, f := range o.Spec.JobCompletions {
			if f.JobID == job.id && f.Version > job.version && f.Version > newest {
				newest, by = f.Version, o.Name
			}
		}
	}
	return newest, by, nil
}

// waitsForNewer says whether an operation of ev waits for a newer completion of its job.
func waitsForNewer(ev *hooksv1alpha1.WebhookEvent) bool {
	for _, op := range ev.Status.Operations {
		if op.Outcome == hooksv1alpha1.OutcomePending && strings.HasPrefix(op.Message, waitingForNewer) {
			return true
		}
	}
	return false
}

// supersededOutcome is the outcome of a settlement asked for by an older completion of
// its job.
func supersededOutcome(op hooksv1alpha1.OperationStatus, job jobReport, current int64) hooksv1alpha1.OperationStatus {
	op.Outcome = hooksv1alpha1.OutcomeSuperseded
	op.Message = fmt.Sprintf("from an older completion of job %q; the job's charge follows its newest completion", job.id)
	if current > 0 {
		op.Message = fmt.Sprintf("from version %d of job %q, which is at version %d; the job's charge follows its newest completion",
			job.version, job.id, current)
	}
	return op
}

// settlement creates or links the settlement of f. job is what the event says about
// the job f charges for: the charge of a job follows its highest completion version,
// so an event whose completion is older than the job's never creates it.
func (r *Reconciler) settlement(ctx context.Context, ev *hooksv1alpha1.WebhookEvent,
	f *hooksv1alpha1.SettlementFacts, prev hooksv1alpha1.OperationStatus, job jobReport) (hooksv1alpha1.OperationStatus, error) {
	want := settlement.New(ev, f)
	if f.Usage != nil && job.completedAt != nil {
		want.Spec.OccurredAt = job.completedAt.DeepCopy()
	}
	if job.firstSeen != "" && f.SettlementKey == identity.JobSettlementKey(ev.Namespace, ev.Spec.Provider, f.JobID) {
		want.Annotations = map[string]string{hooksv1alpha1.AnnotationFreshForJob: job.firstSeen}
	}
	name := want.Name
	op := hooksv1alpha1.OperationStatus{Type: hooksv1alpha1.OperationBillingSettlement, Key: f.SettlementKey,
		Child: name, Outcome: hooksv1alpha1.OutcomePending}
	key := types.NamespacedName{Namespace: ev.Namespace, Name: name}

	var bs hooksv1alpha1.BillingSettlement
	err := r.Get(ctx, key, &bs)
	if apierrors.IsNotFound(err) {
		if legacy, ok := r.legacySettlement(ctx, ev, f); ok {
			bs, err = legacy, nil
			op.Child = bs.Name
		}
	}
	if apierrors.IsNotFound(err) && r.Archive != nil {
		// Archived is not missing: the archived settlement is this key's record, so
		// the event links to it (or conflicts with it) and nothing is created again.
		got, aerr := archivelookup.Operation(ctx, r.Archive, want)
		if aerr != nil {
			return op, fmt.Errorf("%w: look up settlement %s: %v", archivelookup.ErrUnavailable, name, aerr)
		}
		if got != nil {
			bs, err = *got, nil
			op.Child = bs.Name
		}
	}
	if apierrors.IsNotFound(err) && prev.Outcome == hooksv1alpha1.OutcomeSuperseded {
		// Superseded without creating anything: there is no child of this event's to
		// mirror (the newer completion's own event reports on the charge).
		op.Outcome, op.Message = prev.Outcome, prev.Message
		return op, nil
	}
	if apierrors.IsNotFound(err) && final(prev.Outcome) {
		if err = r.APIReader.Get(ctx, key, &bs); apierrors.IsNotFound(err) {
			return childDeleted(prev), nil
		}
	}
	if apierrors.IsNotFound(err) {
		if job.superseded {
			return supersededOutcome(op, job, 0), nil
		}
		// A newer completion received before this one but whose version has not reached
		// the JobCompletion yet (several workers, or a queue that hands this event over
		// first) decides the job's charge: this one waits for it rather than making the
		// charge first. Not for good: once that version reaches the JobCompletion this one
		// is superseded, and if it never does (the event deleted, or removed as a
		// duplicate of an archived receipt) this one goes on. The events are listed
		// before the JobCompletion is read, so a newer event that proposes its version in
		// between is seen by one or the other.
		waitFor, by, nerr := r.newerReceived(ctx, ev, job)
		if nerr != nil {
			return op, nerr
		}
		current, newer, nerr := r.newerCompletion(ctx, ev, job)
		if nerr != nil {
			return op, nerr
		}
		if newer {
			return supersededOutcome(op, job, current), nil
		}
		if waitFor > 0 {
			op.Outcome = hooksv1alpha1.OutcomePending
			op.Message = fmt.Sprintf("%sversion %d of job %q was received in %s and has not reached the job's record yet; the job's charge follows its newest completion",
				waitingForNewer, waitFor, job.id, by)
			return op, nil
		}
		err = r.Create(ctx, want)
		if err == nil {
			op.Outcome, op.State = hooksv1alpha1.OutcomeCreated, string(hooksv1alpha1.SettlementPending)
			return op, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return op, fmt.Errorf("create billingsettlement %s: %w", name, err)
		}
		err = r.APIReader.Get(ctx, key, &bs)
	}
	if err != nil {
		return op, fmt.Errorf("get billingsettlement %s: %w", name, err)
	}
	op.State = mirroredSettlementState(&bs)
	if final(prev.Outcome) {
		op.Outcome, op.Message = prev.Outcome, prev.Message
		return op, nil
	}
	same := sameCharge(bs.Spec, want.Spec)
	var current int64
	older := job.superseded
	if !same && !older {
		// Whether other content is a conflict depends on the job's current version,
		// not on the outcome recorded when this event's completion was new.
		if current, older, err = r.newerCompletion(ctx, ev, job); err != nil {
			return op, err
		}
	}
	switch {
	case !same && older:
		// An older completion reports other usage than the newer one already charged:
		// it is superseded, not a conflict. (If the older report was charged before
		// the newer one arrived, the newer report's settlement is a Conflict for a
		// human: a charge is never edited.)
		op = supersededOutcome(op, job, current)
	case !same:
		op.Outcome = hooksv1alpha1.OutcomeConflict
		op.Message = fmt.Sprintf("settlement key %q already exists with different content (from %s); nothing is charged for this event",
			f.SettlementKey, bs.Spec.SourceEvent)
		r.Recorder.Eventf(&bs, ev, corev1.EventTypeWarning, hooksv1alpha1.ReasonOperationAmbiguous, "Conflict",
			"%s asks for settlement key %q with different content", ev.Name, f.SettlementKey)
	case bs.Spec.SourceEvent == ev.Name:
		op.Outcome = hooksv1alpha1.OutcomeCreated
	default:
		op.Outcome = hooksv1alpha1.OutcomeLinked
		op.Message = "already requested by " + bs.Spec.SourceEvent
	}
	return op, nil
}

// legacySettlement finds the settlement a keyFrom charge was created under before keys
// were namespaced (issue 10): the same logical charge under its legacy key and name.
// Without it, a charge made before the upgrade would be made again under the new key.
// A job's charge needs no such lookup: its name did not change.
func (r *Reconciler) legacySettlement(ctx context.Context, ev *hooksv1alpha1.WebhookEvent,
	f *hooksv1alpha1.SettlementFacts) (hooksv1alpha1.BillingSettlement, bool) {
	var bs hooksv1alpha1.BillingSettlement
	k, ok := identity.ParseSettlementKey(f.SettlementKey)
	if !ok || k.Kind != identity.KeyKindFields {
		return bs, false
	}
	name := identity.SettlementName(ev.Spec.Provider, k.LegacyKey())
	if err := r.Get(ctx, types.NamespacedName{Namespace: ev.Namespace, Name: name}, &bs); err != nil {
		return bs, false
	}
	// Legacy objects predate the upgrade, so the cache has them; the key check keeps
	// a hand-made settlement that merely shares the name from being taken for it.
	return bs, bs.Spec.SettlementKey == k.LegacyKey()
}

// sameCharge compares what would be charged, not which event asked first. A
// settlement stored before keys were namespaced holds the same operation's legacy
// settlement key and idempotency key (and a stored event's legacy key is charged with
// a namespaced idempotency key from now on): the keys are then not compared, the
// charge is.
func sameCharge(a, b hooksv1alpha1.BillingSettlementSpec) bool {
	a.SourceEvent, b.SourceEvent = "", ""
	a.Metadata, b.Metadata = nil, nil
	// When the usage happened dates it, it does not change it: a settlement created
	// before occurredAt existed, or by another completion of the job, is the same
	// charge.
	a.OccurredAt, b.OccurredAt = nil, nil
	if sameOperation(a.SettlementKey, b.SettlementKey) {
		a.SettlementKey, b.SettlementKey = "", ""
		a.IdempotencyKey, b.IdempotencyKey = "", ""
	}
	return equality.Semantic.DeepEqual(a, b)
}

// sameOperation reports whether two settlement keys name one logical operation: equal,
// or one the legacy form of the other.
func sameOperation(a, b string) bool {
	legacy := func(key string) string {
		if k, ok := identity.ParseSettlementKey(key); ok {
			return k.LegacyKey()
		}
		return key
	}
	return a == b || legacy(a) == legacy(b) && (a == legacy(a) || b == legacy(b))
}

// health classifies a child's state for the event's phase.
type health int

const (
	healthGood health = iota
	healthProgressing
	healthFailing
	healthAmbiguous
)

func operationHealth(op hooksv1alpha1.OperationStatus) health {
	switch op.Outcome {
	case hooksv1alpha1.OutcomeSuperseded:
		return healthGood
	case hooksv1alpha1.OutcomeConflict:
		return healthAmbiguous
	case hooksv1alpha1.OutcomeFailed:
		return healthFailing
	case hooksv1alpha1.OutcomePending:
		return healthProgressing
	}
	switch op.State {
	case string(hooksv1alpha1.JobCompletionApplied), string(hooksv1alpha1.JobCompletionSuperseded),
		string(hooksv1alpha1.SettlementSettled):
		return healthGood
	case string(hooksv1alpha1.SettlementFailed): // same string as JobCompletionFailed
		return healthFailing
	case string(hooksv1alpha1.SettlementRequiresReconciliation):
		return healthAmbiguous
	case stateRetrying:
		return healthFailing
	case stateDeleted:
		return healthAmbiguous
	}
	return healthProgressing
}

func mirroredJobState(jc *hooksv1alpha1.JobCompletion) string {
	if jc.Status.ObservedGeneration != jc.Generation {
		// A newer version was proposed and not taken up yet: its state is not the
		// Status's (that one is the previous version's).
		return string(hooksv1alpha1.JobCompletionPending)
	}
	if jc.Status.LastError != "" && jc.Status.State == hooksv1alpha1.JobCompletionPending {
		return stateRetrying
	}
	if jc.Status.State == "" {
		return string(hooksv1alpha1.JobCompletionPending)
	}
	return string(jc.Status.State)
}

func mirroredSettlementState(bs *hooksv1alpha1.BillingSettlement) string {
	switch bs.Status.State {
	case "":
		return string(hooksv1alpha1.SettlementPending)
	case hooksv1alpha1.SettlementPending, hooksv1alpha1.SettlementSubmitted:
		if bs.Status.LastError != nil {
			return stateRetrying
		}
	}
	return string(bs.Status.State)
}

// stateRetrying is mirrored for a child that is being retried after an error, so the
// event shows PartiallyFailed (docs/design.md §9) while the child itself stays in its state.
const stateRetrying = "Retrying"

// derivePhase summarises the operations; the event's status only mirrors its children.
func derivePhase(ev *hooksv1alpha1.WebhookEvent) {
	worst, done := healthGood, 0
	for _, op := range ev.Status.Operations {
		h := operationHealth(op)
		if h > worst {
			worst = h
		}
		if h == healthGood {
			done++
		}
	}
	n := len(ev.Status.Operations)
	dispatched := metav1.ConditionTrue
	for _, op := range ev.Status.Operations {
		if op.Outcome == hooksv1alpha1.OutcomePending {
			dispatched = metav1.ConditionFalse
		}
	}
	conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionDispatched, dispatched,
		map[metav1.ConditionStatus]string{metav1.ConditionTrue: hooksv1alpha1.ReasonAccepted,
			metav1.ConditionFalse: hooksv1alpha1.ReasonOperationsInProgress}[dispatched],
		fmt.Sprintf("%d operation(s)", n))
	switch worst {
	case healthAmbiguous:
		ev.Status.Phase = hooksv1alpha1.EventRequiresReconciliation
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			hooksv1alpha1.ReasonOperationAmbiguous, "an operation conflicts or its outcome needs reconciliation; see status.operations")
	case healthFailing:
		ev.Status.Phase = hooksv1alpha1.EventPartiallyFailed
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			hooksv1alpha1.ReasonOperationFailed,
			fmt.Sprintf("%d of %d operations done; the others failed or are being retried (see status.operations)", done, n))
	case healthProgressing:
		ev.Status.Phase = hooksv1alpha1.EventDispatching
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			hooksv1alpha1.ReasonOperationsInProgress, fmt.Sprintf("%d of %d operations done", done, n))
	default:
		ev.Status.Phase = hooksv1alpha1.EventComplete
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue,
			hooksv1alpha1.ReasonAllOperationsDone, fmt.Sprintf("all %d operations done", n))
	}
}

// eventChildren lists the child names an event's facts derive, for the index.
func eventChildren(obj client.Object) []string {
	ev := obj.(*hooksv1alpha1.WebhookEvent)
	var names []string
	for _, f := range ev.Spec.JobCompletions {
		names = append(names, identity.JobCompletionName(ev.Spec.Provider, f.JobID))
	}
	for _, f := range ev.Spec.Settlements {
		names = append(names, identity.SettlementNameFor(ev.Spec.Provider, f.SettlementKey))
		if k, ok := identity.ParseSettlementKey(f.SettlementKey); ok && k.Kind == identity.KeyKindFields {
			// The charge may live under its legacy name (legacySettlement).
			names = append(names, identity.SettlementName(ev.Spec.Provider, k.LegacyKey()))
		}
	}
	return names
}

// IndexEvents registers the WebhookEvent index the controller reads (IndexEventChildren);
// SetupWithManager calls it.
func IndexEvents(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &hooksv1alpha1.WebhookEvent{},
		index.EventChildren, eventChildren); err != nil {
		return fmt.Errorf("index webhookevents by child: %w", err)
	}
	return nil
}

// eventsOfChild maps a changed child to the events that dispatched it.
func (r *Reconciler) eventsOfChild(ctx context.Context, obj client.Object) []reconcile.Request {
	var l hooksv1alpha1.WebhookEventList
	if err := r.List(ctx, &l, client.InNamespace(obj.GetNamespace()), client.MatchingFields{index.EventChildren: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "list events of child", "child", obj.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(l.Items))
	for _, ev := range l.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ev.Namespace, Name: ev.Name}})
	}
	return reqs
}

// childHandler enqueues a child's events when they have something to write about it
// (docs/design.md §9: an event's status is written when its operations are decided
// and when they finish, and when one goes wrong). A child's creation was done (or
// linked) by the event itself, so it enqueues nothing; its deletion always enqueues.
// An update enqueues only when the child's health as its events classify it changes
// (Pending → Submitted does not), and a child that turned out well only once none of
// the event's other children is still progressing: partial progress is read on the
// children, not rewritten on every event (issue 14: 3.4 event reconciles per event
// before, 2 now).
func (r *Reconciler) childHandler(healthOf func(client.Object) health) handler.Funcs {
	enqueue := func(ctx context.Context, obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request], whenDone bool) {
		for _, req := range r.eventsOfChild(ctx, obj) {
			if whenDone && !r.othersDone(ctx, req.NamespacedName, obj) {
				continue
			}
			q.Add(req)
		}
	}
	return handler.Funcs{
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.GetResourceVersion() == e.ObjectNew.GetResourceVersion() {
				enqueue(ctx, e.ObjectNew, q, false) // a resync: the safety net for anything missed
				return
			}
			was, is := healthOf(e.ObjectOld), healthOf(e.ObjectNew)
			if was != is {
				enqueue(ctx, e.ObjectNew, q, is == healthGood)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q, false)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q, false)
		},
	}
}

func childHealthOfJob(o client.Object) health {
	return operationHealth(hooksv1alpha1.OperationStatus{State: mirroredJobState(o.(*hooksv1alpha1.JobCompletion))})
}

func childHealthOfSettlement(o client.Object) health {
	return operationHealth(hooksv1alpha1.OperationStatus{State: mirroredSettlementState(o.(*hooksv1alpha1.BillingSettlement))})
}

// othersDone reports whether none of the event's children but changed is still
// progressing, as the cache shows them. Whatever it cannot tell (the event or a
// child not in the cache) counts as done, so the event is reconciled rather than
// missed. Of two children finishing at once, the later notification sees the other's
// new state (an informer updates its store before it notifies), so one enqueues.
func (r *Reconciler) othersDone(ctx context.Context, key types.NamespacedName, changed client.Object) bool {
	var ev hooksv1alpha1.WebhookEvent
	if err := r.Get(ctx, key, &ev); err != nil {
		return true
	}
	progressing := func(name string, obj client.Object, h func(client.Object) health) bool {
		if name == changed.GetName() {
			return false
		}
		if err := r.Get(ctx, types.NamespacedName{Namespace: ev.Namespace, Name: name}, obj); err != nil {
			return false
		}
		return h(obj) == healthProgressing
	}
	for _, f := range ev.Spec.JobCompletions {
		var jc hooksv1alpha1.JobCompletion
		name := identity.JobCompletionName(ev.Spec.Provider, f.JobID)
		if progressing(name, &jc, childHealthOfJob) && jc.Spec.Completion.Version <= f.Version {
			// (A newer version's progress is not this event's: its operation is Superseded.)
			return false
		}
	}
	for _, f := range ev.Spec.Settlements {
		var bs hooksv1alpha1.BillingSettlement
		if progressing(identity.SettlementNameFor(ev.Spec.Provider, f.SettlementKey), &bs, childHealthOfSettlement) {
			return false
		}
	}
	return true
}

// notOnlyStatus passes every change of an object but one to its status alone: the
// event controller writes its events' status itself and reads nothing else there, so
// its own write must not cost it another reconcile (issue 14: about one per event).
// Its writes carry the resourceVersion they were computed from, so one computed from
// a cache that had not seen the previous write yet conflicts and is redone, instead
// of being skipped or half-applied with nothing to wake the event again.
// Everything it acts on is in the spec (generation), metadata (the replay annotation,
// labels, finalizers, deletion) or its children, which are watched on their own.
func notOnlyStatus() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		if o == nil || n == nil {
			return true
		}
		return o.GetResourceVersion() == n.GetResourceVersion() || // a resync
			o.GetGeneration() != n.GetGeneration() ||
			!maps.Equal(o.GetAnnotations(), n.GetAnnotations()) ||
			!maps.Equal(o.GetLabels(), n.GetLabels()) ||
			!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
			!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp()) ||
			len(o.GetOwnerReferences()) != len(n.GetOwnerReferences())
	}}
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
