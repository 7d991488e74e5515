package billingsettlement

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/keyedsem"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

// guardCompensation holds a Refund or Void, before every submission of it (the first, and
// any after a retry or a replay), while sending it
// could move money wrongly: the original must exist, be for the same customer and
// currency, and be Settled (Refund) or sent but not settled (Void) — or, for a Void,
// settled at a provider that can still cancel it (billing.VoidsSettled), for the whole
// of it; refunds of one original never add up to more than it charged, and a Void is
// never sent beside another compensation of the same charge that may have moved money.
// Two compensations created at once see each other, in one process (a live list, under
// the charge's lock: guardAndSubmit) and across processes (the claim, persisted before
// the bracket and followed by a second live read: docs/design.md §16), so neither can
// slip past the total or the Void's exclusivity.
func (r *Reconciler) guardCompensation(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	bs := s.bs
	if bs.Spec.Type != hooksv1alpha1.SettlementRefund && bs.Spec.Type != hooksv1alpha1.SettlementVoid {
		return ctrl.Result{}, nil
	}
	// The original may have been archived: it is read from the archive then.
	origp, _, err := archivelookup.Settlement(ctx, r.APIReader, r.Archive, bs.Namespace, bs.Spec.Reverses)
	if apierrors.IsNotFound(err) {
		return r.holdCompensation(s, fmt.Sprintf("waiting for the settlement it reverses, %q, to exist", bs.Spec.Reverses))
	}
	if errors.Is(err, archivelookup.ErrUnavailable) {
		return r.holdCompensation(s, "waiting for the archive: the settlement it reverses may be there")
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("get reversed settlement %s: %w", bs.Spec.Reverses, err)
	}
	orig := *origp
	if why := settlement.CompensationRefusal(bs, &orig, s.client != nil && billing.VoidsSettled(s.client)); why != "" {
		return r.holdCompensation(s, why)
	}
	pinned := bs.Status.ReversesRef
	if pinned != "" && orig.Status.ProviderRef != "" && pinned != orig.Status.ProviderRef {
		return r.holdCompensation(s, fmt.Sprintf("%s now has provider reference %q, not %q as when this %s was first sent: "+
			"compare both at the provider", orig.Name, orig.Status.ProviderRef, pinned, bs.Spec.Type))
	}
	all, err := r.compensationsOf(ctx, bs, &orig)
	if err != nil {
		return ctrl.Result{}, err
	}
	if all == nil {
		return r.holdCompensation(s, "waiting for the archive: earlier compensations of the charge may be there")
	}
	why := reversalRefusal(bs, &orig, all)
	if why == "" && bs.Status.ClaimedAt == nil {
		// The claim is persisted before the bracket, and the others are read again after
		// it: of two guards in two processes, at least one reads the other's claim
		// (docs/design.md §16). One write per compensation, none on the charge.
		now := metav1.NewTime(s.now)
		bs.Status.ClaimedAt = &now
		if _, err := statuspatch.Patch(ctx, r.Client, bs, s.before, true); err != nil {
			bs.Status.ClaimedAt = nil
			return ctrl.Result{}, fmt.Errorf("claim %s for %s: %w", orig.Name, bs.Name, err)
		}
		s.before = bs.DeepCopy()
		if all, err = r.compensationsOf(ctx, bs, &orig); err != nil {
			return ctrl.Result{}, err // the claim stays: the next reconcile reads again
		}
		if all == nil {
			return r.holdCompensation(s, "waiting for the archive: earlier compensations of the charge may be there")
		}
		why = reversalRefusal(bs, &orig, all)
	}
	if why != "" {
		if bs.Status.ClaimedAt != nil && reversalRefusal(bs, &orig, settlement.WithoutLaterClaims(bs, &orig, all)) == "" {
			// Only later claims stand in the way, and they step back on seeing this one.
			r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonCompensationNotAllowed,
				"claimed "+orig.Name+"; waiting for a later compensation of it to step back ("+why+")")
			return ctrl.Result{RequeueAfter: claimRecheck}, nil
		}
		return r.holdCompensation(s, why)
	}

	s.reverses, s.reversesRef = orig.Spec.SettlementKey, settlement.ReversesRefOf(bs, &orig)
	return ctrl.Result{}, nil
}

