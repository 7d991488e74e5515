package billingsettlement

import (
	"github.com/settlement-operator/settlement-operator/internal/index"

	"github.com/settlement-operator/settlement-operator/internal/archivelookup"

	"github.com/settlement-operator/settlement-operator/internal/metrics"

	"github.com/settlement-operator/settlement-operator/internal/providerclient"

	"github.com/settlement-operator/settlement-operator/internal/credentials"

	"github.com/settlement-operator/settlement-operator/internal/settlement"

	"github.com/settlement-operator/settlement-operator/internal/statuspatch"

	"github.com/settlement-operator/settlement-operator/internal/conditions"

	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/keyedsem"
)

// The phases of a settlement reconcile, in the order Reconcile runs them. Each reads
// and changes s.bs.Status in memory; the deferred patch writes it once.

// freshWindow bounds how far apart a settlement and its job's JobCompletion may have
// been created for the settlement to count as created in the same dispatch.
const freshWindow = time.Minute

// waitForReference is how long a settlement waits before looking again for an
// object it needs (its BillingProvider, the settlement it reverses).
const waitForReference = 30 * time.Second

// observeGeneration stamps the generation and gives a new settlement its first state.
func (r *Reconciler) observeGeneration(_ context.Context, s *settlementScope) (ctrl.Result, error) {
	bs, st := s.bs, &s.bs.Status
	st.ObservedGeneration = bs.Generation
	if st.Charge == "" { // rides along with the first status write: no write of its own
		st.Charge = chargeDisplay(&bs.Spec)
	}
	if st.State == "" {
		st.State = hooksv1alpha1.SettlementPending
		r.cond(bs, hooksv1alpha1.ConditionSubmitted, metav1.ConditionFalse, hooksv1alpha1.ReasonAwaitingSubmission, "not sent to the provider yet")
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonAwaitingSubmission, "not sent to the provider yet")
	}
	return ctrl.Result{}, nil
}

// checkIdentity refuses a settlement whose name or idempotency key is not the one
// derived from its settlement key (and namespace): sending it could charge under
// another operation's or another tenant's key. One never sent is Failed with reason
// InvalidIdentity and nothing is sent; its spec is immutable, so the fix is a
// correctly made settlement. One an older operator already sent keeps being resolved
// by lookups only (money may be at the provider), with a Warning.
func (r *Reconciler) checkIdentity(_ context.Context, s *settlementScope) (ctrl.Result, error) {
	bs, st := s.bs, &s.bs.Status
	err := settlement.ValidateIdentity(bs)
	if err == nil {
		return ctrl.Result{}, nil
	}
	msg := conditions.TruncateMessage(err.Error())
	if st.Attempts > 0 || st.FirstSubmittedAt != nil {
		if c := findCondition(bs, hooksv1alpha1.ConditionReady); c == nil || c.Reason != hooksv1alpha1.ReasonInvalidIdentity {
			r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonInvalidIdentity, "Validate", "%s", msg)
		}
		s.lookupOnly = msg // resolved by lookups only, never sent again
		return ctrl.Result{}, nil
	}
	if st.State != hooksv1alpha1.SettlementFailed {
		r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonInvalidIdentity, "Validate", "%s", msg)
	}
	st.State, st.Exposure = hooksv1alpha1.SettlementFailed, hooksv1alpha1.ExposureNone
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonInvalidIdentity,
		msg+"; nothing was sent: create a settlement whose name and keys are derived from its settlement key (kubectl explain billingsettlement.spec.idempotencyKey)")
	return ctrl.Result{}, reconcile.TerminalError(err)
}

