package controllers

import (
	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// SettlementHoldsProvider reports whether a settlement may have moved money at its
// BillingProvider without being resolved yet, so the provider must not go away: only
// that provider (its endpoint and credentials) can answer for the settlement's key.
//
//   - exposure Possible holds, whatever the state: an attempt may have reached the
//     provider and nobody knows what it did.
//   - exposure Confirmed holds until the state is final: the provider has our record,
//     and a pending one is polled there until it settles or fails.
//   - exposure None or unset falls back to the fields an operator wrote before
//     exposure existed (and that the current one still writes): outcomeUnknown, or a
//     first submission recorded while the settlement is still Pending or Submitted.
//     None is treated like unset on purpose: a settlement that is still being
//     submitted needs its provider to finish, whatever it concluded so far.
//
// Final here means the controller will not call the provider again by itself:
// Settled, Failed, or RequiresReconciliation (a human decides, as after a dead
// letter). A replay of such a settlement after its provider was deleted waits for a
// BillingProvider of that name.
func SettlementHoldsProvider(bs *hooksv1alpha1.BillingSettlement) bool {
	st := &bs.Status
	switch st.Exposure {
	case hooksv1alpha1.ExposurePossible:
		return true
	case hooksv1alpha1.ExposureConfirmed:
		return !settlementFinal(st.State)
	}
	if st.OutcomeUnknown {
		return true
	}
	return st.FirstSubmittedAt != nil &&
		(st.State == hooksv1alpha1.SettlementPending || st.State == hooksv1alpha1.SettlementSubmitted)
}

// settlementFinal reports whether the settlement controller is done with the
// provider until a human acts (a replay or a reconcile request).
func settlementFinal(s hooksv1alpha1.SettlementState) bool {
	switch s {
	case hooksv1alpha1.SettlementSettled, hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation:
		return true
	}
	return false
}
