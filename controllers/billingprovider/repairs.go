package billingprovider

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

// requestReconcile asks a settlement's own controller to query the provider by key,
// by setting the reconcile-request annotation to the report's name.
func (r *Reconciler) requestReconcile(ctx context.Context, bs *hooksv1alpha1.BillingSettlement, reportName string) bool {
	if bs.Annotations[hooksv1alpha1.AnnotationReconcileRequest] == reportName {
		return true
	}
	patch := client.MergeFrom(bs.DeepCopy())
	if bs.Annotations == nil {
		bs.Annotations = map[string]string{}
	}
	bs.Annotations[hooksv1alpha1.AnnotationReconcileRequest] = reportName
	if err := r.Patch(ctx, bs, patch); err != nil {
		log.FromContext(ctx).Error(err, "request reconcile", "settlement", bs.Name)
		return false
	}
	return true
}

// touch asks an event's controller to dispatch it again.
func (r *Reconciler) touch(ctx context.Context, ev *hooksv1alpha1.WebhookEvent, reportName string) bool {
	patch := client.MergeFrom(ev.DeepCopy())
	if ev.Annotations == nil {
		ev.Annotations = map[string]string{}
	}
	ev.Annotations[hooksv1alpha1.AnnotationReconcileRequest] = reportName
	if err := r.Patch(ctx, ev, patch); err != nil {
		log.FromContext(ctx).Error(err, "request re-dispatch", "event", ev.Name)
		return false
	}
	return true
}

// markReconciled confirms a settled settlement the provider confirmed.
func (r *Reconciler) markReconciled(ctx context.Context, p *passState, bs *hooksv1alpha1.BillingSettlement, rec billing.Record, now time.Time) {
	if bs.Status.ProviderRef != "" && rec.ID != bs.Status.ProviderRef {
		return // another record than the one the settlement adopted confirms nothing
	}
	r.markCompared(ctx, p, bs, hooksv1alpha1.ReasonConfirmedByProvider, fmt.Sprintf("the provider's record %s matches", rec.ID), now)
}

// markCompared confirms a settlement: the pass has done what it can for it. With the
// archive on, the confirmation goes into the pass's report (its UID and the version
// compared) and the settlement is not written; the archiver takes it from there
// (docs/design.md §7, §12). Without the archive, or past the report's cap, it sets
// Reconciled=True on the settlement itself. Settled settlements are final, so their
// controller no longer writes them; the optimistic lock still guards against a
// concurrent write (the next pass retries).
func (r *Reconciler) markCompared(ctx context.Context, p *passState, bs *hooksv1alpha1.BillingSettlement, reason, message string, now time.Time) {
	if confirmation.Confirmed(bs) {
		return
	}
	if p.confirmed != nil {
		if p.confirmed.Add(reason, bs) {
			return
		}
		p.confirmed.Marked++
	}
	r.markOnSettlement(ctx, bs, reason, message, now)
}

// markOnSettlement writes Reconciled=True and lastReconciledAt on the settlement.
func (r *Reconciler) markOnSettlement(ctx context.Context, bs *hooksv1alpha1.BillingSettlement, reason, message string, now time.Time) error {
	base := bs.DeepCopy()
	t := metav1.NewTime(now)
	bs.Status.LastReconciledAt = &t
	conditions.Set(&bs.Status.Conditions, bs.Generation, hooksv1alpha1.ConditionReconciled, metav1.ConditionTrue, reason, conditions.TruncateMessage(message))
	if _, err := statuspatch.Patch(ctx, r.Client, bs, base, true); err != nil {
		log.FromContext(ctx).V(1).Info("mark reconciled skipped", "settlement", bs.Name, "error", err.Error())
		return err
	}
	return nil
}
