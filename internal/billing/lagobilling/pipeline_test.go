package lagobilling_test

import (
	"testing"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
	"github.com/settlement-operator/settlement-operator/test/fakelago"
)

// On the ClickHouse pipeline Lago ingests asynchronously and a transaction_id is not
// guaranteed unique: a lookup's "not found" proves nothing and nothing is resent after
// a possible ingest. The registry (before a client is built) and the client say the
// same; the default pipeline keeps its authoritative lookup.
func TestClickHousePipelineLookupProvesPresenceOnly(t *testing.T) {
	fake, err := fakelago.Start(fakelago.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	r := fake.Charge("stl_pipeline")
	for pipeline, want := range map[hooksv1alpha1.LagoEventPipeline]billing.Capabilities{
		"":                                   {Lookup: billing.LookupByKey},
		hooksv1alpha1.LagoPipelinePostgres:   {Lookup: billing.LookupByKey},
		hooksv1alpha1.LagoPipelineClickHouse: {Lookup: billing.LookupByKey, AbsenceUnproven: true, NoDeduplication: true},
	} {
		bp, key := fake.Provider()
		bp.Spec.Lago.EventPipeline = pipeline
		c, err := adapters.New(adapters.Settings{Provider: bp, Token: key})
		if err != nil {
			t.Fatal(err)
		}
		if got := adapters.Capabilities(bp, r); got != want {
			t.Errorf("%q: registry %+v, want %+v", pipeline, got, want)
		}
		if got := billing.CapabilitiesOf(c, r); got != want {
			t.Errorf("%q: client %+v, want %+v", pipeline, got, want)
		}
	}
}
