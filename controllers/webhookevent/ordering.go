package webhookevent

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/index"
)

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
		jobs, _, _ := facts(o)
		for _, f := range jobs {
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
