package controllers

import (
	"context"
	"fmt"
	"math/big"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// BillingSettlementControllerName names the controller in logs and metrics.
const BillingSettlementControllerName = "billingsettlement"

// IndexSettlementReverses indexes settlements by the settlement they compensate.
const IndexSettlementReverses = "spec.reverses"

// Defaults applied when a BillingProvider predates a field (the API server defaults
// them on write; these keep a zero from ever meaning "retry in a tight loop").
const (
	defaultMaxAttempts       = 10
	defaultMaxElapsed        = time.Hour
	defaultInitialBackoff    = time.Second
	defaultMaxBackoff        = 5 * time.Minute
	defaultIdempotencyWindow = 24 * time.Hour
	defaultRequestTimeout    = 10 * time.Second
	maxPollInterval          = time.Minute
)

// BillingSettlementReconciler drives one financial operation to the provider's final
// answer with one idempotency key, set at creation and reused on every attempt and
// replay (§5). Around each submission it follows the create-pending bracket:
// firstSubmittedAt is persisted *before* the call, so after a crash or a lost
// response it knows the outcome is unknown and asks the provider by key instead of
// guessing or waiting for a human.
type BillingSettlementReconciler struct {
	client.Client
	// APIReader reads provider credentials (Secrets) by name.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// NewClient builds a provider client; billing.NewHTTP when nil.
	NewClient func(cfg billing.HTTPConfig) (billing.Client, error)
	// Now is the clock (time.Now).
	Now func() time.Time
	// MaxConcurrentReconciles is how many records are worked on at once (1): calls to
	// slow peers must not queue every other record behind them.
	MaxConcurrentReconciles int

	clients providerClients
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch

// settlementScope carries one reconcile's state between its phases.
type settlementScope struct {
	bs       *hooksv1alpha1.BillingSettlement
	before   *hooksv1alpha1.BillingSettlement
	provider *hooksv1alpha1.BillingProvider
	client   billing.Client
	now      time.Time
	reverses string // the original's settlement key, for compensations
}

// Reconcile drives one settlement.
func (r *BillingSettlementReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	var bs hooksv1alpha1.BillingSettlement
	if err := r.Get(ctx, req.NamespacedName, &bs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	s := &settlementScope{bs: &bs, before: bs.DeepCopy(), now: r.now()}
	defer func() {
		if perr := r.patchStatus(ctx, s); perr != nil && err == nil {
			err = perr
		}
	}()

	if !bs.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}
	// The finalizer goes on before anything is sent, so a charge can never lose its
	// local record while its outcome is unknown.
	if !controllerutil.ContainsFinalizer(&bs, hooksv1alpha1.FinalizerSettlementProtection) {
		patch := client.MergeFrom(bs.DeepCopy())
		controllerutil.AddFinalizer(&bs, hooksv1alpha1.FinalizerSettlementProtection)
		if err := r.Patch(ctx, &bs, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to billingsettlement %s: %w", req.NamespacedName, err)
		}
		s.before.ObjectMeta = *bs.ObjectMeta.DeepCopy()
	}
	return r.reconcileNormal(ctx, s)
}

func (r *BillingSettlementReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// patchStatus writes status once per reconcile, only if it changed, and counts the
// transition.
func (r *BillingSettlementReconciler) patchStatus(ctx context.Context, s *settlementScope) error {
	if equality.Semantic.DeepEqual(s.before.Status, s.bs.Status) {
		return nil
	}
	// Optimistic lock: a reconcile that worked from a stale copy must not overwrite
	// what a newer one wrote (a conflict just requeues it with fresh state).
	if err := r.Status().Patch(ctx, s.bs, client.MergeFromWithOptions(s.before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patch status of billingsettlement %s: %w", s.bs.Name, err)
	}
	if s.before.Status.State != s.bs.Status.State {
		settlementTransitions.WithLabelValues(string(s.bs.Status.State)).Inc()
	}
	s.before = s.bs.DeepCopy()
	return nil
}

func (r *BillingSettlementReconciler) reconcileNormal(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	bs := s.bs
	st := &bs.Status
	st.ObservedGeneration = bs.Generation
	if st.State == "" {
		st.State = hooksv1alpha1.SettlementPending
		r.cond(bs, hooksv1alpha1.ConditionSubmitted, metav1.ConditionFalse, hooksv1alpha1.ReasonAwaitingSubmission, "not sent to the provider yet")
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonAwaitingSubmission, "not sent to the provider yet")
	}
	r.handleReplay(s)
	if err := r.updateReversedBy(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if res, done, err := r.handleReconcileRequest(ctx, s); done || err != nil {
		return res, err
	}

	switch st.State {
	case hooksv1alpha1.SettlementSettled, hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation:
		return ctrl.Result{}, nil
	}
	if st.NextAttemptAt != nil {
		if wait := st.NextAttemptAt.Sub(s.now); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	for _, phase := range []func(context.Context, *settlementScope) (ctrl.Result, bool, error){
		r.resolveCompensation,
		r.resolveProvider,
		r.resolveUnknownOutcome,
		r.submit,
	} {
		res, done, err := phase(ctx, s)
		if err != nil || done {
			return res, err
		}
	}
	return ctrl.Result{}, nil
}

func (r *BillingSettlementReconciler) cond(bs *hooksv1alpha1.BillingSettlement, typ string, status metav1.ConditionStatus, reason, msg string) {
	setCondition(&bs.Status.Conditions, bs.Generation, typ, status, reason, msg)
}

// handleReplay acts on a new value of the replay annotation: a Failed or
// RequiresReconciliation settlement resumes through the normal path with the same
// key and a fresh retry budget; any other state only records that nothing was to do.
func (r *BillingSettlementReconciler) handleReplay(s *settlementScope) {
	bs := s.bs
	token := truncateToken(bs.Annotations[hooksv1alpha1.AnnotationReplay])
	if token == "" || (bs.Status.Replay != nil && bs.Status.Replay.LastToken == token) {
		return
	}
	st := &bs.Status
	if st.Replay == nil {
		st.Replay = &hooksv1alpha1.ReplayStatus{}
	}
	st.Replay.LastToken = token
	switch st.State {
	case hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation:
	default:
		r.Recorder.Eventf(bs, nil, "Normal", hooksv1alpha1.ReasonReplayed, "Replay",
			"replay %q ignored: the settlement is %s, not Failed or RequiresReconciliation", token, st.State)
		return
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
	// ProviderRef stays for history; a stale "pending" must not turn the provider's
	// "not found" into a conflict: after a replay, not found means resubmit.
	st.LastError, st.NextAttemptAt, st.ProviderStatus = nil, nil, ""
	r.cond(bs, hooksv1alpha1.ConditionDeadLettered, metav1.ConditionFalse, hooksv1alpha1.ReasonReplayed,
		fmt.Sprintf("replay %q resumed it from %s with the same idempotency key", token, from))
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonReplayed, "replayed; asking the provider by key before resubmitting")
	r.Recorder.Eventf(bs, nil, "Normal", hooksv1alpha1.ReasonReplayed, "Replay",
		"replay %q: resuming from %s with key %s", token, from, bs.Spec.IdempotencyKey)
}

// handleReconcileRequest acts on a new reconcile-request annotation (set by a
// reconciliation pass): the settlement asks its provider by key, now, whatever its
// state or backoff, and imports a matching final answer. This is how a pass repairs
// "provider settled, local pending/failed" without a side path: the same lookup, the
// same key, the same adopt rules.
func (r *BillingSettlementReconciler) handleReconcileRequest(ctx context.Context, s *settlementScope) (ctrl.Result, bool, error) {
	bs, st := s.bs, &s.bs.Status
	token := truncateToken(bs.Annotations[hooksv1alpha1.AnnotationReconcileRequest])
	if token == "" || token == st.ReconcileRequest {
		return ctrl.Result{}, false, nil
	}
	if st.State == hooksv1alpha1.SettlementSettled {
		st.ReconcileRequest = token
		return ctrl.Result{}, false, nil
	}
	if res, done, err := r.resolveProvider(ctx, s); done || err != nil {
		return res, true, err
	}
	rec, found, err := s.client.Lookup(ctx, bs.Spec.IdempotencyKey)
	if err != nil {
		// Not consumed: the request is acted on again at the next reconcile.
		settlementAttempts.WithLabelValues("lookup", classLabel(err)).Inc()
		return ctrl.Result{}, false, nil
	}
	st.ReconcileRequest = token
	settlementAttempts.WithLabelValues("lookup", "ok").Inc()
	if !found {
		return ctrl.Result{}, false, nil
	}
	if st.State == hooksv1alpha1.SettlementPending || st.State == hooksv1alpha1.SettlementSubmitted ||
		rec.Status != "pending" {
		r.Recorder.Eventf(bs, nil, "Normal", hooksv1alpha1.ReasonConfirmedByProvider, "Reconcile",
			"reconcile request %q: the provider has key %s as %s (%s)", token, bs.Spec.IdempotencyKey, rec.ID, rec.Status)
		return r.adopt(ctx, s, rec, policyOf(s.provider)), true, nil
	}
	return ctrl.Result{}, false, nil
}

// resolveCompensation finds the key of the settlement a Refund or Void reverses; it
// waits until the original has at least been sent.
func (r *BillingSettlementReconciler) resolveCompensation(ctx context.Context, s *settlementScope) (ctrl.Result, bool, error) {
	bs := s.bs
	if bs.Spec.Type == hooksv1alpha1.SettlementCharge || bs.Spec.Type == "" {
		return ctrl.Result{}, false, nil
	}
	var orig hooksv1alpha1.BillingSettlement
	err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.Reverses}, &orig)
	if apierrors.IsNotFound(err) {
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonAwaitingSubmission,
			fmt.Sprintf("waiting for the settlement it reverses, %q, to exist", bs.Spec.Reverses))
		return ctrl.Result{RequeueAfter: 30 * time.Second}, true, nil
	}
	if err != nil {
		return ctrl.Result{}, true, fmt.Errorf("get reversed settlement %s: %w", bs.Spec.Reverses, err)
	}
	if orig.Status.FirstSubmittedAt == nil {
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonAwaitingSubmission,
			fmt.Sprintf("waiting until %q has been sent to the provider", orig.Name))
		return ctrl.Result{RequeueAfter: 10 * time.Second}, true, nil
	}
	s.reverses = orig.Spec.SettlementKey
	return ctrl.Result{}, false, nil
}

// resolveProvider loads the BillingProvider and a client for it.
func (r *BillingSettlementReconciler) resolveProvider(ctx context.Context, s *settlementScope) (ctrl.Result, bool, error) {
	if s.client != nil {
		// Already resolved in this reconcile (a reconcile request resolves it first):
		// no second provider read and live Secret GET.
		return ctrl.Result{}, false, nil
	}
	bs := s.bs
	var bp hooksv1alpha1.BillingProvider
	err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.BillingProviderRef}, &bp)
	if apierrors.IsNotFound(err) {
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, ReasonBillingProviderNotFound,
			fmt.Sprintf("BillingProvider %q not found; waiting for it", bs.Spec.BillingProviderRef))
		return ctrl.Result{RequeueAfter: 30 * time.Second}, true, nil
	}
	if err != nil {
		return ctrl.Result{}, true, fmt.Errorf("get billingprovider %s: %w", bs.Spec.BillingProviderRef, err)
	}
	s.provider = &bp
	c, err := r.clientFor(ctx, &bp)
	if err != nil {
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, ReasonBillingProviderNotFound, truncateMessage(err.Error()))
		return ctrl.Result{RequeueAfter: 30 * time.Second}, true, nil
	}
	s.client = c
	return ctrl.Result{}, false, nil
}