// checkArchive refuses a settlement whose name, settlement key or idempotency key the
// archive already holds under another object (docs/design.md §12): that operation was
// carried out — or decided — before and left the cluster, so this one is never sent,
// even when the provider has forgotten the key by now. It is asked only before this
// object's first submission: one that was sent is the live record of its key. It is
// Failed with reason ArchivedDuplicate and exposure None (this object moved nothing;
// the archived record accounts for its key), kept for review, and may be deleted.
// While the archive does not answer, nothing is sent: the settlement waits.
func (r *Reconciler) checkArchive(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	bs, st := s.bs, &s.bs.Status
	if r.Archive == nil {
		return ctrl.Result{}, nil
	}
	if archivedDuplicate(bs) {
		return ctrl.Result{}, reconcile.TerminalError(errors.New("the archive holds this settlement's key"))
	}
	if st.Attempts > 0 || st.FirstSubmittedAt != nil || st.SentTo != nil ||
		(st.State != hooksv1alpha1.SettlementPending && st.State != "") {
		return ctrl.Result{}, nil
	}
	prior, err := archivelookup.Operation(ctx, r.Archive, bs)
	if err != nil {
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonArchiveUnavailable,
			"waiting for the archive: it must say whether this key was charged before anything is sent")
		return ctrl.Result{RequeueAfter: archivelookup.RetryInterval}, nil
	}
	if prior == nil || prior.UID == bs.UID {
		return ctrl.Result{}, nil
	}
	msg := fmt.Sprintf("the archive already holds settlement %s (%s, provider reference %q) with this name or key; nothing is sent for this one",
		prior.Name, settlement.StateOrNew(prior.Status.State), prior.Status.ProviderRef)
	r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonArchivedDuplicate, "Validate", "%s", msg)
	st.State, st.Exposure = hooksv1alpha1.SettlementFailed, hooksv1alpha1.ExposureNone
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonArchivedDuplicate,
		msg+": find it with `kubectl settlement archive get "+bs.Spec.IdempotencyKey+"`; delete this one when reviewed")
	return ctrl.Result{}, reconcile.TerminalError(errors.New(msg))
}

// archivedDuplicate reports whether checkArchive refused bs.
func archivedDuplicate(bs *hooksv1alpha1.BillingSettlement) bool {
	c := findCondition(bs, hooksv1alpha1.ConditionReady)
	return bs.Status.State == hooksv1alpha1.SettlementFailed && c != nil && c.Reason == hooksv1alpha1.ReasonArchivedDuplicate
}

// initExposure gives a settlement its first exposure. Only a settlement the operator
// created together with its job's first JobCompletion — a job never seen before, so
// nothing can have been sent under the key — starts at None and is sent directly.
// Anything else (created again by hand or by a runbook, by a redelivery after its
// Record was deleted, or written by an older operator) starts at Possible: the
// provider must answer a lookup by key before the first submission.
func (r *Reconciler) initExposure(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	st := &s.bs.Status
	if st.Exposure != "" {
		return ctrl.Result{}, nil
	}
	if st.FirstSubmittedAt != nil || st.OutcomeUnknown || st.State != hooksv1alpha1.SettlementPending {
		st.Exposure = settlement.EffectiveExposure(st) // written by an older operator
		return ctrl.Result{}, nil
	}
	fresh, err := r.createdWithItsJob(ctx, s.bs)
	if err != nil {
		return ctrl.Result{}, err
	}
	st.Exposure = hooksv1alpha1.ExposurePossible
	if fresh {
		st.Exposure = hooksv1alpha1.ExposureNone
	}
	return ctrl.Result{}, nil
}

// createdWithItsJob checks the fresh-for-job annotation against the JobCompletion it
// names: same UID, same job, created within freshWindow of the settlement, and the
// settlement's key is that job's default key. A copied annotation on a settlement
// created again later fails the time check.
func (r *Reconciler) createdWithItsJob(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) (bool, error) {
	v := bs.Annotations[hooksv1alpha1.AnnotationFreshForJob]
	name, uid, ok := strings.Cut(v, "/")
	if !ok || bs.Spec.JobID == "" || bs.Spec.WebhookProvider == "" ||
		bs.Spec.SettlementKey != identity.JobSettlementKey(bs.Namespace, bs.Spec.WebhookProvider, bs.Spec.JobID) {
		return false, nil
	}
	var jc hooksv1alpha1.JobCompletion
	if err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: name}, &jc); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("get jobcompletion %s: %w", name, err)
	}
	apart := bs.CreationTimestamp.Sub(jc.CreationTimestamp.Time)
	return string(jc.UID) == uid && jc.Spec.JobID == bs.Spec.JobID && apart >= -freshWindow && apart <= freshWindow, nil
}

