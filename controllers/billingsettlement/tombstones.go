package billingsettlement

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/internal/tombstone"
)

// A namespace deleted without an archive takes its settlements, and one created again
// under the same name derives the same names and keys (docs/design.md §3, §8). So a
// settlement that presented its key leaves a tombstone — its name and key, in the
// operator's namespace — before its finalizer goes, and a settlement is taken for
// never presented (exposure None: one POST, no lookup) only if no tombstone holds its
// name: otherwise the provider is asked by key first, and finds the charge made in the
// namespace's earlier life.

// tombstoneRecheck is how soon a settlement held for want of a tombstone tries again
// when only a person can change that (no operator namespace, tombstones full).
const tombstoneRecheck = 10 * time.Minute

// presentedBefore returns the tombstone of s's settlement (under any of its operation's
// names), read once per reconcile, and the name it was found under.
func (r *Reconciler) presentedBefore(ctx context.Context, s *settlementScope) (*tombstone.Tombstone, string, error) {
	if s.tombstoneAsked {
		return s.tombstone, s.tombstoneName, nil
	}
	bs := s.bs
	names, _ := settlement.OperationIdentities(bs.Namespace, bs.Name, bs.Spec.SettlementKey, bs.Spec.IdempotencyKey)
	t, name, err := r.Tombstones.Find(ctx, bs.Namespace, names...)
	if err != nil {
		// Nothing is sent as new until they answer (the API server, or the manager's
		// Role on ConfigMaps in its namespace): retried with backoff.
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonAPIServerFailure,
			conditions.TruncateMessage("nothing is sent until the tombstones of deleted namespaces say whether this key was presented before: "+err.Error()))
		return nil, "", fmt.Errorf("ask the tombstones whether billingsettlement %s was presented before: %w", bs.Name, err)
	}
	s.tombstone, s.tombstoneName, s.tombstoneAsked = t, name, true
	return t, name, nil
}

// notPresentedBeforeNamespaceDeletion answers, for a settlement about to start at
// exposure None, whether it still may: false when a tombstone holds its name, with a
// Warning and a Ready condition that say so (the decision then asks the provider by
// key before anything is sent).
func (r *Reconciler) notPresentedBeforeNamespaceDeletion(ctx context.Context, s *settlementScope) (bool, error) {
	t, _, err := r.presentedBefore(ctx, s)
	if err != nil {
		return false, err
	}
	if t != nil {
		r.warnPresentedBefore(s)
	}
	return t == nil, nil
}

// warnPresentedBefore says, once as its exposure is decided, that s's settlement
// starts at Possible because a tombstone holds its name (presentedBefore found it).
func (r *Reconciler) warnPresentedBefore(s *settlementScope) {
	bs, t, name := s.bs, s.tombstone, s.tombstoneName
	msg := conditions.TruncateMessage(fmt.Sprintf("settlement %s of this namespace presented key %s (%s, provider reference %q) before the namespace was deleted without an archive "+
		"(tombstone in ConfigMap %s, %s): this one is not taken for never presented, and the provider is asked by key before anything is sent",
		name, t.IdempotencyKey, settlement.StateOrNew(t.State), t.ProviderRef, r.Tombstones.Where(bs.Namespace, name), t.DeletedAt.UTC().Format(time.RFC3339)))
	r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonPresentedBeforeNamespaceDeletion, "Validate", "%s", msg)
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonPresentedBeforeNamespaceDeletion, msg)
}

// recordTombstone writes the tombstone of a settlement leaving without an archive
// that presented its key; held is true, with the result, while it cannot be written
// (the finalizer stays, and Ready says why and what to do).
func (r *Reconciler) recordTombstone(ctx context.Context, s *settlementScope) (res ctrl.Result, held bool, _ error) {
	bs := s.bs
	err := r.Tombstones.Record(ctx, bs)
	if err == nil {
		return ctrl.Result{}, false, nil
	}
	const why = "deletion is held: without an archive, a settlement that presented its key leaves only once its name and key are recorded " +
		"outside its namespace (a tombstone), or a namespace created again under this name would charge it again; "
	switch {
	case errors.Is(err, tombstone.ErrOff):
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonTombstoneNotWritten,
			why+err.Error()+": set one, or configure an archive (docs/runbook.md, \"Deleting a namespace\")")
		return ctrl.Result{RequeueAfter: tombstoneRecheck}, true, nil
	case errors.Is(err, tombstone.ErrFull):
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonTombstoneNotWritten,
			conditions.TruncateMessage(why+err.Error()+": configure an archive, which takes it instead (docs/runbook.md, \"Deleting a namespace\")"))
		return ctrl.Result{RequeueAfter: tombstoneRecheck}, true, nil
	default:
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonTombstoneNotWritten,
			conditions.TruncateMessage(why+"trying again: "+err.Error()))
		return ctrl.Result{}, true, err
	}
}
