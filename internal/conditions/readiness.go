package conditions

import (
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// Readiness is what a provider kind's Ready condition says, in the terms GitOps tools
// read it (kstatus: docs/design.md §3.1).
type Readiness int

const (
	// Working: Ready=True; neither Reconciling nor Stalled.
	Working Readiness = iota
	// Waiting: Ready=False on something that may still come or heal by itself (a
	// Secret or BillingProvider not created yet, a provider that does not answer).
	// Reconciling=True for up to the grace, then Stalled=True: a wait never hangs.
	Waiting
	// Broken: Ready=False on a configuration that cannot work as it is; Stalled=True
	// at once.
	Broken
)

// DefaultWaitingGrace is how long a provider may wait (Reconciling) before it is
// reported Stalled.
const DefaultWaitingGrace = 2 * time.Minute

// SetReadiness sets Ready and kstatus's abnormal-true conditions, Reconciling and
// Stalled, which are present only while True; all three carry the same reason and
// message. For Waiting it returns how long until the wait turns Stalled (0 when it
// already has), so the caller looks again then; otherwise 0. The wait is timed from
// the Reconciling condition's lastTransitionTime: it began when the provider first
// waited, whatever it has waited for since.
func SetReadiness(conds *[]metav1.Condition, generation int64, r Readiness, reason, message string,
	now time.Time, grace time.Duration) time.Duration {
	if r == Working {
		Set(conds, generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue, reason, message)
		apimeta.RemoveStatusCondition(conds, hooksv1alpha1.ConditionReconciling)
		apimeta.RemoveStatusCondition(conds, hooksv1alpha1.ConditionStalled)
		return 0
	}
	Set(conds, generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, reason, message)
	if r == Waiting {
		if grace <= 0 {
			grace = DefaultWaitingGrace
		}
		// A new generation is a new configuration: its wait starts afresh.
		since := now
		if c := apimeta.FindStatusCondition(*conds, hooksv1alpha1.ConditionReconciling); c != nil &&
			c.Status == metav1.ConditionTrue && c.ObservedGeneration == generation {
			since = c.LastTransitionTime.Time
		} else if c := apimeta.FindStatusCondition(*conds, hooksv1alpha1.ConditionStalled); c != nil &&
			c.Status == metav1.ConditionTrue && c.ObservedGeneration == generation {
			since = now.Add(-grace) // stalled already: it stays so until it works
		}
		if since.Equal(now) {
			// Removed first, so a Reconciling of an older generation does not keep
			// its lastTransitionTime.
			apimeta.RemoveStatusCondition(conds, hooksv1alpha1.ConditionReconciling)
		}
		if left := since.Add(grace).Sub(now); left > 0 {
			apimeta.SetStatusCondition(conds, metav1.Condition{Type: hooksv1alpha1.ConditionReconciling,
				Status: metav1.ConditionTrue, Reason: reason, Message: message, ObservedGeneration: generation,
				LastTransitionTime: metav1.NewTime(since)})
			apimeta.RemoveStatusCondition(conds, hooksv1alpha1.ConditionStalled)
			return left
		}
		message = TruncateMessage(message + "; still waiting after " + grace.String() + ", checked again regularly")
	}
	Set(conds, generation, hooksv1alpha1.ConditionStalled, metav1.ConditionTrue, reason, message)
	apimeta.RemoveStatusCondition(conds, hooksv1alpha1.ConditionReconciling)
	return 0
}