// handleReplay acts on a new value of the replay annotation: a Failed or
// RequiresReconciliation settlement resumes through the normal path with the same key
// and a fresh retry budget; exposure is kept, so one that may have charged is asked by
// key first. Any other state only records that nothing was to do.
func (r *Reconciler) handleReplay(_ context.Context, s *settlementScope) (ctrl.Result, error) {
	bs := s.bs
	token := settlement.TruncateToken(bs.Annotations[hooksv1alpha1.AnnotationReplay])
	if token == "" || (bs.Status.Replay != nil && bs.Status.Replay.LastToken == token) {
		return ctrl.Result{}, nil
	}
	st := &bs.Status
	if st.Replay == nil {
		st.Replay = &hooksv1alpha1.ReplayStatus{}
	}
	st.Replay.LastToken = token
	switch st.State {
	case hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation:
	default:
		r.Recorder.Eventf(bs, nil, corev1.EventTypeNormal, hooksv1alpha1.ReasonReplayed, "Replay",
			"replay %q ignored: the settlement is %s, not Failed or RequiresReconciliation", token, st.State)
		return ctrl.Result{}, nil
	}
	now := metav1.NewTime(s.now)
	st.Replay.Count++
	st.Replay.LastAt = &now
	st.Replay.AttemptsBefore = st.Attempts
	from := st.State
	st.State = hooksv1alpha1.SettlementPending
	if st.FirstSubmittedAt != nil {
		st.State = hooksv1alpha1.SettlementSubmitted
	}
	st.LastError, st.NextAttemptAt, st.Failures = nil, nil, 0
	r.cond(bs, hooksv1alpha1.ConditionDeadLettered, metav1.ConditionFalse, hooksv1alpha1.ReasonReplayed,
		fmt.Sprintf("replay %q resumed it from %s with the same idempotency key", token, from))
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonReplayed,
		"replayed with the same key (exposure "+string(settlement.EffectiveExposure(st))+")")
	r.Recorder.Eventf(bs, nil, corev1.EventTypeNormal, hooksv1alpha1.ReasonReplayed, "Replay",
		"replay %q: resuming from %s with key %s", token, from, bs.Spec.IdempotencyKey)
	return ctrl.Result{}, nil
}

// handleReconcileRequest notes a new reconcile-request annotation (set by a
// reconciliation pass or a user): the settlement asks its provider by key now,
// whatever its state or backoff, and adopts a final answer that is provably its own.
// The token is recorded once the provider answered (see drive).
func (r *Reconciler) handleReconcileRequest(_ context.Context, s *settlementScope) (ctrl.Result, error) {
	st := &s.bs.Status
	token := settlement.TruncateToken(s.bs.Annotations[hooksv1alpha1.AnnotationReconcileRequest])
	if token == "" || token == st.ReconcileRequest {
		return ctrl.Result{}, nil
	}
	if st.State == hooksv1alpha1.SettlementSettled {
		st.ReconcileRequest = token
		return ctrl.Result{}, nil
	}
	s.forceLookup, s.reconcileToken = true, token
	return ctrl.Result{}, nil
}

// updateReversedBy lists the compensations that reverse this settlement.
func (r *Reconciler) updateReversedBy(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	var l hooksv1alpha1.BillingSettlementList
	if err := r.List(ctx, &l, client.InNamespace(s.bs.Namespace), client.MatchingFields{index.SettlementReverses: s.bs.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list compensations of %s: %w", s.bs.Name, err)
	}
	var names []string
	for _, c := range l.Items {
		if len(names) < 16 {
			names = append(names, c.Name)
		}
	}
	s.bs.Status.ReversedBy = names
	return ctrl.Result{}, nil
}

// resolveProvider loads the BillingProvider, a client for it, its retry policy and
// where it points now.
func (r *Reconciler) resolveProvider(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	bs := s.bs
	var bp hooksv1alpha1.BillingProvider
	err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.BillingProviderRef}, &bp)
	if apierrors.IsNotFound(err) {
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonBillingProviderNotReady,
			fmt.Sprintf("BillingProvider %q not found; waiting for it", bs.Spec.BillingProviderRef))
		return ctrl.Result{RequeueAfter: waitForReference}, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("get billingprovider %s: %w", bs.Spec.BillingProviderRef, err)
	}
	s.provider, s.policy, s.target = &bp, settlement.PolicyOf(&bp), providerclient.TargetOf(&bp)
	c, err := r.clients.Get(ctx, r.APIReader, r.NewClient, &bp, r.Health)
	if err != nil {
		// A wait, never a failure: nothing was sent, and a settlement that may already
		// hold money keeps its exposure until the credentials are usable again.
		reason, wait := hooksv1alpha1.ReasonBillingProviderNotReady, waitForReference
		if credentials.IsRefused(err) {
			reason, wait = hooksv1alpha1.ReasonCredentialsNotAllowed, r.credentialRecheck()
		}
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, reason, conditions.TruncateMessage(err.Error()))
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	s.client = c
	s.target = providerclient.TargetFor(&bp, c)
	// The original's key travels in every request and every comparison.
	if s.reverses, s.reversesRef, err = archivelookup.ReversedKey(ctx, r.Client, r.Archive, bs); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// resolveProviderIfHeld resolves the provider for a settlement being deleted only if
