package controllers

import (
	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// SettlementHoldsProvider reports whether a settlement still needs its BillingProvider,
// so the provider must not go away: only that provider (its endpoint and credentials)
// can answer for the settlement's key. It is derived from exposure (HoldsMoney: money
// may be there without a final answer — Possible, or Confirmed and not settled,
// including a settlement written by an older operator or not yet given an exposure),
// plus a settlement still being submitted (sent before, not final), which needs the
// provider to finish even when nothing can have moved yet.
func SettlementHoldsProvider(bs *hooksv1alpha1.BillingSettlement) bool {
	st := &bs.Status
	if HoldsMoney(st) {
		return true
	}
	return st.FirstSubmittedAt != nil &&
		(st.State == hooksv1alpha1.SettlementPending || st.State == hooksv1alpha1.SettlementSubmitted)
}
