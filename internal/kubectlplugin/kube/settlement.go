package kube

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// ResolveSettlement finds the settlement ref names: by object name, by the name derived
// from ref as a settlement key (for a structured key from the key itself, else for the
// webhook provider given), else by a list matching the settlement key or idempotency
// key. tried says what was looked for, for the message when nothing matches. replay and
// refund both take a settlement by any of these references.
func ResolveSettlement(ctx context.Context, cl client.Client, ns, provider, ref string) (*hooksv1alpha1.BillingSettlement, []string, error) {
	var tried []string
	try := func(name, why string) (*hooksv1alpha1.BillingSettlement, error) {
		for _, t := range tried {
			if strings.HasPrefix(t, "BillingSettlement "+name+" ") {
				return nil, nil
			}
		}
		tried = append(tried, "BillingSettlement "+name+" ("+why+")")
		var bs hooksv1alpha1.BillingSettlement
		ok, err := GetIfExists(ctx, cl, ns, name, &bs)
		if !ok || err != nil {
			return nil, err
		}
		// A name derived from a key must hold that key: a settlement that merely
		// shares the name is not the one asked for.
		if why != "object name" && bs.Spec.SettlementKey != ref {
			return nil, nil
		}
		return &bs, nil
	}
	if bs, err := try(ref, "object name"); bs != nil || err != nil {
		return bs, tried, err
	}
	if k, ok := identity.ParseSettlementKey(ref); ok {
		if bs, err := try(identity.SettlementNameFor(k.Provider, ref), "settlement key"); bs != nil || err != nil {
			return bs, tried, err
		}
	} else if provider != "" {
		if bs, err := try(identity.SettlementName(provider, ref), "settlement key of webhook provider "+provider); bs != nil || err != nil {
			return bs, tried, err
		}
	}
	tried = append(tried, "every BillingSettlement of the namespace whose settlement key or idempotency key is the reference")
	found, err := FindSettlements(ctx, cl, ns, func(bs *hooksv1alpha1.BillingSettlement) bool {
		return bs.Spec.SettlementKey == ref || bs.Spec.IdempotencyKey == ref
	})
	if err != nil || len(found) == 0 {
		return nil, tried, err
	}
	if len(found) > 1 {
		names := make([]string, len(found))
		for i := range found {
			names[i] = found[i].Name
		}
		return nil, tried, fmt.Errorf("%q matches %d settlements (%s): give the name", ref, len(found), strings.Join(names, ", "))
	}
	return &found[0], tried, nil
}