// money may be at the provider: one that holds nothing may go without it.
func (r *Reconciler) resolveProviderIfHeld(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	if !settlement.HoldsMoney(&s.bs.Status) {
		return ctrl.Result{}, nil
	}
	res, err := r.resolveProvider(ctx, s)
	if !res.IsZero() {
		why := "the BillingProvider or its credentials are missing"
		if c := findCondition(s.bs, hooksv1alpha1.ConditionReady); c != nil &&
			(c.Reason == hooksv1alpha1.ReasonBillingProviderNotReady || c.Reason == hooksv1alpha1.ReasonCredentialsNotAllowed) {
			why = c.Message // names the missing provider or Secret
		}
		r.holdDeletion(s, why)
	}
	return res, err
}

// guardCompensation holds a Refund or Void, before every submission of it (the first, and
// any after a retry or a replay), while sending it
// could move money wrongly: the original must exist, be for the same customer and
// currency, and be Settled (Refund) or sent but not settled (Void) — or, for a Void,
// settled at a provider that can still cancel it (billing.VoidsSettled), for the whole
// of it; refunds of one original never add up to more than it charged, and a Void is
// never sent beside another compensation of the same charge that may have moved money.
// Two compensations created at once see each other (a live list, under the charge's
// lock: guardAndSubmit), so neither can slip past the total or the Void's exclusivity.
func (r *Reconciler) guardCompensation(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	bs := s.bs
	if bs.Spec.Type != hooksv1alpha1.SettlementRefund && bs.Spec.Type != hooksv1alpha1.SettlementVoid {
		return ctrl.Result{}, nil
	}
	// The original may have been archived: it is read from the archive then.
	origp, _, err := archivelookup.Settlement(ctx, r.APIReader, r.Archive, bs.Namespace, bs.Spec.Reverses)
	if apierrors.IsNotFound(err) {
		return r.holdCompensation(s, fmt.Sprintf("waiting for the settlement it reverses, %q, to exist", bs.Spec.Reverses))
	}
	if errors.Is(err, archivelookup.ErrUnavailable) {
		return r.holdCompensation(s, "waiting for the archive: the settlement it reverses may be there")
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("get reversed settlement %s: %w", bs.Spec.Reverses, err)
	}
	orig := *origp
	if why := settlement.CompensationRefusal(bs, &orig, s.client != nil && billing.VoidsSettled(s.client)); why != "" {
		return r.holdCompensation(s, why)
	}
	pinned := bs.Status.ReversesRef
	if pinned != "" && orig.Status.ProviderRef != "" && pinned != orig.Status.ProviderRef {
		return r.holdCompensation(s, fmt.Sprintf("%s now has provider reference %q, not %q as when this %s was first sent: "+
			"compare both at the provider", orig.Name, orig.Status.ProviderRef, pinned, bs.Spec.Type))
	}
	var l hooksv1alpha1.BillingSettlementList
	if err := r.APIReader.List(ctx, &l, client.InNamespace(bs.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("list compensations of %s: %w", orig.Name, err)
	}
	if r.Archive != nil {
		// Compensations already archived count as much as those in the cluster: without
		// them, a charge could be refunded again once its first refund left.
		archived, err := r.Archive.Reversing(ctx, bs.Namespace, orig.Name)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return r.holdCompensation(s, "waiting for the archive: earlier compensations of the charge may be there")
		}
		l.Items = settlement.WithArchived(l.Items, archived)
	}
	if why := settlement.ReversalConflict(bs, &orig, l.Items); why != "" {
		return r.holdCompensation(s, why)
	}
	if bs.Spec.Type == hooksv1alpha1.SettlementRefund {
		total := bs.Spec.Amount.Minor // this one, as it is about to be sent (a replay is not persisted yet)
		for i := range l.Items {
			o := &l.Items[i]
			if o.Name == bs.Name || o.Spec.Reverses != orig.Name || o.Spec.Type != hooksv1alpha1.SettlementRefund || o.Spec.Amount == nil {
				continue
			}
			if settlement.MovedNothing(o) {
				continue // refused or failed at the provider: refunded nothing
			}
			total += o.Spec.Amount.Minor
		}
		if charged := settlement.ChargedAmount(&orig); total > charged.Minor {
			return r.holdCompensation(s, fmt.Sprintf("refunds of %s would add up to %d, more than the %d %s it charged",
				orig.Name, total, charged.Minor, charged.Currency))
		}
	}
	s.reverses, s.reversesRef = orig.Spec.SettlementKey, settlement.ReversesRefOf(bs, &orig)
	return ctrl.Result{}, nil
}

