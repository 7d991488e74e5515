package controllers

import (
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"

	"github.com/settlement-operator/settlement-operator/internal/conditions"

	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/money"
)

// Status computation of a settlement: a decision (settlement_decision.go) becomes
// status fields, conditions, Kubernetes Events and metrics here, and nowhere else.

// patchStatus writes the settlement's status once per reconcile, only if it changed,
// with an optimistic lock, and counts the transition.
func (r *BillingSettlementReconciler) patchStatus(ctx context.Context, s *settlementScope) error {
	wrote, err := statuspatch.Patch(ctx, r.Client, s.bs, s.before, true)
	if err != nil || !wrote {
		return err
	}
	r.countTransition(s)
	s.before = s.bs.DeepCopy()
	return nil
}

// countTransition counts a state change between the last write and this one.
func (r *BillingSettlementReconciler) countTransition(s *settlementScope) {
	if s.before.Status.State != s.bs.Status.State {
		settlementTransitions.WithLabelValues(s.bs.Namespace, s.bs.Spec.BillingProviderRef, string(s.bs.Status.State)).Inc()
	}
}

func (r *BillingSettlementReconciler) cond(bs *hooksv1alpha1.BillingSettlement, typ string, status metav1.ConditionStatus, reason, msg string) {
	conditions.Set(&bs.Status.Conditions, bs.Generation, typ, status, reason, msg)
}

// apply copies a decision into the status and says what it means in conditions.
func (r *BillingSettlementReconciler) apply(ctx context.Context, s *settlementScope, d decision, obs observation) {
	bs, st := s.bs, &s.bs.Status
	from := st.State
	readyBefore := findCondition(bs, hooksv1alpha1.ConditionReady)
	prevReason := ""
	if readyBefore != nil {
		prevReason = readyBefore.Reason
	}
	st.State, st.Exposure, st.Failures, st.LastSubmission = d.state, d.exposure, d.failures, d.lastSubmission
	switch d.action {
	case actWait:
		next := metav1.NewTime(s.now.Add(d.wait))
		st.NextAttemptAt = &next
	case actHold, actRelease:
	default:
		st.NextAttemptAt = nil
	}
	if d.disagreement != nil {
		dis := *d.disagreement
		dis.At = metav1.NewTime(s.now)
		st.Disagreement = &dis
	} else if d.clearDisagreement {
		st.Disagreement = nil
	}
	if obs.kind == obsRecord || obs.kind == obsNotFound {
		st.LastError = nil
	}
	if d.adopt {
		st.ProviderRef, st.ProviderStatus = obs.record.ID, obs.record.Status
		if a := obs.record.Amount; a != nil {
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
	case d.action == actRelease || d.action == actContinue && d.reason == "":
		return
	case deleting && HoldsMoney(st):
		r.holdDeletion(s, d.message)
	case d.state == hooksv1alpha1.SettlementSettled && from != hooksv1alpha1.SettlementSettled:
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
	case d.state == hooksv1alpha1.SettlementFailed && from != hooksv1alpha1.SettlementFailed:
		msg := d.message
		if d.reason == hooksv1alpha1.ReasonProviderFailed {
			reason := obs.record.FailureReason
			if reason == "" {
				reason = "no reason given"
			}
			msg = fmt.Sprintf("the provider failed %s: %s", obs.record.ID, conditions.TruncateMessage(reason))
		}
		st.NextAttemptAt = nil
		r.cond(bs, hooksv1alpha1.ConditionSettled, metav1.ConditionFalse, d.reason, msg)
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.reason, msg)
		if d.deadLetter {
			deadLetters.WithLabelValues(bs.Namespace, bs.Spec.BillingProviderRef).Inc()
			r.cond(bs, hooksv1alpha1.ConditionDeadLettered, metav1.ConditionTrue, d.reason,
				conditions.TruncateMessage(msg+"; nothing was charged; to retry with the same key: kubectl annotate billingsettlement "+bs.Name+" "+
					hooksv1alpha1.AnnotationReplay+"=\"$(date +%s)\" --overwrite"))
			r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonRetriesExhausted, "DeadLetter", "%s", conditions.TruncateMessage(msg))
			return
		}
		r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, d.reason, "Fail", "%s", conditions.TruncateMessage(msg))
	case d.state == hooksv1alpha1.SettlementRequiresReconciliation && d.message != "":
		// The record is not provably ours: nothing of it (not even its ID) is copied.
		msg := d.message
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.reason, conditions.TruncateMessage(msg+"; see docs/runbook.md"))
		if from != hooksv1alpha1.SettlementRequiresReconciliation || prevReason != d.reason {
			r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, d.reason, "Reconcile", "%s", conditions.TruncateMessage(msg))
		}
	case d.action == actWait && d.message != "":
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.reason,
			conditions.TruncateMessage(fmt.Sprintf("%s; next at %s", d.message, st.NextAttemptAt.UTC().Format(time.RFC3339))))
	case d.action == actHold:
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.reason, d.message)
		if prevReason != d.reason {
			r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, d.reason, "Hold", "%s", d.message)
		}
	case d.action == actLookup && d.reason == hooksv1alpha1.ReasonAwaitingLookup && st.Attempts == 0:
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, d.reason, d.message)
	}
}

