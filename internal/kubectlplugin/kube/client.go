package kube

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
)

// Scheme holds the client-go types and the operator's, so that one client reads both
// (Secrets and the hooks.settlement.dev kinds).
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(hooksv1alpha1.AddToScheme(s))
	return s
}()

// Client is a client of the cluster the kubeconfig names. It reads the API server
// directly (no cache): every answer is the current state, which is what a person
// looking at a settlement needs.
func Client(c *cmdline.Flags, env func(string) string) (client.Client, error) {
	cfg, err := kubeConfig(c, env).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("read the kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-settlement"
	cfg.Timeout = c.Timeout
	cl, err := client.New(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		return nil, fmt.Errorf("connect to the cluster: %w", err)
	}
	return cl, nil
}

// GetIfExists reads one object; false when it does not exist. Any other error (no
// permission, no connection) is returned, with what was being read, so that a command
// never reports "not found" for what it was not allowed to read.
func GetIfExists(ctx context.Context, cl client.Client, ns, name string, obj client.Object) (bool, error) {
	// A reference that cannot be a name (a settlement key with "/", an event ID with
	// capitals) names no object: asking would only get a validation error back.
	if name == "" || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return false, nil
	}
	err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsForbidden(err):
		return false, fmt.Errorf("not allowed to read %s %s/%s: %w", kindOf(obj), ns, name, err)
	}
	return false, fmt.Errorf("read %s %s/%s: %w", kindOf(obj), ns, name, err)
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *hooksv1alpha1.WebhookEvent:
		return "WebhookEvent"
	case *hooksv1alpha1.JobCompletion:
		return "JobCompletion"
	case *hooksv1alpha1.BillingSettlement:
		return "BillingSettlement"
	case *hooksv1alpha1.WebhookProvider:
		return "WebhookProvider"
	}
	return fmt.Sprintf("%T", obj)
}

// WebhookProviders are the providers whose names are derived: --provider, else every
// WebhookProvider of the namespace, since every name the operator derives includes
// its webhook provider.
func WebhookProviders(ctx context.Context, cl client.Client, ns, provider string) ([]string, error) {
	if provider != "" {
		return []string{provider}, nil
	}
	var list hooksv1alpha1.WebhookProviderList
	if err := cl.List(ctx, &list, client.InNamespace(ns)); err != nil {
		if apierrors.IsForbidden(err) {
			return nil, errors.New("not allowed to list the WebhookProviders of namespace " + ns + ": give --provider")
		}
		return nil, fmt.Errorf("list the WebhookProviders of namespace %s (or give --provider): %w", ns, err)
	}
	out := make([]string, 0, len(list.Items))
	for _, p := range list.Items {
		out = append(out, p.Name)
	}
	return out, nil
}

// FindSettlements lists the namespace's settlements, a page at a time, and keeps those
// match accepts. It is the only way from an idempotency key (a hash) or a hand-written
// settlement key to its settlement.
func FindSettlements(ctx context.Context, cl client.Client, ns string, match func(*hooksv1alpha1.BillingSettlement) bool) ([]hooksv1alpha1.BillingSettlement, error) {
	var out []hooksv1alpha1.BillingSettlement
	cont := ""
	for {
		var list hooksv1alpha1.BillingSettlementList
		if err := cl.List(ctx, &list, client.InNamespace(ns), client.Limit(500), client.Continue(cont)); err != nil {
			return nil, fmt.Errorf("list the BillingSettlements of namespace %s: %w", ns, err)
		}
		for i := range list.Items {
			if match(&list.Items[i]) {
				out = append(out, list.Items[i])
			}
		}
		if cont = list.Continue; cont == "" {
			return out, nil
		}
	}
}
