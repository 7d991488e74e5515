package adapters

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

func TestNewPicksTheAdapterByType(t *testing.T) {
	bp := &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://billing.example.com/v1"}}
	for _, typ := range []hooksv1alpha1.BillingProviderType{"", hooksv1alpha1.BillingProviderHTTP} {
		bp.Spec.Type = typ
		c, err := New(Settings{Provider: bp, Token: "t"})
		if err != nil || c == nil {
			t.Fatalf("type %q: %v", typ, err)
		}
	}
	bp.Spec.Type = "Carrier-Pigeon"
	if _, err := New(Settings{Provider: bp}); err == nil || !strings.Contains(err.Error(), `type "Carrier-Pigeon" has no adapter`) ||
		!strings.Contains(err.Error(), "HTTP") {
		t.Fatalf("unknown type: %v", err)
	}
	bp.Spec.Type, bp.Spec.Endpoint = hooksv1alpha1.BillingProviderHTTP, "ftp://billing.example.com"
	if _, err := New(Settings{Provider: bp}); err == nil || !strings.Contains(err.Error(), "endpoint") {
		t.Fatalf("a bad endpoint must fail when the adapter is built: %v", err)
	}
	bp.Spec.Endpoint = "https://billing.example.com/v1"
	if c, err := New(Settings{Provider: bp, Token: "t"}); err != nil || Mode(c) != "" {
		t.Fatalf("an HTTP provider has no key mode: %v", err)
	}
}

func TestStripeAdapterFromTheSpec(t *testing.T) {
	bp := &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderStripe,
		Endpoint: "https://api.stripe.com",
		Stripe:   &hooksv1alpha1.StripeSettings{Meters: []hooksv1alpha1.StripeMeter{{Meter: "tokens", EventName: "inference_tokens"}}}}}
	for key, mode := range map[string]string{"rk_test_abc": "test", "sk_live_abc": "live"} {
		c, err := New(Settings{Provider: bp, Token: key})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if got := Mode(c); got != mode {
			t.Fatalf("mode %q, want %q", got, mode)
		}
		if _, ok := c.(billing.RequestLooker); !ok {
			t.Fatal("the Stripe adapter must look up by request: it has no lookup by key")
		}
	}
	if _, err := New(Settings{Provider: bp, Token: "test-billing-token"}); err == nil || strings.Contains(err.Error(), "test-billing-token") {
		t.Fatalf("a token that is no Stripe key must be refused without showing it: %v", err)
	}
	bp.Spec.Stripe.Meters[0].EventName = ""
	if _, err := New(Settings{Provider: bp, Token: "rk_test_abc"}); err == nil || !strings.Contains(err.Error(), "eventName") {
		t.Fatalf("a meter without an event name must fail when the adapter is built: %v", err)
	}
}

// The CRD admits exactly the types that have an adapter: no BillingProvider is
// accepted that the operator cannot serve.
func TestRegistryMatchesTheCRDEnum(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "hooks.settlement.dev_billingproviders.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties map[string]struct {
							Properties map[string]struct {
								Enum []string `json:"enum"`
							} `json:"properties"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	enum := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["type"].Enum
	slices.Sort(enum)
	if !slices.Equal(enum, Types()) {
		t.Fatalf("CRD spec.type enum %v, adapters %v", enum, Types())
	}
}

// TestCapabilitiesBeforeAClientAreTheClients: what the registry says a provider type
// can answer, before a client exists (a settlement's first exposure), is what the
// built client reports (every decision after), for each kind of request.
func TestCapabilitiesBeforeAClientAreTheClients(t *testing.T) {
	requests := []billing.Request{
		{Type: billing.TypeCharge, Usage: &billing.Usage{Meter: "tokens", Quantity: "1"}},
		{Type: billing.TypeCharge, Amount: &billing.Amount{Minor: 100, Currency: "USD"}},
		{Type: billing.TypeRefund, Amount: &billing.Amount{Minor: 100, Currency: "USD"}, Reverses: "k", ReversesRef: "ii_1"},
		{Type: billing.TypeVoid, Reverses: "k", ReversesRef: "meter_event:stl_1"},
		{Type: billing.TypeVoid, Reverses: "k", ReversesRef: "ii_1"},
	}
	for _, s := range []Settings{
		{Provider: &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://billing.example.com/v1"}}, Token: "t"},
		{Provider: &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderStripe,
			Endpoint: "https://api.stripe.com"}}, Token: "sk_test_x"},
		{Provider: openMeterProvider(0), Token: "om"},
		{Provider: openMeterProvider(time.Hour), Token: "om"},
	} {
		c, err := New(s)
		if err != nil {
			t.Fatalf("type %q: %v", s.Provider.Spec.Type, err)
		}
		for _, r := range requests {
			if before, after := Capabilities(s.Provider, r), billing.CapabilitiesOf(c, r); before != after {
				t.Errorf("type %q, %s of %s: before a client %+v, the client %+v", s.Provider.Spec.Type, r.Type, r.ReversesRef, before, after)
			}
		}
	}
}

// openMeterProvider is an OpenMeter provider whose install deduplicates for dedup (0:
// it does not).
func openMeterProvider(dedup time.Duration) *hooksv1alpha1.BillingProvider {
	bp := &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderOpenMeter,
		Endpoint: hooksv1alpha1.OpenMeterCloudEndpoint, OpenMeter: &hooksv1alpha1.OpenMeterSettings{
			Meters: []hooksv1alpha1.OpenMeterMeter{{Meter: "tokens", EventType: "prompt.tokens"}}}}}
	if dedup > 0 {
		bp.Spec.OpenMeter.Deduplication = &hooksv1alpha1.OpenMeterDeduplication{Window: metav1.Duration{Duration: dedup}}
	}
	return bp
}

// TestOpenMeterDeclaresItsDeduplication: without spec.openMeter.deduplication the
// adapter declares that OpenMeter does not deduplicate; with it, the window and a
// resend as proof. Either way a record is found only by listing.
func TestOpenMeterDeclaresItsDeduplication(t *testing.T) {
	r := billing.Request{Type: billing.TypeCharge, Usage: &billing.Usage{Meter: "tokens", Quantity: "1"}, KeyNamespaced: true}
	if got := Capabilities(openMeterProvider(0), r); got != (billing.Capabilities{Lookup: billing.LookupByListing, NoDeduplication: true}) {
		t.Errorf("no deduplication: %+v", got)
	}
	if got := Capabilities(openMeterProvider(time.Hour), r); got != (billing.Capabilities{Lookup: billing.LookupByListing, Window: time.Hour, ResendIsProof: true}) {
		t.Errorf("an hour of deduplication: %+v", got)
	}
	r.KeyNamespaced = false
	if got := Capabilities(openMeterProvider(time.Hour), r); got.ResendIsProof {
		t.Errorf("a legacy key's dropped resend proves only that some event holds the id: %+v", got)
	}
	bp := openMeterProvider(0)
	bp.Spec.OpenMeter = nil
	if _, err := New(Settings{Provider: bp}); err == nil || !strings.Contains(err.Error(), "spec.openMeter") {
		t.Errorf("no settings: %v", err)
	}
}