// ReasonBillingProviderNotFound: the settlement waits for its BillingProvider or its
// credentials.
const ReasonBillingProviderNotFound = "BillingProviderNotReady"

// clientFor returns a client for the provider, reused while its spec and token stay
// the same so connections are pooled.
func (r *BillingSettlementReconciler) clientFor(ctx context.Context, bp *hooksv1alpha1.BillingProvider) (billing.Client, error) {
	return r.clients.get(ctx, r.APIReader, r.NewClient, bp)
}

type retryPolicy struct {
	maxAttempts                         int32
	maxElapsed, initial, max, keyWindow time.Duration
}

func policyOf(bp *hooksv1alpha1.BillingProvider) retryPolicy {
	p := retryPolicy{maxAttempts: defaultMaxAttempts, maxElapsed: defaultMaxElapsed, initial: defaultInitialBackoff,
		max: defaultMaxBackoff, keyWindow: durationOr(bp.Spec.IdempotencyWindow, defaultIdempotencyWindow)}
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

// exhausted reports whether the retry budget since the first submission (or the last
// replay) is spent.
func exhausted(s *settlementScope, p retryPolicy) (bool, string) {
	st := &s.bs.Status
	used, start := st.Attempts, st.FirstSubmittedAt
	if st.Replay != nil && st.Replay.LastAt != nil {
		used, start = st.Attempts-st.Replay.AttemptsBefore, st.Replay.LastAt
	}
	if used >= p.maxAttempts {
		return true, fmt.Sprintf("%d attempts made (maxAttempts %d)", used, p.maxAttempts)
	}
	if start != nil && s.now.Sub(start.Time) >= p.maxElapsed {
		return true, fmt.Sprintf("%s since the first attempt (maxElapsed %s)", s.now.Sub(start.Time).Round(time.Second), p.maxElapsed)
	}
	return false, ""
}

// resolveUnknownOutcome asks the provider by key whenever what happened to an earlier
// call is not known: after a timeout or 5xx, after a restart while Submitted, while
// the provider reports "pending", and once the idempotency window has passed.
// Never a new key; never a wait for a human when the provider can answer.
//
// A settlement never sent is looked up once too: a settlement deleted after it
// settled and created again (by hand, or by a redelivery after retention) must find
// its charge, not make another one once the provider's key window has passed.
func (r *BillingSettlementReconciler) resolveUnknownOutcome(ctx context.Context, s *settlementScope) (ctrl.Result, bool, error) {
	st := &s.bs.Status
	p := policyOf(s.provider)
	pending := st.ProviderRef != "" && st.ProviderStatus == "pending"
	neverSent := st.FirstSubmittedAt == nil && st.Attempts == 0
	unknown := st.OutcomeUnknown || (st.FirstSubmittedAt != nil && st.LastError == nil)
	outsideWindow := st.FirstSubmittedAt != nil && s.now.Sub(st.FirstSubmittedAt.Time) >= p.keyWindow
	if !pending && !unknown && !outsideWindow && !neverSent {
		return ctrl.Result{}, false, nil // a provably unreceived attempt: resubmit directly
	}
	rec, found, err := s.client.Lookup(ctx, s.bs.Spec.IdempotencyKey)
	if err != nil {
		settlementAttempts.WithLabelValues("lookup", classLabel(err)).Inc()
		if neverSent && !pending && !unknown && !outsideWindow {
			// The precaution failed (provider unreachable?): submitting with the key is
			// as safe as always inside the window, and it fails the same way if down.
			return ctrl.Result{}, false, nil
		}
		return r.failedAttempt(s, p, err, "ask the provider by key")
	}
	settlementAttempts.WithLabelValues("lookup", "ok").Inc()
	if found {
		return r.adopt(ctx, s, rec, p), true, nil
	}
	// Authoritative: the provider has nothing under this key.
	st.OutcomeUnknown = false
	if pending {
		// The provider reported it and now does not know it: that is for a human.
		r.requiresReconciliation(s, hooksv1alpha1.ReasonMismatchWithProvider,
			fmt.Sprintf("the provider reported %s as pending and now does not know key %s", st.ProviderRef, s.bs.Spec.IdempotencyKey))
		return ctrl.Result{}, true, nil
	}
	log.FromContext(ctx).V(1).Info("provider does not know the key; resubmitting with it", "key", s.bs.Spec.IdempotencyKey)
	return ctrl.Result{}, false, nil
}

// submit sends the settlement, persisting the attempt first.
func (r *BillingSettlementReconciler) submit(ctx context.Context, s *settlementScope) (ctrl.Result, bool, error) {
	bs, st := s.bs, &s.bs.Status
	p := policyOf(s.provider)
	if done, why := exhausted(s, p); done {
		// Reached only when the provider's answer is known (resolveUnknownOutcome
		// asked it): nothing was charged, so dead-lettering loses nothing.
		r.deadLetter(s, why)
		return ctrl.Result{}, true, nil
	}
	now := metav1.NewTime(s.now)
	if st.FirstSubmittedAt == nil {
		st.FirstSubmittedAt = &now
	}
	st.State = hooksv1alpha1.SettlementSubmitted
	st.Attempts++
	st.LastAttemptAt = &now
	st.NextAttemptAt = nil
	r.cond(bs, hooksv1alpha1.ConditionSubmitted, metav1.ConditionTrue, hooksv1alpha1.ReasonSubmittedToProvider,
		fmt.Sprintf("attempt %d sent with key %s", st.Attempts, bs.Spec.IdempotencyKey))
	// The create-pending bracket: the attempt is durable before the call, with the
	// resourceVersion as compare-and-swap, so two reconciles from the same snapshot
	// cannot both send. (A resend after a leader change while a call is in flight is
	// possible and harmless: it carries the same key.)
	if err := r.Status().Patch(ctx, bs, client.MergeFromWithOptions(s.before, client.MergeFromWithOptimisticLock{})); err != nil {
		*st = s.before.Status
		return ctrl.Result{}, true, fmt.Errorf("record attempt of billingsettlement %s: %w", bs.Name, err)
	}
	if s.before.Status.State != st.State {
		settlementTransitions.WithLabelValues(string(st.State)).Inc()
		r.Recorder.Eventf(bs, nil, "Normal", hooksv1alpha1.ReasonSubmittedToProvider, "Submit",
			"submitting to %s with key %s", s.provider.Name, bs.Spec.IdempotencyKey)
	}
	s.before = bs.DeepCopy()

	rec, err := s.client.Submit(ctx, requestOf(bs, s.reverses))
	if err != nil {
		settlementAttempts.WithLabelValues("submit", classLabel(err)).Inc()
		if e, ok := billing.AsError(err); ok && e.Class == billing.Terminal {
			if e.KeyReused {
				r.requiresReconciliation(s, hooksv1alpha1.ReasonKeyReused,
					"the provider has this idempotency key with other parameters: "+truncateMessage(e.Error()))
			} else {
				r.fail(s, hooksv1alpha1.ReasonTerminalError, "the provider refused it: "+truncateMessage(e.Error()), true)
			}
			st.LastError = settlementError(e, s.now)
			return ctrl.Result{}, true, nil
		}
		if e, ok := billing.AsError(err); !ok || e.Class == billing.Ambiguous {
			st.OutcomeUnknown = true
		}
		return r.failedAttempt(s, p, err, "submit")
	}
	settlementAttempts.WithLabelValues("submit", "ok").Inc()
	return r.adopt(ctx, s, rec, p), true, nil
}

func requestOf(bs *hooksv1alpha1.BillingSettlement, reversesKey string) billing.Request {
	req := billing.Request{
		SettlementKey: bs.Spec.SettlementKey, IdempotencyKey: bs.Spec.IdempotencyKey,
		Type: strings.ToLower(string(bs.Spec.Type)), Reverses: reversesKey, Customer: bs.Spec.Customer,
		Metadata: bs.Spec.Metadata,
	}
	if req.Type == "" {
		req.Type = "charge"
	}
	if u := bs.Spec.Usage; u != nil {
		req.Usage = &billing.Usage{Meter: u.Meter, Quantity: u.Quantity, Unit: u.Unit}
	}
	if a := bs.Spec.Amount; a != nil {
		req.Amount = &billing.Amount{Minor: a.Minor, Currency: a.Currency}
	}
	return req
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
	se := &hooksv1alpha1.SettlementError{Class: errorClassAmbiguous, Message: truncateMessage(err.Error()), At: metav1.NewTime(now)}
	if e, ok := billing.AsError(err); ok {
		se.Class, se.Code = errorClassName(e.Class), e.Code
		if len(se.Code) > 128 {
			se.Code = se.Code[:128]
		}
	}
	return se
}

// failedAttempt records a transient or ambiguous failure and schedules the next try,
// or dead-letters when the budget is spent.
func (r *BillingSettlementReconciler) failedAttempt(s *settlementScope, p retryPolicy, err error, what string) (ctrl.Result, bool, error) {
	st := &s.bs.Status
	st.LastError = settlementError(err, s.now)
	done, why := exhausted(s, p)
	if done && !st.OutcomeUnknown {
		r.deadLetter(s, why+"; last error: "+st.LastError.Message)
		return ctrl.Result{}, true, nil
	}
	wait := backoff(st.Attempts, p.initial, p.max)
	if done {
		// The budget is spent but an earlier attempt may have charged: nothing is
		// sent any more, the provider is only asked by key until it answers.
		wait = p.max
		next := metav1.NewTime(s.now.Add(wait))
		st.NextAttemptAt = &next
		r.cond(s.bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonOutcomeUnknown,
			fmt.Sprintf("retries exhausted (%s), but an earlier attempt may have reached the provider: asking it by key until it answers, next at %s (last error: %s)",
				why, next.UTC().Format(time.RFC3339), st.LastError.Message))
		return ctrl.Result{RequeueAfter: wait}, true, nil
	}
	if e, ok := billing.AsError(err); ok && e.RetryAfter > wait {
		wait = e.RetryAfter
	}
	next := metav1.NewTime(s.now.Add(wait))
	st.NextAttemptAt = &next
	reason := hooksv1alpha1.ReasonTransientError
	if st.LastError.Class == errorClassAmbiguous {
		reason = hooksv1alpha1.ReasonOutcomeUnknown
	}
	r.cond(s.bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, reason,
		fmt.Sprintf("%s failed (%s: %s); next try at %s with the same key", what, st.LastError.Class,
			st.LastError.Message, next.UTC().Format(time.RFC3339)))
	return ctrl.Result{RequeueAfter: wait}, true, nil
}

// adopt takes the provider's record as the truth — if it is the same operation: a
// record under our key with another amount or usage is a conflict for a human.
func (r *BillingSettlementReconciler) adopt(ctx context.Context, s *settlementScope, rec billing.Record, p retryPolicy) ctrl.Result {
	bs, st := s.bs, &s.bs.Status
	if why := RecordMismatch(bs, rec); why != "" {
		st.ProviderRef, st.ProviderStatus = rec.ID, rec.Status
		r.requiresReconciliation(s, hooksv1alpha1.ReasonMismatchWithProvider,
			fmt.Sprintf("the provider's record %s under key %s differs: %s", rec.ID, bs.Spec.IdempotencyKey, why))
		return ctrl.Result{}
	}
	st.ProviderRef, st.ProviderStatus, st.LastError, st.NextAttemptAt, st.OutcomeUnknown = rec.ID, rec.Status, nil, nil, false
	if st.FirstSubmittedAt == nil { // found by the lookup before the first submission
		now := metav1.NewTime(s.now)
		st.FirstSubmittedAt = &now
	}
	switch rec.Status {
	case "settled":
		now := metav1.NewTime(s.now)
		st.State, st.SettledAt = hooksv1alpha1.SettlementSettled, &now
		msg := fmt.Sprintf("settled by %s as %s", s.provider.Name, rec.ID)
		r.cond(bs, hooksv1alpha1.ConditionSettled, metav1.ConditionTrue, hooksv1alpha1.ReasonProviderSettled, msg)
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionTrue, hooksv1alpha1.ReasonProviderSettled, msg)
		if c := findCondition(bs, hooksv1alpha1.ConditionDeadLettered); c != nil {
			r.cond(bs, hooksv1alpha1.ConditionDeadLettered, metav1.ConditionFalse, hooksv1alpha1.ReasonProviderSettled, "settled")
		}
		r.Recorder.Eventf(bs, nil, "Normal", hooksv1alpha1.ReasonProviderSettled, "Settle", "%s", msg)
		r.observeReceiptToSettled(ctx, bs)
		return ctrl.Result{}
	case "failed":
		reason := rec.FailureReason
		if reason == "" {
			reason = "no reason given"
		}
		r.fail(s, hooksv1alpha1.ReasonProviderFailed, fmt.Sprintf("the provider failed %s: %s", rec.ID, truncateMessage(reason)), false)
		return ctrl.Result{}
	default: // pending: poll until final
		st.State = hooksv1alpha1.SettlementSubmitted
		since := s.now.Sub(st.FirstSubmittedAt.Time)
		wait := min(max(since/2, p.initial), maxPollInterval)
		next := metav1.NewTime(s.now.Add(wait))
		st.NextAttemptAt = &next
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonProviderPending,
			fmt.Sprintf("the provider has it as %s (pending); polling by key, next at %s", rec.ID, next.UTC().Format(time.RFC3339)))
		return ctrl.Result{RequeueAfter: wait}
	}
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

