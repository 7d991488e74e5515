package billingprovider

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// archivedCheck is a finding that stands only if the archive does not hold key.
type archivedCheck struct {
	key string
	d   hooksv1alpha1.Discrepancy
}

// addUnlessArchived adds the findings whose key (the name of the missing object) the
// archive does not hold (all of them without an archive) and that the API server does
// not have either: the pass compares cached lists taken one after the other, so a
// Record created or archived in between would otherwise be reported as missing. An
// archive that does not answer fails the pass: reporting an archived record as missing
// would send a human after a charge that is fine.
func (r *Reconciler) addUnlessArchived(ctx context.Context, ns string, checks []archivedCheck, p *passState,
	known func(context.Context, string, []string) (map[string]bool, error), newObj func() client.Object) error {
	if len(checks) == 0 {
		return nil
	}
	archived := map[string]bool{}
	if r.Archive != nil {
		keys := make([]string, 0, len(checks))
		for _, c := range checks {
			keys = append(keys, c.key)
		}
		var err error
		archived, err = known(ctx, ns, keys)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return fmt.Errorf("%w: compare with the archive: %v", archivelookup.ErrUnavailable, err)
		}
		p.examined["Archived"] += int32(len(archived))
	}
	for _, c := range checks {
		if archived[c.key] || r.existsLive(ctx, ns, c.key, newObj()) {
			continue
		}
		p.add(c.d)
	}
	return nil
}

// orphanedSettlements reports the namespace's unfinished settlements that name a
// BillingProvider which does not exist (a typo in a route, a provider deleted before
// it was protected): no provider's pass compares them and nothing is sent for them,
// so every pass of their namespace lists them. A finished one (Settled, Failed) names
// a provider that may be retired on purpose and is not reported.
func (r *Reconciler) orphanedSettlements(ctx context.Context, ns string,
	settlements []hooksv1alpha1.BillingSettlement, p *passState) error {
	var providers hooksv1alpha1.BillingProviderList
	if err := r.List(ctx, &providers, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list billing providers: %w", err)
	}
	known := map[string]bool{}
	for _, bp := range providers.Items {
		known[bp.Name] = true
	}
	missing := map[string]bool{} // confirmed live once per pass
	for i := range settlements {
		bs := &settlements[i]
		ref := bs.Spec.BillingProviderRef
		if known[ref] || bs.Status.State == hooksv1alpha1.SettlementSettled || bs.Status.State == hooksv1alpha1.SettlementFailed {
			continue
		}
		gone, checked := missing[ref]
		if !checked {
			// The cache may not have seen a provider created moments ago.
			gone = !r.existsLive(ctx, ns, ref, &hooksv1alpha1.BillingProvider{})
			missing[ref] = gone
		}
		if !gone {
			continue
		}
		p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancySettlementWithoutBillingProvider,
			Object: "BillingSettlement/" + bs.Name, Action: hooksv1alpha1.RepairManualReview,
			Message: conditions.TruncateMessage(fmt.Sprintf("names BillingProvider %q, which does not exist in %s: nothing is sent for it and no pass "+
				"compares it; create that provider, or fix the route that made it (kubectl get webhookproviders -n %s) "+
				"and delete this settlement once nothing was sent (its exposure is %s)",
				ref, ns, ns, settlement.EffectiveExposure(&bs.Status)))})
	}
	return nil
}

// existsLive reads an object from the API server (not the cache); an error counts as
// "not there", so a finding is reported rather than hidden.
func (r *Reconciler) existsLive(ctx context.Context, ns, name string, obj client.Object) bool {
	if r.APIReader == nil || name == "" {
		return false
	}
	return r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj) == nil
}

// inFlight reports whether the settlement a provider record names exists now, under
// the record's idempotency key (live, not from the cache).
func (r *Reconciler) inFlight(ctx context.Context, ns string, rec billing.Record) bool {
	k, ok := identity.ParseSettlementKey(rec.SettlementKey)
	if !ok {
		return false
	}
	var bs hooksv1alpha1.BillingSettlement
	return r.existsLive(ctx, ns, identity.SettlementNameFor(k.Provider, rec.SettlementKey), &bs) &&
		bs.Spec.IdempotencyKey == rec.IdempotencyKey
}

func (r *Reconciler) archivedSettlementNames(ctx context.Context, ns string, names []string) (map[string]bool, error) {
	return r.Archive.KnownSettlementNames(ctx, ns, names)
}

func (r *Reconciler) archivedJobNames(ctx context.Context, ns string, names []string) (map[string]bool, error) {
	return r.Archive.KnownJobNames(ctx, ns, names)
}

