package billingprovider

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archivedmemory"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/index"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// listWalk is a walk of the provider's list that a pass cut at the page limit: the
// next pass goes on from its cursor instead of from the start, so a list longer than
// one pass may walk still ends and the mark (providerListedUntil) advances. Without
// it, a provider listing more than maxListPages pages between the mark less the
// overlap and now (5,000 records: 5.6 events/s with the 15-minute overlap) was walked
// from the same start by every pass, forever, and every settlement past the cut was
// confirmed by a lookup of its own (docs/decisions.md "Reconciliation walks").
// The mark a finished walk sets is the time its first pass started, not its last: the
// list contract promises no order, so a record created while the walk went on may
// have sorted before its cursor; the next walk, from that mark less the overlap,
// lists it. It lives in memory: after a restart or a change of leader the walk starts
// again from the mark; a failed page or a changed BillingProvider spec drops it too.
type listWalk struct {
	// mark is the providerListedUntil the walk started from (zero before the first
	// complete walk); since is where it lists from; started is when its first pass
	// began; generation is the BillingProvider's (an endpoint change starts over).
	mark, since, started time.Time
	generation           int64
	cursor               string
	// seen holds the idempotency keys of this provider's settlements whose settled
	// Record the walk listed (each was then confirmed or reported).
	seen map[string]bool
}

type walkMemory struct {
	mu         sync.Mutex
	byProvider map[types.UID]*listWalk
}

// take removes and returns the provider's unfinished walk (nil when there is none).
func (m *walkMemory) take(uid types.UID) *listWalk {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.byProvider[uid]
	delete(m.byProvider, uid)
	return w
}

// keep stores an unfinished walk for the provider's next pass.
func (m *walkMemory) keep(uid types.UID, w *listWalk) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byProvider == nil {
		m.byProvider = map[types.UID]*listWalk{}
	}
	m.byProvider[uid] = w
}

// pending says whether the provider has an unfinished walk.
func (m *walkMemory) pending(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byProvider[uid] != nil
}

func (r *Reconciler) maxListPages() int {
	if r.MaxListPages > 0 {
		return r.MaxListPages
	}
	return maxListPages
}

