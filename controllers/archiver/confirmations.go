package archiver

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
	"github.com/settlement-operator/settlement-operator/internal/index"
)

// A reconciliation pass with the archive on writes what it confirmed into its report,
// not onto each settlement (docs/design.md §7, §12). A Settled settlement counts as
// confirmed when it carries Reconciled=True itself, or when a report of its
// BillingProvider — the one in the cluster now, by UID — still in the cluster confirms
// exactly its UID at its current resourceVersion. One that changed since (a refund
// added to status.reversedBy) waits for a pass that confirms the version it has now; a
// pruned report confirms nothing. The archiver writes the confirmation into the copy
// it archives — Reconciled=True with the report's reason and a message naming the
// report, and lastReconciledAt the time of the pass — so the archived row's reconciled
// column and object say it was confirmed. The content hash covers neither, so the
// same settlement archived with or without them hashes the same.

// confirmFromReport sets Reconciled=True on obj, in memory, when a report confirms it
// at its current version. Anything else is left as it is.
func (a *Reconciler) confirmFromReport(ctx context.Context, obj client.Object) error {
	bs, ok := obj.(*hooksv1alpha1.BillingSettlement)
	if !ok || bs.Status.State != hooksv1alpha1.SettlementSettled || confirmation.Confirmed(bs) {
		return nil
	}
	var bp hooksv1alpha1.BillingProvider
	err := a.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.BillingProviderRef}, &bp)
	if apierrors.IsNotFound(err) {
		return nil // no provider, no pass of it: nothing confirms it
	}
	if err != nil {
		return fmt.Errorf("get billing provider %s: %w", bs.Spec.BillingProviderRef, err)
	}
	var reports hooksv1alpha1.ReconciliationReportList
	// Read, never changed: reports may hold thousands of confirmations and are not copied.
	if err := a.List(ctx, &reports, client.InNamespace(bs.Namespace), client.UnsafeDisableDeepCopy,
		client.MatchingLabels{hooksv1alpha1.LabelBillingProvider: bp.Name}); err != nil {
		return fmt.Errorf("list reports of %s: %w", bp.Name, err)
	}
	rr, reason, ok := confirmation.Find(reports.Items, bp.UID, bs)
	if !ok {
		a.released.reapply(bs)
		return nil
	}
	confirmation.Apply(bs, rr, reason)
	return nil
}

// releasedConfirmations carries a report's confirmation across the archiver's own
// release of a settlement. The release (removing the protection finalizer) gives the
// settlement a resourceVersion no report names; should its DELETE then be refused —
// the settlement controller put the finalizer back — or fail, the settlement is still
// the content the report confirmed and that is archived, and must go on its next
// reconcile rather than wait for a pass to confirm a version that differs only in
// its finalizer. So, per settlement released and not yet deleted, the confirmation
// and the content hash it covered are kept (in memory: after a restart in between,
// the next pass asks the provider about the changed version and confirms it again).
// A settlement whose content has changed since gets nothing from it.
type releasedConfirmations struct {
	mu sync.Mutex
	m  map[types.UID]releasedConfirmation
}

type releasedConfirmation struct {
	hash string
	cond metav1.Condition
	at   *metav1.Time
}

// remember keeps bs's confirmation before the archiver releases it (nothing when it
// carries none: it is not archived unconfirmed).
func (r *releasedConfirmations) remember(bs *hooksv1alpha1.BillingSettlement) {
	c := apimeta.FindStatusCondition(bs.Status.Conditions, hooksv1alpha1.ConditionReconciled)
	if c == nil || c.Status != metav1.ConditionTrue {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[types.UID]releasedConfirmation{}
	}
	r.m[bs.UID] = releasedConfirmation{hash: archive.SettlementContentHash(bs), cond: *c, at: bs.Status.LastReconciledAt.DeepCopy()}
}

// forget drops what was kept for a settlement once it is gone.
func (r *releasedConfirmations) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, uid)
}

// reapply confirms bs again, in memory, if the archiver released it on a confirmation
// of exactly its present content.
func (r *releasedConfirmations) reapply(bs *hooksv1alpha1.BillingSettlement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kept, ok := r.m[bs.UID]
	if !ok {
		return
	}
	if kept.hash != archive.SettlementContentHash(bs) {
		delete(r.m, bs.UID) // changed since: a pass must look at it again
		return
	}
	cond := kept.cond
	cond.ObservedGeneration = bs.Generation
	apimeta.SetStatusCondition(&bs.Status.Conditions, cond)
	bs.Status.LastReconciledAt = kept.at.DeepCopy()
}

// settlementsConfirmedBy maps a report to the settlements it confirms that are still
// in the cluster, so a confirmation is acted on when it is written.
func (a *Reconciler) settlementsConfirmedBy(ctx context.Context, o client.Object) []reconcile.Request {
	rr, ok := o.(*hooksv1alpha1.ReconciliationReport)
	if !ok || rr.Status.Confirmed == nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, g := range rr.Status.Confirmed.ByReason {
		for _, v := range g.Settlements {
			var l hooksv1alpha1.BillingSettlementList
			if err := a.List(ctx, &l, client.InNamespace(rr.Namespace), client.UnsafeDisableDeepCopy,
				client.MatchingFields{index.SettlementUID: string(confirmation.UIDOf(v))}); err != nil {
				continue // the settlement's own next change, or the next report, brings it
			}
			for i := range l.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
			}
		}
	}
	return reqs
}

// watchConfirmations indexes settlements by UID and enqueues those a report confirms
// when it is written (its status carries them; creation and deletion bring nothing).
func (a *Reconciler) watchConfirmations(mgr ctrl.Manager, b *builder.Builder) (*builder.Builder, error) {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &hooksv1alpha1.BillingSettlement{}, index.SettlementUID,
		func(o client.Object) []string { return []string{string(o.GetUID())} }); err != nil {
		return nil, err
	}
	return b.Watches(&hooksv1alpha1.ReconciliationReport{}, handler.EnqueueRequestsFromMapFunc(a.settlementsConfirmedBy),
		builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(e event.CreateEvent) bool {
				return e.Object.(*hooksv1alpha1.ReconciliationReport).Status.Confirmed != nil
			},
			UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectNew.(*hooksv1alpha1.ReconciliationReport).Status.Confirmed != nil &&
					e.ObjectOld.(*hooksv1alpha1.ReconciliationReport).Status.Confirmed == nil
			},
			DeleteFunc:  func(event.DeleteEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})), nil
}
