package billingprovider

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// DefaultMaxLookups is how many lookups by key one pass makes at most when
// Reconciler.MaxLookups is 0 (docs/design.md §7, "Lookups by key"): 200 per pass, one
// pass per interval (10 minutes by default), stays well inside the rate limits the
// providers document for their lookups (Metronome's events search is the tightest).
const DefaultMaxLookups = 200

// minLookupRetry is the shortest wait before a pass whose lookups a provider rate
// limited is followed by the next: reports are named by the second.
const minLookupRetry = time.Second

// lookupQueue is, per BillingProvider (by UID), what its passes' lookups by key left
// for the next: when each settlement still waiting for a confirmation was last asked
// about, so that a pass asks first those that waited longest and none starves behind
// others asked again and again, and when the provider asked to be called again after
// rate limiting a lookup. It lives in memory: after a restart or a change of leader the
// settlements are asked in the order they settled, and the next pass comes at the
// usual interval.
type lookupQueue struct {
	mu         sync.Mutex
	byProvider map[types.UID]*lookupState
}

type lookupState struct {
	// asked holds, per settlement UID, when a pass last had the provider's answer about
	// it (an answer that did not confirm it: a confirmed one leaves the queue).
	asked map[types.UID]time.Time
	// resumeAt is when the provider asked to be called again (its Retry-After); zero
	// when the last pass was not rate limited, or was without a Retry-After.
	resumeAt time.Time
	// changed holds the settlements settled before the window that a pass had to ask
	// about because they changed since a kept report confirmed them, and that got no
	// answer yet (their lookup waited, failed, or the provider does not show them yet).
	// They are asked again by the next pass though the kept report that made them
	// "changed since" may be pruned meanwhile: without this, one whose lookups waited
	// longer than keepReports passes would never be confirmed again, nor archived.
	changed map[types.UID]bool
	// ran is true once a pass of this process got to its lookups for the provider:
	// until then changed is not known, and pruning goes by what is stored
	// (confirmBeforePrune).
	ran bool
}

// state returns the provider's queue (an empty one before its first pass).
func (q *lookupQueue) state(uid types.UID) lookupState {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.byProvider[uid]; s != nil {
		return *s
	}
	return lookupState{}
}

// keep stores what a pass left for the next.
func (q *lookupQueue) keep(uid types.UID, s lookupState) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.byProvider == nil {
		q.byProvider = map[types.UID]*lookupState{}
	}
	q.byProvider[uid] = &s
}

// drop forgets a deleted provider's queue.
func (q *lookupQueue) drop(uid types.UID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.byProvider, uid)
}

// resumeIn is how soon after from the provider's next pass is due because a rate
// limit it set runs out (0: no such limit, or one that ran out before from: a pass
// since, which did not get to its lookups, does not hurry the next).
func (q *lookupQueue) resumeIn(uid types.UID, from time.Time) time.Duration {
	at := q.state(uid).resumeAt
	if !at.After(from) {
		return 0
	}
	return max(at.Sub(from), minLookupRetry)
}

func (r *Reconciler) maxLookups() int {
	if r.MaxLookups > 0 {
		return r.MaxLookups
	}
	return DefaultMaxLookups
}

// alreadyConfirmed reports a settlement a pass confirmed before at its current
// version, as the archiver decides it (docs/design.md §12): it
// carries Reconciled=True itself, or a kept report of this provider names its version.
// The provider's answer about it would not change that, so it is not asked again.
func alreadyConfirmed(p *passState, bs *hooksv1alpha1.BillingSettlement) bool {
	return confirmation.Confirmed(bs) || (p.confirmed != nil && p.confirmed.Holds(bs))
}

