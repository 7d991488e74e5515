package billingsettlement

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/money"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

// Status computation of a settlement: a decision (internal/settlement) becomes
// Status fields, conditions, Kubernetes Events and metrics here, and nowhere else.

// patchStatus writes the settlement's status once per reconcile, only if it changed,
// with an optimistic lock, and counts the transition.
func (r *Reconciler) patchStatus(ctx context.Context, s *settlementScope) error {
	setStalled(s.bs)
	wrote, err := statuspatch.Patch(ctx, r.Client, s.bs, s.before, true)
	if err != nil || !wrote {
		return err
	}
	r.countTransition(s)
	s.before = s.bs.DeepCopy()
	return nil
}

// setStalled writes kstatus's Stalled=True, with Ready's reason and message, while the
// settlement is in a state only a person ends (Failed, dead-lettered or not, and
// RequiresReconciliation), and removes it otherwise (docs/design.md §3.1). It is
// derived from the state in the write that changes the state, so it costs no write of
// its own and leaves nothing on a settled settlement. kstatus reads Ready=False as in
// progress, so without it a Flux wait on a Refund kept in Git that failed would run
// to its timeout instead of failing with the reason.
func setStalled(bs *hooksv1alpha1.BillingSettlement) {
	switch bs.Status.State {
	case hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation:
		reason, msg := string(bs.Status.State), "the settlement needs a person: see docs/runbook.md"
		if ready := findCondition(bs, hooksv1alpha1.ConditionReady); ready != nil && ready.Status == metav1.ConditionFalse {
			reason, msg = ready.Reason, ready.Message
		}
		r := metav1.Condition{Type: hooksv1alpha1.ConditionStalled, Status: metav1.ConditionTrue, Reason: reason, Message: msg,
			ObservedGeneration: bs.Generation}
		meta.SetStatusCondition(&bs.Status.Conditions, r)
	default:
		meta.RemoveStatusCondition(&bs.Status.Conditions, hooksv1alpha1.ConditionStalled)
	}
}

// countTransition counts a state change between the last write and this one.
func (r *Reconciler) countTransition(s *settlementScope) {
	if s.before.Status.State != s.bs.Status.State {
		metrics.SettlementTransitions.WithLabelValues(s.bs.Namespace, s.bs.Spec.BillingProviderRef, string(s.bs.Status.State)).Inc()
	}
}

func (r *Reconciler) cond(bs *hooksv1alpha1.BillingSettlement, typ string, status metav1.ConditionStatus, reason, msg string) {
	conditions.Set(&bs.Status.Conditions, bs.Generation, typ, status, reason, msg)
}

