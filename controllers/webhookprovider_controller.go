package controllers

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
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/extract"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/signature"
)

// WebhookProviderControllerName names the controller in logs and metrics.
const WebhookProviderControllerName = "webhookprovider"

// WebhookProviderReconciler reports whether a provider can receive: its routes
// compile, its signing Secret exists and every key in it is usable. It reads the
// Secret with a live GET (no cluster-wide Secret watch, so only `get` is needed) and
// re-checks every SecretRecheckInterval to notice rotations and fixes.
type WebhookProviderReconciler struct {
	client.Client
	// APIReader reads Secrets directly from the API server.
	APIReader client.Reader
	// SecretRecheckInterval is how often the Secret is re-read (1m).
	SecretRecheckInterval time.Duration
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch

// Reconcile validates one provider and writes its Ready condition.
func (r *WebhookProviderReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
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
	setCondition(&p.Status.Conditions, p.Generation, hooksv1alpha1.ConditionReady, status, reason, message)
	if err := r.nextRetentionSweep(ctx, &p); err != nil {
		return ctrl.Result{}, err
	}
	if _, err := patchStatus(ctx, r.Client, &p, before, false); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: r.interval()}, nil
}

func (r *WebhookProviderReconciler) interval() time.Duration {
	if r.SecretRecheckInterval > 0 {
		return r.SecretRecheckInterval
	}
	return time.Minute
}

// check returns the Ready condition's status, reason and message; err is only for
// failures worth a retry (the API server did not answer).
func (r *WebhookProviderReconciler) check(ctx context.Context, p *hooksv1alpha1.WebhookProvider) (metav1.ConditionStatus, string, string, error) {
	if _, err := extract.Compile(p.Namespace, p.Name, &p.Spec); err != nil {
		return metav1.ConditionFalse, hooksv1alpha1.ReasonInvalidSpec, err.Error(), nil
	}
	cfg := extract.SignatureConfig(&p.Spec.Signature)
	if err := cfg.Validate(); err != nil {
		return metav1.ConditionFalse, hooksv1alpha1.ReasonInvalidSpec, err.Error(), nil
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
	usable := 0
	for k, v := range s.Data {
		if len(v) == 0 {
			continue
		}
		// A key is usable if it can sign: the same decoding the verifier applies.
		if _, err := signature.Sign(cfg, v, "probe", time.Unix(1, 0), []byte("{}")); err != nil {
			return metav1.ConditionFalse, hooksv1alpha1.ReasonSecretInvalid,
				fmt.Sprintf("key %q of Secret %q is not a valid %s secret", k, key.Name, cfg.Scheme), nil
		}
		usable++
	}
	p.Status.SecretKeys = int32(usable)
	if usable == 0 {
		return metav1.ConditionFalse, hooksv1alpha1.ReasonSecretInvalid,
			fmt.Sprintf("Secret %q holds no non-empty key", key.Name), nil
	}
	if status, reason, message, err := r.checkSinkCredentials(ctx, p); err != nil || status != "" {
		return status, reason, message, err
	}
	return metav1.ConditionTrue, hooksv1alpha1.ReasonValid,
		fmt.Sprintf("receiving at %s with %d signing key(s)", p.Status.EndpointPath, usable), nil
}

// checkSinkCredentials makes a route's job sink Secret that is missing or does not
// opt in to being sent to the sink visible on the provider (Ready=False), before a
// completion waits on it. Deliveries are still received: the completions wait, unsent.
// It returns an empty status when every sink's credentials are usable.
func (r *WebhookProviderReconciler) checkSinkCredentials(ctx context.Context, p *hooksv1alpha1.WebhookProvider) (metav1.ConditionStatus, string, string, error) {
	for _, route := range p.Spec.Routes {
		for _, op := range route.Operations {
			if op.JobCompletion == nil || op.JobCompletion.Sink == nil || op.JobCompletion.Sink.CredentialsSecretRef == nil {
				continue
			}
			sink := op.JobCompletion.Sink
			_, err := readCredential(ctx, r.APIReader, p.Namespace, sink.CredentialsSecretRef, hooksv1alpha1.CredentialForJobSink, sink.URL)
			switch {
			case err == nil:
				continue
			case isCredentialRefused(err):
				return metav1.ConditionFalse, hooksv1alpha1.ReasonCredentialsNotAllowed, truncateMessage(fmt.Sprintf(
					"deliveries are received, but job completions of route %q wait: %v", route.EventType, err)), nil
			case apierrors.IsNotFound(err):
				return metav1.ConditionFalse, hooksv1alpha1.ReasonSecretNotFound, truncateMessage(fmt.Sprintf(
					"deliveries are received, but job completions of route %q wait: the sink's Secret %q is not found",
					route.EventType, sink.CredentialsSecretRef.Name)), nil
			case errors.Is(err, errCredentialKeyMissing):
				return metav1.ConditionFalse, hooksv1alpha1.ReasonSecretInvalid, truncateMessage(fmt.Sprintf(
					"deliveries are received, but job completions of route %q wait: %v", route.EventType, err)), nil
			default:
				return "", "", "", fmt.Errorf("check job sink credentials of route %q: %w", route.EventType, err)
			}
		}
	}
	return "", "", "", nil
}

// nextRetentionSweep shows when retention next deletes one of the provider's events.
func (r *WebhookProviderReconciler) nextRetentionSweep(ctx context.Context, p *hooksv1alpha1.WebhookProvider) error {
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

// SetupWithManager registers the controller. Status-only updates do not trigger it.
func (r *WebhookProviderReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(WebhookProviderControllerName).
		For(&hooksv1alpha1.WebhookProvider{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}
