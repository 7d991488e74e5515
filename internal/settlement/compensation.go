package settlement

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// ReversesRefOf is what compensation bs names at the provider: the reference pinned at
// its first attempt, else orig's.
func ReversesRefOf(bs, orig *hooksv1alpha1.BillingSettlement) string {
	if bs.Status.ReversesRef != "" {
		return bs.Status.ReversesRef
	}
	return orig.Status.ProviderRef
}

// MovedNothing reports whether a settlement provably moved no money: it failed with
// nothing possibly at the provider.
func MovedNothing(o *hooksv1alpha1.BillingSettlement) bool {
	return o.Status.State == hooksv1alpha1.SettlementFailed && EffectiveExposure(&o.Status) == hooksv1alpha1.ExposureNone
}

// WithArchived adds the archived settlements to those listed in the cluster, by UID: a
// Record archived and then created again under its name (an ArchivedDuplicate, which
// moved nothing) must not hide the archived one, which may have.
func WithArchived(inCluster, archived []hooksv1alpha1.BillingSettlement) []hooksv1alpha1.BillingSettlement {
	seen := map[types.UID]bool{}
	for i := range inCluster {
		seen[inCluster[i].UID] = true
	}
	for _, a := range archived {
		if !seen[a.UID] {
			inCluster = append(inCluster, a)
		}
	}
	return inCluster
}

// ReversalConflict says why bs may not be sent beside the other compensations of orig
// ("" when it may): a Void cancels the whole charge, so it goes only while no other
// compensation of it may have moved money, and a Refund only while no Void of it may
// have. One held before sending anything, without a claim (heldUnsent), does not count,
// so a compensation held by its guard never blocks a good one. Every compensation
// persists its claim on the charge (ClaimedAt) before its submission bracket and reads
// the others again after it, so of two guards in two processes at least one sees the
// other (docs/design.md §16); within one process the guard and submission of a
// charge's compensations also run one at a time (the reconciler's lock per charge).
func ReversalConflict(bs, orig *hooksv1alpha1.BillingSettlement, all []hooksv1alpha1.BillingSettlement) string {
	for i := range all {
		o := &all[i]
		if o.Name == bs.Name || o.Spec.Reverses != orig.Name || MovedNothing(o) {
			continue
		}
		if heldUnsent(o) {
			continue
		}
		switch {
		case bs.Spec.Type == hooksv1alpha1.SettlementVoid:
			return fmt.Sprintf("%s, a %s of %s, may have moved money: a Void cancels the whole charge, so it is sent only alone",
				o.Name, o.Spec.Type, orig.Name)
		case o.Spec.Type == hooksv1alpha1.SettlementVoid:
			return fmt.Sprintf("%s voids %s, which may have cancelled the whole charge: a Refund of it is not sent", o.Name, orig.Name)
		}
	}
	return ""
}

// heldUnsent reports whether a compensation is waiting, never having sent anything
// itself, with nothing found under its key either, and without a claim on its charge:
// held by its own guard, or not yet reconciled. One that found something (a record not
// provably its own, an unanswerable lookup: RequiresReconciliation, a disagreement, a
// reference) counts as sent, and so does one that claimed the charge (ClaimedAt): it
// may be about to send, in another process (docs/design.md §16).
func heldUnsent(o *hooksv1alpha1.BillingSettlement) bool {
	return unsent(o) && o.Status.ClaimedAt == nil
}

// unsent reports whether a compensation never sent anything itself and found nothing
// under its key, whether or not it claimed its charge.
func unsent(o *hooksv1alpha1.BillingSettlement) bool {
	st := &o.Status
	return (st.State == "" || st.State == hooksv1alpha1.SettlementPending) && st.FirstSubmittedAt == nil && st.Attempts == 0 &&
		st.SentTo == nil && st.Disagreement == nil && st.ProviderRef == ""
}

// ClaimsBefore orders the claims of two compensations of one charge: the older one
// first, by creation time and then by name — fixed facts every process reads alike, so
// two claims that see each other agree on which one steps back.
func ClaimsBefore(a, b *hooksv1alpha1.BillingSettlement) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// WithoutLaterClaims is all without the compensations of orig that claimed it after bs
// (ClaimsBefore) and have sent nothing yet. When bs's guard passes on that set, what
// stops it are only later claims, which step back once they see bs's: bs waits for
// them, keeping its claim. Otherwise bs steps back itself. Of two claims that see each
// other, exactly one waits, and neither is sent while the other's claim stands.
func WithoutLaterClaims(bs, orig *hooksv1alpha1.BillingSettlement, all []hooksv1alpha1.BillingSettlement) []hooksv1alpha1.BillingSettlement {
	out := make([]hooksv1alpha1.BillingSettlement, 0, len(all))
	for i := range all {
		o := &all[i]
		if o.Name != bs.Name && o.Spec.Reverses == orig.Name && o.Status.ClaimedAt != nil && unsent(o) && ClaimsBefore(bs, o) {
			continue
		}
		out = append(out, *o)
	}
	return out
}

