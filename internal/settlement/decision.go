package settlement

import (
	"fmt"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// This file is the settlement's decision: one pure function of (status, provider policy,
// observation, now) that says what happens next — submit, look up, poll, wait, adopt,
// dead-letter, hold or release — and what the status becomes. The reconciler only
// carries decisions out; nothing outside this package decides whether money may move.
// docs/design.md §11 states the model in prose; decision_test.go covers
// every state × observation pair with a fixed clock.

// maxRetryAfterFactor caps a provider's Retry-After at this many times its maxBackoff,
// so a provider answering "Retry-After: 86400" cannot park a charge for a day.
const maxRetryAfterFactor = 2

// settleFactor and minSettle bound how long a provider may still be processing a
// request our side gave up on: a "not found" less than max(settleFactor × request
// timeout, minSettle) after an attempt that may have been received proves nothing
// about that attempt yet. Within it, resending with the same key is safe (the
// provider deduplicates); dead-lettering, releasing the record or forgetting the
// Exposure is not.
const (
	settleFactor = 5
	minSettle    = 30 * time.Second
)

// settleAfter is that bound for a policy.
func settleAfter(p RetryPolicy) time.Duration {
	return max(settleFactor*p.RequestTimeout, minSettle)
}

// jitterFraction is how much of a backoff is randomised, downward only: a wait is never
// longer than its exponential value, so waits at maxBackoff spread out too.
const jitterFraction = 0.2

// Action is what the reconciler does next.
type Action int

const (
	// ActDone: nothing to do until something changes (a final state).
	ActDone Action = iota
	// ActWait: come back after decision.wait.
	ActWait
	// ActHold: a condition a human or another object must change; re-check later.
	ActHold
	// ActSubmit: raise exposure (persisted), then POST with the key.
	ActSubmit
	// ActLookup: ask the provider by key (also how a pending record is polled).
	ActLookup
	// ActContinue: the status changed without a call; decide again.
	ActContinue
	// ActRelease: deleting, and nothing can be pending under the key: drop the finalizer.
	ActRelease
)

func (a Action) String() string {
	return [...]string{"Done", "Wait", "Hold", "Submit", "Lookup", "Continue", "Release"}[a]
}

// ObservationKind is what the last call in this reconcile answered.
type ObservationKind int

const (
	// ObsNone: no call was made yet in this reconcile.
	ObsNone ObservationKind = iota
	// ObsRecord: the provider returned a record (from a submission or a lookup).
	ObsRecord
	// ObsNotFound: a lookup answered that the provider has nothing under the key.
	ObsNotFound
	// ObsTransient: the call provably did not reach the provider (429, 409 in use,
	// connection refused).
	ObsTransient
	// ObsAmbiguous: the call may have been committed (timeout, 5xx, lost reply).
	ObsAmbiguous
	// ObsTerminal: the provider refused and will refuse again (4xx, incl. 401/403).
	ObsTerminal
	// ObsKeyReused: the provider has our key bound to another request (422).
	ObsKeyReused
	// ObsInFlight: the provider refused the call because a request with the same key is
	// still being processed (409 in use): that request may yet commit.
	ObsInFlight
	// ObsUnanswerable: a lookup the provider cannot answer at all (Stripe cannot read
	// meter events back): asking again will not help.
	ObsUnanswerable
)

func (k ObservationKind) String() string {
	return [...]string{"None", "Record", "NotFound", "Transient", "Ambiguous", "Terminal", "KeyReused", "InFlight", "Unanswerable"}[k]
}

// Observation is the answer to the call the previous decision asked for.
type Observation struct {
	Kind ObservationKind
	// Submit is true when the call was a submission, false for a lookup.
	Submit bool
	// Status is the record's provider status (obsRecord).
	Status string
	// Record is the provider's record (obsRecord).
	Record billing.Record
	// Mismatch says why the record is not provably ours (obsRecord); nil when it is.
	Mismatch *billing.Mismatch
	// RetryAfter is the provider's requested wait, if any.
	RetryAfter time.Duration
	// PriorExposure is the exposure before the submission raised it to Possible: an
	// answer that proves the submission did not reach the provider restores it.
	PriorExposure hooksv1alpha1.Exposure
	// PriorLastSubmission is status.lastSubmission before the bracket of this
	// submission set it to MaybeReceived.
	PriorLastSubmission hooksv1alpha1.SubmissionOutcome
	// RepeatHarmless: the provider cannot answer (obsUnanswerable), but carrying the
	// request out twice moves no more money than once (billing.Error.RepeatHarmless).
	RepeatHarmless bool
	// Message is a short description of a failure, for the condition.
	Message string
}

// Input is everything the decision reads.
type Input struct {
	Status *hooksv1alpha1.BillingSettlementStatus
	Policy RetryPolicy
	// ProviderChanged: status.sentTo differs from where the provider points now.
	ProviderChanged bool
	// Deleting: the settlement has a deletion timestamp.
	Deleting bool
	// ForceLookup: a reconcile request asks the provider by key now, whatever the
	// State or backoff.
	ForceLookup bool
	// LookedUp: a lookup was already answered in this reconcile.
	LookedUp bool
	Obs      Observation
	Now      time.Time
	// Random is a number in [0, 1) for jitter; tests fix it.
	Random float64
	// Caps is what the provider can answer about this settlement's request
	// (docs/design.md §14): whether it can be looked up, and whether a resend inside
	// the key window is itself the answer.
	Caps billing.Capabilities
	// NeverPresented: the facts say this settlement never presented its key anywhere —
	// no attempt recorded, no other settlement of its operation in the cluster, none in
	// the archive (docs/design.md §14). Where the provider cannot answer a lookup, the
	// facts do.
	NeverPresented bool
}

// Decision is what to do and what the status becomes. The reconciler copies the
// fields into the status and writes the conditions from reason and message.
type Decision struct {
	Action         Action
	LastSubmission hooksv1alpha1.SubmissionOutcome
	State          hooksv1alpha1.SettlementState
	Exposure       hooksv1alpha1.Exposure
	Failures       int32
	// Wait is how long to wait (actWait, actHold); nextAttemptAt is now + wait for
	// ActWait, nil otherwise.
	Wait time.Duration
	// Reason and message describe the decision for the Ready condition.
	Reason, Message string
	// DeadLetter: Failed because retries ran out or the provider refused for good,
	// with nothing charged; replay resumes it.
	DeadLetter bool
	// Adopt: take the observed record's ID and status.
	Adopt bool
	// Disagreement is set when the provider holds something under the key that is
	// not provably this settlement; clearDisagreement when it answered it has nothing.
	Disagreement      *hooksv1alpha1.ProviderDisagreement
	ClearDisagreement bool
}

// EffectiveExposure is a settlement's exposure, derived for one written by an older
// operator that had no exposure field: unknown outcomes, anything sent and not final,
// and anything not provably unsent count as Possible.
func EffectiveExposure(st *hooksv1alpha1.BillingSettlementStatus) hooksv1alpha1.Exposure {
	if st.Exposure != "" {
		return st.Exposure
	}
	switch {
	case st.ProviderStatus == billing.StatusPending:
		return hooksv1alpha1.ExposureConfirmed
	case st.State == hooksv1alpha1.SettlementSettled:
		return hooksv1alpha1.ExposureConfirmed
	case st.OutcomeUnknown:
		return hooksv1alpha1.ExposurePossible
	case st.State == hooksv1alpha1.SettlementFailed:
		// An older operator dead-lettered only once the outcome was known.
		return hooksv1alpha1.ExposureNone
	}
	return hooksv1alpha1.ExposurePossible
}

// HoldsMoney says whether money may be at the provider under the key without a final
// answer: such a settlement is never deleted, dead-lettered or sent elsewhere.
func HoldsMoney(st *hooksv1alpha1.BillingSettlementStatus) bool {
	switch EffectiveExposure(st) {
	case hooksv1alpha1.ExposurePossible:
		return true
	case hooksv1alpha1.ExposureConfirmed:
		return st.State != hooksv1alpha1.SettlementSettled
	}
	return false
}

// Decide is the settlement's next step. It is pure: the same input gives the same
// decision.
func Decide(in Input) Decision {
	st := in.Status
	d := Decision{State: st.State, Exposure: EffectiveExposure(st), Failures: st.Failures, LastSubmission: st.LastSubmission}
	if d.State == "" {
		d.State = hooksv1alpha1.SettlementPending
	}
	if in.Caps.NoDeduplication {
		// A provider that does not deduplicate counts a resend as new usage: no key
		// window, whatever the policy was built with (docs/design.md §14).
		in.Policy.KeyWindow = 0
	}
	if in.Obs.Kind == ObsNone {
		return nextStep(in, d)
	}
	return afterCall(in, d)
}

// nextStep decides before any call in this reconcile.
func nextStep(in Input, d Decision) Decision {
	st := in.Status
	holds := d.Exposure == hooksv1alpha1.ExposurePossible ||
		(d.Exposure == hooksv1alpha1.ExposureConfirmed && d.State != hooksv1alpha1.SettlementSettled)
	if in.Deleting && !holds {
		d.Action, d.Reason = ActRelease, hooksv1alpha1.ReasonDeletionAllowed
		d.Message = "nothing can be pending at the provider under the key; the record may go"
		return d
	}
	final := d.State == hooksv1alpha1.SettlementSettled || d.State == hooksv1alpha1.SettlementFailed ||
		d.State == hooksv1alpha1.SettlementRequiresReconciliation
	if d.State == hooksv1alpha1.SettlementFailed && d.Exposure != hooksv1alpha1.ExposureNone {
		// Failed with money possibly at the provider is a state older operators could
		// write (a dead-lettered pending charge): it is not final, resume asking.
		d.State, final = hooksv1alpha1.SettlementSubmitted, false
	}
	switch {
	case in.ForceLookup && d.State != hooksv1alpha1.SettlementSettled && !in.ProviderChanged:
		d.Action, d.Reason = ActLookup, hooksv1alpha1.ReasonConfirmedByProvider
		d.Message = "a reconcile request asks the provider by key"
		return d
	case final && !in.Deleting:
		d.Action = ActDone
		return d
	}
	if in.ProviderChanged && d.Exposure != hooksv1alpha1.ExposureNone {
		d.Action, d.Wait, d.Reason = ActHold, time.Minute, hooksv1alpha1.ReasonProviderChanged
		d.Message = "the BillingProvider now points elsewhere than where this settlement was sent, and money may be there: " +
			"no call is made anywhere until it points back (see docs/runbook.md)"
		return d
	}
	if st.NextAttemptAt != nil {
		if wait := st.NextAttemptAt.Sub(in.Now); wait > 0 {
			d.Action, d.Wait = ActWait, wait
			return d
		}
	}
	switch d.Exposure {
	case hooksv1alpha1.ExposureConfirmed:
		d.Action, d.Reason, d.Message = ActLookup, hooksv1alpha1.ReasonProviderPending, "polling the provider by key"
		return d
	case hooksv1alpha1.ExposurePossible:
		if resendIsTheLookup(in) {
			d.Action, d.Reason = ActSubmit, hooksv1alpha1.ReasonSubmittedToProvider
			d.Message = "money may have moved under this key and the provider cannot be asked about it; inside its window " +
				"a resend under the same key is its answer (a replay, or that it holds the key): sending again"
			return d
		}
		d.Action, d.Reason, d.Message = ActLookup, hooksv1alpha1.ReasonAwaitingLookup,
			"money may have moved under this key: asking the provider by key before anything is sent"
		return d
	}
	// Dead-lettering says "nothing was charged": only after a submission the provider
	// provably did not receive. After one it may still be processing, a lookup's "not
	// found" is no such proof, so one more submission (same key) asks it.
	if st.Attempts > 0 && st.LastAttemptAt != nil && in.Now.Sub(st.LastAttemptAt.Time) >= in.Policy.KeyWindow && !in.LookedUp {
		// Past the provider's key window it no longer deduplicates: ask once more
		// before resending, whatever the exposure says.
		d.Action, d.Reason = ActLookup, hooksv1alpha1.ReasonAwaitingLookup
		d.Message = "the provider's idempotency window has passed since the last attempt: asking by key before resending"
		return d
	}
	if spent, why := budgetSpent(st, in.Policy, in.Now); spent && st.LastSubmission != hooksv1alpha1.SubmissionMaybeReceived {
		d.Action, d.State, d.DeadLetter = ActDone, hooksv1alpha1.SettlementFailed, true
		d.Reason, d.Message = hooksv1alpha1.ReasonRetriesExhausted, "retries exhausted: "+why+lastErrorSuffix(st)
		return d
	}
	d.Action, d.Reason = ActSubmit, hooksv1alpha1.ReasonSubmittedToProvider
	return d
}

// afterCall decides from the answer to a submission or a lookup.
func afterCall(in Input, d Decision) Decision {
	st, obs := in.Status, in.Obs
	switch obs.Kind {
	case ObsRecord:
		return adoptRecord(in, d)
	case ObsNotFound:
		if d.Exposure == hooksv1alpha1.ExposureConfirmed {
			// We saw the record (pending), and now the provider does not know the key.
			d.Action, d.State, d.Failures = ActDone, hooksv1alpha1.SettlementRequiresReconciliation, 0
			d.Reason = hooksv1alpha1.ReasonMismatchWithProvider
			d.Message = "the provider reported a record under this key and now does not know the key"
			d.Disagreement = &hooksv1alpha1.ProviderDisagreement{Reason: hooksv1alpha1.ReasonMismatchWithProvider,
				Field: "record"}
			return d
		}
		if !in.Caps.ProvesAbsence() && d.Exposure == hooksv1alpha1.ExposurePossible {
			// A lookup that does not show the request proves nothing (the provider
			// ingests asynchronously): it is decided as a lookup the provider cannot
			// answer — a resend under the key inside its window where it deduplicates,
			// a human otherwise. Never "nothing moved".
			d.Failures = 0
			if in.Obs.Message == "" && !in.Caps.NoDeduplication {
				in.Obs.Message = absenceUnprovenHint
			}
			return unanswerable(in, d)
		}
		d.Failures, d.ClearDisagreement = 0, true
		if st.LastSubmission == hooksv1alpha1.SubmissionMaybeReceived && st.LastAttemptAt != nil {
			if until := st.LastAttemptAt.Add(settleAfter(in.Policy)); in.Now.Before(until) {
				// Nothing is there yet, but the provider may still be processing the
				// last attempt: exposure stays Possible. Resending with the same key is
				// safe inside the key window and gets an answer about it (409 while it
				// is processed); nothing is dead-lettered or released until a "not
				// found" comes after the settle time.
				inWindow := st.FirstSubmittedAt == nil || in.Now.Before(resendableUntil(st.FirstSubmittedAt.Time, in.Policy))
				spent, _ := budgetSpent(st, in.Policy, in.Now)
				final := d.State == hooksv1alpha1.SettlementSettled || d.State == hooksv1alpha1.SettlementFailed ||
					d.State == hooksv1alpha1.SettlementRequiresReconciliation
				switch {
				case final:
					d.Action = ActDone
				case !in.Deleting && inWindow && !spent:
					d.Action, d.Reason = ActSubmit, hooksv1alpha1.ReasonSubmittedToProvider
				default:
					d.Action, d.Wait, d.Reason = ActWait, until.Sub(in.Now), hooksv1alpha1.ReasonOutcomeUnknown
					d.Message = "the provider has nothing under the key yet, but may still be processing the last attempt: " +
						"asking again after the settle time"
				}
				return d
			}
			d.LastSubmission = hooksv1alpha1.SubmissionNotReceived // not found well after the last attempt
		}
		// Authoritative: nothing under this key, so nothing moved.
		d.Action, d.Exposure = ActContinue, hooksv1alpha1.ExposureNone
		return d
	case ObsUnanswerable:
		return unanswerable(in, d)
	case ObsKeyReused:
		d.LastSubmission = hooksv1alpha1.SubmissionRefused
		d.Action, d.State, d.Failures = ActDone, hooksv1alpha1.SettlementRequiresReconciliation, 0
		d.Exposure = raise(d.Exposure, hooksv1alpha1.ExposurePossible)
		d.Reason = hooksv1alpha1.ReasonKeyReused
		d.Message = "the provider holds this idempotency key for a different request; it is never adopted"
		d.Disagreement = &hooksv1alpha1.ProviderDisagreement{Reason: hooksv1alpha1.ReasonKeyReused}
		return d
	}

	// A failed call: transient, ambiguous or terminal.
	if obs.Submit {
		// The answer proves something about this attempt only: after an earlier one
		// that may still be processed, a 429 or a 4xx leaves that one unresolved.
		switch {
		case obs.PriorLastSubmission == hooksv1alpha1.SubmissionMaybeReceived:
			d.LastSubmission = hooksv1alpha1.SubmissionMaybeReceived
		case obs.Kind == ObsTransient:
			d.LastSubmission = hooksv1alpha1.SubmissionNotReceived
		case obs.Kind == ObsTerminal:
			d.LastSubmission = hooksv1alpha1.SubmissionRefused
		default:
			d.LastSubmission = hooksv1alpha1.SubmissionMaybeReceived
		}
	}
	if !obs.Submit && d.Exposure == hooksv1alpha1.ExposureNone {
		// Only a reconcile request looks up with nothing possibly moved: its failure
		// changes nothing, the normal path goes on (and may dead-letter).
		d.Action = ActContinue
		return d
	}
	if obs.Submit {
		switch obs.Kind {
		case ObsTransient, ObsTerminal:
			// This attempt provably did not reach the provider: exposure is what it was.
			d.Exposure = obs.PriorExposure
		case ObsAmbiguous, ObsInFlight:
			d.Exposure = hooksv1alpha1.ExposurePossible
		}
		if d.Exposure == hooksv1alpha1.ExposureNone && d.LastSubmission != hooksv1alpha1.SubmissionMaybeReceived {
			if obs.Kind == ObsTerminal {
				d.Action, d.State, d.DeadLetter, d.Failures = ActDone, hooksv1alpha1.SettlementFailed, true, d.Failures+1
				d.Reason, d.Message = hooksv1alpha1.ReasonTerminalError, "the provider refused it: "+obs.Message
				return d
			}
			if spent, why := budgetSpent(st, in.Policy, in.Now); spent && obs.Kind == ObsTransient {
				d.Action, d.State, d.DeadLetter, d.Failures = ActDone, hooksv1alpha1.SettlementFailed, true, d.Failures+1
				d.Reason = hooksv1alpha1.ReasonRetriesExhausted
				d.Message = "retries exhausted: " + why + "; last error: " + obs.Message
				return d
			}
		}
	}
	d.Failures++
	d.Action = ActWait
	d.Wait = RetryWait(d.Failures, in.Policy, obs.RetryAfter, in.Random)
	what := "lookup by key"
	if obs.Submit {
		what = "submission"
	}
	switch {
	case d.Exposure == hooksv1alpha1.ExposureNone:
		d.Reason = hooksv1alpha1.ReasonTransientError
		d.Message = fmt.Sprintf("%s failed (%s); it did not reach the provider: resending with the same key", what, obs.Message)
	case d.Exposure == hooksv1alpha1.ExposureConfirmed:
		d.Reason = hooksv1alpha1.ReasonProviderPending
		d.Message = fmt.Sprintf("the provider has it as pending; polling failed (%s)", obs.Message)
	case obs.Submit && obs.Kind == ObsTerminal:
		d.Reason = hooksv1alpha1.ReasonTerminalError
		d.Message = fmt.Sprintf("the provider refused it (%s), but an earlier attempt may have reached it: asking by key", obs.Message)
	default:
		d.Reason = hooksv1alpha1.ReasonOutcomeUnknown
		d.Message = fmt.Sprintf("%s failed (%s); money may have moved, so nothing is sent until the provider answers by key", what, obs.Message)
	}
	if spent, why := budgetSpent(st, in.Policy, in.Now); spent && d.Exposure != hooksv1alpha1.ExposureNone {
		d.Message = "retries exhausted (" + why + "), but money may be at the provider: it is never dead-lettered, only asked by key until it answers; " + d.Message
	}
	return d
}

// absenceUnprovenHint is what a person is told when a lookup's "not found" proves
// nothing (billing.Capabilities.AbsenceUnproven) and nothing more can be done.
const absenceUnprovenHint = "the provider's lookup does not show the request, which proves nothing (it processes events " +
	"asynchronously, and may hold one it does not show yet): look for the event under this settlement's idempotency key at the provider; " +
	"if it is there the charge is done, if not, charge it by hand"

// resendMargin keeps a resend under the key clear of the end of the provider's key
// window, beyond the time the lookup before it and the resend itself may take
// (2 × requestTimeout): the request must arrive while the provider still
// deduplicates it, with room for clock skew between replicas.
const resendMargin = time.Minute

// resendableUntil is the last moment a settlement first sent at first may be sent
// again under its key because a lookup could not answer.
func resendableUntil(first time.Time, p RetryPolicy) time.Time {
	return first.Add(p.KeyWindow - resendMargin - 2*p.RequestTimeout)
}

// resendIsTheLookup reports whether a settlement whose money may be at the provider is
// sent again instead of looked up: its provider cannot be asked (LookupNone, where a
// lookup answers Unanswerable every time), a resend under the key is its answer
// (ResendIsProof), and the resend is one unanswerable would make after that lookup —
// first sent by this settlement, still inside the key window, within the retry budget,
// not refused last, not being deleted. It saves the lookup; it decides nothing the
// lookup's answer would not.
func resendIsTheLookup(in Input) bool {
	st := in.Status
	if in.Caps.Lookup != billing.LookupNone || !in.Caps.ResendIsProof || in.Deleting ||
		st.FirstSubmittedAt == nil || st.LastSubmission == hooksv1alpha1.SubmissionRefused {
		return false
	}
	if spent, _ := budgetSpent(st, in.Policy, in.Now); spent {
		return false
	}
	return in.Now.Before(resendableUntil(st.FirstSubmittedAt.Time, in.Policy))
}

// unanswerable decides after a lookup the provider cannot answer (docs/design.md §13).
// Inside the key window since the first attempt (resendableUntil), within the retry
// budget and not deleting, the same request goes again under the same key: the
// provider replays its first answer, or refuses a duplicate, and that is the answer.
// Otherwise nothing proves either way and nothing is sent: a human compares with the
// provider, as the adapter's message says. A submission answered this way (Stripe's
// 404 for a resent delete) is not resent either: the provider does not replay it.
// (Nothing possibly moved: a failed lookup changes nothing.) A provider that does not
// deduplicate (caps.NoDeduplication) has no window: within the settle time of an
// attempt that may still be ingested it is asked again after it, and then a human
// looks (ReasonNotDeduplicated); a lookup that later finds the record adopts it.
func unanswerable(in Input, d Decision) Decision {
	st := in.Status
	if in.Obs.Submit {
		d.LastSubmission, d.Exposure = hooksv1alpha1.SubmissionMaybeReceived, hooksv1alpha1.ExposurePossible
	}
	if d.Exposure == hooksv1alpha1.ExposureNone {
		d.Action = ActContinue
		return d
	}
	switch d.State {
	case hooksv1alpha1.SettlementSettled, hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation:
		// Final already (a reconcile request asked): it stays what it is, and why.
		d.Action = ActDone
		return d
	}
	if in.Caps.NoDeduplication && !in.Obs.Submit && st.LastSubmission == hooksv1alpha1.SubmissionMaybeReceived && st.LastAttemptAt != nil {
		if until := st.LastAttemptAt.Add(settleAfter(in.Policy)); in.Now.Before(until) {
			// The last attempt may not show yet (ingestion is asynchronous): it is asked
			// about again after the settle time, and never resent.
			d.Action, d.Wait, d.Reason, d.Failures = ActWait, until.Sub(in.Now), hooksv1alpha1.ReasonOutcomeUnknown, 0
			d.Message = "the provider does not show the last attempt yet, and does not deduplicate a resend: " +
				"asking again after the settle time; nothing is sent again"
			return d
		}
	}
	spent, why := budgetSpent(st, in.Policy, in.Now)
	first := st.FirstSubmittedAt
	refused := in.Obs.RepeatHarmless && st.LastSubmission == hooksv1alpha1.SubmissionRefused
	resend := !in.Obs.Submit && !in.Deleting && !spent && !refused && first != nil && in.Now.Before(resendableUntil(first.Time, in.Policy))
	if in.Caps.AbsenceUnproven && !resend && !in.Obs.Submit && st.LastSubmission == hooksv1alpha1.SubmissionMaybeReceived && st.LastAttemptAt != nil {
		if until := st.LastAttemptAt.Add(settleAfter(in.Policy)); in.Now.Before(until) {
			// No resend may answer (deleting, budget spent, past the window), and the
			// last attempt may simply not be processed yet: asked again after the
			// settle time before a human is called.
			d.Action, d.Wait, d.Reason, d.Failures = ActWait, until.Sub(in.Now), hooksv1alpha1.ReasonOutcomeUnknown, 0
			d.Message = "the provider's lookup does not show the last attempt yet (it processes events asynchronously): " +
				"asking again after the settle time; nothing is sent again"
			return d
		}
	}
	switch {
	case in.Obs.Submit || in.Deleting || spent || refused:
	case first != nil && in.Now.Before(resendableUntil(first.Time, in.Policy)):
		d.Action, d.Reason = ActSubmit, hooksv1alpha1.ReasonSubmittedToProvider
		return d
	case first == nil && in.NeverPresented:
		// The provider cannot say whether it holds the key; the facts can: nothing in
		// the cluster or the archive holds this settlement's name or keys, and it never
		// recorded an attempt, so the key was never presented (docs/design.md §14).
		d.Action, d.Reason = ActSubmit, hooksv1alpha1.ReasonSubmittedToProvider
		return d
	case first == nil && in.Obs.RepeatHarmless:
		// A cancellation this record never sent: whether an earlier record under its
		// key did cannot be known, and does not matter — sending it twice cancels once.
		d.Action, d.Reason = ActSubmit, hooksv1alpha1.ReasonSubmittedToProvider
		return d
	}
	d.Action, d.State, d.Failures = ActDone, hooksv1alpha1.SettlementRequiresReconciliation, 0
	d.Reason = hooksv1alpha1.ReasonProviderCannotAnswer
	switch {
	case in.Caps.NoDeduplication && !in.Obs.Submit:
		d.Reason = hooksv1alpha1.ReasonNotDeduplicated
		d.Message = "an attempt may have reached the provider, which does not show it (which proves nothing: it ingests " +
			"asynchronously), and it does not deduplicate, so a resend would bill the usage again: the operator never sends it " +
			"again; a reconcile request adopts it once the provider shows it: "
		if in.Obs.Message == "" {
			d.Message += "look for the event under this settlement's idempotency key at the provider"
		}
	case refused:
		// Its last submission was refused (a cancellation past the provider's window),
		// and an earlier record under the key may have carried it out: a human looks.
		d.Message = "the provider refused it, and cannot be asked whether an earlier request under this key was carried out: "
	case in.Obs.Submit:
		d.Message = "the provider's answer proves nothing about this key, and it does not replay the request: "
	case first == nil:
		d.Message = "this record never sent its key, but an earlier one may have, and the provider cannot be asked about it: "
	case spent:
		d.Message = "retries exhausted (" + why + ") and the provider cannot be asked about this key, so nothing is sent again: "
	case in.Deleting:
		d.Message = "the settlement is being deleted and the provider cannot be asked about this key: "
	default:
		d.Message = "the provider cannot be asked about this key, and its idempotency window has passed since the first attempt, " +
			"so nothing is sent again: "
	}
	d.Message += in.Obs.Message
	return d
}

// adoptRecord takes the provider's record as the truth if it is provably ours.
func adoptRecord(in Input, d Decision) Decision {
	st, obs := in.Status, in.Obs
	d.Failures = 0
	if obs.Mismatch != nil || (st.Disagreement != nil && !obs.Submit) {
		d.Action, d.State = ActDone, hooksv1alpha1.SettlementRequiresReconciliation
		d.Exposure = raise(d.Exposure, hooksv1alpha1.ExposurePossible)
		d.Reason = hooksv1alpha1.ReasonMismatchWithProvider
		if obs.Mismatch != nil {
			reason := hooksv1alpha1.ReasonMismatchWithProvider
			if obs.Mismatch.Missing {
				reason = hooksv1alpha1.ReasonMissingField
			}
			d.Disagreement = &hooksv1alpha1.ProviderDisagreement{Reason: reason, Field: obs.Mismatch.Field}
			d.Message = "the provider's record under this key is not provably this settlement: " + obs.Mismatch.String()
		} else {
			d.Message = "the provider disagreed about this key before (" + st.Disagreement.Reason +
				"); its record is never adopted until it answers that it has nothing under the key"
		}
		return d
	}
	d.Adopt, d.ClearDisagreement = true, obs.Submit
	if obs.Submit {
		d.LastSubmission = hooksv1alpha1.SubmissionAccepted
	}
	switch obs.Status {
	case billing.StatusSettled:
		d.Action, d.State, d.Exposure = ActContinue, hooksv1alpha1.SettlementSettled, hooksv1alpha1.ExposureConfirmed
		d.Reason = hooksv1alpha1.ReasonProviderSettled
	case billing.StatusFailed:
		// The provider decided against it: nothing moved; replaying gets the same answer.
		d.Action, d.State, d.Exposure = ActContinue, hooksv1alpha1.SettlementFailed, hooksv1alpha1.ExposureNone
		d.Reason = hooksv1alpha1.ReasonProviderFailed
	default:
		d.Action, d.State, d.Exposure = ActWait, hooksv1alpha1.SettlementSubmitted, hooksv1alpha1.ExposureConfirmed
		d.Wait = pollInterval(st, in.Policy, in.Now)
		d.Reason = hooksv1alpha1.ReasonProviderPending
		d.Message = "the provider has it as pending; polling by key until it is final"
	}
	return d
}

// raise returns the higher of two exposures.
func raise(a, b hooksv1alpha1.Exposure) hooksv1alpha1.Exposure {
	rank := map[hooksv1alpha1.Exposure]int{hooksv1alpha1.ExposureNone: 0, "": 0,
		hooksv1alpha1.ExposurePossible: 1, hooksv1alpha1.ExposureConfirmed: 2}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// budgetSpent reports whether the retry budget since the first submission (or the
// last replay) is spent. Only an exposure of None may act on it.
func budgetSpent(st *hooksv1alpha1.BillingSettlementStatus, p RetryPolicy, now time.Time) (bool, string) {
	used, start := st.Attempts, st.FirstSubmittedAt
	if st.Replay != nil && st.Replay.LastAt != nil {
		used, start = st.Attempts-st.Replay.AttemptsBefore, st.Replay.LastAt
	}
	if p.MaxAttempts > 0 && used >= p.MaxAttempts {
		return true, fmt.Sprintf("%d attempts made (maxAttempts %d)", used, p.MaxAttempts)
	}
	if start != nil && now.Sub(start.Time) >= p.MaxElapsed {
		return true, fmt.Sprintf("%s since the first attempt (maxElapsed %s)", now.Sub(start.Time).Round(time.Second), p.MaxElapsed)
	}
	return false, ""
}

func lastErrorSuffix(st *hooksv1alpha1.BillingSettlementStatus) string {
	if st.LastError == nil {
		return ""
	}
	return "; last error: " + st.LastError.Message
}

// RetryWait is the backoff after the n-th consecutive failure: exponential from the
// Policy's initial backoff, capped at its maximum, jittered downward, and at least a
// provider's Retry-After (itself capped at maxRetryAfterFactor × maxBackoff).
func RetryWait(failures int32, p RetryPolicy, retryAfter time.Duration, random float64) time.Duration {
	wait := jitterDown(exponential(failures, p.Initial, p.Max), random)
	if retryAfter > 0 {
		wait = max(wait, min(retryAfter, maxRetryAfterFactor*p.Max))
	}
	return wait
}

// exponential is initial × 2^(n-1), capped at max.
func exponential(n int32, initial, max time.Duration) time.Duration {
	d := initial
	for i := int32(1); i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}

// jitterDown takes up to jitterFraction off d.
func jitterDown(d time.Duration, random float64) time.Duration {
	return d - time.Duration(float64(d)*jitterFraction*random)
}

// pollInterval is how long to wait before asking about a pending record again: half
// the time since the first submission, between the initial backoff and a minute.
func pollInterval(st *hooksv1alpha1.BillingSettlementStatus, p RetryPolicy, now time.Time) time.Duration {
	since := time.Duration(0)
	if st.FirstSubmittedAt != nil {
		since = now.Sub(st.FirstSubmittedAt.Time)
	}
	return min(max(since/2, p.Initial), maxPollInterval)
}