// compensationLocks serializes the guard and submission of the compensations of one
// charge within this process — the leader of the namespace's shard, the only one that
// reconciles them.
var compensationLocks chargeLocks

// chargeLocks is one lock per charge.
type chargeLocks struct{ sems keyedsem.Set }

// lock takes bs's charge's lock (none for a charge itself) and returns its release,
// or ctx's error when ctx ends first (the manager stopping): a worker never waits for
// good.
func (k *chargeLocks) lock(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) (func(), error) {
	if bs.Spec.Reverses == "" {
		return func() {}, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	unlock, ok := k.sems.Acquire(ctx, nil, bs.Namespace+"/"+bs.Spec.Reverses, 1)
	if !ok {
		return nil, ctx.Err()
	}
	return unlock, nil
}

// holdCompensation keeps a compensation Pending with the reason, and looks again later.
func (r *Reconciler) holdCompensation(s *settlementScope, why string) (ctrl.Result, error) {
	bs := s.bs
	if c := findCondition(bs, hooksv1alpha1.ConditionReady); c == nil || c.Message != why {
		r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonCompensationNotAllowed, "Compensate", "%s", why)
	}
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonCompensationNotAllowed, why)
	return ctrl.Result{RequeueAfter: waitForReference}, nil
}

// maxStepsPerReconcile bounds one reconcile's decisions (e.g. lookup → not found →
// Submit → settled is four).
const maxStepsPerReconcile = 6

