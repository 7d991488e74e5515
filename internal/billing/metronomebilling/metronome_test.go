package metronomebilling_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
	"github.com/settlement-operator/settlement-operator/internal/billing/metronomebilling"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
)

// start runs the fake and a client built through the registry, as the operator
// builds it, with a short timeout for the commit-then-timeout cases.
func start(t *testing.T) (*fakemetronome.Server, billing.Client) {
	t.Helper()
	fake, err := fakemetronome.Start(fakemetronome.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	bp, token := fake.Provider()
	c, err := adapters.New(adapters.Settings{Provider: bp, Token: token, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return fake, c
}

func classOf(t *testing.T, err error) *billing.Error {
	t.Helper()
	e, ok := billing.AsError(err)
	if !ok {
		t.Fatalf("not a classified error: %v", err)
	}
	return e
}

func TestSubmitSendsOneUsageEventUnderTheKey(t *testing.T) {
	fake, c := start(t)
	r := fake.Charge("k-submit")
	rec, err := c.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := billing.Match(r, rec); !ok {
		t.Fatalf("the record of an ingested event is the request: %s", m)
	}
	if rec.ID != metronomebilling.EventRef(r.IdempotencyKey) || rec.Status != billing.StatusSettled {
		t.Fatalf("record %+v", rec)
	}
	events := fake.Events()
	if len(events) != 1 {
		t.Fatalf("events %+v", events)
	}
	e := events[0]
	if e.TransactionID != r.IdempotencyKey || e.CustomerID != r.Customer || e.EventType != fakemetronome.DefaultEventType ||
		e.Properties["quantity"] != "1523" || e.Properties[metronomebilling.PropSettlementKey] != r.SettlementKey ||
		e.Properties[metronomebilling.PropUnit] != "tokens" {
		t.Fatalf("event %+v", e)
	}
	if e.Timestamp != r.OccurredAt.UTC().Format(time.RFC3339) {
		t.Fatalf("timestamp %s, want the usage's time %s", e.Timestamp, r.OccurredAt)
	}
}

// A resend inside the window is answered 200 and ignored: Metronome keeps the first
// copy whatever the second holds. The answer is taken as this request only for a
// namespaced key; the events search shows what was kept, and Match tells them apart.
func TestResendKeepsTheFirstCopy(t *testing.T) {
	fake, c := start(t)
	r := fake.Charge("k-dup")
	if _, err := c.Submit(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	other := r
	other.Usage = &billing.Usage{Meter: r.Usage.Meter, Quantity: "9", Unit: r.Usage.Unit}
	rec, err := c.Submit(context.Background(), other)
	if err != nil {
		t.Fatalf("a duplicate is answered 200: %v", err)
	}
	if fake.Effects(r.IdempotencyKey) != 1 {
		t.Fatalf("effects %d, want 1", fake.Effects(r.IdempotencyKey))
	}
	if reqs := fake.Requests(); len(reqs) != 2 || len(reqs[1].Duplicates) != 1 {
		t.Fatalf("the second request was not ignored as a duplicate: %+v", reqs)
	}
	if _, ok := billing.Match(other, rec); !ok {
		t.Fatal("a namespaced key's resend is proof of this request")
	}
	// A legacy key may be another namespace's: what Metronome holds is read back and
	// compared, never taken on the 200.
	legacy := other
	legacy.KeyNamespaced = false
	rec, err = c.Submit(context.Background(), legacy)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := billing.Match(legacy, rec); ok || m.Field != "usage.quantity" {
		t.Fatalf("a legacy key's resend is what Metronome holds, the first copy: match=%v %s", ok, m)
	}
	same := r
	same.KeyNamespaced = false
	if rec, err = c.Submit(context.Background(), same); err != nil {
		t.Fatal(err)
	}
	if m, ok := billing.Match(same, rec); !ok {
		t.Fatalf("a legacy key whose held copy is this request is proven by the search: %s", m)
	}
	fake.FailSearch(429, 1)
	if rec, err = c.Submit(context.Background(), same); err != nil {
		t.Fatal(err)
	}
	if m, ok := billing.Match(same, rec); ok || !m.Missing {
		t.Fatalf("without the search, a legacy key's 200 proves existence only: match=%v %s", ok, m)
	}
	looked, found, err := billing.LookupFor(context.Background(), c, other)
	if err != nil || !found {
		t.Fatalf("lookup: found=%v err=%v", found, err)
	}
	if m, ok := billing.Match(other, looked); ok || m.Field != "usage.quantity" {
		t.Fatalf("the search shows the first copy's quantity: match=%v %s", ok, m)
	}
	if m, ok := billing.Match(r, looked); !ok {
		t.Fatalf("the first copy is the first request: %s", m)
	}
}

func TestLookupBySearch(t *testing.T) {
	fake, c := start(t)
	r := fake.Charge("k-look")
	r.FirstSubmittedAt = time.Now()
	if _, found, err := billing.LookupFor(context.Background(), c, r); err != nil || found {
		t.Fatalf("nothing sent yet: found=%v err=%v", found, err)
	}
	fake.Fail(adaptercontract.CommitThenTimeout, 1)
	_, err := c.Submit(context.Background(), r)
	if e := classOf(t, err); e.Class != billing.Ambiguous {
		t.Fatalf("a lost answer after the request was sent is ambiguous: %v", e)
	}
	rec, found, err := billing.LookupFor(context.Background(), c, r)
	if err != nil || !found {
		t.Fatalf("the committed event is found: found=%v err=%v", found, err)
	}
	if m, ok := billing.Match(r, rec); !ok {
		t.Fatalf("match: %s", m)
	}
	if fake.Searches() != 2 || fake.Effects(r.IdempotencyKey) != 1 {
		t.Fatalf("searches %d effects %d", fake.Searches(), fake.Effects(r.IdempotencyKey))
	}
	// Another sender's event under the key (a legacy key shared across namespaces):
	// found, and not ours.
	fake.Put(fakemetronome.Event{TransactionID: "k-foreign", CustomerID: "cus_other", EventType: fakemetronome.DefaultEventType,
		Timestamp: time.Now().UTC().Format(time.RFC3339), Properties: map[string]string{"quantity": "1523"}}, time.Now())
	foreign := fake.Charge("k-foreign")
	foreign.FirstSubmittedAt = time.Now()
	rec, found, err = billing.LookupFor(context.Background(), c, foreign)
	if err != nil || !found {
		t.Fatalf("found=%v err=%v", found, err)
	}
	if _, ok := billing.Match(foreign, rec); ok {
		t.Fatal("another sender's event must never match")
	}
}

// The search sees only the last 34 days: past them, or with no date to judge by, a
// missing event proves nothing.
func TestLookupOutsideTheSearchHorizonIsUnanswerable(t *testing.T) {
	fake, c := start(t)
	old := fake.Charge("k-old")
	old.OccurredAt = time.Now().Add(-metronomebilling.SearchHorizon - time.Minute)
	undated := fake.Charge("k-undated")
	undated.OccurredAt = time.Time{}
	lateFirst := fake.Charge("k-late")
	lateFirst.OccurredAt, lateFirst.FirstSubmittedAt = time.Time{}, time.Now().Add(-metronomebilling.SearchHorizon-time.Minute)
	for _, r := range []billing.Request{old, undated, lateFirst} {
		_, found, err := billing.LookupFor(context.Background(), c, r)
		if e := classOf(t, err); found || !e.Unanswerable || e.Class != billing.Terminal {
			t.Fatalf("%s: found=%v err=%v", r.IdempotencyKey, found, e)
		}
	}
	if fake.Searches() != 0 {
		t.Fatal("nothing is asked that cannot answer")
	}
	if _, _, err := c.Lookup(context.Background(), "k-none"); !classOf(t, err).Unanswerable {
		t.Fatal("by key alone, a missing event proves nothing")
	}
}

func TestEveryDocumentedAnswerIsClassified(t *testing.T) {
	fake, c := start(t)
	cases := []struct {
		fault     adaptercontract.Fault
		class     billing.Class
		status    int
		committed int
	}{
		{adaptercontract.Unavailable, billing.Ambiguous, 500, 0},
		{adaptercontract.RateLimited, billing.Transient, 429, 0},
		{adaptercontract.Refused, billing.Terminal, 400, 0},
		{adaptercontract.CommitThenTimeout, billing.Ambiguous, 0, 1},
	}
	for _, tc := range cases {
		r := fake.Charge("k-" + string(tc.fault))
		fake.Fail(tc.fault, 1)
		_, err := c.Submit(context.Background(), r)
		e := classOf(t, err)
		if e.Class != tc.class || e.Status != tc.status || fake.Effects(r.IdempotencyKey) != tc.committed {
			t.Fatalf("%s: %v (status %d), effects %d", tc.fault, e, e.Status, fake.Effects(r.IdempotencyKey))
		}
		if tc.fault == adaptercontract.RateLimited && e.RetryAfter != time.Second {
			t.Fatalf("Retry-After not honoured: %v", e.RetryAfter)
		}
		if tc.fault == adaptercontract.Refused && !strings.Contains(e.Message, "event_type is not accepted") {
			t.Fatalf("Metronome's reason is kept: %q", e.Message)
		}
		if _, err := c.Submit(context.Background(), r); err != nil {
			t.Fatalf("%s: the resend goes through: %v", tc.fault, err)
		}
		if fake.Effects(r.IdempotencyKey) != 1 {
			t.Fatalf("%s: one event after the resend, got %d", tc.fault, fake.Effects(r.IdempotencyKey))
		}
	}

	// A wrong token: 401, Transient (fixing the Secret resumes without a replay), and
	// never in the message.
	bp, _ := fake.Provider()
	wrong, err := adapters.New(adapters.Settings{Provider: bp, Token: "wrong-token-value", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = wrong.Submit(context.Background(), fake.Charge("k-401"))
	if e := classOf(t, err); e.Class != billing.Transient || e.Status != 401 || strings.Contains(e.Error(), "wrong-token-value") {
		t.Fatalf("401: %v", e)
	}

	// Metronome's own validation (its clock says the event is too old; ours did not).
	skewed, err := metronomebilling.New(metronomebilling.Config{Endpoint: fake.URL(), Token: fake.Token(),
		Meters: map[string]metronomebilling.Meter{fakemetronome.DefaultMeter: {EventType: fakemetronome.DefaultEventType}},
		Now:    func() time.Time { return time.Now().Add(-48 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	stale := fake.Charge("k-400")
	stale.OccurredAt = time.Now().Add(-34*24*time.Hour - 30*time.Minute)
	_, err = skewed.Submit(context.Background(), stale)
	if e := classOf(t, err); e.Class != billing.Terminal || e.Status != 400 || !strings.Contains(e.Message, "34 days") {
		t.Fatalf("400: %v", e)
	}

	// Nothing listening: the request never connected, Transient.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	down, err := metronomebilling.New(metronomebilling.Config{Endpoint: "http://" + addr, Token: fake.Token(),
		Meters: map[string]metronomebilling.Meter{fakemetronome.DefaultMeter: {EventType: fakemetronome.DefaultEventType}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = down.Submit(context.Background(), fake.Charge("k-down"))
	if e := classOf(t, err); e.Class != billing.Transient {
		t.Fatalf("refused connection: %v", e)
	}
}

func TestRefusedUnsent(t *testing.T) {
	fake, c := start(t)
	base := fake.Charge("k-refused")
	unknown := base
	unknown.Usage = &billing.Usage{Meter: "gpu-seconds", Quantity: "1"}
	amount := base
	amount.Usage, amount.Amount = nil, &billing.Amount{Minor: 100, Currency: "USD"}
	refund := base
	refund.Type, refund.Reverses, refund.ReversesRef = billing.TypeRefund, "default/k-x", metronomebilling.EventRef("k-x")
	void := refund
	void.Type = billing.TypeVoid
	old := base
	old.OccurredAt = time.Now().Add(-35 * 24 * time.Hour)
	future := base
	future.OccurredAt = time.Now().Add(25 * time.Hour)
	negative := base
	negative.Usage = &billing.Usage{Meter: base.Usage.Meter, Quantity: "-1"}
	for name, tc := range map[string]struct {
		r    billing.Request
		code string
	}{
		"unknown meter": {unknown, "unknown_meter"}, "amount": {amount, "amount_not_supported"},
		"refund": {refund, "no_reversal"}, "void": {void, "no_reversal"}, "too old": {old, "event_too_old"},
		"future": {future, "event_in_future"}, "negative": {negative, "invalid_quantity"},
	} {
		_, err := c.Submit(context.Background(), tc.r)
		if e := classOf(t, err); e.Class != billing.Terminal || e.Code != tc.code || e.Message == "" || !e.Local {
			t.Fatalf("%s: %v", name, e)
		}
	}
	if len(fake.Requests()) != 0 {
		t.Fatal("a refused request is never sent")
	}
	if _, found, err := billing.LookupFor(context.Background(), c, void); found || err != nil {
		t.Fatal("what is never sent is never at Metronome")
	}
}

func TestCapabilitiesAndDating(t *testing.T) {
	fake, c := start(t)
	r := fake.Charge("k-caps")
	bp, _ := fake.Provider()
	want := billing.Capabilities{Lookup: billing.LookupByKey, Window: 34 * 24 * time.Hour, ResendIsProof: true, AbsenceUnproven: true}
	if got := adapters.Capabilities(bp, r); got != want {
		t.Fatalf("registry: %+v", got)
	}
	if got := billing.CapabilitiesOf(c, r); got != want {
		t.Fatalf("client: %+v", got)
	}
	d, ok := billing.UsageDaterOf(c)
	if !ok {
		t.Fatal("the adapter dates usage")
	}
	now := time.Now()
	at := now.Add(-time.Hour)
	if got := d.DateUsage(fakemetronome.DefaultMeter, at, now); !got.Equal(at.Add(metronomebilling.MaxEventAge)) {
		t.Fatalf("dated until %s", got)
	}
	for name, at := range map[string]time.Time{"too old": now.Add(-metronomebilling.MaxEventAge), "far ahead": now.Add(25 * time.Hour)} {
		if !d.DateUsage(fakemetronome.DefaultMeter, at, now).IsZero() {
			t.Fatalf("%s: dated", name)
		}
	}
	if !d.DateUsage("other", at, now).IsZero() {
		t.Fatal("an unknown meter is not dated")
	}
	if recs, next, err := c.List(context.Background(), now.Add(-time.Hour), ""); err != nil || len(recs) != 0 || next != "" {
		t.Fatal("Metronome lists no events by time")
	}
	if _, err := metronomebilling.New(metronomebilling.Config{Token: " "}); err == nil {
		t.Fatal("an empty token is refused")
	}
	if _, err := metronomebilling.New(metronomebilling.Config{Token: "t", Endpoint: "ftp://x"}); err == nil {
		t.Fatal("a non-http endpoint is refused")
	}
}

// The search is a read: nothing it answers can have committed anything.
func TestSearchAnswersAreClassifiedAsReads(t *testing.T) {
	fake, c := start(t)
	r := fake.Charge("k-search")
	r.FirstSubmittedAt = time.Now()
	for _, tc := range []struct {
		status int
		retry  time.Duration
	}{{500, 0}, {429, time.Second}, {401, 0}, {403, 0}} {
		fake.FailSearch(tc.status, 1)
		_, found, err := billing.LookupFor(context.Background(), c, r)
		e := classOf(t, err)
		if found || e.Class != billing.Transient || e.Status != tc.status || e.RetryAfter != tc.retry {
			t.Fatalf("search %d: found=%v %v (retry after %s)", tc.status, found, e, e.RetryAfter)
		}
	}
	fake.FailSearch(400, 1)
	if _, _, err := billing.LookupFor(context.Background(), c, r); classOf(t, err).Class != billing.Terminal {
		t.Fatalf("a refused search is refused again: %v", err)
	}
}