func (r *BillingSettlementReconciler) fail(s *settlementScope, reason, msg string, deadLettered bool) {
	bs := s.bs
	bs.Status.State, bs.Status.NextAttemptAt = hooksv1alpha1.SettlementFailed, nil
	r.cond(bs, hooksv1alpha1.ConditionSettled, metav1.ConditionFalse, reason, msg)
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
	if deadLettered {
		deadLetters.Inc()
		r.cond(bs, hooksv1alpha1.ConditionDeadLettered, metav1.ConditionTrue, reason,
			msg+"; to retry with the same key: kubectl annotate billingsettlement "+bs.Name+" "+
				hooksv1alpha1.AnnotationReplay+"=\"$(date +%s)\" --overwrite")
		r.Recorder.Eventf(bs, nil, "Warning", hooksv1alpha1.ReasonRetriesExhausted, "DeadLetter", "%s", msg)
		return
	}
	r.Recorder.Eventf(bs, nil, "Warning", reason, "Fail", "%s", msg)
}

func (r *BillingSettlementReconciler) deadLetter(s *settlementScope, why string) {
	r.fail(s, hooksv1alpha1.ReasonRetriesExhausted, "retries exhausted: "+why, true)
}

func (r *BillingSettlementReconciler) requiresReconciliation(s *settlementScope, reason, msg string) {
	bs := s.bs
	bs.Status.State, bs.Status.NextAttemptAt = hooksv1alpha1.SettlementRequiresReconciliation, nil
	r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg+"; see docs/runbook.md")
	r.Recorder.Eventf(bs, nil, "Warning", reason, "Reconcile", "%s", msg)
}