// drive carries out the decisions until one says wait, hold or done. It calls the
// provider at most once per kind (one lookup, one submission) per reconcile.
func (r *Reconciler) drive(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	deleting := !s.bs.DeletionTimestamp.IsZero()
	var obs settlement.Observation
	looked, submitted := false, false
	for range maxStepsPerReconcile {
		d := settlement.Decide(settlement.Input{Status: &s.bs.Status, Policy: s.policy, Deleting: deleting,
			ProviderChanged: s.providerChanged(), ForceLookup: s.forceLookup && !looked, LookedUp: looked,
			Obs: obs, Now: s.now, Random: r.random()})
		r.apply(ctx, s, d, obs)
		obs = settlement.Observation{}
		switch d.Action {
		case settlement.ActContinue:
			continue
		case settlement.ActSubmit:
			if submitted || deleting {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			if s.lookupOnly != "" {
				r.cond(s.bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonInvalidIdentity,
					s.lookupOnly+"; it is only ever asked for by key, never sent again")
				return ctrl.Result{}, nil
			}
			submitted = true
			var held providerHold
			res, err := r.guardAndSubmit(ctx, s, &obs, &held)
			if err != nil || !res.IsZero() {
				return res, err
			}
			if held.why != "" {
				reason := held.reason
				if reason == "" {
					reason = hooksv1alpha1.ReasonBillingProviderNotReady
				}
				r.cond(s.bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, reason, held.why)
				return ctrl.Result{RequeueAfter: held.recheck}, nil
			}
		case settlement.ActLookup:
			if looked {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			looked = true
			obs = r.lookup(ctx, s)
			// What follows may be a resend bounded by the key window: judge it by the
			// clock after the lookup, which may have taken a while.
			s.now = r.now()
		case settlement.ActRelease:
			return r.release(ctx, s)
		case settlement.ActWait, settlement.ActHold:
			return ctrl.Result{RequeueAfter: d.Wait}, nil
		default:
			if deleting && settlement.HoldsMoney(&s.bs.Status) {
				// Nothing more to do by itself (e.g. RequiresReconciliation), but the
				// deletion waits for the provider: keep asking it now and then.
				return ctrl.Result{RequeueAfter: s.policy.Max}, nil
			}
			return ctrl.Result{}, nil
		}
	}
	return ctrl.Result{RequeueAfter: time.Second}, nil
}

// guardAndSubmit runs the compensation guard and the submission under the charge's
// lock (compensationLocks), so the guard of one compensation sees the bracket of any
// other of the same charge; a non-zero result or an error means nothing was sent.
func (r *Reconciler) guardAndSubmit(ctx context.Context, s *settlementScope, obs *settlement.Observation, held *providerHold) (ctrl.Result, error) {
	unlock, err := compensationLocks.lock(ctx, s.bs)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("wait for the other compensations of %s: %w", s.bs.Spec.Reverses, err)
	}
	defer unlock()
	if res, err := r.guardCompensation(ctx, s); err != nil || !res.IsZero() {
		return res, err
	}
	*obs, *held, err = r.submit(ctx, s)
	return ctrl.Result{}, err
}

// ProviderChanged reports whether the provider now points elsewhere than where the
// settlement's calls went.
func (s *settlementScope) providerChanged() bool {
	sent := s.bs.Status.SentTo
	return sent != nil && s.provider != nil && *sent != s.target
}

// Submit is the create-pending bracket around the one call that can move money:
// Exposure Possible, where it goes, and the attempt are persisted first, with the
// resourceVersion as compare-and-swap, so two reconciles from one snapshot cannot
// both send and a crash mid-call leaves a settlement that asks before it resends.
//
// After the bracket is written the BillingProvider is read live: if it is being
// deleted (or gone, or another object) nothing is sent and the bracket is undone, so
// its deletion — which releases only once no settlement holds it, listed live — can
// never race a first submission into a provider that no longer exists. held says why.
func (r *Reconciler) submit(ctx context.Context, s *settlementScope) (_ settlement.Observation, held providerHold, _ error) {
	bs, st := s.bs, &s.bs.Status
	prior, priorLast := settlement.EffectiveExposure(st), st.LastSubmission
	now := metav1.NewTime(s.now)
	if st.FirstSubmittedAt == nil {
		st.FirstSubmittedAt = &now
		s.dateUsage()
	}
	if st.ReversesRef == "" && bs.Spec.Reverses != "" {
		// What a compensation cancels, deletes or credits is named once: a resend or a
		// lookup never names another record (Stripe does not key DELETEs).
		st.ReversesRef = s.reversesRef
	}
	target := s.target
	// A crash or a lost answer from here on means the provider may have it.
	st.Exposure, st.SentTo, st.LastSubmission = hooksv1alpha1.ExposurePossible, &target, hooksv1alpha1.SubmissionMaybeReceived
	st.State, st.LastAttemptAt, st.NextAttemptAt = hooksv1alpha1.SettlementSubmitted, &now, nil
	st.Attempts++
	r.cond(bs, hooksv1alpha1.ConditionSubmitted, metav1.ConditionTrue, hooksv1alpha1.ReasonSubmittedToProvider,
		fmt.Sprintf("attempt %d sent with key %s", st.Attempts, bs.Spec.IdempotencyKey))
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonSubmittedToProvider,
		fmt.Sprintf("attempt %d in flight with key %s", st.Attempts, bs.Spec.IdempotencyKey))
	if _, err := statuspatch.Patch(ctx, r.Client, bs, s.before, true); err != nil {
		bs.Status = *s.before.Status.DeepCopy()
		return settlement.Observation{}, providerHold{}, fmt.Errorf("record attempt of billingsettlement %s: %w", bs.Name, err)
	}
	hold, err := r.providerGoing(ctx, s, prior)
	if err == nil && hold.why == "" {
		hold = lateForKey(s, prior, r.now())
	}
	if err != nil || hold.why != "" {
		bracketed := bs.DeepCopy()
		bs.Status = *s.before.Status.DeepCopy() // no call was made: exactly as before
		if _, perr := statuspatch.Patch(ctx, r.Client, bs, bracketed, true); perr != nil {
			return settlement.Observation{}, providerHold{}, perr // exposure stays Possible: it is only asked, never lost
		}
		s.before = bs.DeepCopy()
		return settlement.Observation{}, hold, err
	}
	r.countTransition(s)
	if s.before.Status.Attempts == 0 && r.TransitionEvents {
		r.Recorder.Eventf(bs, nil, corev1.EventTypeNormal, hooksv1alpha1.ReasonSubmittedToProvider, "Submit",
			"submitting to %s with key %s", s.provider.Name, bs.Spec.IdempotencyKey)
	}
	s.before = bs.DeepCopy()

	// Judged by the clock now, after the writes above: a dated request must arrive in
	// time, and is abandoned at datedUntil.
	req := s.requestAt(r.now())
	if !req.OccurredAt.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, st.DatedUntil.Time)
		defer cancel()
	}
	called := time.Now()
	rec, err := s.client.Submit(ctx, req)
	metrics.ObserveBillingCall(bs.Namespace, bs.Spec.BillingProviderRef, "submit", called, err)
	if err != nil {
		o := settlement.FailureObservation(err, s.now, st)
		o.Submit, o.PriorExposure, o.PriorLastSubmission = true, prior, priorLast
		return o, providerHold{}, nil
	}
	return settlement.RecordObservation(req, rec, true), providerHold{}, nil
}

