package billingsettlement

import (
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
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/index"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
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

// initExposure gives a settlement its first exposure. None — sent directly, one call,
// no lookup — for one the operator created together with its job's first
// JobCompletion (a job never seen before), and, where its provider cannot be asked
// about the request at all (billing.LookupNone: Stripe's meter events), for one the
// facts say was never presented (neverPresented). Anything else starts at Possible:
// the provider must answer by key before the first submission. A provider that can be
// asked keeps that lookup: it finds a charge whose record was lost (a namespace
// deleted without an archive, a settlement deleted by hand) and is re-created by a
// person, which the facts cannot see (docs/decisions.md "Where a settlement starts").
// Until the BillingProvider exists the exposure is left unset (a never-sent settlement
// counts as None: settlement.EffectiveExposure), and decided once it does.
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
	if !fresh {
		var bp hooksv1alpha1.BillingProvider
		err := r.Get(ctx, types.NamespacedName{Namespace: s.bs.Namespace, Name: s.bs.Spec.BillingProviderRef}, &bp)
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil // decided once it exists; resolveProvider waits for it
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("get billingprovider %s: %w", s.bs.Spec.BillingProviderRef, err)
		}
		if adapters.Capabilities(&bp, s.request()).Lookup == billing.LookupNone {
			if fresh, err = r.neverPresented(ctx, s); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if fresh {
		// Nothing in the cluster holds its name or keys; a namespace deleted without
		// an archive may have held them (tombstones.go).
		if fresh, err = r.notPresentedBeforeNamespaceDeletion(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	} else if s.tombstone != nil {
		r.warnPresentedBefore(s) // neverPresented found it
	}
	st.Exposure = hooksv1alpha1.ExposurePossible
	if fresh {
		st.Exposure = hooksv1alpha1.ExposureNone
	}
	return ctrl.Result{}, nil
}

// lookupFirstWhileArchiveBehind: while the archive is behind the cluster — it lacks a
// record the cluster archived, read back and deleted (restored from an older copy, a
// lagging standby; internal/archivewatermark) — "the archive holds none of this
// operation" proves nothing: the key may be one the archive lost, charged long ago.
// So a settlement not yet answered (Pending) whose facts said None — never presented,
// or created with its job — is raised to Possible: the provider is asked by key before
// anything is sent, and a record it holds is adopted. Nothing waits for a person where
// the provider can answer; where it cannot (a Stripe meter event never sent by this
// record), the decision goes to RequiresReconciliation with nothing sent. Raising
// exposure is always safe; it is never lowered again when the state clears.
func (r *Reconciler) lookupFirstWhileArchiveBehind(_ context.Context, s *settlementScope) (ctrl.Result, error) {
	bs, st := s.bs, &s.bs.Status
	why := r.Archive.Behind()
	if why == "" || st.Exposure != hooksv1alpha1.ExposureNone || st.State != hooksv1alpha1.SettlementPending {
		return ctrl.Result{}, nil
	}
	st.Exposure = hooksv1alpha1.ExposurePossible
	msg := "the archive is behind the cluster (" + why + "): its key may be one the archive lost, so the provider is asked by key before anything is sent"
	r.Recorder.Eventf(bs, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonArchiveBehind, "Validate", "%s", conditions.TruncateMessage(msg))
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonArchiveBehind, conditions.TruncateMessage(msg))
	return ctrl.Result{}, nil
}

// neverPresented reports whether the facts say s's settlement never presented its key
// anywhere (docs/design.md §14): its status records no attempt, no other settlement of
// its logical operation (its legacy name, for a key minted since keys are namespaced)
// exists in the cluster — read live from the API server, since a cached read could
// miss one just created — the archive holds none (checkArchive asked it earlier in
// this reconcile, and holds back a settlement while the archive does not answer), and
// no tombstone holds one (its namespace deleted without an archive). The answer is
// kept for the reconcile.
//
// Why the facts are proof: every call that could present the key is preceded by the
// bracket, written to this object's status with an optimistic lock (a stale copy
// cannot send); a settlement leaves the cluster only once it is in the archive and
// read back, or when it never presented its key; and the admission policy lets no one
// else delete it (and a settlement that leaves with its namespace without an archive
// leaves a tombstone). Where those do not hold — an archive restored from an older
// copy, a finalizer removed by a person (the break-glass), a tombstone deleted by one —
// the facts can lie, which is why they decide only where the provider cannot.
func (r *Reconciler) neverPresented(ctx context.Context, s *settlementScope) (bool, error) {
	if s.neverPresented != nil {
		return *s.neverPresented, nil
	}
	bs := s.bs
	answer := func(v bool) (bool, error) { s.neverPresented = &v; return v, nil }
	if !settlement.NeverAttempted(&bs.Status) || !bs.DeletionTimestamp.IsZero() || r.Archive.Behind() != "" {
		// (An archive behind the cluster may have lost this operation: its "holds
		// none" proves nothing — lookupFirstWhileArchiveBehind.)
		return answer(false)
	}
	names, _ := settlement.OperationIdentities(bs.Namespace, bs.Name, bs.Spec.SettlementKey, bs.Spec.IdempotencyKey)
	for _, name := range names {
		if name == bs.Name {
			continue
		}
		var other hooksv1alpha1.BillingSettlement
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: name}, &other)
		switch {
		case err == nil:
			return answer(false)
		case !apierrors.IsNotFound(err):
			return false, fmt.Errorf("get billingsettlement %s: %w", name, err)
		}
	}
	t, _, err := r.presentedBefore(ctx, s)
	if err != nil {
		return false, err
	}
	return answer(t == nil)
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
