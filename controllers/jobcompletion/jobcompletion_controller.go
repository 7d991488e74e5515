package jobcompletion

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/credentials"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/jobsink"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

// ControllerName names the controller in logs and metrics.
const ControllerName = "jobcompletion"

// maxSourceEvents caps status.sourceEvents so a chatty job cannot grow its record.
const maxSourceEvents = 16

// Reconciler applies a job's latest proposed completion version to its
// sink. The version guard lives in the spec (only a greater version is ever
// proposed, enforced by CEL and resourceVersion); this controller applies what is
// proposed, exactly once per version, by an idempotency key derived from
// (provider, job, version).
type Reconciler struct {
	client.Client
	// APIReader reads sink credentials (Secrets) by name.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// SinkTimeout bounds each call to an HTTP sink (10s).
	SinkTimeout time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
	// MaxConcurrentReconciles is how many records are worked on at once (1): calls to
	// slow peers must not queue every other record behind them.
	MaxConcurrentReconciles int
	// CredentialRecheckInterval is how soon a completion whose sink Secret is refused
	// (CredentialsNotAllowed) looks again (1m): Secrets are not watched.
	CredentialRecheckInterval time.Duration
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=jobcompletions,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=jobcompletions/status,verbs=get;update;patch

// Reconcile applies the proposed version of one job.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	var jc hooksv1alpha1.JobCompletion
	if err := r.Get(ctx, req.NamespacedName, &jc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if jc.AppliedOnCreation() {
		// No sink and its first version: creating it applied it, and its state is
		// derived from the spec (JobCompletion.Progress). Writing "Applied" would be one
		// more API write per event that tells no reader anything.
		return ctrl.Result{}, nil
	}
	before := jc.DeepCopy()
	defer func() {
		wrote, perr := statuspatch.Patch(ctx, r.Client, &jc, before, false)
		if perr != nil && err == nil {
			err = perr
		}
		if wrote && before.Status.State != jc.Status.State {
			metrics.JobTransitions.WithLabelValues(string(jc.Status.State)).Inc()
		}
	}()
	return r.reconcile(ctx, &jc)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) reconcile(ctx context.Context, jc *hooksv1alpha1.JobCompletion) (ctrl.Result, error) {
	st := &jc.Status
	v := jc.Spec.Completion.Version
	if st.ObservedGeneration != jc.Generation {
		// A new version was proposed: it starts its own attempt count and deadline.
		st.ObservedGeneration = jc.Generation
		st.State, st.Attempts, st.LastError, st.DeferredSince, st.NextAttemptAt =
			hooksv1alpha1.JobCompletionPending, 0, "", nil, nil
		addSourceEvent(st, jc.Spec.Completion.SourceEvent)
	}
	switch st.State {
	case hooksv1alpha1.JobCompletionApplied, hooksv1alpha1.JobCompletionSuperseded,
		hooksv1alpha1.JobCompletionFailed, hooksv1alpha1.JobCompletionRequiresReconciliation:
		return ctrl.Result{}, nil
	}
	if st.AppliedVersion != nil && *st.AppliedVersion >= v {
		r.applied(jc, *st.AppliedVersion)
		return ctrl.Result{}, nil
	}
	if wait := r.untilNextAttempt(st); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}

	sink := jc.Spec.Sink
	if !jc.Spec.HasSink() {
		// A later version of a job without a sink (or one written by an older
		// operator): applied now, and written, as the spec alone no longer says so.
		r.applied(jc, v)
		return ctrl.Result{}, nil
	}

	token, err := credentials.Read(ctx, r.APIReader, jc.Namespace, sink.CredentialsSecretRef, hooksv1alpha1.CredentialForJobSink, sink.URL)
	if credentials.IsRefused(err) {
		return r.credentialsRefused(jc, err), nil
	}
	if err != nil {
		// Counted like an attempt so the backoff grows: a missing Secret must not be
		// re-read every second.
		st.Attempts++
		return r.retry(jc, fmt.Sprintf("sink credentials: %v", err), 0)
	}
	timeout := r.SinkTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	c := jobsink.New(sink.URL, token, timeout, nil)
	completion := jobsink.Completion{JobID: jc.Spec.JobID, Version: v, State: string(jc.Spec.Completion.State)}
	if t := jc.Spec.Completion.CompletedAt; t != nil {
		tt := t.Time
		completion.CompletedAt = &tt
	}
	if u := jc.Spec.Completion.Usage; u != nil {
		completion.Usage = &billing.Usage{Meter: u.Meter, Quantity: u.Quantity, Unit: u.Unit}
	}
	st.Attempts++
	res, err := c.Apply(ctx, identity.JobSinkKey(jc.Namespace, jc.Spec.Provider, jc.Spec.JobID, v), completion)
	if err != nil {
		if e, ok := billing.AsError(err); ok && e.Class == billing.Terminal {
			st.State, st.LastError = hooksv1alpha1.JobCompletionFailed, conditions.TruncateMessage(e.Error())
			conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionApplied, metav1.ConditionFalse,
				hooksv1alpha1.ReasonSinkRejected, "the sink refused version "+strconv.FormatInt(v, 10)+": "+conditions.TruncateMessage(e.Error()))
			conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
				hooksv1alpha1.ReasonSinkRejected, "terminal: fix the sink or the job and report a newer version")
			r.Recorder.Eventf(jc, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonSinkRejected, "Apply", "sink refused version %d: %s", v, e.Code)
			return ctrl.Result{}, nil
		}
		var after time.Duration
		if e, ok := billing.AsError(err); ok {
			after = e.RetryAfter
		}
		return r.retry(jc, err.Error(), after)
	}
	switch res.Outcome {
	case jobsink.Applied:
		r.applied(jc, v)
	case jobsink.Superseded:
		st.State, st.LastError, st.NextAttemptAt = hooksv1alpha1.JobCompletionSuperseded, "", nil
		msg := fmt.Sprintf("the sink already holds version %d, newer than version %d; nothing applied", res.CurrentVersion, v)
		conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionApplied, metav1.ConditionFalse,
			hooksv1alpha1.ReasonVersionSuperseded, msg)
		conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue,
			hooksv1alpha1.ReasonVersionSuperseded, msg)
		r.Recorder.Eventf(jc, nil, corev1.EventTypeNormal, hooksv1alpha1.ReasonVersionSuperseded, "Apply", "%s", msg)
	case jobsink.Deferred:
		return r.defer404(jc, sink)
	}
	return ctrl.Result{}, nil
}

