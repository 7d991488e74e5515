package settlement

import (
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

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

func StatusError(err error, now time.Time) *hooksv1alpha1.SettlementError {
	se := &hooksv1alpha1.SettlementError{Class: errorClassAmbiguous, Message: conditions.TruncateMessage(err.Error()), At: metav1.NewTime(now)}
	if e, ok := billing.AsError(err); ok {
		se.Class, se.Code = errorClassName(e.Class), e.Code
		if len(se.Code) > 128 {
			se.Code = se.Code[:128]
		}
	}
	return se
}

// RecordMatches says whether a provider's record is provably the settlement it is
// filed under (fail closed: a field we send that the record lacks is a mismatch).
// reversesKey is the settlement key of the original, for a compensation.
func RecordMatches(bs *hooksv1alpha1.BillingSettlement, reversesKey string, rec billing.Record) (billing.Mismatch, bool) {
	return billing.Match(RequestOf(bs, reversesKey, ""), rec)
}

// TruncateToken bounds an annotation token to what status stores, before comparing,
// so an over-long token is not taken as new on every reconcile.
func TruncateToken(t string) string {
	if len(t) > 256 {
		return t[:256]
	}
	return t
}

// RecordObservation turns a provider record into an observation, comparing it with
// what we send (fail closed: a missing field is a mismatch).
func RecordObservation(req billing.Request, rec billing.Record, submitted bool) Observation {
	o := Observation{Kind: ObsRecord, Submit: submitted, Status: rec.Status, Record: rec}
	if m, ok := billing.Match(req, rec); !ok {
		o.Mismatch = &m
	}
	return o
}

// FailureObservation classifies a failed call once (the adapter did) and records it
// as the settlement's last error, which is only ever shown, never decided on.
func FailureObservation(err error, now time.Time, st *hooksv1alpha1.BillingSettlementStatus) Observation {
	st.LastError = StatusError(err, now)
	o := Observation{Kind: ObsAmbiguous, Message: st.LastError.Message}
	if e, ok := billing.AsError(err); ok {
		o.RetryAfter = e.RetryAfter
		switch {
		case e.Unanswerable:
			o.Kind, o.RepeatHarmless = ObsUnanswerable, e.RepeatHarmless
		case e.KeyReused:
			o.Kind = ObsKeyReused
		case e.InFlight:
			o.Kind = ObsInFlight
		case e.Class == billing.Transient:
			o.Kind = ObsTransient
		case e.Class == billing.Terminal:
			o.Kind = ObsTerminal
		}
	}
	return o
}

// NeverAttempted reports whether a settlement's status records no attempt and nothing
// learnt from a provider: no submission, no bracket, no outcome, no reference and no
// disagreement.
func NeverAttempted(st *hooksv1alpha1.BillingSettlementStatus) bool {
	return st.Attempts == 0 && st.FirstSubmittedAt == nil && st.LastAttemptAt == nil && st.SentTo == nil &&
		st.LastSubmission == "" && !st.OutcomeUnknown && st.ProviderRef == "" && st.Disagreement == nil
}

// NeverSent reports whether a settlement never presented its key to any provider.
func NeverSent(bs *hooksv1alpha1.BillingSettlement) bool {
	st := &bs.Status
	return st.Attempts == 0 && st.FirstSubmittedAt == nil && st.SentTo == nil && EffectiveExposure(st) == hooksv1alpha1.ExposureNone
}

// RequestOf is what bs asks of the provider; a compensation names the original's
// settlement key and the provider's reference of it.
func RequestOf(bs *hooksv1alpha1.BillingSettlement, reversesKey, reversesRef string) billing.Request {
	req := billing.Request{
		SettlementKey: bs.Spec.SettlementKey, IdempotencyKey: bs.Spec.IdempotencyKey,
		Type: strings.ToLower(string(bs.Spec.Type)), Reverses: reversesKey, ReversesRef: reversesRef, Customer: bs.Spec.Customer,
		Metadata: bs.Spec.Metadata,
	}
	if req.Type == "" {
		req.Type = billing.TypeCharge
	}
	if u := bs.Spec.Usage; u != nil {
		req.Usage = &billing.Usage{Meter: u.Meter, Quantity: u.Quantity, Unit: u.Unit}
	}
	if a := bs.Spec.Amount; a != nil {
		req.Amount = &billing.Amount{Minor: a.Minor, Currency: a.Currency}
	}
	if t := bs.Status.FirstSubmittedAt; t != nil {
		req.FirstSubmittedAt = t.Time
	}
	if t := bs.Status.UsageDatedAt; t != nil {
		req.DatedAt = t.Time // what the first attempt carried, whatever this one does
	}
	req.KeyNamespaced = bs.Spec.IdempotencyKey == identity.NamespacedIdempotencyKey(bs.Namespace, bs.Spec.SettlementKey)
	return req
}
