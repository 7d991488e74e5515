package settlement

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// Metronome's capabilities, a submission that may have been ingested (a lost answer),
// and an events search that does not show the event (not processed yet, or dated
// before what the search sees): the decision takes the "not found" as proof that
// nothing moved, and a settlement being deleted is released (and one whose attempts
// are spent is dead-lettered) although Metronome may bill the event.
func TestSearchNotFoundReleasesAMetronomeChargeThatMayHaveMoved(t *testing.T) {
	caps := billing.Capabilities{Lookup: billing.LookupByKey, Window: 34 * 24 * time.Hour, ResendIsProof: true, AbsenceUnproven: true} // Metronome's, for a usage charge
	first := metav1.NewTime(t0)
	st := &hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSubmitted, Exposure: hooksv1alpha1.ExposurePossible,
		LastSubmission: hooksv1alpha1.SubmissionMaybeReceived, Attempts: 1, FirstSubmittedAt: &first, LastAttemptAt: &first}
	now := t0.Add(2 * time.Minute) // past the settle time
	d := Decide(Input{Status: st, Policy: policy, Deleting: true, Now: now, Caps: caps, Obs: Observation{Kind: ObsNotFound}})
	st.Exposure, st.LastSubmission = d.Exposure, d.LastSubmission
	d = Decide(Input{Status: st, Policy: policy, Deleting: true, Now: now, Caps: caps, LookedUp: true})
	if d.Action == ActRelease {
		t.Fatalf("released on the events search's silence: exposure %s, %s", st.Exposure, d.Message)
	}
}