// lookUpUnlisted asks the provider by key about each settlement settled in the window
// that its list did not show, and reports those it does not hold. A settlement
// already confirmed at its current version is counted, not asked. At most maxLookups
// are asked, those waiting longest first (never asked: since they settled; asked
// before: since then); a lookup the provider rate limits stops the pass's lookups.
// Either way the pass does not fail: the others wait, unconfirmed (the archiver keeps
// them) and not reported, for the next pass, which comes after the provider's
// Retry-After when it gave one, and whose window still holds them (markAtMost)
// (docs/design.md §7, "Lookups by key").
func (r *Reconciler) lookUpUnlisted(ctx context.Context, bp *hooksv1alpha1.BillingProvider, c billing.Client,
	since time.Time, seen map[string]bool, mine []*hooksv1alpha1.BillingSettlement, p *passState, now time.Time) error {
	before := r.lookups.state(bp.UID)
	type waiting struct {
		bs    *hooksv1alpha1.BillingSettlement
		since time.Time
		// changed: settled before the window, asked because it changed since it was
		// confirmed (lookupState.changed).
		changed bool
	}
	var queue []waiting
	for _, bs := range mine {
		if bs.Status.State != hooksv1alpha1.SettlementSettled || seen[bs.Spec.IdempotencyKey] || bs.Status.SettledAt == nil {
			continue
		}
		// One settled before the window is asked about again only when an earlier pass
		// confirmed another version of it than it has now (it changed since, and the
		// archiver waits for a confirmation of this version), as a kept report shows or
		// an earlier pass that could not ask it remembered.
		changed := false
		if bs.Status.SettledAt.Time.Before(since) {
			changed = (p.confirmed != nil && p.confirmed.ChangedSince(bs)) ||
				(before.changed[bs.UID] && bs.DeletionTimestamp.IsZero())
			if !changed {
				continue
			}
		}
		if alreadyConfirmed(p, bs) {
			p.examined["SettlementAlreadyConfirmed"]++
			continue
		}
		w := waiting{bs: bs, since: bs.Status.SettledAt.Time, changed: changed}
		if t, ok := before.asked[bs.UID]; ok {
			w.since = t
		}
		queue = append(queue, w)
	}
	sort.SliceStable(queue, func(i, j int) bool {
		if !queue[i].since.Equal(queue[j].since) {
			return queue[i].since.Before(queue[j].since)
		}
		return queue[i].bs.Name < queue[j].bs.Name
	})

	after := lookupState{asked: map[types.UID]time.Time{}, changed: map[types.UID]bool{}, ran: true}
	defer func() { r.lookups.keep(bp.UID, after) }()
	for _, w := range queue {
		if t, ok := before.asked[w.bs.UID]; ok {
			after.asked[w.bs.UID] = t // still waiting; moved below when asked now
		}
		if w.changed {
			after.changed[w.bs.UID] = true // until an answer below (or a pass's failure)
		}
	}
	target := providerclient.TargetFor(bp, c)
	budget := r.maxLookups()
	asked, deferred := 0, int32(0)
	var limited *billing.Error
	hold := func(bs *hooksv1alpha1.BillingSettlement) {
		// The next pass's window starts at the mark less the overlap: the mark is held
		// back to this one's settling, so that the next window holds it whatever
		// stuckAfter is by then (a shorter one must not cut it out). One asked about
		// because it changed since it was confirmed is asked whatever the window.
		if at := bs.Status.SettledAt.Time; !bs.Status.SettledAt.Time.Before(since) &&
			(p.markAtMost.IsZero() || at.Before(p.markAtMost)) {
			p.markAtMost = at
		}
	}
	wait := func(bs *hooksv1alpha1.BillingSettlement) {
		deferred++
		hold(bs)
	}
	for _, w := range queue {
		if asked >= budget || limited != nil {
			wait(w.bs)
			continue
		}
		asked++
		before := answers(p)
		called, notYet, err := r.lookUp(ctx, bp, c, target, w.bs, p, now)
		if notYet {
			hold(w.bs) // asked again by the next pass
		}
		if e, ok := billing.AsError(err); ok && e.RateLimited() {
			// Refused before the provider looked: this one and the rest wait.
			limited = e
			wait(w.bs)
			continue
		}
		if called && err == nil && !notYet && answers(p) > before {
			// Answered: confirmed, or reported; a kept report says which from now on.
			// (A lookup can also end in neither, e.g. a record under the key other than
			// the one the settlement adopted: it stays remembered, and asked again.)
			delete(after.changed, w.bs.UID)
		}
		if called {
			p.examined["SettlementLookedUp"]++
			// Confirmed ones leave the queue at the next pass (alreadyConfirmed); the
			// others go behind those that waited longer.
			after.asked[w.bs.UID] = r.now()
		}
		if err != nil {
			// Any other failure fails the pass as before: the mark stays, and the next
			// pass asks this one after the others.
			return err
		}
	}
	if deferred == 0 {
		return nil
	}
	p.examined["SettlementLookupDeferred"] = deferred
	switch {
	case limited != nil && limited.RetryAfter > 0:
		after.resumeAt = r.now().Add(limited.RetryAfter)
		p.lookupsWait = fmt.Sprintf("%d lookups wait for the next pass, after the provider's Retry-After (%s): it rate limited them", deferred, limited.RetryAfter)
	case limited != nil:
		p.lookupsWait = fmt.Sprintf("%d lookups wait for the next pass, at the usual interval: the provider rate limited them", deferred)
	default:
		p.lookupsWait = fmt.Sprintf("%d lookups wait for the next pass: this pass asked its most (%d)", deferred, budget)
	}
	return nil
}

// answers counts what a pass concluded so far: findings reported and settlements
// confirmed (into its report, or marked on the settlement past the report's cap).
func answers(p *passState) int {
	n := int(p.report.Discrepancies)
	if p.confirmed != nil {
		n += p.confirmed.Len() + int(p.confirmed.Marked)
	}
	return n
}