// updateReversedBy lists the compensations that reverse this settlement.
func (r *BillingSettlementReconciler) updateReversedBy(ctx context.Context, s *settlementScope) error {
	var l hooksv1alpha1.BillingSettlementList
	if err := r.List(ctx, &l, client.InNamespace(s.bs.Namespace), client.MatchingFields{IndexSettlementReverses: s.bs.Name}); err != nil {
		return fmt.Errorf("list compensations of %s: %w", s.bs.Name, err)
	}
	var names []string
	for _, c := range l.Items {
		if len(names) < 16 {
			names = append(names, c.Name)
		}
	}
	s.bs.Status.ReversedBy = names
	return nil
}

// reconcileDelete holds the finalizer while the outcome at the provider is unknown,
// and keeps resolving it (by key, never by a new submission) so the hold ends as soon
// as the provider answers.
func (r *BillingSettlementReconciler) reconcileDelete(ctx context.Context, s *settlementScope) (ctrl.Result, error) {
	bs, st := s.bs, &s.bs.Status
	unknown := st.OutcomeUnknown || (st.FirstSubmittedAt != nil &&
		(st.State == hooksv1alpha1.SettlementSubmitted || st.State == hooksv1alpha1.SettlementPending))
	if unknown {
		if res, done, err := r.resolveProvider(ctx, s); done || err != nil {
			return res, err
		}
		rec, found, err := s.client.Lookup(ctx, bs.Spec.IdempotencyKey)
		switch {
		case err != nil:
			// keep holding
		case found:
			r.adopt(ctx, s, rec, policyOf(s.provider))
			unknown = st.State == hooksv1alpha1.SettlementSubmitted
		default:
			unknown, st.OutcomeUnknown = false, false // authoritative: no charge under this key
		}
	}
	if unknown {
		msg := "deletion is held: the provider's outcome for key " + bs.Spec.IdempotencyKey + " is not known yet"
		if c := findCondition(bs, hooksv1alpha1.ConditionReady); c == nil || c.Reason != hooksv1alpha1.ReasonDeletionBlocked {
			r.Recorder.Eventf(bs, nil, "Warning", hooksv1alpha1.ReasonDeletionBlocked, "Delete", "%s", msg)
		}
		r.cond(bs, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonDeletionBlocked, msg)
		wait := 30 * time.Second
		if s.provider != nil {
			p := policyOf(s.provider)
			wait = backoff(st.Attempts, p.initial, p.max)
		}
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	if err := r.patchStatus(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if controllerutil.ContainsFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection) {
		patch := client.MergeFrom(bs.DeepCopy())
		controllerutil.RemoveFinalizer(bs, hooksv1alpha1.FinalizerSettlementProtection)
		if err := r.Patch(ctx, bs, patch); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("remove finalizer of billingsettlement %s: %w", bs.Name, err)
		}
	}
	s.before = s.bs.DeepCopy() // nothing more to write: the object is going away
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller. It runs on spec and metadata changes
// (new object, replay annotation, deletion), not on its own status writes, and when
// a compensation naming it appears.
func (r *BillingSettlementReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &hooksv1alpha1.BillingSettlement{},
		IndexSettlementReverses, func(obj client.Object) []string {
			if rev := obj.(*hooksv1alpha1.BillingSettlement).Spec.Reverses; rev != "" {
				return []string{rev}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("index billingsettlements by reverses: %w", err)
	}
	reversed := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		if rev := obj.(*hooksv1alpha1.BillingSettlement).Spec.Reverses; rev != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: rev}}}
		}
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(BillingSettlementControllerName).
		For(&hooksv1alpha1.BillingSettlement{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{},
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return !e.ObjectNew.GetDeletionTimestamp().IsZero()
			}}))).
		Watches(&hooksv1alpha1.BillingSettlement{}, reversed, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false },
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1)}).
		Complete(r)
}

