package lagobilling_test

import (
	"context"
	"strings"
	"testing"
	"time"

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

// On the ClickHouse pipeline (the fake as Lago behaves there): the event is answered
// before it is saved, a resend is another event (why nothing is ever resent), and a
// lookup before ClickHouse ingests it finds nothing — which proves nothing, so it is
// answered Unanswerable with a message naming the event and where to look, never as
// "not found"; once ingested, the lookup finds it and it matches.
func TestClickHouseLookupBeforeIngestIsUnanswerable(t *testing.T) {
	fake, err := fakelago.Start(fakelago.Options{Pipeline: fakelago.ClickHouse, IngestDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	bp, key := fake.Provider()
	c, err := adapters.New(adapters.Settings{Provider: bp, Token: key, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := fake.Charge("stl_ch")
	r.FirstSubmittedAt = time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)
	rec, err := c.Submit(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := billing.Match(r, rec); !ok {
		t.Fatalf("the reply's record does not match: %s", m)
	}
	if rec.ID != "event:stl_ch" {
		t.Fatalf("record ID %q: Lago keeps no id on ClickHouse, want the transaction_id's", rec.ID)
	}
	if _, err := c.Submit(ctx, r); err != nil {
		t.Fatal(err)
	}
	if n := fake.Effects("stl_ch"); n != 2 {
		t.Fatalf("after a resend Lago bills %d events, want 2 (ClickHouse does not refuse a reused transaction_id)", n)
	}

	for name, lookup := range map[string]func() (billing.Record, bool, error){
		"by request": func() (billing.Record, bool, error) { return billing.LookupFor(ctx, c, r) },
		"by key":     func() (billing.Record, bool, error) { return c.Lookup(ctx, "stl_ch") },
	} {
		_, found, err := lookup()
		if err == nil {
			t.Fatalf("%s: a lookup before the ingest answered found=%t and no error, want Unanswerable (not found proves nothing)", name, found)
		}
		e := class(t, err)
		if !e.Unanswerable || e.Local {
			t.Fatalf("%s: %+v, want Unanswerable from Lago", name, e)
		}
		for _, want := range []string{"stl_ch", "/api/v1/events/stl_ch", "asynchronously"} {
			if !strings.Contains(e.Message, want) {
				t.Errorf("%s: message %q does not say %q", name, e.Message, want)
			}
		}
		if name == "by request" && !strings.Contains(e.Message, "sub_stl_ch") {
			t.Errorf("%s: message %q does not name the subscription", name, e.Message)
		}
	}

	fake.IngestNow()
	got, found, err := billing.LookupFor(ctx, c, r)
	if err != nil || !found {
		t.Fatalf("after the ingest: found %t, %v", found, err)
	}
	if m, ok := billing.Match(r, got); !ok {
		t.Fatalf("the ingested event does not match: %s", m)
	}
}
