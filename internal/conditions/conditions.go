package conditions

import (
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Set sets a condition stamped with the object's generation.
// apimeta.SetStatusCondition keeps LastTransitionTime when the status is unchanged,
// so a condition's age tells how long the state has held.
func Set(conds *[]metav1.Condition, generation int64, typ string, status metav1.ConditionStatus, reason, message string) {
	apimeta.SetStatusCondition(conds, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: generation,
	})
}

// TruncateMessage keeps status messages within their CRD bounds.
func TruncateMessage(s string) string {
	if len(s) > 1000 {
		return s[:1000] + "…"
	}
	return s
}
