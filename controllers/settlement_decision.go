package controllers

import (
	"fmt"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// This file is the settlement's decision: one pure function of (status, provider policy,
// observation, now) that says what happens next — submit, look up, poll, wait, adopt,
// dead-letter, hold or release — and what the status becomes. The reconciler only
// carries decisions out; nothing else in the package decides whether money may move.
// docs/design.md §11 states the model in prose; settlement_decision_test.go covers
// every state × observation pair with a fixed clock.

// maxRetryAfterFactor caps a provider's Retry-After at this many times its maxBackoff,
// so a provider answering "Retry-After: 86400" cannot park a charge for a day.
const maxRetryAfterFactor = 2

// settleFactor and minSettle bound how long a provider may still be processing a
// request our side gave up on: a "not found" less than max(settleFactor × request
// timeout, minSettle) after an attempt that may have been received proves nothing
// about that attempt yet. Within it, resending with the same key is safe (the
// provider deduplicates); dead-lettering, releasing the record or forgetting the
// exposure is not.
const (
	settleFactor = 5
	minSettle    = 30 * time.Second
)

// settleAfter is that bound for a policy.
func settleAfter(p retryPolicy) time.Duration {
	return max(settleFactor*p.requestTimeout, minSettle)
}

// jitterFraction is how much of a backoff is randomised, downward only: a wait is never
// longer than its exponential value, so waits at maxBackoff spread out too.
const jitterFraction = 0.2

// action is what the reconciler does next.
type action int

const (
	// actDone: nothing to do until something changes (a final state).
	actDone action = iota
	// actWait: come back after decision.wait.
	actWait
	// actHold: a condition a human or another object must change; re-check later.
	actHold
	// actSubmit: raise exposure (persisted), then POST with the key.
	actSubmit
	// actLookup: ask the provider by key (also how a pending record is polled).
	actLookup
	// actContinue: the status changed without a call; decide again.
	actContinue
	// actRelease: deleting, and nothing can be pending under the key: drop the finalizer.
	actRelease
)

func (a action) String() string {
	return [...]string{"Done", "Wait", "Hold", "Submit", "Lookup", "Continue", "Release"}[a]
}

// observationKind is what the last call in this reconcile answered.
type observationKind int

const (
	// obsNone: no call was made yet in this reconcile.
	obsNone observationKind = iota
	// obsRecord: the provider returned a record (from a submission or a lookup).
	obsRecord
	// obsNotFound: a lookup answered that the provider has nothing under the key.
	obsNotFound
	// obsTransient: the call provably did not reach the provider (429, 409 in use,
	// connection refused).
	obsTransient
	// obsAmbiguous: the call may have been committed (timeout, 5xx, lost reply).
	obsAmbiguous
	// obsTerminal: the provider refused and will refuse again (4xx, incl. 401/403).
	obsTerminal
	// obsKeyReused: the provider has our key bound to another request (422).
	obsKeyReused
	// obsInFlight: the provider refused the call because a request with the same key is
	// still being processed (409 in use): that request may yet commit.
	obsInFlight
	// obsUnanswerable: a lookup the provider cannot answer at all (Stripe cannot read
	// meter events back): asking again will not help.
	obsUnanswerable
)

func (k observationKind) String() string {
	return [...]string{"None", "Record", "NotFound", "Transient", "Ambiguous", "Terminal", "KeyReused", "InFlight", "Unanswerable"}[k]
}

// observation is the answer to the call the previous decision asked for.
type observation struct {
	kind observationKind
	// submit is true when the call was a submission, false for a lookup.
	submit bool
	// status is the record's provider status (obsRecord).
	status string
	// record is the provider's record (obsRecord).
	record billing.Record
	// mismatch says why the record is not provably ours (obsRecord); nil when it is.
	mismatch *billing.Mismatch
	// retryAfter is the provider's requested wait, if any.
	retryAfter time.Duration
	// priorExposure is the exposure before the submission raised it to Possible: an
	// answer that proves the submission did not reach the provider restores it.
	priorExposure hooksv1alpha1.Exposure
	// priorLastSubmission is status.lastSubmission before the bracket of this
	// submission set it to MaybeReceived.
	priorLastSubmission hooksv1alpha1.SubmissionOutcome
	// repeatHarmless: the provider cannot answer (obsUnanswerable), but carrying the
	// request out twice moves no more money than once (billing.Error.RepeatHarmless).
	repeatHarmless bool
	// message is a short description of a failure, for the condition.
	message string
}

// decisionInput is everything the decision reads.
type decisionInput struct {
	status *hooksv1alpha1.BillingSettlementStatus
	policy retryPolicy
	// providerChanged: status.sentTo differs from where the provider points now.
	providerChanged bool
	// deleting: the settlement has a deletion timestamp.
	deleting bool
	// forceLookup: a reconcile request asks the provider by key now, whatever the
	// state or backoff.
	forceLookup bool
	// lookedUp: a lookup was already answered in this reconcile.
	lookedUp bool
	obs      observation
	now      time.Time
	// random is a number in [0, 1) for jitter; tests fix it.
	random float64
}

// decision is what to do and what the status becomes. The reconciler copies the
// fields into the status and writes the conditions from reason and message.
type decision struct {
	action         action
	lastSubmission hooksv1alpha1.SubmissionOutcome
	state          hooksv1alpha1.SettlementState
	exposure       hooksv1alpha1.Exposure
	failures       int32
	// wait is how long to wait (actWait, actHold); nextAttemptAt is now + wait for
	// actWait, nil otherwise.
	wait time.Duration
	// reason and message describe the decision for the Ready condition.
	reason, message string
	// deadLetter: Failed because retries ran out or the provider refused for good,
	// with nothing charged; replay resumes it.
	deadLetter bool
	// adopt: take the observed record's ID and status.
	adopt bool
	// disagreement is set when the provider holds something under the key that is
	// not provably this settlement; clearDisagreement when it answered it has nothing.
	disagreement      *hooksv1alpha1.ProviderDisagreement
	clearDisagreement bool
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

// decide is the settlement's next step. It is pure: the same input gives the same
// decision.
func decide(in decisionInput) decision {
	st := in.status
	d := decision{state: st.State, exposure: EffectiveExposure(st), failures: st.Failures, lastSubmission: st.LastSubmission}
	if d.state == "" {
		d.state = hooksv1alpha1.SettlementPending
	}
	if in.obs.kind == obsNone {
		return nextStep(in, d)
	}
	return afterCall(in, d)
}

// nextStep decides before any call in this reconcile.
func nextStep(in decisionInput, d decision) decision {
	st := in.status
	holds := d.exposure == hooksv1alpha1.ExposurePossible ||
		(d.exposure == hooksv1alpha1.ExposureConfirmed && d.state != hooksv1alpha1.SettlementSettled)
	if in.deleting && !holds {
		d.action, d.reason = actRelease, hooksv1alpha1.ReasonDeletionAllowed
		d.message = "nothing can be pending at the provider under the key; the record may go"
		return d
	}
	final := d.state == hooksv1alpha1.SettlementSettled || d.state == hooksv1alpha1.SettlementFailed ||
		d.state == hooksv1alpha1.SettlementRequiresReconciliation
	if d.state == hooksv1alpha1.SettlementFailed && d.exposure != hooksv1alpha1.ExposureNone {
		// Failed with money possibly at the provider is a state older operators could
		// write (a dead-lettered pending charge): it is not final, resume asking.
		d.state, final = hooksv1alpha1.SettlementSubmitted, false
	}
	switch {
	case in.forceLookup && d.state != hooksv1alpha1.SettlementSettled && !in.providerChanged:
		d.action, d.reason = actLookup, hooksv1alpha1.ReasonConfirmedByProvider
		d.message = "a reconcile request asks the provider by key"
		return d
	case final && !in.deleting:
		d.action = actDone
		return d
	}
	if in.providerChanged && d.exposure != hooksv1alpha1.ExposureNone {
		d.action, d.wait, d.reason = actHold, time.Minute, hooksv1alpha1.ReasonProviderChanged
		d.message = "the BillingProvider now points elsewhere than where this settlement was sent, and money may be there: " +
			"no call is made anywhere until it points back (see docs/runbook.md)"
		return d
	}
	if st.NextAttemptAt != nil {
		if wait := st.NextAttemptAt.Sub(in.now); wait > 0 {
			d.action, d.wait = actWait, wait
			return d
		}
	}
	switch d.exposure {
	case hooksv1alpha1.ExposureConfirmed:
		d.action, d.reason, d.message = actLookup, hooksv1alpha1.ReasonProviderPending, "polling the provider by key"
		return d
	case hooksv1alpha1.ExposurePossible:
		d.action, d.reason, d.message = actLookup, hooksv1alpha1.ReasonAwaitingLookup,
			"money may have moved under this key: asking the provider by key before anything is sent"
		return d
	}
	// Dead-lettering says "nothing was charged": only after a submission the provider
	// provably did not receive. After one it may still be processing, a lookup's "not
	// found" is no such proof, so one more submission (same key) asks it.
	if st.Attempts > 0 && st.LastAttemptAt != nil && in.now.Sub(st.LastAttemptAt.Time) >= in.policy.keyWindow && !in.lookedUp {
		// Past the provider's key window it no longer deduplicates: ask once more
		// before resending, whatever the exposure says.
		d.action, d.reason = actLookup, hooksv1alpha1.ReasonAwaitingLookup
		d.message = "the provider's idempotency window has passed since the last attempt: asking by key before resending"
		return d
	}
	if spent, why := budgetSpent(st, in.policy, in.now); spent && st.LastSubmission != hooksv1alpha1.SubmissionMaybeReceived {
		d.action, d.state, d.deadLetter = actDone, hooksv1alpha1.SettlementFailed, true
		d.reason, d.message = hooksv1alpha1.ReasonRetriesExhausted, "retries exhausted: "+why+lastErrorSuffix(st)
		return d
	}
	d.action, d.reason = actSubmit, hooksv1alpha1.ReasonSubmittedToProvider
	return d
}

// afterCall decides from the answer to a submission or a lookup.
func afterCall(in decisionInput, d decision) decision {
	st, obs := in.status, in.obs
	switch obs.kind {
	case obsRecord:
		return adoptRecord(in, d)
	case obsNotFound:
		if d.exposure == hooksv1alpha1.ExposureConfirmed {
			// We saw the record (pending), and now the provider does not know the key.
			d.action, d.state, d.failures = actDone, hooksv1alpha1.SettlementRequiresReconciliation, 0
			d.reason = hooksv1alpha1.ReasonMismatchWithProvider
			d.message = "the provider reported a record under this key and now does not know the key"
			d.disagreement = &hooksv1alpha1.ProviderDisagreement{Reason: hooksv1alpha1.ReasonMismatchWithProvider,
				Field: "record"}
			return d
		}
		d.failures, d.clearDisagreement = 0, true
		if st.LastSubmission == hooksv1alpha1.SubmissionMaybeReceived && st.LastAttemptAt != nil {
			if until := st.LastAttemptAt.Add(settleAfter(in.policy)); in.now.Before(until) {
				// Nothing is there yet, but the provider may still be processing the
				// last attempt: exposure stays Possible. Resending with the same key is
				// safe inside the key window and gets an answer about it (409 while it
				// is processed); nothing is dead-lettered or released until a "not
				// found" comes after the settle time.
				inWindow := st.FirstSubmittedAt == nil || in.now.Before(resendableUntil(st.FirstSubmittedAt.Time, in.policy))
				spent, _ := budgetSpent(st, in.policy, in.now)
				final := d.state == hooksv1alpha1.SettlementSettled || d.state == hooksv1alpha1.SettlementFailed ||
					d.state == hooksv1alpha1.SettlementRequiresReconciliation
				switch {
				case final:
					d.action = actDone
				case !in.deleting && inWindow && !spent:
					d.action, d.reason = actSubmit, hooksv1alpha1.ReasonSubmittedToProvider
				default:
					d.action, d.wait, d.reason = actWait, until.Sub(in.now), hooksv1alpha1.ReasonOutcomeUnknown
					d.message = "the provider has nothing under the key yet, but may still be processing the last attempt: " +
						"asking again after the settle time"
				}
				return d
			}
			d.lastSubmission = hooksv1alpha1.SubmissionNotReceived // not found well after the last attempt
		}
		// Authoritative: nothing under this key, so nothing moved.
		d.action, d.exposure = actContinue, hooksv1alpha1.ExposureNone
		return d
	case obsUnanswerable:
		return unanswerable(in, d)
	case obsKeyReused:
		d.lastSubmission = hooksv1alpha1.SubmissionRefused
		d.action, d.state, d.failures = actDone, hooksv1alpha1.SettlementRequiresReconciliation, 0
		d.exposure = raise(d.exposure, hooksv1alpha1.ExposurePossible)
		d.reason = hooksv1alpha1.ReasonKeyReused
		d.message = "the provider holds this idempotency key for a different request; it is never adopted"
		d.disagreement = &hooksv1alpha1.ProviderDisagreement{Reason: hooksv1alpha1.ReasonKeyReused}
		return d
	}

	// A failed call: transient, ambiguous or terminal.
	if obs.submit {
		// The answer proves something about this attempt only: after an earlier one
		// that may still be processed, a 429 or a 4xx leaves that one unresolved.
		switch {
		case obs.priorLastSubmission == hooksv1alpha1.SubmissionMaybeReceived:
			d.lastSubmission = hooksv1alpha1.SubmissionMaybeReceived
		case obs.kind == obsTransient:
			d.lastSubmission = hooksv1alpha1.SubmissionNotReceived
		case obs.kind == obsTerminal:
			d.lastSubmission = hooksv1alpha1.SubmissionRefused
		default:
			d.lastSubmission = hooksv1alpha1.SubmissionMaybeReceived
		}
	}
	if !obs.submit && d.exposure == hooksv1alpha1.ExposureNone {
		// Only a reconcile request looks up with nothing possibly moved: its failure
		// changes nothing, the normal path goes on (and may dead-letter).
		d.action = actContinue
		return d
	}
	if obs.submit {
		switch obs.kind {
		case obsTransient, obsTerminal:
			// This attempt provably did not reach the provider: exposure is what it was.
			d.exposure = obs.priorExposure
		case obsAmbiguous, obsInFlight:
			d.exposure = hooksv1alpha1.ExposurePossible
		}
		if d.exposure == hooksv1alpha1.ExposureNone && d.lastSubmission != hooksv1alpha1.SubmissionMaybeReceived {
			if obs.kind == obsTerminal {
				d.action, d.state, d.deadLetter, d.failures = actDone, hooksv1alpha1.SettlementFailed, true, d.failures+1
				d.reason, d.message = hooksv1alpha1.ReasonTerminalError, "the provider refused it: "+obs.message
				return d
			}
			if spent, why := budgetSpent(st, in.policy, in.now); spent && obs.kind == obsTransient {
				d.action, d.state, d.deadLetter, d.failures = actDone, hooksv1alpha1.SettlementFailed, true, d.failures+1
				d.reason = hooksv1alpha1.ReasonRetriesExhausted
				d.message = "retries exhausted: " + why + "; last error: " + obs.message
				return d
			}
		}
	}
	d.failures++
	d.action = actWait
	d.wait = retryWait(d.failures, in.policy, obs.retryAfter, in.random)
	what := "lookup by key"
	if obs.submit {
		what = "submission"
	}
	switch {
	case d.exposure == hooksv1alpha1.ExposureNone:
		d.reason = hooksv1alpha1.ReasonTransientError
		d.message = fmt.Sprintf("%s failed (%s); it did not reach the provider: resending with the same key", what, obs.message)
	case d.exposure == hooksv1alpha1.ExposureConfirmed:
		d.reason = hooksv1alpha1.ReasonProviderPending
		d.message = fmt.Sprintf("the provider has it as pending; polling failed (%s)", obs.message)
	case obs.submit && obs.kind == obsTerminal:
		d.reason = hooksv1alpha1.ReasonTerminalError
		d.message = fmt.Sprintf("the provider refused it (%s), but an earlier attempt may have reached it: asking by key", obs.message)
	default:
		d.reason = hooksv1alpha1.ReasonOutcomeUnknown
		d.message = fmt.Sprintf("%s failed (%s); money may have moved, so nothing is sent until the provider answers by key", what, obs.message)
	}
	if spent, why := budgetSpent(st, in.policy, in.now); spent && d.exposure != hooksv1alpha1.ExposureNone {
		d.message = "retries exhausted (" + why + "), but money may be at the provider: it is never dead-lettered, only asked by key until it answers; " + d.message
	}
	return d
}

// resendMargin keeps a resend under the key clear of the end of the provider's key
// window, beyond the time the lookup before it and the resend itself may take
// (2 × requestTimeout): the request must arrive while the provider still
// deduplicates it, with room for clock skew between replicas.
const resendMargin = time.Minute

// resendableUntil is the last moment a settlement first sent at first may be sent
// again under its key because a lookup could not answer.
func resendableUntil(first time.Time, p retryPolicy) time.Time {
	return first.Add(p.keyWindow - resendMargin - 2*p.requestTimeout)
}

// unanswerable decides after a lookup the provider cannot answer (docs/design.md §13).
// Inside the key window since the first attempt (resendableUntil), within the retry
// budget and not deleting, the same request goes again under the same key: the
// provider replays its first answer, or refuses a duplicate, and that is the answer.
// Otherwise nothing proves either way and nothing is sent: a human compares with the
// provider, as the adapter's message says. A submission answered this way (Stripe's
// 404 for a resent delete) is not resent either: the provider does not replay it.
// (Nothing possibly moved: a failed lookup changes nothing.)
func unanswerable(in decisionInput, d decision) decision {
	st := in.status
	if in.obs.submit {
		d.lastSubmission, d.exposure = hooksv1alpha1.SubmissionMaybeReceived, hooksv1alpha1.ExposurePossible
	}
	if d.exposure == hooksv1alpha1.ExposureNone {
		d.action = actContinue
		return d
	}
	switch d.state {
	case hooksv1alpha1.SettlementSettled, hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation:
		// Final already (a reconcile request asked): it stays what it is, and why.
		d.action = actDone
		return d
	}
	spent, why := budgetSpent(st, in.policy, in.now)
	first := st.FirstSubmittedAt
	refused := in.obs.repeatHarmless && st.LastSubmission == hooksv1alpha1.SubmissionRefused
	switch {
	case in.obs.submit || in.deleting || spent || refused:
	case first != nil && in.now.Before(resendableUntil(first.Time, in.policy)):
		d.action, d.reason = actSubmit, hooksv1alpha1.ReasonSubmittedToProvider
		return d
	case first == nil && in.obs.repeatHarmless:
		// A cancellation this record never sent: whether an earlier record under its
		// key did cannot be known, and does not matter — sending it twice cancels once.
		d.action, d.reason = actSubmit, hooksv1alpha1.ReasonSubmittedToProvider
		return d
	}
	d.action, d.state, d.failures = actDone, hooksv1alpha1.SettlementRequiresReconciliation, 0
	d.reason = hooksv1alpha1.ReasonProviderCannotAnswer
	switch {
	case refused:
		// Its last submission was refused (a cancellation past the provider's window),
		// and an earlier record under the key may have carried it out: a human looks.
		d.message = "the provider refused it, and cannot be asked whether an earlier request under this key was carried out: "
	case in.obs.submit:
		d.message = "the provider's answer proves nothing about this key, and it does not replay the request: "
	case first == nil:
		d.message = "this record never sent its key, but an earlier one may have, and the provider cannot be asked about it: "
	case spent:
		d.message = "retries exhausted (" + why + ") and the provider cannot be asked about this key, so nothing is sent again: "
	case in.deleting:
		d.message = "the settlement is being deleted and the provider cannot be asked about this key: "
	default:
		d.message = "the provider cannot be asked about this key, and its idempotency window has passed since the first attempt, " +
			"so nothing is sent again: "
	}
	d.message += in.obs.message
	return d
}

// adoptRecord takes the provider's record as the truth if it is provably ours.
func adoptRecord(in decisionInput, d decision) decision {
	st, obs := in.status, in.obs
	d.failures = 0
	if obs.mismatch != nil || (st.Disagreement != nil && !obs.submit) {
		d.action, d.state = actDone, hooksv1alpha1.SettlementRequiresReconciliation
		d.exposure = raise(d.exposure, hooksv1alpha1.ExposurePossible)
		d.reason = hooksv1alpha1.ReasonMismatchWithProvider
		if obs.mismatch != nil {
			reason := hooksv1alpha1.ReasonMismatchWithProvider
			if obs.mismatch.Missing {
				reason = hooksv1alpha1.ReasonMissingField
			}
			d.disagreement = &hooksv1alpha1.ProviderDisagreement{Reason: reason, Field: obs.mismatch.Field}
			d.message = "the provider's record under this key is not provably this settlement: " + obs.mismatch.String()
		} else {
			d.message = "the provider disagreed about this key before (" + st.Disagreement.Reason +
				"); its record is never adopted until it answers that it has nothing under the key"
		}
		return d
	}
	d.adopt, d.clearDisagreement = true, obs.submit
	if obs.submit {
		d.lastSubmission = hooksv1alpha1.SubmissionAccepted
	}
	switch obs.status {
	case billing.StatusSettled:
		d.action, d.state, d.exposure = actContinue, hooksv1alpha1.SettlementSettled, hooksv1alpha1.ExposureConfirmed
		d.reason = hooksv1alpha1.ReasonProviderSettled
	case billing.StatusFailed:
		// The provider decided against it: nothing moved; replaying gets the same answer.
		d.action, d.state, d.exposure = actContinue, hooksv1alpha1.SettlementFailed, hooksv1alpha1.ExposureNone
		d.reason = hooksv1alpha1.ReasonProviderFailed
	default:
		d.action, d.state, d.exposure = actWait, hooksv1alpha1.SettlementSubmitted, hooksv1alpha1.ExposureConfirmed
		d.wait = pollInterval(st, in.policy, in.now)
		d.reason = hooksv1alpha1.ReasonProviderPending
		d.message = "the provider has it as pending; polling by key until it is final"
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
func budgetSpent(st *hooksv1alpha1.BillingSettlementStatus, p retryPolicy, now time.Time) (bool, string) {
	used, start := st.Attempts, st.FirstSubmittedAt
	if st.Replay != nil && st.Replay.LastAt != nil {
		used, start = st.Attempts-st.Replay.AttemptsBefore, st.Replay.LastAt
	}
	if used >= p.maxAttempts {
		return true, fmt.Sprintf("%d attempts made (maxAttempts %d)", used, p.maxAttempts)
	}
	if start != nil && now.Sub(start.Time) >= p.maxElapsed {
		return true, fmt.Sprintf("%s since the first attempt (maxElapsed %s)", now.Sub(start.Time).Round(time.Second), p.maxElapsed)
	}
	return false, ""
}

func lastErrorSuffix(st *hooksv1alpha1.BillingSettlementStatus) string {
	if st.LastError == nil {
		return ""
	}
	return "; last error: " + st.LastError.Message
}

// retryWait is the backoff after the n-th consecutive failure: exponential from the
// policy's initial backoff, capped at its maximum, jittered downward, and at least a
// provider's Retry-After (itself capped at maxRetryAfterFactor × maxBackoff).
func retryWait(failures int32, p retryPolicy, retryAfter time.Duration, random float64) time.Duration {
	wait := jitterDown(exponential(failures, p.initial, p.max), random)
	if retryAfter > 0 {
		wait = max(wait, min(retryAfter, maxRetryAfterFactor*p.max))
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
func pollInterval(st *hooksv1alpha1.BillingSettlementStatus, p retryPolicy, now time.Time) time.Duration {
	since := time.Duration(0)
	if st.FirstSubmittedAt != nil {
		since = now.Sub(st.FirstSubmittedAt.Time)
	}
	return min(max(since/2, p.initial), maxPollInterval)
}
