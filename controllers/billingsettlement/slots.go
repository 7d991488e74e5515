package billingsettlement

import (
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/settlement-operator/settlement-operator/internal/metrics"
)

// Outbound isolation (docs/design.md §5.4): the settlements of one BillingProvider
// hold at most its share of the settlement workers while they call it. A provider
// that accepts connections and never answers makes every call last its
// requestTimeout; without a share its settlements would take every worker in turn
// and every other tenant's charges would wait behind them.

// slotRetryBase is how soon a settlement refused a slot (or its charge's lock) looks
// again, before jitter of up to as much again spreads the retries out.
const slotRetryBase = time.Second

// providerShare is how many settlements of one BillingProvider are worked on at once:
// ProviderShare, or a quarter of the workers, at least 1, and never more than all.
func (r *Reconciler) providerShare() int {
	workers := max(r.MaxConcurrentReconciles, 1)
	if r.ProviderShare > 0 {
		return min(r.ProviderShare, workers)
	}
	return max(workers/4, 1)
}

// takeSlot takes one of the settlement's BillingProvider's slots for the rest of the
// reconcile, unless it holds one already; Reconcile gives it back after the status
// patch, so the slot covers the bracket, the call and the write of its outcome. It is
// taken before the first call to the provider in a reconcile and never waited for: a
// worker that cannot have one goes on to other work.
func (r *Reconciler) takeSlot(s *settlementScope) bool {
	if s.releaseSlot != nil {
		return true
	}
	release, ok := r.slots.TryAcquire(s.bs.Namespace+"/"+s.bs.Spec.BillingProviderRef, r.providerShare())
	if ok {
		s.releaseSlot = release
	}
	return ok
}

// waitForSlot requeues a settlement refused a slot. The decision to call is not
// applied (drive asks for the slot before it applies one), so a refusal changes no
// state, writes no bracket and sends nothing; no provider call was made in this
// reconcile either (the first one takes the slot). The decision is made again, from
// the same facts, once a slot is free. What the steps before it decided without the
// provider (ActContinue) is kept: it would be written by the next reconcile anyway.
func (r *Reconciler) waitForSlot(s *settlementScope) (ctrl.Result, error) {
	metrics.ProviderSlotWaits.WithLabelValues(s.bs.Namespace, s.bs.Spec.BillingProviderRef).Inc()
	return ctrl.Result{RequeueAfter: r.slotRetry()}, nil
}

// slotRetry is slotRetryBase plus jitter, so the settlements waiting for one provider
// do not all come back at the same moment.
func (r *Reconciler) slotRetry() time.Duration {
	return slotRetryBase + time.Duration(r.random()*float64(slotRetryBase))
}
