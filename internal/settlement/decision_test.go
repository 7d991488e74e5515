package settlement

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// The decision's table: every (state, exposure) a settlement can be in, before any
// call and after every kind of answer, with a fixed clock and fixed jitter. The
// invariants below are checked for every pair; the explicit rows pin the exact step.

var (
	t0     = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	policy = RetryPolicy{MaxAttempts: 5, MaxElapsed: time.Hour, Initial: time.Second, Max: time.Minute, KeyWindow: 24 * time.Hour}
	// longBudget is a budget set longer than the key window, with no cap on attempts:
	// only the window then keeps a resend under the key safe.
	longBudget = RetryPolicy{MaxElapsed: 48 * time.Hour, Initial: time.Second, Max: time.Minute, KeyWindow: 24 * time.Hour}
	policies   = []RetryPolicy{policy, longBudget}
)

type (
	S = hooksv1alpha1.SettlementState
	E = hooksv1alpha1.Exposure
)

const (
	pending   = hooksv1alpha1.SettlementPending
	submitted = hooksv1alpha1.SettlementSubmitted
	settled   = hooksv1alpha1.SettlementSettled
	failed    = hooksv1alpha1.SettlementFailed
	rr        = hooksv1alpha1.SettlementRequiresReconciliation
	none      = hooksv1alpha1.ExposureNone
	possible  = hooksv1alpha1.ExposurePossible
	confirmed = hooksv1alpha1.ExposureConfirmed
)

var (
	allStates    = []S{pending, submitted, settled, failed, rr}
	allExposures = []E{none, possible, confirmed}
	// allCaps are the providers' shapes (docs/design.md §14): the HTTP contract (lookup
	// by key), Stripe's invoice items (listing; a resend inside 24 h is replayed), its
	// meter events (no lookup; a resend is the answer) and its meter-event
	// cancellations (no lookup; a resend proves nothing), and a provider that does not
	// deduplicate at all (OpenMeter without deduplication: listing; a resend is new usage).
	allCaps = []billing.Capabilities{
		{Lookup: billing.LookupByKey},
		{Lookup: billing.LookupByListing, Window: 24 * time.Hour, ResendIsProof: true},
		{Lookup: billing.LookupNone, Window: 24 * time.Hour, ResendIsProof: true},
		{Lookup: billing.LookupNone, Window: 24 * time.Hour},
		noDedup,
	}
	noDedup     = billing.Capabilities{Lookup: billing.LookupByListing, NoDeduplication: true}
	allObs      = []ObservationKind{ObsNone, ObsRecord, ObsNotFound, ObsTransient, ObsAmbiguous, ObsTerminal, ObsKeyReused, ObsInFlight, ObsUnanswerable}
	recStatuses = []string{billing.StatusPending, billing.StatusSettled, billing.StatusFailed}
)

// firstAttempts are how long before now the first attempt was, for the sweep: -1
// keeps statusOfPair's; answers the key window bounds (an unanswerable lookup) get
// none, one well inside it, one just before resendableUntil's margin and one past it.
func firstAttempts(st *hooksv1alpha1.BillingSettlementStatus, kind ObservationKind, caps billing.Capabilities) []time.Duration {
	resends := kind == ObsUnanswerable || kind == ObsNotFound || kind == ObsNone && caps.ResendIsProof
	if !resends || st.FirstSubmittedAt == nil {
		return []time.Duration{-1}
	}
	out := []time.Duration{-1, time.Minute, policy.KeyWindow - 30*time.Second, policy.KeyWindow + time.Hour}
	if st.State == pending {
		out = append(out, unsentFirst) // a hand-made record: Possible, never sent by itself
	}
	return out
}

// unsentFirst, as a first attempt, clears it: the record never sent its key.
const unsentFirst = time.Duration(-2)

func statusOfPair(state S, exp E) *hooksv1alpha1.BillingSettlementStatus {
	st := &hooksv1alpha1.BillingSettlementStatus{State: state, Exposure: exp}
	if state != pending || exp != none {
		first := metav1.NewTime(t0.Add(-time.Minute))
		st.FirstSubmittedAt, st.Attempts = &first, 1
	}
	return st
}

