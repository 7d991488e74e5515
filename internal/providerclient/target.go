package providerclient

import (
	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
)

// TargetOf is where a BillingProvider points: its endpoint, its identity and the
// Secret its token comes from.
func TargetOf(bp *hooksv1alpha1.BillingProvider) hooksv1alpha1.ProviderTarget {
	ref := bp.Spec.CredentialsSecretRef
	key := ref.Key
	if key == "" {
		key = "token"
	}
	return hooksv1alpha1.ProviderTarget{Endpoint: bp.Spec.Endpoint, BillingProviderUID: string(bp.UID),
		CredentialsSecret: ref.Name + "/" + key}
}

// TargetFor is targetOf with the key mode bp's adapter c reports (a Stripe key's).
func TargetFor(bp *hooksv1alpha1.BillingProvider, c billing.Client) hooksv1alpha1.ProviderTarget {
	t := TargetOf(bp)
	t.Mode = adapters.Mode(c)
	return t
}
