package webhookevent

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
)

// health classifies a child's state for the event's phase.
type health int

const (
	healthGood health = iota
	healthProgressing
	healthFailing
	healthAmbiguous
)

func operationHealth(op hooksv1alpha1.OperationStatus) health {
	switch op.Outcome {
	case hooksv1alpha1.OutcomeSuperseded:
		return healthGood
	case hooksv1alpha1.OutcomeConflict:
		return healthAmbiguous
	case hooksv1alpha1.OutcomeFailed, hooksv1alpha1.OutcomeUnmapped:
		return healthFailing
	case hooksv1alpha1.OutcomePending:
		return healthProgressing
	}
	switch op.State {
	case string(hooksv1alpha1.JobCompletionApplied), string(hooksv1alpha1.JobCompletionSuperseded),
		string(hooksv1alpha1.SettlementSettled):
		return healthGood
	case string(hooksv1alpha1.SettlementFailed): // same string as JobCompletionFailed
		return healthFailing
	case string(hooksv1alpha1.SettlementRequiresReconciliation):
		return healthAmbiguous
	case stateRetrying:
		return healthFailing
	case stateDeleted:
		return healthAmbiguous
	}
	return healthProgressing
}

// mirroredJobState is the job's state as the event shows it, from the job's Progress
// (a job without a sink is Applied by its creation, with no status written).
func mirroredJobState(jc *hooksv1alpha1.JobCompletion) string {
	st := jc.Progress()
	if st.ObservedGeneration != jc.Generation {
		// A newer version was proposed and not taken up yet: its state is not the
		// Status's (that one is the previous version's).
		return string(hooksv1alpha1.JobCompletionPending)
	}
	if st.LastError != "" && st.State == hooksv1alpha1.JobCompletionPending {
		return stateRetrying
	}
	if st.State == "" {
		return string(hooksv1alpha1.JobCompletionPending)
	}
	return string(st.State)
}

func mirroredSettlementState(bs *hooksv1alpha1.BillingSettlement) string {
	switch bs.Status.State {
	case "":
		return string(hooksv1alpha1.SettlementPending)
	case hooksv1alpha1.SettlementPending, hooksv1alpha1.SettlementSubmitted:
		if bs.Status.LastError != nil {
			return stateRetrying
		}
	}
	return string(bs.Status.State)
}

// stateRetrying is mirrored for a child that is being retried after an error, so the
// event shows PartiallyFailed (docs/design.md §9) while the child itself stays in its state.
const stateRetrying = "Retrying"

// derivePhase summarises the operations; the event's status only mirrors its children.
func derivePhase(ev *hooksv1alpha1.WebhookEvent) {
	worst, done := healthGood, 0
	for _, op := range ev.Status.Operations {
		h := operationHealth(op)
		if h > worst {
			worst = h
		}
		if h == healthGood {
			done++
		}
	}
	n := len(ev.Status.Operations)
	dispatched := metav1.ConditionTrue
	for _, op := range ev.Status.Operations {
		if op.Outcome == hooksv1alpha1.OutcomePending {
			dispatched = metav1.ConditionFalse
		}
	}
	conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionDispatched, dispatched,
		map[metav1.ConditionStatus]string{metav1.ConditionTrue: hooksv1alpha1.ReasonAccepted,
			metav1.ConditionFalse: hooksv1alpha1.ReasonOperationsInProgress}[dispatched],
		fmt.Sprintf("%d operation(s)", n))
	switch worst {
	case healthAmbiguous:
		ev.Status.Phase = hooksv1alpha1.EventRequiresReconciliation
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			hooksv1alpha1.ReasonOperationAmbiguous, "an operation conflicts or its outcome needs reconciliation; see status.operations")
	case healthFailing:
		ev.Status.Phase = hooksv1alpha1.EventPartiallyFailed
		if states := unmappedStates(ev); states != "" {
			msg := fmt.Sprintf("job state(s) %s not mapped by the WebhookProvider's spec.states: nothing was created or charged "+
				"for those jobs; add them to spec.states, then replay the event (hooks.settlement.dev/replay annotation; see status.operations)", states)
			if rp := ev.Status.Replay; rp != nil && rp.Message != "" {
				msg = "last " + rp.Message + ". " + msg
			}
			conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
				hooksv1alpha1.ReasonUnmappedState, conditions.TruncateMessage(msg))
			break
		}
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			hooksv1alpha1.ReasonOperationFailed,
			fmt.Sprintf("%d of %d operations done; the others failed or are being retried (see status.operations)", done, n))
	case healthProgressing:
		ev.Status.Phase = hooksv1alpha1.EventDispatching
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			hooksv1alpha1.ReasonOperationsInProgress, fmt.Sprintf("%d of %d operations done", done, n))
	default:
		ev.Status.Phase = hooksv1alpha1.EventComplete
		conditions.Set(&ev.Status.Conditions, ev.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue,
			hooksv1alpha1.ReasonAllOperationsDone, fmt.Sprintf("all %d operations done", n))
	}
}

// unmappedStates lists the event's unmapped job states, quoted, for its condition.
func unmappedStates(ev *hooksv1alpha1.WebhookEvent) string {
	var out []string
	seen := map[string]bool{}
	for _, op := range ev.Status.Operations {
		if op.Outcome != hooksv1alpha1.OutcomeUnmapped {
			continue
		}
		for _, u := range ev.Spec.UnmappedJobStates {
			if u.JobID == op.Key && !seen[u.State] {
				seen[u.State] = true
				out = append(out, fmt.Sprintf("%q", u.State))
			}
		}
	}
	return strings.Join(out, ", ")
}
