package webhookprovider

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/credentials"
	"github.com/settlement-operator/settlement-operator/internal/extract"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/senders"
	"github.com/settlement-operator/settlement-operator/internal/signingkeys"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

// ControllerName names the controller in logs and metrics.
const ControllerName = "webhookprovider"

// Reconciler reports whether a provider can receive: its routes
// compile, its signing Secret exists and the keys it signs with are usable
// (internal/signingkeys, the same selection the receiver verifies with). It reads the
// Secret with a live GET (no cluster-wide Secret watch, so only `get` is needed) and
// re-checks every SecretRecheckInterval to notice rotations and fixes.
type Reconciler struct {
	client.Client
	// APIReader reads Secrets directly from the API server.
	APIReader client.Reader
	// SecretRecheckInterval is how often the Secret of a Ready provider is re-read (1m).
	SecretRecheckInterval time.Duration
	// SecretWaitInterval is how often a provider whose Secret is missing, invalid or
	// refused looks again (5s).
	SecretWaitInterval time.Duration
	// WaitingGrace is how long a provider waiting for its Secret or BillingProvider to
	// be created is Reconciling before it is Stalled (conditions.DefaultWaitingGrace).
	WaitingGrace time.Duration
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingproviders,verbs=get;list;watch

// Reconcile validates one provider and writes its Ready condition.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var p hooksv1alpha1.WebhookProvider
	if err := r.Get(ctx, req.NamespacedName, &p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := p.DeepCopy()
	p.Status.ObservedGeneration = p.Generation
	p.Status.EndpointPath = identity.EndpointPath(p.Namespace, p.Name)

	status, reason, message, err := r.check(ctx, &p)
	if err != nil {
		return ctrl.Result{}, err
	}
	readiness := readinessOf(status, reason)
	stallIn := conditions.SetReadiness(&p.Status.Conditions, p.Generation, readiness, reason, message, time.Now(), r.WaitingGrace)
	if err := r.nextRetentionSweep(ctx, &p); err != nil {
		return ctrl.Result{}, err
	}
	if _, err := statuspatch.Patch(ctx, r.Client, &p, before, false); err != nil {
		return ctrl.Result{}, err
	}
	next := r.interval(reason)
	if stallIn > 0 && stallIn < next {
		next = stallIn // a wait that outlasts the grace turns Stalled on time
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// readinessOf tells a configuration that cannot work as it is (Stalled at once) from
// one waiting for something that may still be created, as a GitOps tool may apply a
// Secret or a BillingProvider after the provider, or a secret store may fill it in
// later (Reconciling, then Stalled after the waiting grace).
func readinessOf(status metav1.ConditionStatus, reason string) conditions.Readiness {
	switch {
	case status == metav1.ConditionTrue:
		return conditions.Working
	case reason == hooksv1alpha1.ReasonSecretNotFound, reason == hooksv1alpha1.ReasonBillingProviderNotFound:
		return conditions.Waiting
	}
	// InvalidSpec, SecretInvalid, SigningKeyRefused, SigningKeysUnnamed,
	// CredentialsNotAllowed: only a change to the spec or the Secret helps.
	return conditions.Broken
}

// interval is when the provider is checked again. Secrets are not watched (the
// operator may only get them by name), so a provider waiting for its Secret to appear
// or be fixed looks every few seconds; a Ready one only needs to notice rotations.
func (r *Reconciler) interval(reason string) time.Duration {
	switch reason {
	case hooksv1alpha1.ReasonSecretNotFound, hooksv1alpha1.ReasonSecretInvalid, hooksv1alpha1.ReasonCredentialsNotAllowed,
		hooksv1alpha1.ReasonSigningKeyRefused, hooksv1alpha1.ReasonSigningKeysUnnamed:
		if r.SecretWaitInterval > 0 {
			return r.SecretWaitInterval
		}
		return 5 * time.Second
	}
	if r.SecretRecheckInterval > 0 {
		return r.SecretRecheckInterval
	}
	return time.Minute
}

// check returns the Ready condition's status, reason and message; err is only for
// Failures worth a retry (the API server did not answer).
func (r *Reconciler) check(ctx context.Context, p *hooksv1alpha1.WebhookProvider) (metav1.ConditionStatus, string, string, error) {
	// What the receiver serves: the spec with its sender preset applied.
	spec := senders.Apply(&p.Spec)
	if _, err := extract.Compile(p.Namespace, p.Name, &spec); err != nil {
		return metav1.ConditionFalse, hooksv1alpha1.ReasonInvalidSpec, err.Error(), nil
	}
	cfg := extract.SignatureConfig(&spec.Signature)
	if err := cfg.Validate(); err != nil {
		return metav1.ConditionFalse, hooksv1alpha1.ReasonInvalidSpec, err.Error(), nil
	}
	if missing, err := r.missingBillingProviders(ctx, p); err != nil || len(missing) > 0 {
		return metav1.ConditionFalse, hooksv1alpha1.ReasonBillingProviderNotFound, conditions.TruncateMessage(fmt.Sprintf(
			"routes charge through BillingProvider %s, which does not exist in namespace %s: "+
				"deliveries are received, and their settlements wait until it is created", quotedList(missing), p.Namespace)), err
	}
	var s corev1.Secret
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.Signature.SecretRef.Name}
	if err := r.APIReader.Get(ctx, key, &s); err != nil {
		if apierrors.IsNotFound(err) {
			p.Status.SecretKeys = 0
			return metav1.ConditionFalse, hooksv1alpha1.ReasonSecretNotFound,
				fmt.Sprintf("Secret %q not found; deliveries are answered 503 until it exists", key.Name), nil
		}
		return "", "", "", fmt.Errorf("read secret %s: %w", key, err)
	}
	// The receiver verifies with the same selection (internal/signingkeys), so what
	// this condition says is what it accepts.
	keys, err := signingkeys.Select(&s, p.Spec.Signature.SecretRef, cfg.Scheme)
	if err != nil {
		p.Status.SecretKeys = 0
		refusal, ok := signingkeys.AsRefusal(err)
		if !ok {
			return "", "", "", fmt.Errorf("select signing keys of secret %s: %w", key, err)
		}
		return metav1.ConditionFalse, refusal.Reason, conditions.TruncateMessage(refusal.Message), nil
	}
	p.Status.SecretKeys = int32(len(keys.Names))
	if status, reason, message, err := r.checkSinkCredentials(ctx, p); err != nil || status != "" {
		return status, reason, message, err
	}
	if keys.Implicit {
		return metav1.ConditionTrue, hooksv1alpha1.ReasonValid, conditions.TruncateMessage(fmt.Sprintf(
			"receiving at %s, signed with key %q, the only key of Secret %q; name it in spec.signature.secretRef.keys "+
				"(keys: [%q]): once the Secret holds a second key, a provider that names none answers 503 until it does",
			p.Status.EndpointPath, keys.Names[0], key.Name, keys.Names[0])), nil
	}
	what := "key"
	if len(keys.Names) > 1 {
		what = "keys" // a rotation: both sign until the old name is removed
	}
	return metav1.ConditionTrue, hooksv1alpha1.ReasonValid, conditions.TruncateMessage(fmt.Sprintf(
		"receiving at %s, signed with %s %s of Secret %q", p.Status.EndpointPath, what, quotedList(keys.Names), key.Name)), nil
}

// checkSinkCredentials makes a route's job sink Secret that is missing or does not
// opt in to being sent to the sink visible on the provider (Ready=False), before a
// completion waits on it. Deliveries are still received: the completions wait, unsent.
// It returns an empty status when every sink's credentials are usable.
func (r *Reconciler) checkSinkCredentials(ctx context.Context, p *hooksv1alpha1.WebhookProvider) (metav1.ConditionStatus, string, string, error) {
	for _, route := range p.Spec.Routes {
		for _, op := range route.Operations {
			if op.JobCompletion == nil || op.JobCompletion.Sink == nil || op.JobCompletion.Sink.CredentialsSecretRef == nil {
				continue
			}
			sink := op.JobCompletion.Sink
			_, err := credentials.Read(ctx, r.APIReader, p.Namespace, sink.CredentialsSecretRef, hooksv1alpha1.CredentialForJobSink, sink.URL)
			switch {
			case err == nil:
				continue
			case credentials.IsRefused(err):
				return metav1.ConditionFalse, hooksv1alpha1.ReasonCredentialsNotAllowed, conditions.TruncateMessage(fmt.Sprintf(
					"deliveries are received, but job completions of route %q wait: %v", route.EventType, err)), nil
			case apierrors.IsNotFound(err):
				return metav1.ConditionFalse, hooksv1alpha1.ReasonSecretNotFound, conditions.TruncateMessage(fmt.Sprintf(
					"deliveries are received, but job completions of route %q wait: the sink's Secret %q is not found",
					route.EventType, sink.CredentialsSecretRef.Name)), nil
			case errors.Is(err, credentials.ErrKeyMissing):
				return metav1.ConditionFalse, hooksv1alpha1.ReasonSecretInvalid, conditions.TruncateMessage(fmt.Sprintf(
					"deliveries are received, but job completions of route %q wait: %v", route.EventType, err)), nil
			default:
				return "", "", "", fmt.Errorf("check job sink credentials of route %q: %w", route.EventType, err)
			}
		}
	}
	return "", "", "", nil
}

// missingBillingProviders lists the BillingProviders the routes charge through that
// do not exist (from the cache: the controller watches BillingProviders).
func (r *Reconciler) missingBillingProviders(ctx context.Context, p *hooksv1alpha1.WebhookProvider) ([]string, error) {
	var missing []string
	for _, name := range billingProvidersOf(p) {
		var bp hooksv1alpha1.BillingProvider
		err := r.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: name}, &bp)
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, name)
		case err != nil:
			return nil, fmt.Errorf("get billingprovider %s/%s: %w", p.Namespace, name, err)
		}
	}
	return missing, nil
}