// lookUp asks the provider about one settled settlement by key and confirms or reports
// it; called is false when no call reached the provider's books (none was made, or the
// provider rate limited it), true otherwise, even when the call failed. notYet is true
// when the provider does not show it yet and its "not found" proves nothing (it
// ingests asynchronously: OpenMeter, Metronome's search, Lago's ClickHouse pipeline):
// inside stuckAfter of its settling that is no discrepancy, and the next pass asks
// again (docs/design.md §7, "Lookups by key").
func (r *Reconciler) lookUp(ctx context.Context, bp *hooksv1alpha1.BillingProvider, c billing.Client, target hooksv1alpha1.ProviderTarget,
	bs *hooksv1alpha1.BillingSettlement, p *passState, now time.Time) (called, notYet bool, _ error) {
	reverses, reversesRef, err := archivelookup.ReversedKey(ctx, r.Client, r.Archive, bs)
	if err != nil {
		// Without the original's reference the lookup could ask about the wrong thing;
		// the pass fails and its mark stays, so the next pass asks again.
		return false, false, err
	}
	req := settlement.RequestOf(bs, reverses, reversesRef)
	start := time.Now()
	rec, found, err := billing.LookupFor(ctx, c, req)
	metrics.ObserveBillingCall(bp.Namespace, bp.Name, "lookup", start, err)
	// Not shown, by a provider whose "not found" proves nothing: a charge it answered
	// for may simply not be ingested yet.
	unproven := !billing.CapabilitiesOf(c, req).ProvesAbsence()
	stuckAfter := reconciliationPolicyOf(bp).stuckAfter
	notVisible := func(why string) (bool, bool, error) {
		if age := now.Sub(bs.Status.SettledAt.Time); age < stuckAfter {
			p.examined["SettlementNotYetVisible"]++
			return true, true, nil
		}
		p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown, Object: "BillingSettlement/" + bs.Name,
			ProviderRef: bs.Status.ProviderRef, Action: hooksv1alpha1.RepairManualReview,
			Message: conditions.TruncateMessage(fmt.Sprintf("settled locally as %s at %s, but the provider still does not show key %s, not visible "+
				"stuckAfter (%s) after it settled (it ingests asynchronously, so this alone does not prove it lacks the charge): %s",
				bs.Status.ProviderRef, bs.Status.SettledAt.UTC().Format(time.RFC3339), bs.Spec.IdempotencyKey, stuckAfter, why))})
		return true, false, nil
	}
	if e, ok := billing.AsError(err); ok && e.Unanswerable {
		if e.Unreadable && (bs.Status.SentTo == nil || *bs.Status.SentTo == target) {
			// Stripe can neither list nor read back meter events: the settlement rests
			// on the provider's answer to its submission, which it matched field by
			// field. Counted and marked (so it may be archived).
			p.examined["SettlementNotComparable"]++
			r.markCompared(ctx, p, bs, hooksv1alpha1.ReasonProviderCannotAnswer,
				"the provider cannot list or read back this kind of record: it rests on the provider's answer to its submission; "+
					"compare the provider's own totals (Stripe: the meter's event summaries) in its dashboard", now)
			return true, false, nil
		}
		if unproven && !e.Unreadable {
			return notVisible(e.Message)
		}
		p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown, Object: "BillingSettlement/" + bs.Name,
			ProviderRef: bs.Status.ProviderRef, Action: hooksv1alpha1.RepairManualReview,
			Message: conditions.TruncateMessage(fmt.Sprintf("settled locally as %s, but the provider could not be asked about key %s: %s",
				bs.Status.ProviderRef, bs.Spec.IdempotencyKey, e.Message))})
		return true, false, nil
	}
	if err != nil {
		if e, ok := billing.AsError(err); ok && e.RateLimited() {
			return false, false, err // the caller tells this one apart
		}
		return true, false, fmt.Errorf("look up %s: %w", bs.Spec.IdempotencyKey, err)
	}
	if found && rec.Status == billing.StatusSettled {
		if why := r.notProvablyOurs(ctx, bs, rec); why != "" {
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: "BillingSettlement/" + bs.Name,
				ProviderRef: rec.ID, Action: hooksv1alpha1.RepairManualReview, Message: why})
			return true, false, nil
		}
		r.markReconciled(ctx, p, bs, rec, now)
		return true, false, nil
	}
	if !found {
		// A charge a settled Void cancelled is gone at a provider that deletes it
		// (Stripe): that is the Void's doing, not a loss.
		void, err := r.settledVoidOf(ctx, bs)
		if err != nil {
			return true, false, err
		}
		if void != "" {
			r.markCompared(ctx, p, bs, hooksv1alpha1.ReasonVoided,
				fmt.Sprintf("the provider no longer has %s: %s voided it", bs.Status.ProviderRef, void), now)
			return true, false, nil
		}
		if unproven {
			return notVisible("its lookup finds no record under the key")
		}
	}
	state := "no record"
	if found {
		state = rec.Status
	}
	p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown, Object: "BillingSettlement/" + bs.Name,
		ProviderRef: bs.Status.ProviderRef, Action: hooksv1alpha1.RepairManualReview,
		Message: fmt.Sprintf("settled locally as %s, but the provider has %s under key %s", bs.Status.ProviderRef, state, bs.Spec.IdempotencyKey)})
	return true, false, nil
}