// The Reconciler's compensationLocks serialize the guard and submission of the
// compensations of one charge within this process (one Reconciler per manager); across
// processes it is the claim (docs/design.md §16).

// chargeLocks is one lock per charge.
type chargeLocks struct{ sems keyedsem.Set }

// chargeLockWait bounds how long a compensation waits for its charge's lock: the
// holder may be in a POST that lasts its provider's whole requestTimeout (up to a
// minute), and a worker waiting that long is a worker no other settlement gets.
const chargeLockWait = 2 * time.Second

// errChargeBusy: another compensation of the same charge held the lock for all of
// chargeLockWait; nothing was checked or sent, and the settlement is requeued.
var errChargeBusy = errors.New("another compensation of the same charge is being checked or sent")

// lock takes bs's charge's lock (none for a charge itself) and returns its release,
// errChargeBusy when another holds it for chargeLockWait, or ctx's error when ctx ends
// first (the manager stopping): a worker never waits for long.
func (k *chargeLocks) lock(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) (func(), error) {
	if bs.Spec.Reverses == "" {
		return func() {}, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	expiry := time.NewTimer(chargeLockWait)
	defer expiry.Stop()
	unlock, ok := k.sems.Acquire(ctx, expiry.C, bs.Namespace+"/"+bs.Spec.Reverses, 1)
	if !ok {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, errChargeBusy
	}
	return unlock, nil
}

// claimRecheck is how soon a compensation whose claim waits for a later one to step
// back looks again.
const claimRecheck = time.Second

// reversalRefusal is the guard's rules on the charge's compensations ("" when bs may go).
func reversalRefusal(bs, orig *hooksv1alpha1.BillingSettlement, all []hooksv1alpha1.BillingSettlement) string {
	if why := settlement.ReversalConflict(bs, orig, all); why != "" {
		return why
	}
	return settlement.RefundOverCharge(bs, orig, all)
}

// compensationsOf lists the settlements of bs's namespace live from the API server,
// with the archived compensations of orig merged in: nil (and no error) while the
// archive does not answer.
func (r *Reconciler) compensationsOf(ctx context.Context, bs, orig *hooksv1alpha1.BillingSettlement) ([]hooksv1alpha1.BillingSettlement, error) {
	var l hooksv1alpha1.BillingSettlementList
	if err := r.APIReader.List(ctx, &l, client.InNamespace(bs.Namespace)); err != nil {
		return nil, fmt.Errorf("list compensations of %s: %w", orig.Name, err)
	}
	if r.Archive != nil {
		// Compensations already archived count as much as those in the cluster: without
		// them, a charge could be refunded again once its first refund left.
		archived, err := r.Archive.Reversing(ctx, bs.Namespace, orig.Name)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return nil, nil
		}
		l.Items = settlement.WithArchived(l.Items, archived)
	}
	if l.Items == nil {
		l.Items = []hooksv1alpha1.BillingSettlement{}
	}
	return l.Items, nil
}

// holdCompensation keeps a compensation Pending with the reason, and looks again later.
// A claim it holds on its charge is released (with the reconcile's status write): it
// sends nothing now, and must not stand in another's way.
func (r *Reconciler) holdCompensation(s *settlementScope, why string) (ctrl.Result, error) {
	bs := s.bs
	bs.Status.ClaimedAt = nil
	if c := findCondition(bs, hooksv1alpha1.ConditionReady); c == nil || c.Message != why {
		r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonCompensationNotAllowed, "Compensate", "%s", why)
	}
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonCompensationNotAllowed, why)
	return ctrl.Result{RequeueAfter: waitForReference}, nil
}