// CompensationRefusal says why a compensation may not be sent for orig ("" when it may).
// voidsSettled: the provider can still cancel a settled record (billing.VoidsSettled).
func CompensationRefusal(bs, orig *hooksv1alpha1.BillingSettlement, voidsSettled bool) string {
	switch {
	case orig.Spec.Type != hooksv1alpha1.SettlementCharge && orig.Spec.Type != "":
		return fmt.Sprintf("%s is a %s, not a charge: only charges are compensated", orig.Name, orig.Spec.Type)
	case orig.Spec.BillingProviderRef != bs.Spec.BillingProviderRef:
		return fmt.Sprintf("%s was sent to BillingProvider %q, not %q", orig.Name, orig.Spec.BillingProviderRef, bs.Spec.BillingProviderRef)
	case orig.Spec.Customer != bs.Spec.Customer:
		return fmt.Sprintf("%s is for another customer", orig.Name)
	case bs.Spec.Amount != nil && ChargedAmount(orig) != nil && bs.Spec.Amount.Currency != ChargedAmount(orig).Currency:
		return fmt.Sprintf("%s is in another currency", orig.Name)
	}
	st := orig.Status.State
	switch bs.Spec.Type {
	case hooksv1alpha1.SettlementRefund:
		if st == hooksv1alpha1.SettlementSettled && ChargedAmount(orig) == nil {
			why := fmt.Sprintf("%s is usage priced and its provider reported no amount, so a refund cannot be bounded by it; refund at the provider", orig.Name)
			if voidsSettled {
				why += ", or void the whole charge while the provider can still cancel it"
			}
			return why
		}
		if st != hooksv1alpha1.SettlementSettled {
			if MovedNothing(orig) {
				return fmt.Sprintf("%s failed: nothing was charged, so there is nothing to refund", orig.Name)
			}
			return fmt.Sprintf("a Refund is sent only once %s has settled (it is %s); use a Void while it has not", orig.Name, StateOrNew(st))
		}
	case hooksv1alpha1.SettlementVoid:
		switch {
		case voidsSettled && orig.Status.ProviderRef == "" && !MovedNothing(orig):
			// Such a provider cancels by reference (Stripe): without one there is nothing
			// to name yet.
			return fmt.Sprintf("waiting until %s has a provider reference to cancel (it is %s)", orig.Name, StateOrNew(st))
		case st == hooksv1alpha1.SettlementSettled && !voidsSettled:
			return fmt.Sprintf("%s has settled: a Void can no longer cancel it; use a Refund", orig.Name)
		case voidsSettled && !reversesWhole(bs, orig):
			return fmt.Sprintf("a Void cancels the whole of %s at the provider: its usage and amount must be the charge's", orig.Name)
		case MovedNothing(orig):
			return fmt.Sprintf("%s failed: nothing was charged, so there is nothing to void", orig.Name)
		case orig.Status.FirstSubmittedAt == nil:
			return fmt.Sprintf("waiting until %s has been sent to the provider", orig.Name)
		}
	}
	return ""
}

// reversesWhole reports whether a compensation names exactly what orig charged: the same
// usage (meter, unit, quantity by value) and the same amount, each present in both or
// in neither.
func reversesWhole(bs, orig *hooksv1alpha1.BillingSettlement) bool {
	u, ou := bs.Spec.Usage, orig.Spec.Usage
	a, oa := bs.Spec.Amount, orig.Spec.Amount
	switch {
	case (u == nil) != (ou == nil), (a == nil) != (oa == nil):
		return false
	case u != nil && (u.Meter != ou.Meter || u.Unit != ou.Unit || !billing.SameQuantity(u.Quantity, ou.Quantity)):
		return false
	case a != nil && (a.Minor != oa.Minor || a.Currency != oa.Currency):
		return false
	}
	return true
}

// ChargedAmount is what a charge moved: its own amount, or for a usage-priced one what
// the provider reported (nil when neither is known).
func ChargedAmount(orig *hooksv1alpha1.BillingSettlement) *hooksv1alpha1.Amount {
	if orig.Spec.Amount != nil {
		return orig.Spec.Amount
	}
	return orig.Status.ChargedAmount
}

func StateOrNew(s hooksv1alpha1.SettlementState) string {
	if s == "" {
		return "new"
	}
	return string(s)
}

// RefundOverCharge says why Refund bs may not be sent beside the settlements all (the
// other compensations of orig, in the cluster and the archive) — "" when it may:
// refunds of one charge never add up to more than it charged. bs counts as it is about
// to be sent (a replay is not persisted yet); a refund that provably moved nothing
// (MovedNothing: refused or failed at the provider) counts for nothing.
// CompensationRefusal has already held a Refund whose original has no known amount.
func RefundOverCharge(bs, orig *hooksv1alpha1.BillingSettlement, all []hooksv1alpha1.BillingSettlement) string {
	if bs.Spec.Type != hooksv1alpha1.SettlementRefund {
		return ""
	}
	total := bs.Spec.Amount.Minor
	for i := range all {
		o := &all[i]
		if o.Name == bs.Name || o.Spec.Reverses != orig.Name || o.Spec.Type != hooksv1alpha1.SettlementRefund || o.Spec.Amount == nil {
			continue
		}
		if MovedNothing(o) {
			continue
		}
		total += o.Spec.Amount.Minor
	}
	if charged := ChargedAmount(orig); total > charged.Minor {
		return fmt.Sprintf("refunds of %s would add up to %d, more than the %d %s it charged",
			orig.Name, total, charged.Minor, charged.Currency)
	}
	return ""
}
