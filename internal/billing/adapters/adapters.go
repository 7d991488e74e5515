// Package adapters picks a billing provider's adapter by its type
// (BillingProvider.spec.type) from one registry: a new provider type is a new package
// implementing billing.Client and one line in the registry below, never edits across
// the controllers. Each adapter keeps its wire vocabulary (status strings, error
// codes) to itself and answers in billing's terms (billing.Record, billing.Error).
package adapters

import (
	"fmt"
	"sort"
	"strings"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/metronomebilling"
	"github.com/settlement-operator/settlement-operator/internal/billing/stripebilling"
)

// Settings is what an adapter gets: the BillingProvider (its spec says where and how
// to call), the token read from its credentials Secret (the opt-in already checked)
// and the request timeout.
type Settings struct {
	Provider *hooksv1alpha1.BillingProvider
	Token    string
	Timeout  time.Duration
	// Now is the clock an adapter measures its provider's windows on (time.Now when
	// nil); a test moves it to pass a window.
	Now func() time.Time
}

// Factory builds an adapter, validating everything it reads from the spec so a bad
// BillingProvider is a clear error when it is loaded, not a failed charge.
type Factory func(Settings) (billing.Client, error)

// adapter is one registry entry: how to build a provider type's client, and what its
// provider can answer about a request (billing.Capabilities), known before a client is
// built — the same declaration its client reports.
type adapter struct {
	build Factory
	caps  func(billing.Request) billing.Capabilities
	// capsOf, when set, is caps for a type whose capabilities follow from its spec
	// (OpenMeter's deduplication).
	capsOf func(*hooksv1alpha1.BillingProvider, billing.Request) billing.Capabilities
}

// registry holds every provider type the operator serves; the CRD's enum of
// spec.type lists the same (a test keeps them in step).
var registry = map[hooksv1alpha1.BillingProviderType]adapter{
	hooksv1alpha1.BillingProviderHTTP:      {build: newHTTP, caps: billing.ContractCapabilities},
	hooksv1alpha1.BillingProviderStripe:    {build: newStripe, caps: stripebilling.RequestCapabilities},
	hooksv1alpha1.BillingProviderLago:      {build: newLago, capsOf: lagoCapabilities},
	hooksv1alpha1.BillingProviderMetronome: {build: newMetronome, caps: metronomebilling.RequestCapabilities},
	hooksv1alpha1.BillingProviderOpenMeter: {build: newOpenMeter, capsOf: openMeterCapabilities},
}

// New builds the adapter of s.Provider's type ("" is HTTP, the CRD's default).
func New(s Settings) (billing.Client, error) {
	t := s.Provider.Spec.Type
	if t == "" {
		t = hooksv1alpha1.BillingProviderHTTP
	}
	a, ok := registry[t]
	if !ok {
		return nil, fmt.Errorf("billing provider type %q has no adapter in this operator (it serves %s)", t, strings.Join(Types(), ", "))
	}
	return a.build(s)
}

// Types lists the provider types with an adapter, sorted.
func Types() []string {
	out := make([]string, 0, len(registry))
	for t := range registry {
		out = append(out, string(t))
	}
	sort.Strings(out)
	return out
}

func newHTTP(s Settings) (billing.Client, error) {
	return billing.NewHTTP(billing.HTTPConfig{Endpoint: s.Provider.Spec.Endpoint, Token: s.Token, Timeout: s.Timeout})
}

func newStripe(s Settings) (billing.Client, error) {
	meters := map[string]stripebilling.Meter{}
	if st := s.Provider.Spec.Stripe; st != nil {
		for _, m := range st.Meters {
			meter := stripebilling.Meter{EventName: m.EventName, ID: m.ID, CustomerKey: m.CustomerKey, ValueKey: m.ValueKey,
				DateAtCompletion: m.Timestamp == hooksv1alpha1.StripeTimestampCompletion}
			if m.GracePeriod != nil {
				meter.GracePeriod = m.GracePeriod.Duration
			}
			meters[m.Meter] = meter
		}
	}
	return stripebilling.New(stripebilling.Config{Endpoint: s.Provider.Spec.Endpoint, APIKey: s.Token, Timeout: s.Timeout, Meters: meters, Now: s.Now})
}

// Capabilities is what the provider of bp's type can answer about r (docs/design.md
// §14), without building a client: as its registry entry declares it. A type with no
// adapter is taken to follow the HTTP contract (asked by key first).
func Capabilities(bp *hooksv1alpha1.BillingProvider, r billing.Request) billing.Capabilities {
	t := bp.Spec.Type
	if t == "" {
		t = hooksv1alpha1.BillingProviderHTTP
	}
	if a, ok := registry[t]; ok && a.capsOf != nil {
		return a.capsOf(bp, r)
	} else if ok {
		return a.caps(r)
	}
	return billing.ContractCapabilities(r)
}

// Mode is the key mode an adapter reports (a Stripe key's "test" or "live"), or "".
func Mode(c billing.Client) string {
	if m, ok := billing.Unwrap(c).(interface{ Mode() stripebilling.Mode }); ok {
		return string(m.Mode())
	}
	return ""
}