// compareUnknown reports the provider's records that no settlement in the cluster
// knows: those the archive does not know either, and those whose archived settlement
// they do not prove (another record, other content, or a settlement archived as
// Failed that the provider holds). An archived record is final, so nothing is
// repaired automatically: a human looks. A record that compared clean before is not
// read back again (archivedmemory.Memory).
func (r *Reconciler) compareUnknown(ctx context.Context, bp *hooksv1alpha1.BillingProvider, recs []billing.Record, p *passState, now time.Time) error {
	if len(recs) == 0 {
		return nil
	}
	ns := bp.Namespace
	archived := map[string]*hooksv1alpha1.BillingSettlement{}
	if r.Archive != nil {
		if !r.Archive.Ready() || r.Archive.Behind() != "" {
			// An archive that is behind may have lost what was compared: compare again.
			r.archived.Forget()
		}
		keys := make([]string, 0, len(recs))
		changed := make([]billing.Record, 0, len(recs))
		for _, rec := range recs {
			if r.archived.Clean(bp.UID, bp.Generation, rec, now) {
				p.examined["ArchivedUnchanged"]++
				continue
			}
			changed = append(changed, rec)
			keys = append(keys, rec.IdempotencyKey)
		}
		if recs = changed; len(recs) == 0 {
			return nil
		}
		var err error
		archived, err = r.Archive.SettlementsByIdempotencyKey(ctx, ns, keys)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			r.archived.Forget()
			return fmt.Errorf("%w: compare with the archive: %v", archivelookup.ErrUnavailable, err)
		}
		p.examined["Archived"] += int32(len(archived))
	}
	for _, rec := range recs {
		bs, ok := archived[rec.IdempotencyKey]
		if !ok && r.inFlight(ctx, ns, rec) {
			continue // created after the pass listed the settlements: the next pass compares it
		}
		if !ok {
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderRecordWithoutSettlement,
				ProviderRef: rec.ID, Action: hooksv1alpha1.RepairManualReview,
				Message: fmt.Sprintf("the provider has %s %s for key %q (settlement key %q) that no local or archived settlement knows",
					rec.Type, rec.Status, rec.IdempotencyKey, rec.SettlementKey)})
			continue
		}
		object := "BillingSettlement/" + bs.Name + " (archived)"
		switch {
		case r.notProvablyOurs(ctx, bs, rec) != "":
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: object, ProviderRef: rec.ID,
				Action: hooksv1alpha1.RepairManualReview, Message: r.notProvablyOurs(ctx, bs, rec)})
		case bs.Status.State == hooksv1alpha1.SettlementSettled && bs.Status.ProviderRef != "" && rec.ID != bs.Status.ProviderRef:
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: object, ProviderRef: rec.ID,
				Action: hooksv1alpha1.RepairManualReview,
				Message: fmt.Sprintf("the provider has record %s under key %s, but the archived settlement recorded %s: more than one record under one key",
					rec.ID, bs.Spec.IdempotencyKey, bs.Status.ProviderRef)})
		case bs.Status.State != hooksv1alpha1.SettlementSettled && (rec.Status == billing.StatusSettled || rec.Status == billing.StatusPending):
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderSettledLocalPending, Object: object, ProviderRef: rec.ID,
				Action: hooksv1alpha1.RepairManualReview,
				Message: fmt.Sprintf("the provider has %s %s under key %s, but the settlement was archived as %s; archived records are final: review it",
					rec.ID, rec.Status, bs.Spec.IdempotencyKey, settlement.StateOrNew(bs.Status.State))})
		default:
			// Nothing to report: the same record compares the same way next time.
			r.archived.Remember(bp.UID, bp.Generation, rec, now)
		}
	}
	return nil
}

// failedChild names a child of ev in state Failed, if any.
func failedChild(ev *hooksv1alpha1.WebhookEvent) string {
	for _, op := range ev.Status.Operations {
		if op.State == string(hooksv1alpha1.SettlementFailed) {
			return op.Child
		}
	}
	return ""
}

func phaseOrNew(ev *hooksv1alpha1.WebhookEvent) string {
	if ev.Status.Phase == "" {
		return string(hooksv1alpha1.EventReceived)
	}
	return string(ev.Status.Phase)
}

// eventConcerns scopes events to a billing provider: those that charge at it, and
// those with no settlement at all (job-only events, quarantine records), which every
// billing provider of the namespace reports.
func eventConcerns(ev *hooksv1alpha1.WebhookEvent, bp string) bool {
	if len(ev.Spec.Settlements) == 0 {
		return true
	}
	for _, s := range ev.Spec.Settlements {
		if s.BillingProviderRef == bp {
			return true
		}
	}
	return false
}

// jobRouteExists reports whether a webhook provider records job completions at all:
// only then is a settlement without one a discrepancy.
func jobRouteExists(providers []hooksv1alpha1.WebhookProvider, name string) bool {
	for _, wp := range providers {
		if wp.Name != name {
			continue
		}
		for _, route := range wp.Spec.Routes {
			for _, op := range route.Operations {
				if op.Type == hooksv1alpha1.OperationJobCompletion {
					return true
				}
			}
		}
	}
	return false
}

func lastActivity(bs *hooksv1alpha1.BillingSettlement) time.Time {
	switch {
	case bs.Status.LastAttemptAt != nil:
		return bs.Status.LastAttemptAt.Time
	case bs.Status.FirstSubmittedAt != nil:
		return bs.Status.FirstSubmittedAt.Time
	}
	return bs.CreationTimestamp.Time
}

// stuckSince: Submitted (outcome unknown or pending) or Pending past the threshold.
func stuckSince(bs *hooksv1alpha1.BillingSettlement, after time.Duration, now time.Time) bool {
	switch bs.Status.State {
	case hooksv1alpha1.SettlementSubmitted, hooksv1alpha1.SettlementPending, "":
		start := bs.CreationTimestamp.Time
		if bs.Status.FirstSubmittedAt != nil {
			start = bs.Status.FirstSubmittedAt.Time
		}
		return now.Sub(start) >= after
	}
	return false
}
