package webhookevent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

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
