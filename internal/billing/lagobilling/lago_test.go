package lagobilling_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
	"github.com/settlement-operator/settlement-operator/internal/billing/lagobilling"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakelago"
)

// setup starts the fake Lago and builds the adapter through the registry, exactly as
// the operator does.
func setup(t *testing.T) (*fakelago.Server, billing.Client) {
	t.Helper()
	fake, err := fakelago.Start(fakelago.Options{HangFor: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	bp, key := fake.Provider()
	c, err := adapters.New(adapters.Settings{Provider: bp, Token: key, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return fake, c
}

func class(t *testing.T, err error) *billing.Error {
	t.Helper()
	e, ok := billing.AsError(err)
	if !ok {
		t.Fatalf("error %v is not classified", err)
	}
	return e
}

func TestChargeIsOneEventMatchedByLookup(t *testing.T) {
	fake, c := setup(t)
	r := fake.Charge("stl_one")
	r.FirstSubmittedAt = time.Date(2026, 12, 6, 6, 0, 0, 123456789, time.UTC)
	rec, err := c.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := billing.Match(r, rec); !ok {
		t.Fatalf("submit's record does not match: %s", m)
	}
	evs := fake.Events()
	if len(evs) != 1 {
		t.Fatalf("events %d, want 1", len(evs))
	}
	ev := evs[0]
	if ev.TransactionID != "stl_one" || ev.ExternalSubscriptionID != "sub_stl_one" || ev.Code != "llm_tokens" ||
		string(ev.Properties["tokens"]) != "1523" || !ev.Timestamp.Equal(time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)) {
		t.Fatalf("event as stored: %+v (%s)", ev, ev.Properties)
	}
	got, found, err := billing.LookupFor(context.Background(), c, r)
	if err != nil || !found {
		t.Fatalf("lookup: found %v, %v", found, err)
	}
	if m, ok := billing.Match(r, got); !ok {
		t.Fatalf("lookup's record does not match: %s", m)
	}
	if got.ID != ev.LagoID {
		t.Fatalf("record ID %q, want Lago's %q", got.ID, ev.LagoID)
	}
	// By key alone (what reconciliation and a lookup without the request see).
	got, found, err = c.Lookup(context.Background(), "stl_one")
	if err != nil || !found {
		t.Fatalf("lookup by key: %v %v", found, err)
	}
	if m, ok := billing.Match(r, got); !ok {
		t.Fatalf("lookup by key does not match: %s", m)
	}
	if _, found, err := c.Lookup(context.Background(), "stl_none"); err != nil || found {
		t.Fatalf("unknown key: found %v, %v; want not found", found, err)
	}
}

// A resend answered 422 value_already_exist is the event Lago holds, read back and
// compared: the same request matches, one event billed.
func TestResendIsReadBackAndCompared(t *testing.T) {
	fake, c := setup(t)
	r := fake.Charge("stl_dup")
	for range 3 {
		rec, err := c.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := billing.Match(r, rec); !ok {
			t.Fatalf("resend's record does not match: %s", m)
		}
	}
	if n := fake.Effects("stl_dup"); n != 1 {
		t.Fatalf("effects %d, want 1", n)
	}
	var refused int
	for _, q := range fake.Requests() {
		if q.Method == http.MethodPost && q.Status == http.StatusUnprocessableEntity {
			refused++
		}
	}
	if refused != 2 {
		t.Fatalf("Lago refused %d resends with 422, want 2", refused)
	}
}

// What Lago holds under our key with other content is never adopted: the 422 proves
// only that an event exists.
func TestResendOfOtherContentFailsClosed(t *testing.T) {
	fake, c := setup(t)
	r := fake.Charge("stl_other")
	held := map[string]json.RawMessage{"tokens": json.RawMessage("9"), lagobilling.PropSettlementKey: json.RawMessage(`"contract/stl_other"`),
		lagobilling.PropUnit: json.RawMessage(`"tokens"`)}
	fake.Store(fakelago.Event{TransactionID: "stl_other", ExternalSubscriptionID: r.Customer, Code: "llm_tokens", Properties: held, Timestamp: time.Now()})
	rec, err := c.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := billing.Match(r, rec)
	if ok || m.Field != "usage.quantity" {
		t.Fatalf("match %v %s, want usage.quantity differs", ok, m)
	}
	// Held without our settlement key (someone else's event): missing, not adopted.
	r2 := fake.Charge("stl_foreign")
	fake.Store(fakelago.Event{TransactionID: "stl_foreign", ExternalSubscriptionID: r2.Customer, Code: "llm_tokens",
		Properties: map[string]json.RawMessage{"tokens": json.RawMessage("1523")}, Timestamp: time.Now()})
	rec, err = c.Submit(context.Background(), r2)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := billing.Match(r2, rec); ok || m.Field != "settlement_key" || !m.Missing {
		t.Fatalf("match %v %s, want settlement_key missing", ok, m)
	}
	if fake.Effects("stl_other") != 1 || fake.Effects("stl_foreign") != 1 {
		t.Fatal("a refused resend was billed")
	}
}

// Every answer the fake shows as Lago documents it, classified once.
func TestFaultsAreClassified(t *testing.T) {
	for _, tc := range []struct {
		fault   adaptercontract.Fault
		class   billing.Class
		effects int
	}{
		{adaptercontract.Unavailable, billing.Ambiguous, 0},
		{adaptercontract.RateLimited, billing.Transient, 0},
		{adaptercontract.Refused, billing.Terminal, 0},
		{adaptercontract.CommitThenTimeout, billing.Ambiguous, 1},
	} {
		t.Run(string(tc.fault), func(t *testing.T) {
			fake, c := setup(t)
			r := fake.Charge("stl_fault")
			fake.Fail(tc.fault, 1)
			_, err := c.Submit(context.Background(), r)
			e := class(t, err)
			if e.Class != tc.class {
				t.Fatalf("class %s, want %s (%v)", e.Class, tc.class, err)
			}
			if tc.fault == adaptercontract.RateLimited && e.RetryAfter != 2*time.Second {
				t.Fatalf("retry after %s, want X-RateLimit-Reset's 2s", e.RetryAfter)
			}
			if n := fake.Effects("stl_fault"); n != tc.effects {
				t.Fatalf("effects %d, want %d", n, tc.effects)
			}
			// Sent again: one event in Lago's books whatever happened before, and the
			// answer is this request's (a refusal stays a refusal).
			rec, err := c.Submit(context.Background(), r)
			if tc.fault == adaptercontract.Refused {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m, ok := billing.Match(r, rec); !ok {
				t.Fatalf("after %s: %s", tc.fault, m)
			}
			if n := fake.Effects("stl_fault"); n != 1 {
				t.Fatalf("effects after resend %d, want 1", n)
			}
		})
	}
}

// What the adapter refuses before sending anything, each terminally with a reason.
func TestRefusedBeforeSending(t *testing.T) {
	fake, c := setup(t)
	base := fake.Charge("stl_refused")
	for name, tc := range map[string]struct {
		mutate func(*billing.Request)
		code   string
	}{
		"amount":                       {func(r *billing.Request) { r.Amount = &billing.Amount{Minor: 100, Currency: "USD"} }, "amount_not_supported"},
		"refund":                       {func(r *billing.Request) { r.Type, r.Reverses = billing.TypeRefund, "contract/x" }, "no_reversal"},
		"void":                         {func(r *billing.Request) { r.Type, r.Reverses = billing.TypeVoid, "contract/x" }, "no_reversal"},
		"unknown meter":                {func(r *billing.Request) { r.Usage.Meter = "gpu-seconds" }, "unknown_meter"},
		"bad quantity":                 {func(r *billing.Request) { r.Usage.Quantity = "-1" }, "invalid_quantity"},
		"no usage":                     {func(r *billing.Request) { r.Usage = nil }, "nothing_to_charge"},
		"dated without a grace period": {func(r *billing.Request) { r.OccurredAt = time.Now().Add(-time.Minute) }, "event_too_old"},
		"dated ahead":                  {func(r *billing.Request) { r.OccurredAt = time.Now().Add(time.Hour) }, "event_in_future"},
	} {
		t.Run(name, func(t *testing.T) {
			r := base
			u := *base.Usage
			r.Usage = &u
			tc.mutate(&r)
			_, err := c.Submit(context.Background(), r)
			if e := class(t, err); e.Class != billing.Terminal || e.Code != tc.code || e.Message == "" {
				t.Fatalf("got %v, want terminal %s", err, tc.code)
			}
		})
	}
	if len(fake.Requests()) != 0 {
		t.Fatalf("requests reached Lago: %+v", fake.Requests())
	}
}

// Lago's documented error answers, from a real HTTP server answering each.
func TestLagoAnswersAreClassified(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		header   map[string]string
		body     string
		class    billing.Class
		lookupCl billing.Class
	}{
		{"401", 401, nil, `{"status":401,"error":"Unauthorized"}`, billing.Transient, billing.Transient},
		{"403", 403, nil, `{"status":403,"error":"Forbidden","code":"feature_unavailable"}`, billing.Transient, billing.Transient},
		{"404 subscription", 404, nil, `{"status":404,"error":"Not Found","code":"subscription_not_found"}`, billing.Terminal, billing.Terminal},
		{"422", 422, nil, `{"status":422,"error":"Unprocessable Entity","code":"validation_errors","error_details":{"code":["value_is_mandatory"]}}`, billing.Terminal, billing.Terminal},
		{"400", 400, nil, `{"status":400,"error":"BadRequest: param is missing"}`, billing.Terminal, billing.Terminal},
		{"429", 429, map[string]string{"X-RateLimit-Reset": "7"}, `{"status":429,"error":"Too Many Requests"}`, billing.Transient, billing.Transient},
		{"500", 500, nil, `{"status":500,"error":"Internal Server Error"}`, billing.Ambiguous, billing.Transient},
		{"502 not JSON", 502, nil, `<html>bad gateway</html>`, billing.Ambiguous, billing.Transient},
		{"200 unreadable", 200, nil, `{"event":`, billing.Ambiguous, billing.Transient},
		{"302", 302, map[string]string{"Location": "https://elsewhere.example"}, ``, billing.Terminal, billing.Terminal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			c, err := lagobilling.New(lagobilling.Config{Endpoint: srv.URL, APIKey: "k", Timeout: time.Second,
				Metrics: map[string]lagobilling.Metric{"tokens": {Code: "llm_tokens", FieldName: "tokens"}}})
			if err != nil {
				t.Fatal(err)
			}
			r := billing.Request{SettlementKey: "s", IdempotencyKey: "stl_x", Type: billing.TypeCharge, Customer: "sub_1",
				Usage: &billing.Usage{Meter: "tokens", Quantity: "3"}}
			_, err = c.Submit(context.Background(), r)
			e := class(t, err)
			if e.Class != tc.class {
				t.Fatalf("submit: class %s, want %s (%v)", e.Class, tc.class, err)
			}
			if tc.status == 429 && e.RetryAfter != 7*time.Second {
				t.Fatalf("retry after %s, want 7s", e.RetryAfter)
			}
			if tc.status == 200 {
				return
			}
			_, _, err = c.Lookup(context.Background(), "stl_x")
			if e := class(t, err); e.Class != tc.lookupCl {
				t.Fatalf("lookup: class %s, want %s (%v)", e.Class, tc.lookupCl, err)
			}
			if strings.Contains(err.Error(), "<html>") {
				t.Fatalf("a body leaked into the error: %v", err)
			}
		})
	}
}

// A 422 value_already_exist whose read-back fails is still "may have committed",
// never a refusal.
func TestAlreadyExistsWithoutReadBackIsAmbiguous(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.WriteHeader(422)
			_, _ = w.Write([]byte(`{"status":422,"error":"Unprocessable Entity","code":"validation_errors","error_details":{"transaction_id":["value_already_exist"]}}`))
			return
		}
		w.WriteHeader(503)
	}))
	defer srv.Close()
	c, err := lagobilling.New(lagobilling.Config{Endpoint: srv.URL, APIKey: "k",
		Metrics: map[string]lagobilling.Metric{"tokens": {Code: "llm_tokens", FieldName: "tokens"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(context.Background(), billing.Request{SettlementKey: "s", IdempotencyKey: "stl_x", Type: billing.TypeCharge,
		Customer: "sub_1", Usage: &billing.Usage{Meter: "tokens", Quantity: "3"}})
	if e := class(t, err); e.Class != billing.Ambiguous {
		t.Fatalf("class %s, want ambiguous (%v)", e.Class, err)
	}
}

// A 404 that is not Lago's event_not_found (a wrong endpoint) is never "not found".
func TestLookupOnAWrongEndpointIsNotNotFound(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	c, err := lagobilling.New(lagobilling.Config{Endpoint: srv.URL, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	_, found, err := c.Lookup(context.Background(), "stl_x")
	if found || err == nil || class(t, err).Code != "not_lago" {
		t.Fatalf("found %v, err %v; want the not_lago error", found, err)
	}
}

// A usage charge dated at the job's completion within the grace period: Lago holds
// that date; a record dated otherwise is not this request's usage.
func TestDatedAtCompletionWithinGracePeriod(t *testing.T) {
	fake, err := fakelago.Start(fakelago.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	bp, key := fake.Provider()
	bp.Spec.Lago.GracePeriod = nil
	c, err := lagobilling.New(lagobilling.Config{Endpoint: fake.URL(), APIKey: key, GracePeriod: 24 * time.Hour,
		Metrics: map[string]lagobilling.Metric{"tokens": {Code: "llm_tokens", FieldName: "tokens"}}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	done := now.Add(-time.Hour).Truncate(time.Second)
	if until := c.DateUsage("tokens", done, now); !until.Equal(done.Add(24*time.Hour - lagobilling.DateMargin)) {
		t.Fatalf("dated until %s", until)
	}
	if until := c.DateUsage("tokens", now.Add(-24*time.Hour), now); !until.IsZero() {
		t.Fatal("dated past the grace period")
	}
	if until := c.DateUsage("gpu", done, now); !until.IsZero() {
		t.Fatal("dated an unmapped meter")
	}
	r := fake.Charge("stl_dated")
	r.OccurredAt = done
	if _, err := c.Submit(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if evs := fake.Events(); len(evs) != 1 || !evs[0].Timestamp.Equal(done) {
		t.Fatalf("stored %+v, want dated %s", evs, done)
	}
	rec, found, err := c.LookupRequest(context.Background(), r)
	if err != nil || !found {
		t.Fatal(found, err)
	}
	if m, ok := billing.Match(r, rec); !ok {
		t.Fatalf("dated lookup: %s", m)
	}
	r.OccurredAt = done.Add(-time.Minute)
	rec, _, _ = c.LookupRequest(context.Background(), r)
	if m, ok := billing.Match(r, rec); ok || m.Field != "usage" {
		t.Fatalf("a record dated otherwise matched (%v %s)", ok, m)
	}
}

// List pages through the events Lago created since, ours only, to the end.
func TestListPagesOurEvents(t *testing.T) {
	fake, c := setup(t)
	since := time.Now().Add(-time.Minute)
	for i := range lagobilling.PageSize + 5 {
		r := fake.Charge("stl_l" + string(rune('a'+i/26)) + string(rune('a'+i%26)))
		if _, err := c.Submit(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	fake.Store(fakelago.Event{TransactionID: "someone_else", ExternalSubscriptionID: "sub_x", Code: "llm_tokens", Timestamp: time.Now()})
	seen := map[string]bool{}
	cursor, pages := "", 0
	for {
		items, next, err := c.List(context.Background(), since, cursor)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, it := range items {
			if it.SettlementKey == "" || seen[it.IdempotencyKey] {
				t.Fatalf("listed %+v twice or without its settlement key", it)
			}
			seen[it.IdempotencyKey] = true
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if len(seen) != lagobilling.PageSize+5 || pages != 2 {
		t.Fatalf("listed %d events in %d pages", len(seen), pages)
	}
	if _, _, err := c.List(context.Background(), since, "garbage"); class(t, err).Class != billing.Terminal {
		t.Fatal("a foreign cursor was accepted")
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	for name, cfg := range map[string]lagobilling.Config{
		"endpoint with /api/v1": {Endpoint: "https://api.getlago.com/api/v1", APIKey: "k"},
		"credentials in URL":    {Endpoint: "https://u:p@api.getlago.com", APIKey: "k"},
		"no key":                {Endpoint: "https://api.getlago.com"},
		"metric without field":  {APIKey: "k", Metrics: map[string]lagobilling.Metric{"a": {Code: "c"}}},
		"reserved field":        {APIKey: "k", Metrics: map[string]lagobilling.Metric{"a": {Code: "c", FieldName: lagobilling.PropSettlementKey}}},
		"one code, two meters":  {APIKey: "k", Metrics: map[string]lagobilling.Metric{"a": {Code: "c", FieldName: "f"}, "b": {Code: "c", FieldName: "f"}}},
	} {
		if _, err := lagobilling.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "u:p") {
			t.Errorf("%s: error shows the credentials: %v", name, err)
		}
	}
	c, err := lagobilling.New(lagobilling.Config{APIKey: "secret-key"})
	if err != nil || strings.Contains(c.String()+c.GoString(), "secret-key") || !strings.Contains(c.String(), lagobilling.DefaultEndpoint) {
		t.Fatalf("default endpoint or redaction: %v %v", c, err)
	}
}

func TestCapabilitiesAreALookupByKey(t *testing.T) {
	fake, c := setup(t)
	caps := billing.CapabilitiesOf(c, fake.Charge("k"))
	if caps.Lookup != billing.LookupByKey || caps.ResendIsProof || caps.Window != 0 {
		t.Fatalf("capabilities %+v", caps)
	}
	bp, _ := fake.Provider()
	if adapters.Capabilities(bp, fake.Charge("k")) != caps {
		t.Fatal("the registry declares other capabilities than the client")
	}
}
