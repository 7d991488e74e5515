package billingsettlement

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

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
		// The facts matter only where a lookup cannot answer for a settlement that
		// never sent: read them then, once per reconcile.
		neverPresented := false
		if obs.Kind == settlement.ObsUnanswerable && s.bs.Status.FirstSubmittedAt == nil {
			var err error
			if neverPresented, err = r.neverPresented(ctx, s); err != nil {
				return ctrl.Result{}, err
			}
		}
		d := settlement.Decide(settlement.Input{Status: &s.bs.Status, Policy: s.policy, Deleting: deleting,
			ProviderChanged: s.providerChanged(), ForceLookup: s.forceLookup && !looked, LookedUp: looked,
			Obs: obs, Now: s.now, Random: r.random(), Caps: s.caps, NeverPresented: neverPresented})
		// A decision to call the provider takes one of its slots first (slots.go); one
		// refused is not applied at all, so the refusal changes nothing.
		calls := (d.Action == settlement.ActSubmit && !submitted && !deleting && s.lookupOnly == "") ||
			(d.Action == settlement.ActLookup && !looked)
		if calls && !r.takeSlot(s) {
			return r.waitForSlot(s)
		}
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
				// Asked again later: past the key window the decision goes to a lookup,
				// and an unanswered one to a human.
				return ctrl.Result{RequeueAfter: s.policy.Max}, nil
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
// other of the same charge in this process (another process's is seen through its
// claim: docs/design.md §16); a non-zero result or an error means nothing was sent.
func (r *Reconciler) guardAndSubmit(ctx context.Context, s *settlementScope, obs *settlement.Observation, held *providerHold) (ctrl.Result, error) {
	unlock, err := r.compensationLocks.lock(ctx, s.bs)
	if errors.Is(err, errChargeBusy) {
		// Nothing was checked or sent: its turn comes at a later reconcile.
		*held = providerHold{why: fmt.Sprintf("%s of %s; nothing was sent: trying again in a moment", errChargeBusy.Error(), s.bs.Spec.Reverses),
			recheck: r.slotRetry(), reason: hooksv1alpha1.ReasonCompensationWaiting}
		return ctrl.Result{}, nil
	}
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
	setStalled(bs)
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
		if settlement.NeverAttempted(&bs.Status) {
			bs.Status.ClaimedAt = nil // nor will one be soon: the charge's claim is released
		}
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
// decision to resend used the reconcile's clock, and the status writes since have no
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
// found nothing can be pending at the provider under its key. What presented its key
// leaves a record first: in the archive, or without one a tombstone.
func (r *Reconciler) release(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	bs := s.bs
	if r.Archive != nil && !settlement.NeverSent(bs) && controllerutil.ContainsFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection) {
		// A financial record leaves the cluster only once it is in the archive and read
		// back (docs/design.md §12); the archiver put it there already, or it goes now.
		// One that never presented its key anywhere is no financial record: it goes as
		// without an archive (its events show it deleted; nothing reserves its keys).
		err := r.Archive.ArchiveSettlement(ctx, bs)
		metrics.NoteArchive("BillingSettlement", err)
		if err == nil {
			err = r.Watermark.Cover(ctx) // before it leaves (internal/archivewatermark)
		}
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
	if r.Archive == nil && !settlement.NeverSent(bs) && controllerutil.ContainsFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection) {
		// Without an archive, a settlement that presented its key leaves a tombstone
		// first: its namespace, created again, derives the same key (tombstones.go).
		if res, held, err := r.recordTombstone(ctx, s); held || err != nil {
			return res, err
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