// billingProvidersOf lists, once each and in order, the BillingProviders a
// provider's routes name.
func billingProvidersOf(p *hooksv1alpha1.WebhookProvider) []string {
	var names []string
	for _, route := range p.Spec.Routes {
		for _, op := range route.Operations {
			if op.Settlement != nil && !slices.Contains(names, op.Settlement.BillingProviderRef) {
				names = append(names, op.Settlement.BillingProviderRef)
			}
		}
	}
	return names
}

func quotedList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// nextRetentionSweep shows when retention next deletes one of the provider's events.
func (r *Reconciler) nextRetentionSweep(ctx context.Context, p *hooksv1alpha1.WebhookProvider) error {
	var l hooksv1alpha1.WebhookEventList
	// Read-only use of cached objects: no deep copy of every event each minute.
	if err := r.List(ctx, &l, client.InNamespace(p.Namespace), client.MatchingLabels{hooksv1alpha1.LabelProvider: p.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list events of %s: %w", p.Name, err)
	}
	var next *metav1.Time
	for i := range l.Items {
		if d := l.Items[i].Status.DeleteAfter; d != nil && (next == nil || d.Before(next)) {
			next = d.DeepCopy()
		}
	}
	p.Status.NextRetentionSweep = next
	return nil
}

// SetupWithManager registers the controller. Status-only updates do not trigger it;
// a BillingProvider created or deleted re-checks the providers of its namespace whose
// routes name it.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	namingIt := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		var l hooksv1alpha1.WebhookProviderList
		if err := r.List(ctx, &l, client.InNamespace(obj.GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "list webhookproviders naming a billingprovider", "billingprovider", obj.GetName())
			return nil
		}
		var reqs []reconcile.Request
		for i := range l.Items {
			if slices.Contains(billingProvidersOf(&l.Items[i]), obj.GetName()) {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
			}
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&hooksv1alpha1.WebhookProvider{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&hooksv1alpha1.BillingProvider{}, namingIt, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false }, // existence is all it reads
		})).
		Complete(r)
}