// holdDeletion says on the Ready condition (and once as a Warning Event) why a
// deletion waits.
func (r *BillingSettlementReconciler) holdDeletion(s *settlementScope, why string) {
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

type retryPolicy struct {
	maxAttempts                                         int32
	maxElapsed, initial, max, keyWindow, requestTimeout time.Duration
}

func policyOf(bp *hooksv1alpha1.BillingProvider) retryPolicy {
	p := retryPolicy{maxAttempts: defaultMaxAttempts, maxElapsed: defaultMaxElapsed, initial: defaultInitialBackoff,
		max: defaultMaxBackoff, keyWindow: durationOr(bp.Spec.IdempotencyWindow, defaultIdempotencyWindow),
		requestTimeout: durationOr(bp.Spec.RequestTimeout, defaultRequestTimeout)}
	if rp := bp.Spec.Retry; rp != nil {
		if rp.MaxAttempts > 0 {
			p.maxAttempts = rp.MaxAttempts
		}
		p.maxElapsed = durationOr(rp.MaxElapsed, p.maxElapsed)
		p.initial = durationOr(rp.InitialBackoff, p.initial)
		p.max = durationOr(rp.MaxBackoff, p.max)
	}
	return p
}

func classLabel(err error) string {
	if e, ok := billing.AsError(err); ok {
		return strings.ToLower(e.Class.String())
	}
	return "ambiguous"
}

// Error classes as the CRD spells them in status.lastError.class.
const (
	errorClassTransient = "Transient"
	errorClassTerminal  = "Terminal"
	errorClassAmbiguous = "Ambiguous"
)

func errorClassName(c billing.Class) string {
	switch c {
	case billing.Transient:
		return errorClassTransient
	case billing.Terminal:
		return errorClassTerminal
	}
	return errorClassAmbiguous
}

func settlementError(err error, now time.Time) *hooksv1alpha1.SettlementError {
	se := &hooksv1alpha1.SettlementError{Class: errorClassAmbiguous, Message: conditions.TruncateMessage(err.Error()), At: metav1.NewTime(now)}
	if e, ok := billing.AsError(err); ok {
		se.Class, se.Code = errorClassName(e.Class), e.Code
		if len(se.Code) > 128 {
			se.Code = se.Code[:128]
		}
	}
	return se
}

func findCondition(bs *hooksv1alpha1.BillingSettlement, typ string) *metav1.Condition {
	for i := range bs.Status.Conditions {
		if bs.Status.Conditions[i].Type == typ {
			return &bs.Status.Conditions[i]
		}
	}
	return nil
}

func (r *BillingSettlementReconciler) observeReceiptToSettled(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) {
	start := bs.CreationTimestamp.Time
	if bs.Spec.SourceEvent != "" {
		var ev hooksv1alpha1.WebhookEvent
		if err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.SourceEvent}, &ev); err == nil {
			start = ev.Spec.ReceivedAt.Time
		}
	}
	receiptToSettled.Observe(r.now().Sub(start).Seconds())
}

// RecordMatches says whether a provider's record is provably the settlement it is
// filed under (fail closed: a field we send that the record lacks is a mismatch).
// reversesKey is the settlement key of the original, for a compensation.
func RecordMatches(bs *hooksv1alpha1.BillingSettlement, reversesKey string, rec billing.Record) (billing.Mismatch, bool) {
	return billing.Match(requestOf(bs, reversesKey, ""), rec)
}

// truncateToken bounds an annotation token to what status stores, before comparing,
// so an over-long token is not taken as new on every reconcile.
func truncateToken(t string) string {
	if len(t) > 256 {
		return t[:256]
	}
	return t
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