// providerHold says why nothing may be sent through a BillingProvider now ("" when it
// may) and when to look again; reason is the Ready reason (BillingProviderNotFound when
// empty).
type providerHold struct {
	why     string
	recheck time.Duration
	reason  string
}

// lateForKey holds a resend of what may already be at the provider that could arrive
// after the provider's key window, judged by the clock right before the call: the
// Decision to resend used the reconcile's clock, and the status writes since have no
// deadline of their own. Past the window the provider no longer deduplicates, so the
// resend could charge twice; the next reconcile asks first.
func lateForKey(s *settlementScope, prior hooksv1alpha1.Exposure, now time.Time) providerHold {
	first := s.before.Status.FirstSubmittedAt
	if prior != hooksv1alpha1.ExposurePossible || first == nil {
		return providerHold{}
	}
	arrive := now.Add(s.policy.RequestTimeout + dateSkew)
	if arrive.Before(first.Add(s.policy.KeyWindow)) {
		return providerHold{}
	}
	return providerHold{why: "the resend could reach the provider after its idempotency window since the first attempt; " +
		"nothing was sent: asking by key again", recheck: time.Second, reason: hooksv1alpha1.ReasonOutcomeUnknown}
}

// providerGoing reads the BillingProvider live and says whether something may be sent
// through it.
func (r *Reconciler) providerGoing(ctx context.Context, s *settlementScope, prior hooksv1alpha1.Exposure) (providerHold, error) {
	var bp hooksv1alpha1.BillingProvider
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: s.bs.Namespace, Name: s.bs.Spec.BillingProviderRef}, &bp)
	switch {
	case apierrors.IsNotFound(err):
		return providerHold{why: fmt.Sprintf("BillingProvider %q is gone; nothing is sent", s.bs.Spec.BillingProviderRef), recheck: waitForReference}, nil
	case err != nil:
		return providerHold{}, fmt.Errorf("get billingprovider %s: %w", s.bs.Spec.BillingProviderRef, err)
	case !bp.DeletionTimestamp.IsZero() && prior != hooksv1alpha1.ExposurePossible:
		// A resend of what may already be there (same key) finishes the job; new
		// Exposure through a provider being deleted is not taken.
		return providerHold{why: fmt.Sprintf("BillingProvider %q is being deleted; nothing new is sent through it", bp.Name), recheck: waitForReference}, nil
	case bp.UID != s.provider.UID:
		return providerHold{why: fmt.Sprintf("BillingProvider %q was replaced; looking again", bp.Name), recheck: waitForReference}, nil
	case !controllerutil.ContainsFinalizer(&bp, hooksv1alpha1.FinalizerBillingProviderInUse):
		// Its deletion would not wait for this settlement yet: the BillingProvider
		// controller puts the finalizer on at its first reconcile, moments from now.
		return providerHold{why: fmt.Sprintf("BillingProvider %q is not protected from deletion yet; sending in a moment", bp.Name), recheck: time.Second}, nil
	}
	return providerHold{}, nil
}

// lookup asks the provider by key (a poll, for a pending record).
func (r *Reconciler) lookup(ctx context.Context, s *settlementScope) settlement.Observation {
	bs := s.bs
	if s.reconcileToken != "" {
		// Acted on once, answered or not: a settlement that may have charged keeps
		// asking on its own backoff anyway.
		bs.Status.ReconcileRequest = s.reconcileToken
	}
	req := s.request()
	called := time.Now()
	rec, found, err := billing.LookupFor(ctx, s.client, req)
	metrics.ObserveBillingCall(bs.Namespace, bs.Spec.BillingProviderRef, "lookup", called, err)
	if err != nil {
		return settlement.FailureObservation(err, s.now, &bs.Status)
	}
	if !found {
		return settlement.Observation{Kind: settlement.ObsNotFound}
	}
	return settlement.RecordObservation(req, rec, false)
}

