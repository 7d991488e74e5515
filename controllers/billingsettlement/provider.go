package billingsettlement

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/credentials"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

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
	s.provider, s.policy, s.target = &bp, settlement.PolicyOf(&bp, billing.Capabilities{}), providerclient.TargetOf(&bp)
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
	// What the provider can answer about this request, and so how long a resend under
	// its key is safe and the retry budget lasts (docs/design.md §14).
	s.caps = billing.CapabilitiesOf(c, s.request())
	s.policy = settlement.PolicyOf(&bp, s.caps)
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