// apply copies a decision into the status and says what it means in conditions.
func (r *Reconciler) apply(ctx context.Context, s *settlementScope, d settlement.Decision, obs settlement.Observation) {
	bs, st := s.bs, &s.bs.Status
	from := st.State
	readyBefore := findCondition(bs, hooksv1alpha1.ConditionReady)
	prevReason := ""
	if readyBefore != nil {
		prevReason = readyBefore.Reason
	}
	st.State, st.Exposure, st.Failures, st.LastSubmission = d.State, d.Exposure, d.Failures, d.LastSubmission
	if settlement.MovedNothing(bs) {
		st.ClaimedAt = nil // a compensation that moved nothing releases its claim on the charge (§16)
	}
	switch d.Action {
	case settlement.ActWait:
		next := metav1.NewTime(s.now.Add(d.Wait))
		st.NextAttemptAt = &next
	case settlement.ActHold, settlement.ActRelease:
	default:
		st.NextAttemptAt = nil
	}
	if d.Disagreement != nil {
		dis := *d.Disagreement
		dis.At = metav1.NewTime(s.now)
		st.Disagreement = &dis
	} else if d.ClearDisagreement {
		st.Disagreement = nil
	}
	if obs.Kind == settlement.ObsRecord || obs.Kind == settlement.ObsNotFound {
		st.LastError = nil
	}
	if d.Adopt {
		st.ProviderRef, st.ProviderStatus = obs.Record.ID, obs.Record.Status
		if a := obs.Record.Amount; a != nil {
			st.ChargedAmount = &hooksv1alpha1.Amount{Minor: a.Minor, Currency: a.Currency}
		}
		if st.FirstSubmittedAt == nil { // found by a lookup: it was sent in an earlier life
			now := metav1.NewTime(s.now)
			st.FirstSubmittedAt = &now
		}
	}
	provider := bs.Spec.BillingProviderRef
	deleting := !bs.DeletionTimestamp.IsZero()
	switch {
	case d.Action == settlement.ActRelease || d.Action == settlement.ActContinue && d.Reason == "":
		return
	case deleting && settlement.HoldsMoney(st):
		r.holdDeletion(s, d.Message)
	case d.State == hooksv1alpha1.SettlementSettled && from != hooksv1alpha1.SettlementSettled:
		now := metav1.NewTime(s.now)
		st.SettledAt = &now
		msg := fmt.Sprintf("settled by %s as %s", provider, st.ProviderRef)
		r.cond(bs, hooksv1alpha1.ConditionSettled, metav1.ConditionTrue, hooksv1alpha1.ReasonProviderSettled, msg)
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionTrue, hooksv1alpha1.ReasonProviderSettled, msg)
		// A settled dead letter answers its RetriesExhausted Warning with an Event;
		// a routine settlement records one only when asked to.
		if findCondition(bs, hooksv1alpha1.ConditionDeadLettered) != nil {
			r.cond(bs, hooksv1alpha1.ConditionDeadLettered, metav1.ConditionFalse, hooksv1alpha1.ReasonProviderSettled, "settled")
			r.Recorder.Eventf(bs, nil, corev1.EventTypeNormal, hooksv1alpha1.ReasonProviderSettled, "Settle", "%s", msg)
		} else if r.TransitionEvents {
			r.Recorder.Eventf(bs, nil, corev1.EventTypeNormal, hooksv1alpha1.ReasonProviderSettled, "Settle", "%s", msg)
		}
		r.observeReceiptToSettled(ctx, bs)
	case d.State == hooksv1alpha1.SettlementFailed && from != hooksv1alpha1.SettlementFailed:
		msg := d.Message
		if d.Reason == hooksv1alpha1.ReasonProviderFailed {
			reason := obs.Record.FailureReason
			if reason == "" {
				reason = "no reason given"
			}
			msg = fmt.Sprintf("the provider failed %s: %s", obs.Record.ID, conditions.TruncateMessage(reason))
		}
		st.NextAttemptAt = nil
		r.cond(bs, hooksv1alpha1.ConditionSettled, metav1.ConditionFalse, d.Reason, msg)
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.Reason, msg)
		if d.DeadLetter {
			metrics.DeadLetters.WithLabelValues(bs.Namespace, bs.Spec.BillingProviderRef).Inc()
			r.cond(bs, hooksv1alpha1.ConditionDeadLettered, metav1.ConditionTrue, d.Reason,
				conditions.TruncateMessage(msg+"; nothing was charged; to retry with the same key: kubectl annotate billingsettlement "+bs.Name+" "+
					hooksv1alpha1.AnnotationReplay+"=\"$(date +%s)\" --overwrite"))
			r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonRetriesExhausted, "DeadLetter", "%s", conditions.TruncateMessage(msg))
			return
		}
		r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, d.Reason, "Fail", "%s", conditions.TruncateMessage(msg))
	case d.State == hooksv1alpha1.SettlementRequiresReconciliation && d.Message != "":
		// The record is not provably ours: nothing of it (not even its ID) is copied.
		msg := d.Message
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.Reason, conditions.TruncateMessage(msg+"; see docs/runbook.md"))
		if from != hooksv1alpha1.SettlementRequiresReconciliation || prevReason != d.Reason {
			r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, d.Reason, "Reconcile", "%s", conditions.TruncateMessage(msg))
		}
	case d.Action == settlement.ActWait && d.Message != "":
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.Reason,
			conditions.TruncateMessage(fmt.Sprintf("%s; next at %s", d.Message, st.NextAttemptAt.UTC().Format(time.RFC3339))))
	case d.Action == settlement.ActHold:
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.Reason, d.Message)
		if prevReason != d.Reason {
			r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, d.Reason, "Hold", "%s", d.Message)
		}
	case d.Action == settlement.ActLookup && d.Reason == hooksv1alpha1.ReasonAwaitingLookup && st.Attempts == 0:
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.Reason, d.Message)
	}
}

// holdDeletion says on the Ready condition (and once as a Warning Event) why a
// deletion waits.
func (r *Reconciler) holdDeletion(s *settlementScope, why string) {
	bs := s.bs
	msg := "deletion is held: money may be at the provider under key " + bs.Spec.IdempotencyKey
	if why != "" {
		msg += " (" + why + ")"
	}
	if c := findCondition(bs, hooksv1alpha1.ConditionReady); c == nil || c.Reason != hooksv1alpha1.ReasonDeletionBlocked {
		r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonDeletionBlocked, "Delete", "%s", conditions.TruncateMessage(msg))
	}
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonDeletionBlocked, conditions.TruncateMessage(msg))
}

func findCondition(bs *hooksv1alpha1.BillingSettlement, typ string) *metav1.Condition {
	for i := range bs.Status.Conditions {
		if bs.Status.Conditions[i].Type == typ {
			return &bs.Status.Conditions[i]
		}
	}
	return nil
}

func (r *Reconciler) observeReceiptToSettled(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) {
	start := bs.CreationTimestamp.Time
	if bs.Spec.SourceEvent != "" {
		var ev hooksv1alpha1.WebhookEvent
		if err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.SourceEvent}, &ev); err == nil {
			start = ev.Spec.ReceivedAt.Time
		}
	}
	metrics.ReceiptToSettled.Observe(r.now().Sub(start).Seconds())
}

// chargeDisplay is status.charge: what the settlement charges, for the CHARGE column.
func chargeDisplay(spec *hooksv1alpha1.BillingSettlementSpec) string {
	var parts []string
	if a := spec.Amount; a != nil {
		parts = append(parts, money.FormatAmount(a.Minor, a.Currency))
	}
	if u := spec.Usage; u != nil {
		parts = append(parts, money.FormatUsage(u.Quantity, u.Unit))
	}
	if len(parts) == 2 {
		return parts[0] + " (" + parts[1] + ")"
	}
	return strings.Join(parts, "")
}