// request is what this settlement asks about (and is compared with).
func (s *settlementScope) request() billing.Request {
	return s.requestAt(s.now)
}

// dateSkew is the clock skew allowed between this manager and the provider when a
// dated request must arrive before a bound.
const dateSkew = time.Minute

// requestAt is the request as sent at now: dated at its pinned usage time only if it
// reaches the provider — by now + requestTimeout + dateSkew at the latest — before
// datedUntil, and before the bound the adapter gives today (a grace period lowered
// since, or a meter no longer dated). Otherwise undated: the provider could accept a
// late dated one and never bill it, and under the same key it refuses an undated one
// if the dated one was received (the settlement then stops for a human).
func (s *settlementScope) requestAt(now time.Time) billing.Request {
	req := settlement.RequestOf(s.bs, s.reverses, s.reversesRef)
	st := &s.bs.Status
	if st.UsageDatedAt == nil || st.DatedUntil == nil || s.bs.Spec.Usage == nil || s.client == nil {
		return req
	}
	arrive := now.Add(s.policy.RequestTimeout + dateSkew)
	if !arrive.Before(st.DatedUntil.Time) {
		return req
	}
	if d, ok := billing.UsageDaterOf(s.client); !ok || d.DateUsage(s.bs.Spec.Usage.Meter, st.UsageDatedAt.Time, arrive).IsZero() {
		return req
	}
	req.OccurredAt = st.UsageDatedAt.Time
	return req
}

// dateUsage pins, at a usage charge's first attempt, whether and until when it is sent
// dated at spec.occurredAt, as its adapter says (billing.UsageDater).
func (s *settlementScope) dateUsage() {
	bs, st := s.bs, &s.bs.Status
	if bs.Spec.Usage == nil || bs.Spec.OccurredAt == nil || bs.Spec.Reverses != "" || st.UsageDatedAt != nil || s.client == nil {
		return
	}
	d, ok := billing.UsageDaterOf(s.client)
	if !ok {
		return
	}
	// Judged as requestAt judges each attempt: by when it could arrive.
	arrive := s.now.Add(s.policy.RequestTimeout + dateSkew)
	if until := d.DateUsage(bs.Spec.Usage.Meter, bs.Spec.OccurredAt.Time, arrive); !until.IsZero() {
		at, u := *bs.Spec.OccurredAt, metav1.NewTime(until)
		st.UsageDatedAt, st.DatedUntil = &at, &u
	}
}

// release drops the protection finalizer of a settlement being deleted: the decision
// found nothing can be pending at the provider under its key.
func (r *Reconciler) release(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	bs := s.bs
	if r.Archive != nil && !settlement.NeverSent(bs) && controllerutil.ContainsFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection) {
		// A financial record leaves the cluster only once it is in the archive and read
		// back (docs/design.md §12); the archiver put it there already, or it goes now.
		// One that never presented its key anywhere is no financial record: it goes as
		// without an archive (its events show it deleted; nothing reserves its keys).
		err := r.Archive.ArchiveSettlement(ctx, bs)
		metrics.NoteArchive("BillingSettlement", err)
		switch {
		case err == nil:
		case archive.IsConflict(err):
			r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonArchiveConflict,
				"deletion is held: the archive holds other content under this settlement's name or key; it stays until a human reviews both")
			r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonArchiveConflict, "Archive", "%s", conditions.TruncateMessage(err.Error()))
			return ctrl.Result{RequeueAfter: 10 * time.Minute}, nil
		default:
			r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonArchiveUnavailable,
				"deletion waits for the archive: a settlement leaves the cluster only once it is archived and read back")
			return ctrl.Result{RequeueAfter: archivelookup.RetryInterval}, nil
		}
	}
	if _, err := statuspatch.Patch(ctx, r.Client, bs, s.before, false); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	if controllerutil.ContainsFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection) {
		patch := client.MergeFrom(bs.DeepCopy())
		controllerutil.RemoveFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection)
		if err := r.Patch(ctx, bs, patch); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("remove finalizer of billingsettlement %s: %w", bs.Name, err)
		}
	}
	s.before = bs.DeepCopy() // nothing more to write: the object is going away
	return ctrl.Result{}, nil
}
