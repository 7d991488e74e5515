package settlement

import (
	"errors"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// ErrIdentity marks a settlement whose name or idempotency key is not the
// one derived from its settlement key (and namespace). Submitting it could charge
// under another operation's key, or another tenant's, and be deduplicated onto that
// charge: it is input a human must fix (reconcile.TerminalError), never retried.
var ErrIdentity = errors.New("the settlement's identity is not derived from its settlement key")

// ValidateIdentity checks that a settlement's metadata.name and
// spec.idempotencyKey are the ones derived from its spec.settlementKey, so that a
// hand-made settlement cannot present a key that belongs to another operation or
// another namespace. CEL cannot check this on the CRD: Kubernetes' CEL libraries have
// no SHA-256, and CRD rules cannot read metadata.namespace.
//
// Two derivations are accepted, so that nothing already stored becomes invalid:
//
//   - a structured key (identity.ParseSettlementKey, minted since keys are namespaced) must name
//     the settlement's own namespace, match spec.webhookProvider (and spec.jobID for a
//     job's key), and carry identity.NamespacedIdempotencyKey and
//     identity.SettlementNameFor;
//   - any other key (legacy "<provider>/<jobID>", or written by hand) may carry either
//     the legacy identity.IdempotencyKey (every settlement created before keys were namespaced) or
//     the namespaced one, under a name "<prefix>-stl-<h(settlementKey)>" whose prefix
//     is spec.webhookProvider when that is set.
//
// The error wraps ErrSettlementIdentity and says which values are expected. It is
// pure: the BillingSettlement controller calls it before any call to a provider.
func ValidateIdentity(bs *hooksv1alpha1.BillingSettlement) error {
	key, ns := bs.Spec.SettlementKey, bs.Namespace
	var problems []string
	if k, ok := identity.ParseSettlementKey(key); ok {
		if k.Namespace != ns {
			problems = append(problems, fmt.Sprintf("spec.settlementKey belongs to namespace %q, not %q: "+
				"a settlement may only use its own namespace's keys", k.Namespace, ns))
		}
		if bs.Spec.WebhookProvider != k.Provider {
			problems = append(problems, fmt.Sprintf("spec.webhookProvider is %q, but spec.settlementKey is webhook provider %q's",
				bs.Spec.WebhookProvider, k.Provider))
		}
		if k.Kind == identity.KeyKindJob && bs.Spec.JobID != k.JobID() {
			problems = append(problems, fmt.Sprintf("spec.jobID is %q, but spec.settlementKey is job %q's", bs.Spec.JobID, k.JobID()))
		}
		if want := identity.NamespacedIdempotencyKey(ns, key); bs.Spec.IdempotencyKey != want {
			problems = append(problems, fmt.Sprintf("spec.idempotencyKey is %q, want %q (derived from the namespace and spec.settlementKey)",
				bs.Spec.IdempotencyKey, want))
		}
		if want := identity.SettlementNameFor(k.Provider, key); bs.Name != want {
			problems = append(problems, fmt.Sprintf("metadata.name is %q, want %q (derived from spec.settlementKey)", bs.Name, want))
		}
	} else {
		legacy, namespaced := identity.IdempotencyKey(key), identity.NamespacedIdempotencyKey(ns, key)
		if bs.Spec.IdempotencyKey != legacy && bs.Spec.IdempotencyKey != namespaced {
			problems = append(problems, fmt.Sprintf("spec.idempotencyKey is %q, want %q (derived from the namespace and "+
				"spec.settlementKey; settlements created before keys were namespaced have %q)", bs.Spec.IdempotencyKey, namespaced, legacy))
		}
		if why := legacyNameProblem(bs); why != "" {
			problems = append(problems, why)
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s; the spec is immutable, so create a settlement with these values instead",
		ErrIdentity, strings.Join(problems, "; "))
}

// legacyNameProblem checks "<prefix>-stl-<h(settlementKey)>", the name of a
// settlement under a key that is not structured.
func legacyNameProblem(bs *hooksv1alpha1.BillingSettlement) string {
	suffix := identity.SettlementName("", bs.Spec.SettlementKey) // "-stl-<h(settlementKey)>"
	prefix, found := strings.CutSuffix(bs.Name, suffix)
	switch {
	case bs.Spec.WebhookProvider != "":
		if want := identity.SettlementName(bs.Spec.WebhookProvider, bs.Spec.SettlementKey); bs.Name != want {
			return fmt.Sprintf("metadata.name is %q, want %q (derived from spec.webhookProvider and spec.settlementKey)", bs.Name, want)
		}
	case !found || prefix == "":
		return fmt.Sprintf("metadata.name is %q, want <prefix>%s (derived from spec.settlementKey)", bs.Name, suffix)
	}
	return ""
}

// New builds the BillingSettlement an event's settlement facts ask for: its
// name derives from the settlement key (identity.SettlementNameFor), its idempotency
// key from the namespace and the settlement key, so every event asking for the same
// charge names the same object and the same provider key, and no other tenant's
// charge ever presents that key.
func New(ev *hooksv1alpha1.WebhookEvent, f *hooksv1alpha1.SettlementFacts) *hooksv1alpha1.BillingSettlement {
	// The labels something selects on: the provider's (a person's kubectl -l), the
	// billing provider's (its reconciliation pass) and the job's (a job's other
	// settlements). The key's hash is the name's and the event is spec.sourceEvent:
	// labels of those would be stored on every settlement for no reader.
	labels := map[string]string{
		hooksv1alpha1.LabelProvider:        ev.Spec.Provider,
		hooksv1alpha1.LabelBillingProvider: f.BillingProviderRef,
	}
	if f.JobID != "" {
		labels[hooksv1alpha1.LabelJob] = identity.Hash32(f.JobID)
	}
	return &hooksv1alpha1.BillingSettlement{
		// The protection finalizer is set at creation: no separate write later, and no
		// window in which a settlement exists without it.
		ObjectMeta: metav1.ObjectMeta{Namespace: ev.Namespace, Name: identity.SettlementNameFor(ev.Spec.Provider, f.SettlementKey),
			Labels: labels, Finalizers: []string{hooksv1alpha1.FinalizerSettlementProtection}},
		Spec: hooksv1alpha1.BillingSettlementSpec{
			BillingProviderRef: f.BillingProviderRef, SettlementKey: f.SettlementKey,
			IdempotencyKey: identity.NamespacedIdempotencyKey(ev.Namespace, f.SettlementKey), Type: hooksv1alpha1.SettlementCharge,
			Customer: f.Customer, Usage: f.Usage.DeepCopy(), Amount: f.Amount.DeepCopy(), JobID: f.JobID,
			WebhookProvider: ev.Spec.Provider, SourceEvent: ev.Name,
		},
	}
}

// OperationIdentities lists every name and key one logical settlement may have been
// stored under: its own, and — for a namespaced key — the legacy key, the
// name that key had, and the idempotency keys (legacy and namespaced) derived from it.
// A charge made before the upgrade and archived since must stop the same operation
// from being charged again under its new key.
func OperationIdentities(ns, name, settlementKey, idempotencyKey string) (names, keys []string) {
	names = []string{name}
	keys = []string{settlementKey}
	if idempotencyKey != "" {
		keys = append(keys, idempotencyKey)
	}
	if k, ok := identity.ParseSettlementKey(settlementKey); ok {
		legacy := k.LegacyKey()
		names = append(names, identity.SettlementName(k.Provider, legacy))
		keys = append(keys, legacy, identity.IdempotencyKey(legacy), identity.NamespacedIdempotencyKey(ns, legacy))
	}
	return names, keys
}