// TestDecisionInvariants runs every state × exposure × observation (× record status,
// × submission or lookup, × deleting) and checks what must hold whatever the row.
func TestDecisionInvariants(t *testing.T) {
	n := 0
	for _, state := range allStates {
		for _, exp := range allExposures {
			for _, kind := range allObs {
				for _, submit := range []bool{false, true} {
					for _, deleting := range []bool{false, true} {
						for _, spent := range []bool{false, true} {
							if kind == ObsKeyReused && !submit {
								continue // only a submission can be told the key is reused
							}
							statuses := []string{""}
							if kind == ObsRecord {
								statuses = recStatuses
							}
							for _, rs := range statuses {
								st := statusOfPair(state, exp)
								if spent {
									st.Attempts = policy.MaxAttempts
								}
								for _, last := range []hooksv1alpha1.SubmissionOutcome{"", hooksv1alpha1.SubmissionMaybeReceived, hooksv1alpha1.SubmissionNotReceived, hooksv1alpha1.SubmissionRefused} {
									for pc := range len(allCaps) * len(policies) {
										ci, caps, policy := pc%len(allCaps), allCaps[pc%len(allCaps)], policies[pc/len(allCaps)]
										for _, firstAgo := range firstAttempts(st, kind, caps) {
											for _, harmless := range []bool{false, kind == ObsUnanswerable} {
												for _, neverPresented := range []bool{false, kind == ObsUnanswerable && firstAgo == unsentFirst} {
													st := st.DeepCopy()
													st.LastSubmission = last
													if firstAgo >= 0 && st.FirstSubmittedAt != nil {
														st.FirstSubmittedAt = &metav1.Time{Time: t0.Add(-firstAgo)}
													}
													if firstAgo == unsentFirst {
														st.FirstSubmittedAt, st.Attempts = nil, 0
													}
													if st.FirstSubmittedAt != nil {
														st.LastAttemptAt = &metav1.Time{Time: t0.Add(-5 * time.Second)}
													}
													in := Input{Status: st, Policy: policy, Deleting: deleting, Now: t0, Random: 0.5, Caps: caps,
														Obs: Observation{Kind: kind, Submit: submit, Status: rs, PriorExposure: exp,
															PriorLastSubmission: last, Message: "x", RepeatHarmless: harmless}, NeverPresented: neverPresented}
													d := Decide(in)
													n++
													name := fmt.Sprintf("%s/%s/%s/submit=%v/deleting=%v/spent=%v/%s/last=%s/policy=%d/caps=%d/first=-%s/harmless=%v/neverPresented=%v", state, exp, kind, submit, deleting, spent, rs, last, pc/len(allCaps), ci, firstAgo, harmless, neverPresented)
													checkInvariants(t, name, in, d)
												}
											}
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d pairs checked", n)
}

func checkInvariants(t *testing.T, name string, in Input, d Decision) {
	t.Helper()
	exp := EffectiveExposure(in.Status)
	if d.DeadLetter && d.Exposure != none {
		t.Errorf("%s: dead-lettered with exposure %s", name, d.Exposure)
	}
	if d.DeadLetter && in.Obs.Kind == ObsNone && in.Status.LastSubmission == hooksv1alpha1.SubmissionMaybeReceived {
		t.Errorf("%s: dead-lettered after a submission the provider may still be processing", name)
	}
	if d.DeadLetter && in.Obs.Submit && (in.Obs.Kind == ObsAmbiguous || in.Obs.Kind == ObsInFlight) {
		t.Errorf("%s: dead-lettered right after an ambiguous submission", name)
	}
	if d.DeadLetter && d.State != failed {
		t.Errorf("%s: dead-lettered but state %s", name, d.State)
	}
	if d.Action == ActSubmit && exp != none && in.Obs.Kind == ObsNone {
		// Without a call in this reconcile: only where the provider cannot be asked and
		// a resend inside its window is its answer, and only as unanswerable would resend
		// after the lookup.
		first := in.Status.FirstSubmittedAt
		spent, _ := budgetSpent(in.Status, in.Policy, in.Now)
		switch {
		case in.Caps.Lookup != billing.LookupNone || !in.Caps.ResendIsProof:
			t.Errorf("%s: resends without a lookup to a provider that can be asked, or whose resend proves nothing", name)
		case first == nil:
			t.Errorf("%s: resends without a lookup a key this record never sent", name)
		case !in.Now.Before(resendableUntil(first.Time, in.Policy)):
			t.Errorf("%s: resends without a lookup near or past the end of the key window", name)
		case spent:
			t.Errorf("%s: resends without a lookup with the retry budget spent", name)
		}
	}
	if d.Action == ActSubmit && exp != none && in.Obs.Kind != ObsNotFound && in.Obs.Kind != ObsNone && !(in.Obs.Kind == ObsUnanswerable && !in.Obs.Submit) {
		// (A lookup the provider cannot answer is answered by resending under the key,
		// inside its window: the provider replays its first answer.)
		t.Errorf("%s: submits with exposure %s without a lookup that answered", name, exp)
	}
	if d.Action == ActSubmit && in.Obs.Kind == ObsUnanswerable {
		switch first := in.Status.FirstSubmittedAt; {
		case first == nil && !in.Obs.RepeatHarmless && !in.NeverPresented:
			t.Errorf("%s: resends after an unanswerable lookup a key this record never sent, and the facts do not say nothing else did", name)
		case first == nil && in.NeverPresented:
			// The facts answer where the provider cannot: nothing ever presented the key.
		case first == nil:
			// A cancellation never sent by this record: sending it twice cancels once.
		case in.Obs.RepeatHarmless && in.Status.LastSubmission == hooksv1alpha1.SubmissionRefused:
			t.Errorf("%s: sends again a request the provider refused, with an earlier one unknowable", name)
		case !in.Now.Before(resendableUntil(first.Time, in.Policy)):
			t.Errorf("%s: resends an unanswerable key near or past the end of its window", name)
		case in.Obs.Submit:
			t.Errorf("%s: resends a request the provider does not replay", name)
		case in.Status.State == settled || in.Status.State == failed || in.Status.State == rr:
			t.Errorf("%s: resends from final state %s", name, in.Status.State)
		}
		if spent, _ := budgetSpent(in.Status, in.Policy, in.Now); spent {
			t.Errorf("%s: resends an unanswerable key with the retry budget spent", name)
		}
	}
	if in.Obs.Kind == ObsUnanswerable {
		if d.Adopt || d.DeadLetter {
			t.Errorf("%s: an unanswerable answer adopted a record or dead-lettered (adopt %v, dead letter %v)", name, d.Adopt, d.DeadLetter)
		}
		if d.State == settled && in.Status.State != settled {
			t.Errorf("%s: an unanswerable answer settled it", name)
		}
		if in.Status.State == rr && (d.State != rr || d.Reason != "") {
			t.Errorf("%s: rewrote a RequiresReconciliation settlement (now %s, %s)", name, d.State, d.Reason)
		}
	}
	if d.Action == ActSubmit && exp != none && in.Status.FirstSubmittedAt != nil && in.Now.Sub(in.Status.FirstSubmittedAt.Time) >= policy.KeyWindow {
		t.Errorf("%s: resends at exposure %s outside the key window", name, exp)
	}
	if in.Status.LastSubmission == hooksv1alpha1.SubmissionMaybeReceived && in.Status.LastAttemptAt != nil &&
		in.Now.Sub(in.Status.LastAttemptAt.Time) < settleAfter(policy) && exp != none && in.Obs.Kind != ObsRecord {
		// (A record of ours is the provider's word about the key itself.)
		if d.Exposure == none {
			t.Errorf("%s: exposure lowered to None within the settle time of an attempt that may still be processed", name)
		}
		if d.Action == ActRelease && in.Status.State != settled {
			t.Errorf("%s: released within the settle time", name)
		}
	}
	if in.Obs.Submit && in.Obs.PriorLastSubmission == hooksv1alpha1.SubmissionMaybeReceived && d.DeadLetter {
		t.Errorf("%s: dead-lettered while an earlier attempt may still be processed", name)
	}
	if in.Caps.NoDeduplication && d.Action == ActSubmit && (exp != none || d.Exposure != none) &&
		!(in.Obs.Kind == ObsUnanswerable && !in.Obs.Submit && in.Status.FirstSubmittedAt == nil && (in.NeverPresented || in.Obs.RepeatHarmless)) {
		// Without deduplication a resend is new usage: only the facts (nothing ever
		// presented the key) or a harmless repeat may send with money possibly there.
		t.Errorf("%s: resends to a provider that does not deduplicate while an attempt may have reached it", name)
	}
	if in.Caps.NoDeduplication && in.Obs.Kind == ObsNotFound && exp == possible && d.Exposure == none {
		t.Errorf("%s: a listing that does not show the request lowered exposure at a provider that does not deduplicate", name)
	}
	if d.Action == ActSubmit && in.Deleting {
		t.Errorf("%s: submits while deleting", name)
	}
	if d.Action == ActRelease && (exp == possible || (exp == confirmed && in.Status.State != settled)) {
		t.Errorf("%s: releases the finalizer while money may be at the provider", name)
	}
	if (in.Obs.Kind == ObsAmbiguous || in.Obs.Kind == ObsInFlight) && in.Obs.Submit && d.Exposure != possible {
		t.Errorf("%s: an ambiguous submission leaves exposure %s", name, d.Exposure)
	}
	if in.Obs.Kind == ObsNone && d.Exposure != exp {
		t.Errorf("%s: exposure changed from %s to %s without a provider answer", name, exp, d.Exposure)
	}
	if in.Obs.Kind != ObsNone && in.Obs.Kind != ObsRecord && in.Obs.Kind != ObsNotFound && !in.Obs.Submit && d.Exposure != exp {
		t.Errorf("%s: a failed lookup changed exposure from %s to %s", name, exp, d.Exposure)
	}
	if d.Exposure == none && exp != none && in.Obs.Kind != ObsNotFound &&
		!(in.Obs.Kind == ObsRecord && in.Obs.Status == billing.StatusFailed) &&
		!(in.Obs.Submit && (in.Obs.Kind == ObsTransient || in.Obs.Kind == ObsTerminal)) {
		t.Errorf("%s: exposure lowered to None without an authoritative answer", name)
	}
	if d.Action == ActWait && d.Wait <= 0 {
		t.Errorf("%s: waits %s", name, d.Wait)
	}
	if d.Wait > maxRetryAfterFactor*policy.Max+time.Minute {
		t.Errorf("%s: waits %s, beyond any cap", name, d.Wait)
	}
}

// decisionRow is one pinned step: from status st (and what in sets), the action,
// State, exposure, wait and dead letter expected.
type decisionRow struct {
	name   string
	st     hooksv1alpha1.BillingSettlementStatus
	in     func(*Input)
	action Action
	state  S
	exp    E
	wait   time.Duration
	dl     bool
	// reason, when set, is the Ready reason expected.
	reason string
}

// TestDecisionTable pins the step for the pairs that matter, one row each.
func TestDecisionTable(t *testing.T) {
	at := func(d time.Duration) *metav1.Time { v := metav1.NewTime(t0.Add(d)); return &v }
	rows := []decisionRow{
		{name: "fresh settlement is sent directly", st: hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: none},
			action: ActSubmit, state: pending, exp: none},
		{name: "possibly sent before: look up first", st: hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			action: ActLookup, state: pending, exp: possible},
		{name: "legacy object without exposure looks up", st: hooksv1alpha1.BillingSettlementStatus{State: pending},
			action: ActLookup, state: pending, exp: possible},
		{name: "lookup not found: resend (continue)", st: hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			in: func(in *Input) { in.Obs = Observation{Kind: ObsNotFound} }, action: ActContinue, state: pending, exp: none},
		{name: "failed lookup backs off, never submits (defect 2)", st: hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible, Failures: 2},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsTerminal, Message: "403"} },
			action: ActWait, state: pending, exp: possible, wait: 4*time.Second - 400*time.Millisecond},
		{name: "backoff grows with failed lookups (defect 12)", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Failures: 6, Attempts: 1},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsTransient} },
			action: ActWait, state: submitted, exp: possible, wait: time.Minute - 6*time.Second},
		{name: "Retry-After is honoured", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: none, Attempts: 1},
			in: func(in *Input) {
				in.Obs = Observation{Kind: ObsTransient, Submit: true, PriorExposure: none, RetryAfter: 30 * time.Second}
			},
			action: ActWait, state: submitted, exp: none, wait: 30 * time.Second},
		{name: "Retry-After is capped at 2 x maxBackoff", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: none, Attempts: 1},
			in: func(in *Input) {
				in.Obs = Observation{Kind: ObsTransient, Submit: true, PriorExposure: none, RetryAfter: 24 * time.Hour}
			},
			action: ActWait, state: submitted, exp: none, wait: 2 * time.Minute},
		{name: "429 restores None: resend directly later", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsTransient, Submit: true, PriorExposure: none} },
			action: ActWait, state: submitted, exp: none, wait: time.Second - 100*time.Millisecond},
		{name: "crash after 429: exposure Possible persisted, look up (defect 9)", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 2,
			LastError: &hooksv1alpha1.SettlementError{Class: errorClassTransient}},
			action: ActLookup, state: submitted, exp: possible},
		{name: "ambiguous submission raises Possible", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsAmbiguous, Submit: true, PriorExposure: none} },
			action: ActWait, state: submitted, exp: possible, wait: time.Second - 100*time.Millisecond},
		{name: "409 in use after a lookup said not found: Possible, never dead-letter (defect 1)", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 5},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsInFlight, Submit: true, PriorExposure: none} },
			action: ActWait, state: submitted, exp: possible, wait: 900 * time.Millisecond},
		{name: "budget spent with None after a lookup's not found, but the last POST may still commit: ask by resending (defect 1)",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: none, Attempts: 5, LastSubmission: hooksv1alpha1.SubmissionMaybeReceived},
			action: ActSubmit, state: submitted, exp: none},
		{name: "404 right after a timeout: exposure stays Possible, resend with the same key (review 1/2)",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-3 * time.Second),
				LastAttemptAt: at(-3 * time.Second), LastSubmission: hooksv1alpha1.SubmissionMaybeReceived},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsNotFound} },
			action: ActSubmit, state: submitted, exp: possible},
		{name: "404 right after a timeout while deleting: wait for the settle time, never release",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-3 * time.Second),
				LastAttemptAt: at(-3 * time.Second), LastSubmission: hooksv1alpha1.SubmissionMaybeReceived},
			in:     func(in *Input) { in.Deleting, in.Obs = true, Observation{Kind: ObsNotFound} },
			action: ActWait, state: submitted, exp: possible, wait: 27 * time.Second},
		{name: "404 after the settle time: None, and the earlier attempt is resolved",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-time.Minute),
				LastAttemptAt: at(-time.Minute), LastSubmission: hooksv1alpha1.SubmissionMaybeReceived},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsNotFound} },
			action: ActContinue, state: submitted, exp: none},
		{name: "429 to the resend after a timeout: the earlier attempt stays unresolved, no dead letter (review 2)",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 5, LastSubmission: hooksv1alpha1.SubmissionMaybeReceived},
			in: func(in *Input) {
				in.Obs = Observation{Kind: ObsTransient, Submit: true, PriorExposure: possible, PriorLastSubmission: hooksv1alpha1.SubmissionMaybeReceived}
			},
			action: ActWait, state: submitted, exp: possible, wait: 900 * time.Millisecond},
		{name: "None, last attempt older than the key window: look up before resending",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: none, Attempts: 1, LastAttemptAt: at(-25 * time.Hour)},
			action: ActLookup, state: submitted, exp: none},
		{name: "budget spent with None: dead-letter", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: none, Attempts: 5},
			action: ActDone, state: failed, exp: none, dl: true},
		{name: "budget spent with Possible: keep asking (defect 1)", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 5,
			FirstSubmittedAt: at(-2 * time.Hour)},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsTransient} },
			action: ActWait, state: submitted, exp: possible, wait: 900 * time.Millisecond},
		{name: "pending past the budget, poll fails: keep polling (defect 1)", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: confirmed, Attempts: 1,
			FirstSubmittedAt: at(-2 * time.Hour), ProviderStatus: billing.StatusPending},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsAmbiguous} },
			action: ActWait, state: submitted, exp: confirmed, wait: 900 * time.Millisecond},
		{name: "pending record: poll later", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-10 * time.Second)},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsRecord, Status: billing.StatusPending} },
			action: ActWait, state: submitted, exp: confirmed, wait: 5 * time.Second},
		{name: "settled record: adopt", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsRecord, Status: billing.StatusSettled} },
			action: ActContinue, state: settled, exp: confirmed},
		{name: "provider failed: Failed, not dead-lettered, nothing moved", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsRecord, Status: billing.StatusFailed} },
			action: ActContinue, state: failed, exp: none},
		{name: "record lacking a field is not adopted (defect 5)", st: hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			in: func(in *Input) {
				in.Obs = Observation{Kind: ObsRecord, Status: billing.StatusSettled, Mismatch: &billing.Mismatch{Field: "amount", Missing: true}}
			},
			action: ActDone, state: rr, exp: possible},
		{name: "after a disagreement a matching lookup is still not adopted", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1,
			Disagreement: &hooksv1alpha1.ProviderDisagreement{Reason: hooksv1alpha1.ReasonKeyReused}},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsRecord, Status: billing.StatusSettled} },
			action: ActDone, state: rr, exp: possible},
		{name: "key reused: RequiresReconciliation, exposure Possible", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsKeyReused, Submit: true, PriorExposure: none} },
			action: ActDone, state: rr, exp: possible},
		{name: "terminal refusal with None: dead-letter", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsTerminal, Submit: true, PriorExposure: none} },
			action: ActDone, state: failed, exp: none, dl: true},
		{name: "terminal refusal after an ambiguous attempt: ask, do not dead-letter", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 2},
			in: func(in *Input) {
				in.Obs = Observation{Kind: ObsTerminal, Submit: true, PriorExposure: possible}
			},
			action: ActWait, state: submitted, exp: possible, wait: 900 * time.Millisecond},
		{name: "pending record vanished: RequiresReconciliation", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: confirmed, Attempts: 1},
			in:     func(in *Input) { in.Obs = Observation{Kind: ObsNotFound} },
			action: ActDone, state: rr, exp: confirmed},
		{name: "waiting: nothing before nextAttemptAt", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, NextAttemptAt: at(7 * time.Second)},
			action: ActWait, state: submitted, exp: possible, wait: 7 * time.Second},
		{name: "provider changed while Possible: hold (defect 6)", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1},
			in: func(in *Input) { in.ProviderChanged = true }, action: ActHold, state: submitted, exp: possible, wait: time.Minute},
		{name: "provider changed with None: send to the new one", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: none, Attempts: 1},
			in: func(in *Input) { in.ProviderChanged = true }, action: ActSubmit, state: submitted, exp: none},
		{name: "deleting with Possible: ask, never release", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1},
			in: func(in *Input) { in.Deleting = true }, action: ActLookup, state: submitted, exp: possible},
		{name: "deleting with None: release", st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: none, Attempts: 1},
			in: func(in *Input) { in.Deleting = true }, action: ActRelease, state: submitted, exp: none},
		{name: "deleting settled: release", st: hooksv1alpha1.BillingSettlementStatus{State: settled, Exposure: confirmed, Attempts: 1},
			in: func(in *Input) { in.Deleting = true }, action: ActRelease, state: settled, exp: confirmed},
		{name: "legacy dead-lettered pending charge resumes polling", st: hooksv1alpha1.BillingSettlementStatus{State: failed, Attempts: 1, ProviderStatus: billing.StatusPending},
			action: ActLookup, state: submitted, exp: confirmed},
		{name: "reconcile request asks a failed settlement by key", st: hooksv1alpha1.BillingSettlementStatus{State: failed, Exposure: none, Attempts: 3},
			in: func(in *Input) { in.ForceLookup = true }, action: ActLookup, state: failed, exp: none},
		{name: "final states do nothing", st: hooksv1alpha1.BillingSettlementStatus{State: settled, Exposure: confirmed, Attempts: 1},
			action: ActDone, state: settled, exp: confirmed},
	}
	unanswerable := func(submit bool) func(*Input) {
		return func(in *Input) {
			in.Obs = Observation{Kind: ObsUnanswerable, Submit: submit, PriorExposure: possible, Message: "check the dashboard"}
		}
	}
	rows = append(rows, []decisionRow{
		{name: "money may be at a provider that cannot be asked, inside its window: the resend is the lookup",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-10 * time.Minute),
				LastSubmission: hooksv1alpha1.SubmissionMaybeReceived},
			in: func(in *Input) {
				in.Caps = billing.Capabilities{Lookup: billing.LookupNone, Window: 24 * time.Hour, ResendIsProof: true}
			},
			action: ActSubmit, state: submitted, exp: possible},
		{name: "money may be at a provider that can be asked by key: asked first, never resent blind",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-10 * time.Minute),
				LastSubmission: hooksv1alpha1.SubmissionMaybeReceived},
			in:     func(in *Input) { in.Caps = billing.Capabilities{Lookup: billing.LookupByKey} },
			action: ActLookup, state: submitted, exp: possible},
		{name: "money may be at a provider whose resend proves nothing (a cancellation): asked first",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-10 * time.Minute)},
			in:     func(in *Input) { in.Caps = billing.Capabilities{Lookup: billing.LookupNone, Window: 24 * time.Hour} },
			action: ActLookup, state: submitted, exp: possible},
		{name: "a record that never sent, at a provider that cannot be asked: asked, never resent blind",
			st: hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			in: func(in *Input) {
				in.Caps = billing.Capabilities{Lookup: billing.LookupNone, Window: 24 * time.Hour, ResendIsProof: true}
			},
			action: ActLookup, state: pending, exp: possible},
		{name: "past the window at a provider that cannot be asked: asked (and, unanswered, a human), never resent",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-25 * time.Hour),
				Replay: &hooksv1alpha1.ReplayStatus{LastAt: at(-time.Minute), AttemptsBefore: 1}},
			in: func(in *Input) {
				in.Caps = billing.Capabilities{Lookup: billing.LookupNone, Window: 24 * time.Hour, ResendIsProof: true}
			},
			action: ActLookup, state: submitted, exp: possible},
		{name: "unanswerable lookup for a record the facts say was never presented: sent, the facts answer",
			st:     hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			in:     func(in *Input) { unanswerable(false)(in); in.NeverPresented = true },
			action: ActSubmit, state: pending, exp: possible},
		{name: "unanswerable lookup inside the key window: resend under the same key",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-10 * time.Minute)},
			in:     unanswerable(false),
			action: ActSubmit, state: submitted, exp: possible},
		{name: "unanswerable lookup with the retry budget spent: RequiresReconciliation, not a day of resends",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 5, FirstSubmittedAt: at(-10 * time.Minute)},
			in:     unanswerable(false),
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable lookup for a record that never sent (a compensation, a hand-made charge): RequiresReconciliation",
			st:     hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			in:     unanswerable(false),
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable lookup of a cancellation this record never sent: sent, as cancelling twice cancels once",
			st:     hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			in:     func(in *Input) { unanswerable(false)(in); in.Obs.RepeatHarmless = true },
			action: ActSubmit, state: pending, exp: possible},
		{name: "unanswerable lookup of a cancellation whose only submission was refused: RequiresReconciliation",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-time.Minute),
				LastSubmission: hooksv1alpha1.SubmissionRefused},
			in:     func(in *Input) { unanswerable(false)(in); in.Obs.RepeatHarmless = true },
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable lookup of a cancellation never sent, while deleting: RequiresReconciliation, nothing sent",
			st:     hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			in:     func(in *Input) { unanswerable(false)(in); in.Obs.RepeatHarmless = true; in.Deleting = true },
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable lookup of a settlement already in RequiresReconciliation keeps its reason",
			st: hooksv1alpha1.BillingSettlementStatus{State: rr, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-10 * time.Minute),
				Disagreement: &hooksv1alpha1.ProviderDisagreement{Reason: hooksv1alpha1.ReasonKeyReused}},
			in:     func(in *Input) { unanswerable(false)(in); in.ForceLookup = true },
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable lookup within a minute of the window's end: RequiresReconciliation",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-24*time.Hour + 30*time.Second)},
			in:     unanswerable(false),
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable lookup past the key window: RequiresReconciliation, nothing sent",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 3, FirstSubmittedAt: at(-25 * time.Hour)},
			in:     unanswerable(false),
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable lookup while deleting: RequiresReconciliation, the deletion waits",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-time.Hour)},
			in:     func(in *Input) { unanswerable(false)(in); in.Deleting = true },
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable answer to a submission (a resent delete): RequiresReconciliation",
			st:     hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 2, FirstSubmittedAt: at(-time.Hour)},
			in:     unanswerable(true),
			action: ActDone, state: rr, exp: possible},
		{name: "unanswerable lookup of a settled settlement leaves it settled",
			st:     hooksv1alpha1.BillingSettlementStatus{State: settled, Exposure: confirmed, Attempts: 1, FirstSubmittedAt: at(-time.Hour)},
			in:     unanswerable(false),
			action: ActDone, state: settled, exp: confirmed},
		{name: "unanswerable lookup with nothing moved changes nothing",
			st:     hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: none},
			in:     unanswerable(false),
			action: ActContinue, state: pending, exp: none},
	}...)
	notListed := func(in *Input) {
		in.Caps = noDedup
		in.Obs = Observation{Kind: ObsUnanswerable, PriorExposure: possible, Message: "not listed"}
	}
	maybeAt := func(ago time.Duration) hooksv1alpha1.BillingSettlementStatus {
		return hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: possible, Attempts: 1, FirstSubmittedAt: at(-ago),
			LastAttemptAt: at(-ago), LastSubmission: hooksv1alpha1.SubmissionMaybeReceived}
	}
	rows = append(rows, []decisionRow{
		{name: "no deduplication: money may be there, so it is listed, never resent",
			st: maybeAt(time.Minute), in: func(in *Input) { in.Caps = noDedup },
			action: ActLookup, state: submitted, exp: possible},
		{name: "no deduplication: not listed within the settle time: listed again after it, never resent",
			st: maybeAt(5 * time.Second), in: notListed,
			action: ActWait, state: submitted, exp: possible, wait: 25 * time.Second, reason: hooksv1alpha1.ReasonOutcomeUnknown},
		{name: "no deduplication: not listed after the settle time: RequiresReconciliation, never resent",
			st: maybeAt(10 * time.Minute), in: notListed,
			action: ActDone, state: rr, exp: possible, reason: hooksv1alpha1.ReasonNotDeduplicated},
		{name: "no deduplication: a listing's not-found is no proof of absence",
			st: maybeAt(10 * time.Minute), in: func(in *Input) { in.Caps = noDedup; in.Obs = Observation{Kind: ObsNotFound} },
			action: ActDone, state: rr, exp: possible, reason: hooksv1alpha1.ReasonNotDeduplicated},
		{name: "no deduplication: a listing's not-found within the settle time waits, never resends",
			st: maybeAt(5 * time.Second), in: func(in *Input) { in.Caps = noDedup; in.Obs = Observation{Kind: ObsNotFound} },
			action: ActWait, state: submitted, exp: possible, wait: 25 * time.Second},
		{name: "no deduplication: listed and matching: adopted",
			st: maybeAt(10 * time.Minute), in: func(in *Input) {
				in.Caps = noDedup
				in.Obs = Observation{Kind: ObsRecord, Status: billing.StatusSettled}
			},
			action: ActContinue, state: settled, exp: confirmed},
		{name: "no deduplication: a reconcile request that finds it listed adopts it out of RequiresReconciliation",
			st: func() hooksv1alpha1.BillingSettlementStatus { st := maybeAt(time.Hour); st.State = rr; return st }(),
			in: func(in *Input) {
				in.Caps, in.ForceLookup = noDedup, true
				in.Obs = Observation{Kind: ObsRecord, Status: billing.StatusSettled}
			},
			action: ActContinue, state: settled, exp: confirmed},
		{name: "no deduplication: nothing was there (a 429 before): the lookup's not-listed leaves it to be sent",
			st: hooksv1alpha1.BillingSettlementStatus{State: submitted, Exposure: none, Attempts: 1, FirstSubmittedAt: at(-time.Minute),
				LastAttemptAt: at(-time.Minute), LastSubmission: hooksv1alpha1.SubmissionNotReceived},
			in: notListed, action: ActContinue, state: submitted, exp: none},
		{name: "no deduplication: the facts say the key was never presented: sent",
			st:     hooksv1alpha1.BillingSettlementStatus{State: pending, Exposure: possible},
			in:     func(in *Input) { notListed(in); in.NeverPresented = true },
			action: ActSubmit, state: pending, exp: possible},
		{name: "deduplication for an hour: not listed inside it: the resend under the same id is the answer",
			st: maybeAt(10 * time.Minute), in: func(in *Input) {
				notListed(in)
				in.Caps = billing.Capabilities{Lookup: billing.LookupByListing, Window: time.Hour, ResendIsProof: true}
				in.Policy.KeyWindow = time.Hour
			},
			action: ActSubmit, state: submitted, exp: possible},
	}...)
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			st := row.st
			in := Input{Status: &st, Policy: policy, Now: t0, Random: 0.5}
			if row.in != nil {
				row.in(&in)
			}
			d := Decide(in)
			if d.Action != row.action || d.State != row.state || d.Exposure != row.exp || d.DeadLetter != row.dl {
				t.Fatalf("got action %s state %s exposure %s deadLetter %v, want %s %s %s %v (%s)",
					d.Action, d.State, d.Exposure, d.DeadLetter, row.action, row.state, row.exp, row.dl, d.Message)
			}
			if row.wait != 0 && d.Wait != row.wait {
				t.Fatalf("wait %s, want %s", d.Wait, row.wait)
			}
			if row.reason != "" && d.Reason != row.reason {
				t.Fatalf("reason %s, want %s (%s)", d.Reason, row.reason, d.Message)
			}
			checkInvariants(t, row.name, in, d)
		})
	}
}