// credentialsRefused leaves the version Pending, unsent, while its sink's Secret does
// not opt in to being sent there: no attempt is counted (nothing was tried), and the
// Secret is read again every CredentialRecheckInterval.
func (r *Reconciler) credentialsRefused(jc *hooksv1alpha1.JobCompletion, err error) ctrl.Result {
	st := &jc.Status
	wait := r.CredentialRecheckInterval
	if wait <= 0 {
		wait = time.Minute
	}
	next := metav1.NewTime(r.now().Add(wait))
	msg := conditions.TruncateMessage("sink credentials: " + err.Error())
	if st.LastError != msg {
		r.Recorder.Eventf(jc, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonCredentialsNotAllowed, "Apply", "%s", msg)
	}
	st.State, st.LastError, st.NextAttemptAt = hooksv1alpha1.JobCompletionPending, msg, &next
	conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionApplied, metav1.ConditionFalse,
		hooksv1alpha1.ReasonCredentialsNotAllowed, msg)
	conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
		hooksv1alpha1.ReasonCredentialsNotAllowed, "waiting for the sink's Secret to opt in; nothing is sent until then")
	return ctrl.Result{RequeueAfter: wait}
}

func (r *Reconciler) untilNextAttempt(st *hooksv1alpha1.JobCompletionStatus) time.Duration {
	if st.NextAttemptAt == nil {
		return 0
	}
	return st.NextAttemptAt.Sub(r.now())
}

func (r *Reconciler) applied(jc *hooksv1alpha1.JobCompletion, v int64) {
	st := &jc.Status
	// No Kubernetes Event for the happy path: it would be one more API write per job
	// and says nothing the Applied condition does not.
	if st.State != hooksv1alpha1.JobCompletionApplied {
		now := metav1.NewTime(r.now())
		st.AppliedAt = &now
	}
	st.State, st.AppliedVersion, st.LastError, st.NextAttemptAt, st.DeferredSince =
		hooksv1alpha1.JobCompletionApplied, &v, "", nil, nil
	msg := fmt.Sprintf("version %d applied", v)
	conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionApplied, metav1.ConditionTrue, hooksv1alpha1.ReasonVersionApplied, msg)
	conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue, hooksv1alpha1.ReasonVersionApplied, msg)
}

