package settlement

import (
	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// HoldsProvider reports whether a settlement still needs its BillingProvider,
// so the provider must not go away: only that provider (its endpoint and credentials)
// can answer for the settlement's key. It is HoldsMoney, derived from exposure: money
// may be there without a final answer (Possible, or Confirmed and not settled,
// including a settlement written by an older operator or not yet given an exposure).
// A settlement at None needs nothing from the provider that is going: a provider being
// deleted takes no new exposure (the settlement then waits, BillingProviderNotReady).
func HoldsProvider(bs *hooksv1alpha1.BillingSettlement) bool {
	return HoldsMoney(&bs.Status)
}
