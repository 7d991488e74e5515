package openmeterbilling_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/openmeterbilling"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakeopenmeter"
)

// Every answer OpenMeter documents for its events API, classified, against the fake
// over real HTTP.

func start(t *testing.T, dedup time.Duration) (*fakeopenmeter.Server, *openmeterbilling.Client) {
	t.Helper()
	fake, err := fakeopenmeter.Start(fakeopenmeter.Options{Token: fakeopenmeter.Token, Deduplication: dedup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	return fake, client(t, fake.URL(), fakeopenmeter.Token, dedup)
}

func client(t *testing.T, endpoint, token string, dedup time.Duration) *openmeterbilling.Client {
	t.Helper()
	c, err := openmeterbilling.New(openmeterbilling.Config{Endpoint: endpoint, Token: token, Timeout: time.Second,
		Source: fakeopenmeter.Source, Deduplication: dedup,
		Meters: map[string]openmeterbilling.Meter{fakeopenmeter.Meter: {EventType: fakeopenmeter.EventType, ValueProperty: fakeopenmeter.ValueProperty}}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func classOf(t *testing.T, err error) *billing.Error {
	t.Helper()
	e, ok := billing.AsError(err)
	if !ok {
		t.Fatalf("not a classified error: %v", err)
	}
	return e
}

var ctx = context.Background()

func TestUsageIsOneCloudEventUnderTheKey(t *testing.T) {
	fake, c := start(t, 0)
	r := fake.Charge("stl_00000000000000000000000000000001")
	r.OccurredAt = time.Now().Add(-time.Hour).Truncate(time.Second)
	rec, err := c.Submit(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := billing.Match(r, rec); !ok || rec.Status != billing.StatusSettled || rec.ID != openmeterbilling.EventRef(r.IdempotencyKey) {
		t.Fatalf("record %+v", rec)
	}
	evs := fake.Events()
	if len(evs) != 1 {
		t.Fatalf("%d events", len(evs))
	}
	ev := evs[0]
	var data map[string]any
	_ = json.Unmarshal(ev.Data, &data)
	if ev.ID != r.IdempotencyKey || ev.Source != fakeopenmeter.Source || ev.Type != fakeopenmeter.EventType || ev.Subject != r.Customer ||
		ev.Time != r.OccurredAt.UTC().Format(time.RFC3339Nano) || fmt.Sprint(data[fakeopenmeter.ValueProperty]) != "12.5" ||
		data[openmeterbilling.DataSettlementKey] != r.SettlementKey {
		t.Fatalf("event %+v data %v", ev, data)
	}
	// The listing finds it and it is provably this request.
	got, found, err := c.LookupRequest(ctx, r)
	if err != nil || !found {
		t.Fatalf("lookup: %v %v", found, err)
	}
	if m, ok := billing.Match(r, got); !ok {
		t.Fatalf("listed record does not match: %s", m)
	}
}

// TestWithoutDeduplicationAResendIsCountedAgain is the platform's behaviour the
// capabilities declare: nothing the decision may resend.
func TestWithoutDeduplicationAResendIsCountedAgain(t *testing.T) {
	fake, c := start(t, 0)
	r := fake.Charge("stl_00000000000000000000000000000002")
	for range 2 {
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if n := fake.Effects(r.IdempotencyKey); n != 2 {
		t.Fatalf("effects %d, want 2: the fake must count a resend without deduplication", n)
	}
	if caps := c.Capabilities(r); !caps.NoDeduplication || caps.ResendIsProof || caps.Lookup != billing.LookupByListing {
		t.Fatalf("capabilities %+v", caps)
	}
}

func TestWithDeduplicationAResendInsideTheWindowIsDropped(t *testing.T) {
	fake, c := start(t, time.Hour)
	r := fake.Charge("stl_00000000000000000000000000000003")
	for range 3 {
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if n := fake.Effects(r.IdempotencyKey); n != 1 {
		t.Fatalf("effects %d, want 1", n)
	}
	if caps := c.Capabilities(r); caps.NoDeduplication || !caps.ResendIsProof || caps.Window != time.Hour {
		t.Fatalf("capabilities %+v", caps)
	}
}

func TestAnswersAreClassified(t *testing.T) {
	fake, c := start(t, 0)
	for i, tc := range []struct {
		fault   adaptercontract.Fault
		class   billing.Class
		effects int
		want    string
	}{
		{adaptercontract.Unavailable, billing.Ambiguous, 0, "may have committed"},
		{adaptercontract.RateLimited, billing.Transient, 0, "rate limited by OpenMeter"},
		{adaptercontract.Refused, billing.Terminal, 0, "OpenMeter refused it: invalid event"},
		{adaptercontract.CommitThenTimeout, billing.Ambiguous, 1, ""},
	} {
		r := fake.Charge(fmt.Sprintf("stl_1000000000000000000000000000000%d", i))
		fake.Fail(tc.fault, 1)
		_, err := c.Submit(ctx, r)
		e := classOf(t, err)
		if e.Class != tc.class || !strings.Contains(e.Error(), tc.want) {
			t.Errorf("%s: %s (%v)", tc.fault, e.Class, e)
		}
		if tc.fault == adaptercontract.RateLimited && e.RetryAfter != time.Second {
			t.Errorf("429: Retry-After %s", e.RetryAfter)
		}
		if n := fake.Effects(r.IdempotencyKey); n != tc.effects {
			t.Errorf("%s: %d effects, want %d", tc.fault, n, tc.effects)
		}
	}
	// A wrong token: our configuration, retried until it is fixed, nothing counted.
	bad := client(t, fake.URL(), "wrong", 0)
	r := fake.Charge("stl_20000000000000000000000000000000")
	if e := classOf(t, func() error { _, err := bad.Submit(ctx, r); return err }()); e.Class != billing.Transient || e.Status != 401 ||
		strings.Contains(e.Error(), "wrong") {
		t.Errorf("401: %v", e)
	}
	// Nothing listening: provably not received.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	_ = ln.Close()
	if e := classOf(t, func() error { _, err := client(t, "http://"+addr, "", 0).Submit(ctx, r); return err }()); e.Class != billing.Transient {
		t.Errorf("connection refused: %v", e)
	}
}

// TestRefusedBeforeSending: what OpenMeter cannot take, or a later lookup could not
// find, is refused terminally, saying why, and never reaches it.
func TestRefusedBeforeSending(t *testing.T) {
	fake, c := start(t, 0)
	base := fake.Charge("stl_30000000000000000000000000000000")
	for name, tc := range map[string]struct {
		mutate func(*billing.Request)
		want   string
	}{
		"an amount":      {func(r *billing.Request) { r.Usage, r.Amount = nil, &billing.Amount{Minor: 100, Currency: "USD"} }, "meters usage"},
		"a refund":       {func(r *billing.Request) { r.Type, r.Reverses = billing.TypeRefund, "k" }, "no reversal of ingested usage"},
		"a void":         {func(r *billing.Request) { r.Type, r.Reverses = billing.TypeVoid, "k" }, "no reversal of ingested usage"},
		"unmapped meter": {func(r *billing.Request) { r.Usage = &billing.Usage{Meter: "gpu-seconds", Quantity: "1"} }, `"gpu-seconds" has no event type`},
		"a bad quantity": {func(r *billing.Request) { r.Usage.Quantity = "-1" }, "not a non-negative decimal"},
		"too old":        {func(r *billing.Request) { r.OccurredAt = time.Now().Add(-33 * 24 * time.Hour) }, "more than 32 days ago"},
		"in the future":  {func(r *billing.Request) { r.OccurredAt = time.Now().Add(time.Hour) }, "ahead of this clock"},
		"no customer":    {func(r *billing.Request) { r.Customer = "" }, "subject"},
	} {
		r := base
		u := *base.Usage
		r.Usage = &u
		tc.mutate(&r)
		_, err := c.Submit(ctx, r)
		if e := classOf(t, err); e.Class != billing.Terminal || !strings.Contains(e.Message, tc.want) {
			t.Errorf("%s: %v", name, e)
		}
	}
	if n := len(fake.Requests()); n != 0 {
		t.Fatalf("%d requests reached OpenMeter", n)
	}
}

// TestNotListedIsNoProof: an accepted event OpenMeter has not ingested yet is not
// listed, and the lookup says so without claiming it is absent; once listed it is
// found; a legacy key proves nothing but the key.
func TestNotListedIsNoProof(t *testing.T) {
	fake, c := start(t, 0)
	fake.SetListingDelay(time.Hour)
	r := fake.Charge("stl_40000000000000000000000000000000")
	r.FirstSubmittedAt = time.Now()
	if _, err := c.Submit(ctx, r); err != nil {
		t.Fatal(err)
	}
	_, found, err := c.LookupRequest(ctx, r)
	e := classOf(t, err)
	if found || !e.Unanswerable || e.Unreadable || !strings.Contains(e.Message, "does not prove") || !strings.Contains(e.Message, r.IdempotencyKey) {
		t.Fatalf("not yet listed: found %v, %v", found, e)
	}
	fake.SetListingDelay(0)
	other := client(t, fake.URL(), fakeopenmeter.Token, 0)
	r2 := fake.Charge("stl_40000000000000000000000000000001")
	if _, err := other.Submit(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if rec, found, err := c.LookupRequest(ctx, r2); err != nil || !found {
		t.Fatalf("listed: %v %v %+v", found, err, rec)
	}
	legacy := r2
	legacy.KeyNamespaced = false
	rec, _, _ := c.LookupRequest(ctx, legacy)
	if m, ok := billing.Match(legacy, rec); ok || m.Field != "settlement_key" {
		t.Fatalf("a legacy key's record is proof of nothing but the key: %v %s", ok, m)
	}
}

// TestListPagesThroughTheSource: reconciliation sees every event of this source,
// across pages of 100, and none of another source.
func TestListPagesThroughTheSource(t *testing.T) {
	fake, c := start(t, 0)
	base := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	for i := range 120 {
		r := fake.Charge(fmt.Sprintf("stl_5%031d", i))
		r.OccurredAt = base.Add(time.Duration(i) * time.Second)
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	foreign, err := openmeterbilling.New(openmeterbilling.Config{Endpoint: fake.URL(), Token: fakeopenmeter.Token, Source: "someone-else",
		Meters: map[string]openmeterbilling.Meter{fakeopenmeter.Meter: {EventType: fakeopenmeter.EventType}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := foreign.Submit(ctx, fake.Charge("stl_60000000000000000000000000000000")); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	cursor, pages := "", 0
	for {
		recs, next, err := c.List(ctx, base.Add(-time.Minute), cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			seen[rec.IdempotencyKey] = true
			if rec.Usage == nil || rec.Usage.Meter != fakeopenmeter.Meter || rec.SettlementKey == "" {
				t.Fatalf("record %+v", rec)
			}
		}
		if pages++; next == "" || pages > 5 {
			break
		}
		cursor = next
	}
	if len(seen) != 120 || seen["stl_60000000000000000000000000000000"] {
		t.Fatalf("listed %d of 120 (pages %d)", len(seen), pages)
	}
}

// TestUsageIsDatedAtItsTime: the controller dates an event at the job's completion
// while OpenMeter lists it, and pins a date outside that range only long enough for
// Submit to refuse it with the reason.
func TestUsageIsDatedAtItsTime(t *testing.T) {
	_, c := start(t, 0)
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var d billing.UsageDater = c
	if got := d.DateUsage("tokens", time.Time{}, now); !got.IsZero() {
		t.Errorf("no completion time: dated until %s", got)
	}
	at := now.Add(-time.Hour)
	if got := d.DateUsage("tokens", at, now); !got.Equal(at.Add(openmeterbilling.ListHorizon)) {
		t.Errorf("an hour ago: until %s", got)
	}
	for _, at := range []time.Time{now.Add(-40 * 24 * time.Hour), now.Add(time.Hour)} {
		if got := d.DateUsage("tokens", at, now); !got.Equal(now.Add(time.Hour)) {
			t.Errorf("%s: until %s, want an hour from now (Submit refuses it)", at, got)
		}
	}
}