// The job sink's retry policies, carried out by the same backoff code as a
// settlement's (internal/settlement: exponential, jittered downward, Retry-After
// capped at twice the maximum).
var (
	sinkRetryPolicy = settlement.RetryPolicy{Initial: time.Second, Max: 5 * time.Minute}
	sinkDeferPolicy = settlement.RetryPolicy{Initial: 2 * time.Second, Max: time.Minute}
)

func (r *Reconciler) retry(jc *hooksv1alpha1.JobCompletion, msg string, retryAfter time.Duration) (ctrl.Result, error) {
	st := &jc.Status
	st.LastError = conditions.TruncateMessage(msg)
	wait := settlement.RetryWait(st.Attempts, sinkRetryPolicy, retryAfter, rand.Float64())
	next := metav1.NewTime(r.now().Add(wait))
	st.NextAttemptAt = &next
	conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionApplied, metav1.ConditionFalse,
		hooksv1alpha1.ReasonSinkUnavailable, fmt.Sprintf("attempt %d failed; retrying at %s: %s", st.Attempts, next.UTC().Format(time.RFC3339), st.LastError))
	conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
		hooksv1alpha1.ReasonSinkUnavailable, "retrying with the same idempotency key")
	return ctrl.Result{RequeueAfter: wait}, nil
}

func (r *Reconciler) defer404(jc *hooksv1alpha1.JobCompletion, sink *hooksv1alpha1.JobSink) (ctrl.Result, error) {
	st := &jc.Status
	now := r.now()
	if st.DeferredSince == nil {
		t := metav1.NewTime(now)
		st.DeferredSince = &t
		r.Recorder.Eventf(jc, nil, corev1.EventTypeNormal, hooksv1alpha1.ReasonSinkDeferred, "Apply",
			"the sink does not know job %q yet; retrying until the defer deadline", jc.Spec.JobID)
	}
	deadline := st.DeferredSince.Add(settlement.DurationOr(sink.DeferDeadline, time.Hour))
	if !now.Before(deadline) {
		st.State, st.NextAttemptAt = hooksv1alpha1.JobCompletionRequiresReconciliation, nil
		msg := fmt.Sprintf("the sink still did not know job %q at the defer deadline (%s)", jc.Spec.JobID, deadline.UTC().Format(time.RFC3339))
		conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionApplied, metav1.ConditionFalse, hooksv1alpha1.ReasonDeadlineExceeded, msg)
		conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonDeadlineExceeded, msg)
		r.Recorder.Eventf(jc, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonDeadlineExceeded, "Apply", "%s", msg)
		return ctrl.Result{}, nil
	}
	st.State, st.LastError = hooksv1alpha1.JobCompletionDeferred, ""
	wait := settlement.RetryWait(st.Attempts, sinkDeferPolicy, 0, rand.Float64())
	if left := deadline.Sub(now); wait > left {
		wait = left
	}
	next := metav1.NewTime(now.Add(wait))
	st.NextAttemptAt = &next
	msg := fmt.Sprintf("the sink does not know job %q yet; next try at %s, deadline %s", jc.Spec.JobID,
		next.UTC().Format(time.RFC3339), deadline.UTC().Format(time.RFC3339))
	conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionApplied, metav1.ConditionFalse, hooksv1alpha1.ReasonSinkDeferred, msg)
	conditions.Set(&st.Conditions, jc.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse, hooksv1alpha1.ReasonSinkDeferred, msg)
	return ctrl.Result{RequeueAfter: wait}, nil
}

func addSourceEvent(st *hooksv1alpha1.JobCompletionStatus, name string) {
	if name == "" {
		return
	}
	for _, s := range st.SourceEvents {
		if s == name {
			return
		}
	}
	st.SourceEvents = append(st.SourceEvents, name)
	if len(st.SourceEvents) > maxSourceEvents {
		st.SourceEvents = st.SourceEvents[len(st.SourceEvents)-maxSourceEvents:]
	}
}

// SetupWithManager registers the controller; only spec changes (a new proposed
// version) trigger it, not its own status writes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&hooksv1alpha1.JobCompletion{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1)}).
		Complete(r)
}
