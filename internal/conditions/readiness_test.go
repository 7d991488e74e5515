package conditions

import (
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

func present(conds []metav1.Condition, typ string) bool {
	return apimeta.IsStatusConditionTrue(conds, typ)
}

// TestSetReadinessWaitTurnsStalled walks a provider through kstatus's states: a wait
// is Reconciling until the grace is over, then Stalled, and working again clears
// both; a new generation starts its wait afresh; Broken is Stalled at once.
func TestSetReadinessWaitTurnsStalled(t *testing.T) {
	const grace = time.Minute
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var conds []metav1.Condition

	if left := SetReadiness(&conds, 1, Waiting, "SecretNotFound", "m", t0, grace); left != grace {
		t.Fatalf("first wait: %v left, want %v", left, grace)
	}
	if !present(conds, hooksv1alpha1.ConditionReconciling) || present(conds, hooksv1alpha1.ConditionStalled) {
		t.Fatalf("waiting: %+v", conds)
	}
	// Another reason to wait does not restart the clock.
	if left := SetReadiness(&conds, 1, Waiting, "BillingProviderNotFound", "m", t0.Add(40*time.Second), grace); left != 20*time.Second {
		t.Fatalf("still waiting: %v left, want 20s", left)
	}
	if left := SetReadiness(&conds, 1, Waiting, "BillingProviderNotFound", "m", t0.Add(grace), grace); left != 0 {
		t.Fatalf("wait over: %v left", left)
	}
	if present(conds, hooksv1alpha1.ConditionReconciling) || !present(conds, hooksv1alpha1.ConditionStalled) {
		t.Fatalf("after the grace: %+v", conds)
	}
	// Stalled stays while the same generation keeps waiting.
	SetReadiness(&conds, 1, Waiting, "SecretNotFound", "m", t0.Add(2*grace), grace)
	if !present(conds, hooksv1alpha1.ConditionStalled) {
		t.Fatalf("stalled wait: %+v", conds)
	}
	// A new generation waits afresh.
	if left := SetReadiness(&conds, 2, Waiting, "SecretNotFound", "m", t0.Add(3*grace), grace); left != grace {
		t.Fatalf("new generation: %v left, want %v (%+v)", left, grace, conds)
	}
	if c := apimeta.FindStatusCondition(conds, hooksv1alpha1.ConditionReconciling); c == nil || !c.LastTransitionTime.Time.Equal(t0.Add(3*grace)) {
		t.Fatalf("new generation's Reconciling: %+v", c)
	}
	SetReadiness(&conds, 2, Working, "Valid", "ok", t0.Add(4*grace), grace)
	if present(conds, hooksv1alpha1.ConditionReconciling) || apimeta.FindStatusCondition(conds, hooksv1alpha1.ConditionStalled) != nil ||
		!present(conds, hooksv1alpha1.ConditionReady) {
		t.Fatalf("working: %+v", conds)
	}
	SetReadiness(&conds, 2, Broken, "InvalidSpec", "bad", t0.Add(5*grace), grace)
	if c := apimeta.FindStatusCondition(conds, hooksv1alpha1.ConditionStalled); c == nil || c.Reason != "InvalidSpec" ||
		apimeta.FindStatusCondition(conds, hooksv1alpha1.ConditionReconciling) != nil {
		t.Fatalf("broken: %+v", conds)
	}
}
