package settlement

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// TestSettlementHoldsProvider is a plain table test (no control plane):
// go test ./controllers/ -run TestSettlementHoldsProvider
func TestSettlementHoldsProvider(t *testing.T) {
	sent := &metav1.Time{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	for _, tc := range []struct {
		name           string
		exposure       hooksv1alpha1.Exposure
		state          hooksv1alpha1.SettlementState
		firstSubmitted *metav1.Time
		outcomeUnknown bool
		want           bool
	}{
		{name: "new, no status (exposure not decided yet)", want: true},
		{name: "pending, exposure not decided yet", state: pending, want: true},
		{name: "pending, exposure None, never sent", exposure: none, state: pending, want: false},

		{name: "Possible while submitted", exposure: possible, state: submitted, firstSubmitted: sent, want: true},
		{name: "Possible while pending (about to be sent)", exposure: possible, state: pending, want: true},
		{name: "Possible even when failed", exposure: possible, state: failed, firstSubmitted: sent, want: true},
		{name: "Possible even when it requires reconciliation", exposure: possible, state: rr, firstSubmitted: sent, want: true},

		{name: "Confirmed, pending at the provider (polled)", exposure: confirmed, state: submitted, firstSubmitted: sent, want: true},
		{name: "Confirmed and settled", exposure: confirmed, state: settled, firstSubmitted: sent, want: false},
		{name: "Confirmed but Failed (an older operator dead-lettered a pending charge)", exposure: confirmed, state: failed, firstSubmitted: sent, want: true},
		{name: "Confirmed, requires reconciliation (the record vanished)", exposure: confirmed, state: rr, firstSubmitted: sent, want: true},

		{name: "None after an authoritative not-found, still being submitted: nothing there", exposure: none, state: submitted, firstSubmitted: sent, want: false},
		{name: "None and dead-lettered", exposure: none, state: failed, firstSubmitted: sent, want: false},

		{name: "legacy: submitted with firstSubmittedAt", state: submitted, firstSubmitted: sent, want: true},
		{name: "legacy: pending again with firstSubmittedAt (retrying)", state: pending, firstSubmitted: sent, want: true},
		{name: "legacy: outcomeUnknown", state: submitted, firstSubmitted: sent, outcomeUnknown: true, want: true},
		{name: "legacy: outcomeUnknown left on a failed settlement", state: failed, firstSubmitted: sent, outcomeUnknown: true, want: true},
		{name: "legacy: settled", state: settled, firstSubmitted: sent, want: false},
		{name: "legacy: failed", state: failed, firstSubmitted: sent, want: false},
		{name: "legacy: requires reconciliation (money may be there)", state: rr, firstSubmitted: sent, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := &hooksv1alpha1.BillingSettlement{Status: hooksv1alpha1.BillingSettlementStatus{
				Exposure: tc.exposure, State: tc.state, FirstSubmittedAt: tc.firstSubmitted, OutcomeUnknown: tc.outcomeUnknown,
			}}
			if got := HoldsProvider(bs); got != tc.want {
				t.Errorf("SettlementHoldsProvider(exposure %q, state %q, firstSubmittedAt %v, outcomeUnknown %v) = %v, want %v",
					tc.exposure, tc.state, tc.firstSubmitted != nil, tc.outcomeUnknown, got, tc.want)
			}
		})
	}
}