// TestRetryWaitJittersDownward: a wait is never above its exponential value, also at
// the cap, and spreads below it.
func TestRetryWaitJittersDownward(t *testing.T) {
	for n := int32(1); n < 20; n++ {
		top := exponential(n, policy.Initial, policy.Max)
		if got := RetryWait(n, policy, 0, 0); got != top {
			t.Fatalf("failures %d random 0: %s, want %s", n, got, top)
		}
		if got := RetryWait(n, policy, 0, 0.999); got >= top || got < top*8/10 {
			t.Fatalf("failures %d random 0.999: %s not in [0.8, 1) x %s", n, got, top)
		}
	}
}

// TestPolicyOfDefaultsTheBudgetToTheKeyWindow: unless a BillingProvider sets them, the
// retry budget lasts as long as a resend under the key is safe — the shorter of the
// spec's and the provider's window, less the margins — with no cap on attempts; what
// the spec sets wins.
func TestPolicyOfDefaultsTheBudgetToTheKeyWindow(t *testing.T) {
	bp := func(window time.Duration, retry *hooksv1alpha1.RetryPolicy) *hooksv1alpha1.BillingProvider {
		return &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{
			IdempotencyWindow: &metav1.Duration{Duration: window}, RequestTimeout: &metav1.Duration{Duration: 10 * time.Second},
			Retry: retry}}
	}
	stripe := billing.Capabilities{Lookup: billing.LookupNone, Window: 24 * time.Hour, ResendIsProof: true}
	for _, c := range []struct {
		name               string
		bp                 *hooksv1alpha1.BillingProvider
		caps               billing.Capabilities
		window, maxElapsed time.Duration
		maxAttempts        int32
	}{
		{"HTTP, 24h window", bp(24*time.Hour, nil), billing.Capabilities{}, 24 * time.Hour, 24*time.Hour - time.Minute - 20*time.Second, 0},
		{"Stripe caps a longer spec window", bp(48*time.Hour, &hooksv1alpha1.RetryPolicy{}), stripe, 24 * time.Hour,
			24*time.Hour - time.Minute - 20*time.Second, 0},
		{"a 1h spec window", bp(time.Hour, nil), stripe, time.Hour, time.Hour - time.Minute - 20*time.Second, 0},
		{"a window shorter than its margins", bp(time.Minute, nil), billing.Capabilities{}, time.Minute, time.Minute, 0},
		{"no deduplication: no key window, the spec's window still sets the budget", bp(24*time.Hour, nil),
			billing.Capabilities{Lookup: billing.LookupByListing, NoDeduplication: true}, 0, 24*time.Hour - time.Minute - 20*time.Second, 0},
		{"set in the spec", bp(24*time.Hour, &hooksv1alpha1.RetryPolicy{MaxAttempts: 7, MaxElapsed: &metav1.Duration{Duration: 2 * time.Hour}}),
			stripe, 24 * time.Hour, 2 * time.Hour, 7},
	} {
		p := PolicyOf(c.bp, c.caps)
		if p.KeyWindow != c.window || p.MaxElapsed != c.maxElapsed || p.MaxAttempts != c.maxAttempts {
			t.Errorf("%s: window %s, maxElapsed %s, maxAttempts %d; want %s, %s, %d", c.name, p.KeyWindow, p.MaxElapsed, p.MaxAttempts,
				c.window, c.maxElapsed, c.maxAttempts)
		}
		if c.maxAttempts == 0 {
			st := &hooksv1alpha1.BillingSettlementStatus{Attempts: 500, FirstSubmittedAt: &metav1.Time{Time: t0.Add(-10 * time.Minute)}}
			if spent, why := budgetSpent(st, p, t0); spent && c.maxElapsed > 10*time.Minute {
				t.Errorf("%s: 500 attempts in 10 minutes spent an uncapped budget: %s", c.name, why)
			}
		}
	}
}
