package webhookevent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// dispatch creates or links every child and records each operation's outcome once:
// an outcome is a fact about what this event did, so it is never recomputed (a later
// newer version must not turn this event's "Created" into "Superseded"). Only the
// mirrored child state is refreshed.
func (r *Reconciler) dispatch(ctx context.Context, ev *hooksv1alpha1.WebhookEvent) error {
	recorded := map[string]hooksv1alpha1.OperationStatus{}
	for _, op := range ev.Status.Operations {
		if op.Outcome == hooksv1alpha1.OutcomeUnmapped {
			// Nothing was created for it; once a replay mapped its state, the job's
			// operation is decided afresh (and never read as a child deleted).
			continue
		}
		recorded[string(op.Type)+"/"+op.Key] = op
	}
	jobFacts, stlFacts, unmapped := facts(ev)
	var ops []hooksv1alpha1.OperationStatus
	var errs []error
	// firstSeen holds the jobs whose JobCompletion this reconcile created: they were
	// never seen, so their default-key settlement cannot have been sent before.
	firstSeen := map[string]string{}
	for i := range jobFacts {
		f := &jobFacts[i]
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
	for _, f := range jobFacts {
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
	for i := range stlFacts {
		f := &stlFacts[i]
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
	ops = append(ops, unmappedOperations(ev, unmapped)...)
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
			if created != nil {
				op.Outcome = hooksv1alpha1.OutcomeCreated
				op.Message = fmt.Sprintf("version %d replaces archived version %d", f.Version, got.Spec.Completion.Version)
				op.State = mirroredJobState(created)
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
			op.State = mirroredJobState(&jc)
			noteAppliedOnCreation(&jc)
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

// createJob creates a job's JobCompletion and returns it as created; nil when it
// exists already.
func (r *Reconciler) createJob(ctx context.Context, ev *hooksv1alpha1.WebhookEvent, f *hooksv1alpha1.JobCompletionFacts,
	name string, proposed hooksv1alpha1.Completion) (*hooksv1alpha1.JobCompletion, error) {
	jc := newJobCompletion(ev, f, name, proposed)
	err := r.Create(ctx, jc)
	if apierrors.IsAlreadyExists(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("create jobcompletion %s: %w", name, err)
	}
	noteAppliedOnCreation(jc)
	return jc, nil
}

// noteAppliedOnCreation counts the transition to Applied of a job that its creation
// applied: its own controller writes nothing for it, so it counts nothing.
func noteAppliedOnCreation(jc *hooksv1alpha1.JobCompletion) {
	if jc.AppliedOnCreation() {
		metrics.JobTransitions.WithLabelValues(string(hooksv1alpha1.JobCompletionApplied)).Inc()
	}
}

func newJobCompletion(ev *hooksv1alpha1.WebhookEvent, f *hooksv1alpha1.JobCompletionFacts, name string,
	proposed hooksv1alpha1.Completion) *hooksv1alpha1.JobCompletion {
	return &hooksv1alpha1.JobCompletion{
		// Only the provider's label (kubectl get jc -l): the job's hash is its name's, the
		// event is spec.completion.sourceEvent, and nothing selects jobs on either.
		ObjectMeta: metav1.ObjectMeta{Namespace: ev.Namespace, Name: name, Labels: map[string]string{
			hooksv1alpha1.LabelProvider: ev.Spec.Provider,
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
// were namespaced: the same logical charge under its legacy key and name.
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

// unmappedOperations records the job completions whose state the provider does not map
// (docs/design.md §5, "Job states"): nothing was created or charged for them, and the
// outcome says what to do. The message names the state, never the payload.
func unmappedOperations(ev *hooksv1alpha1.WebhookEvent, unmapped []hooksv1alpha1.UnmappedJobState) []hooksv1alpha1.OperationStatus {
	var ops []hooksv1alpha1.OperationStatus
	for _, u := range unmapped {
		what := fmt.Sprintf("job %s", u.JobID)
		if u.JobID == "" {
			what = "a when condition's jobState()"
		}
		ops = append(ops, hooksv1alpha1.OperationStatus{Type: hooksv1alpha1.OperationJobCompletion, Key: u.JobID,
			Outcome: hooksv1alpha1.OutcomeUnmapped, State: hooksv1alpha1.ReasonUnmappedState,
			Message: fmt.Sprintf("%s: job state %q is not in WebhookProvider %s's spec.states; nothing was created or charged for it. "+
				"Add the state to spec.states, then replay the event: set the hooks.settlement.dev/replay annotation (docs/runbook.md, UnmappedState)",
				what, u.State, ev.Spec.Provider)})
	}
	return ops
}