// RecordMismatch says how a provider's record differs from the settlement it is
// filed under ("" when it matches). Fields the provider did not return are not
// compared.
func RecordMismatch(bs *hooksv1alpha1.BillingSettlement, rec billing.Record) string {
	if rec.SettlementKey != "" && rec.SettlementKey != bs.Spec.SettlementKey {
		return fmt.Sprintf("settlement key %q locally, %q at the provider", bs.Spec.SettlementKey, rec.SettlementKey)
	}
	if rec.Customer != "" && rec.Customer != bs.Spec.Customer {
		return fmt.Sprintf("customer %q locally, %q at the provider", bs.Spec.Customer, rec.Customer)
	}
	if want := strings.ToLower(string(bs.Spec.Type)); rec.Type != "" && want != "" && rec.Type != want {
		return fmt.Sprintf("type %s locally, %s at the provider", want, rec.Type)
	}
	if a, b := bs.Spec.Amount, rec.Amount; a != nil && b != nil && (a.Minor != b.Minor || a.Currency != b.Currency) {
		return fmt.Sprintf("amount %d %s locally, %d %s at the provider", a.Minor, a.Currency, b.Minor, b.Currency)
	}
	if u, v := bs.Spec.Usage, rec.Usage; u != nil && v != nil && !sameQuantity(u.Quantity, v.Quantity) {
		return fmt.Sprintf("usage %s locally, %s at the provider", u.Quantity, v.Quantity)
	}
	return ""
}

func sameQuantity(a, b string) bool {
	x, ok1 := new(big.Rat).SetString(a)
	y, ok2 := new(big.Rat).SetString(b)
	if !ok1 || !ok2 {
		return a == b
	}
	return x.Cmp(y) == 0
}

// truncateToken bounds an annotation token to what status stores, before comparing,
// so an over-long token is not taken as new on every reconcile.
func truncateToken(t string) string {
	if len(t) > 256 {
		return t[:256]
	}
	return t
}