// compareProvider walks the provider's records since the window start (with an
// overlap for clock skew) and compares them with the local settlements.
func (r *Reconciler) compareProvider(ctx context.Context, bp *hooksv1alpha1.BillingProvider, c billing.Client,
	now time.Time, reportName string, byKey map[string]*hooksv1alpha1.BillingSettlement,
	mine []*hooksv1alpha1.BillingSettlement, p *passState) error {
	since, mark := now.Add(-firstWindow), time.Time{}
	if t := bp.Status.ProviderListedUntil; t != nil {
		since, mark = t.Add(-reconciliationPolicyOf(bp).stuckAfter), t.Time
	}
	// Records no pass has listed for an hour past the overlap are out of every window;
	// an archive that changed may no longer hold what was compared.
	r.archived.Prune(bp.UID, now.Add(-reconciliationPolicyOf(bp).stuckAfter-time.Hour))
	if r.Archive != nil {
		if counter, err := r.Archive.InsertCounter(ctx); err != nil {
			r.archived.Forget()
		} else {
			r.archived.SameArchive(archivedmemory.State{Changes: r.Archive.Changes(), Counter: counter})
		}
	}
	seen := map[string]bool{}
	cursor, pages, records := "", 0, int32(0)
	p.walkStarted = now
	if w := r.walks.take(bp.UID); w != nil && w.mark.Equal(mark) && w.generation == bp.Generation {
		// The walk the last pass cut goes on.
		since, seen, cursor, p.walkStarted = w.since, w.seen, w.cursor, w.started
	}
	for {
		called := time.Now()
		recs, next, err := c.List(ctx, since, cursor)
		metrics.ObserveBillingCall(bp.Namespace, bp.Name, "list", called, err)
		if err != nil {
			// The walk is dropped: a refused cursor must not be retried forever, and the
			// next pass, at the usual interval, starts again from the mark.
			return fmt.Errorf("list the provider's records: %w", err)
		}
		var unknown []billing.Record
		for _, rec := range recs {
			records++
			if k, ok := identity.ParseSettlementKey(rec.SettlementKey); ok && k.Namespace != bp.Namespace {
				// Another namespace's record in a shared billing account: its own
				// pass reports it (legacy keys, minted before keys were namespaced, carry no namespace).
				records--
				continue
			}
			bs, ok := byKey[rec.IdempotencyKey]
			if !ok {
				unknown = append(unknown, rec)
				continue
			}
			if rec.Status == billing.StatusSettled {
				// Confirmed or reported below; a pending or failed record leaves a
				// locally settled settlement to be asked about by key.
				seen[rec.IdempotencyKey] = true
			}
			if why := r.notProvablyOurs(ctx, bs, rec); why != "" {
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: "BillingSettlement/" + bs.Name,
					ProviderRef: rec.ID, Action: hooksv1alpha1.RepairManualReview, Message: why})
				continue
			}
			if bs.Status.ProviderRef != "" && rec.ID != bs.Status.ProviderRef && settlement.EffectiveExposure(&bs.Status) == hooksv1alpha1.ExposureConfirmed {
				// A second record under one key: a double charge, or the provider
				// re-created it. Never confirmed; a human looks.
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: "BillingSettlement/" + bs.Name,
					ProviderRef: rec.ID, Action: hooksv1alpha1.RepairManualReview,
					Message: fmt.Sprintf("the provider has record %s under key %s, but the settlement recorded %s: more than one record under one key",
						rec.ID, bs.Spec.IdempotencyKey, bs.Status.ProviderRef)})
				continue
			}
			switch {
			case rec.Status == billing.StatusPending && bs.Status.State == hooksv1alpha1.SettlementFailed:
				// Pending there, failed here (nothing charged, we thought): ask by key,
				// which resumes polling it.
				carried := r.requestReconcile(ctx, bs, reportName)
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderSettledLocalPending,
					Object: "BillingSettlement/" + bs.Name, ProviderRef: rec.ID, Action: hooksv1alpha1.RepairAuthoritativeQuery,
					CarriedOut: carried,
					Message:    fmt.Sprintf("the provider has %s pending; locally Failed: asking the provider by key", rec.ID)})
			case rec.Status == billing.StatusSettled && bs.Status.State != hooksv1alpha1.SettlementSettled:
				carried := r.requestReconcile(ctx, bs, reportName)
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderSettledLocalPending,
					Object: "BillingSettlement/" + bs.Name, ProviderRef: rec.ID, Action: hooksv1alpha1.RepairAuthoritativeQuery,
					CarriedOut: carried,
					Message:    fmt.Sprintf("the provider settled %s; locally %s: importing the provider's final status by key", rec.ID, settlement.StateOrNew(bs.Status.State))})
			case rec.Status == billing.StatusSettled:
				r.markReconciled(ctx, p, bs, rec, now)
			}
		}
		// A record whose settlement left for the archive is compared with the archived one.
		if err := r.compareUnknown(ctx, bp, unknown, p, now); err != nil {
			return err
		}
		pages++
		if next == "" {
			p.listedAll = true
			// What this walk did not list left the window for good.
			r.archived.WalkEnded(bp.UID, p.walkStarted)
			break
		}
		if pages >= r.maxListPages() {
			// The rest waits for the next pass, which goes on from here, soon.
			p.report.Truncated = true
			r.walks.keep(bp.UID, &listWalk{mark: mark, since: since, started: p.walkStarted,
				generation: bp.Generation, cursor: next, seen: seen})
			break
		}
		cursor = next
	}
	p.examined["ProviderRecord"] = records
	if !p.listedAll {
		// Settlements are told apart from the provider's records only once the walk
		// has ended: asking by key for every one past the cut costs a lookup each.
		return nil
	}

	// Local settled but unknown to the provider: those settled in the window that the
	// list did not show are asked by key before anything is reported (lookups.go).
	return r.lookUpUnlisted(ctx, bp, c, since, seen, mine, p, now)
}

// settledVoidOf names a settled Void of charge bs, in the cluster or the archive ("" when
// there is none).
func (r *Reconciler) settledVoidOf(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) (string, error) {
	if bs.Spec.Reverses != "" {
		return "", nil
	}
	var l hooksv1alpha1.BillingSettlementList
	if err := r.List(ctx, &l, client.InNamespace(bs.Namespace), client.MatchingFields{index.SettlementReverses: bs.Name}); err != nil {
		return "", fmt.Errorf("list compensations of %s: %w", bs.Name, err)
	}
	comps := l.Items
	if r.Archive != nil {
		archived, err := r.Archive.Reversing(ctx, bs.Namespace, bs.Name)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return "", fmt.Errorf("list archived compensations of %s: %w", bs.Name, err)
		}
		comps = append(comps, archived...)
	}
	for i := range comps {
		c := &comps[i]
		if c.Spec.Type == hooksv1alpha1.SettlementVoid && c.Spec.Reverses == bs.Name && c.Status.State == hooksv1alpha1.SettlementSettled {
			return c.Name, nil
		}
	}
	return "", nil
}

// notProvablyOurs says why a provider record under a settlement's key cannot confirm
// it ("" when it can): a field that differs or is missing (fail closed), or an earlier
// Disagreement the settlement recorded. It names fields, never another record's values.
func (r *Reconciler) notProvablyOurs(ctx context.Context, bs *hooksv1alpha1.BillingSettlement, rec billing.Record) string {
	reverses, _, _ := archivelookup.ReversedKey(ctx, r.Client, r.Archive, bs) // unreadable: "" fails the comparison, closed
	if m, ok := settlement.RecordMatches(bs, reverses, rec); !ok {
		return fmt.Sprintf("the provider's record %s under key %s is not provably this settlement: %s", rec.ID, bs.Spec.IdempotencyKey, m)
	}
	if d := bs.Status.Disagreement; d != nil {
		return fmt.Sprintf("the provider's record %s is not confirmed: the settlement recorded a disagreement (%s %s)", rec.ID, d.Reason, d.Field)
	}
	return ""
}
