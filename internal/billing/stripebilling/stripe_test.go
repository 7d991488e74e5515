package stripebilling_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/stripebilling"
	"github.com/settlement-operator/settlement-operator/test/fakestripe"
	"github.com/settlement-operator/settlement-operator/test/stripemock"
)

const apiKey = "sk_test_fake0123456789"

// clock is a movable time for the fake and the adapter alike.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var meters = map[string]stripebilling.Meter{"gpt-tokens": {EventName: "gpt_tokens", ID: "mtr_tokens"}}

func setup(t *testing.T) (*fakestripe.Server, *stripebilling.Client, *clock) {
	t.Helper()
	clk := &clock{t: time.Now()}
	fake, err := fakestripe.Start(fakestripe.Options{APIKey: apiKey, Now: clk.Now, PageSize: 100,
		Meters: []fakestripe.Meter{{ID: "mtr_tokens", EventName: "gpt_tokens"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	c, err := stripebilling.New(stripebilling.Config{Endpoint: fake.URL(), APIKey: apiKey, Timeout: 2 * time.Second,
		Meters: meters, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return fake, c, clk
}

func usageCharge(key string) billing.Request {
	return billing.Request{SettlementKey: "ns/inference/" + key, IdempotencyKey: "stl_" + key, Type: billing.TypeCharge,
		Customer: "cus_A", Usage: &billing.Usage{Meter: "gpt-tokens", Quantity: "1500", Unit: "tokens"},
		OccurredAt: time.Now().Add(-time.Hour)}
}

func amountCharge(key string) billing.Request {
	return billing.Request{SettlementKey: "ns/inference/" + key, IdempotencyKey: "stl_" + key, Type: billing.TypeCharge,
		Customer: "cus_A", Amount: &billing.Amount{Minor: 1250, Currency: "USD"}}
}

// voidOf is the Void of charge, whose Stripe reference is ref, under key.
func voidOf(charge billing.Request, ref, key string) billing.Request {
	return billing.Request{SettlementKey: charge.SettlementKey + "/void", IdempotencyKey: key, Type: billing.TypeVoid,
		Reverses: charge.SettlementKey, ReversesRef: ref, Customer: charge.Customer, Usage: charge.Usage, Amount: charge.Amount}
}

// refundOf is a Refund of minor USD cents of charge, whose Stripe reference is ref, under key.
func refundOf(charge billing.Request, ref, key string, minor int64) billing.Request {
	return billing.Request{SettlementKey: charge.SettlementKey + "/refund/1", IdempotencyKey: key, Type: billing.TypeRefund,
		Reverses: charge.SettlementKey, ReversesRef: ref, Customer: charge.Customer, Amount: &billing.Amount{Minor: minor, Currency: "USD"}}
}

func class(t *testing.T, err error) *billing.Error {
	t.Helper()
	e, ok := billing.AsError(err)
	if !ok {
		t.Fatalf("error %v is not classified", err)
	}
	return e
}

func mustMatch(t *testing.T, r billing.Request, rec billing.Record) {
	t.Helper()
	if m, ok := billing.Match(r, rec); !ok {
		t.Fatalf("record %+v does not match the request: %s", rec, m)
	}
}

// The billing rows of the failure matrix (docs/design.md §9) against the stateful
// fake, each ending with exactly one charge per key in the fake's ledger.
func TestMeterEventExactlyOnce(t *testing.T) {
	ctx := context.Background()

	t.Run("a retry with the same key is replayed, not charged again", func(t *testing.T) {
		fake, c, _ := setup(t)
		r := usageCharge("replay")
		rec, err := c.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		mustMatch(t, r, rec)
		if rec.ID != stripebilling.MeterEventRef(r.IdempotencyKey) || rec.Status != billing.StatusSettled {
			t.Fatalf("record %+v", rec)
		}
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		if n := fake.Charges(r.IdempotencyKey); n != 1 {
			t.Fatalf("charges = %d, want 1", n)
		}
		reqs := fake.Requests()
		if !reqs[len(reqs)-1].Replayed || reqs[len(reqs)-1].IdempotencyKey != r.IdempotencyKey {
			t.Fatalf("the second call was not an idempotent replay: %+v", reqs[len(reqs)-1])
		}
		ev := fake.MeterEvents()[0]
		if ev.Identifier != r.IdempotencyKey || ev.Value != "1500" || ev.Customer != "cus_A" || ev.Timestamp != r.OccurredAt.Unix() {
			t.Fatalf("meter event %+v", ev)
		}
	})

	t.Run("the reply lost after Stripe committed: ambiguous, and the resend is the answer", func(t *testing.T) {
		fake, c, _ := setup(t)
		r := usageCharge("lost")
		fake.CommitThenHangNext(1, "/v1/billing/meter_events")
		_, err := c.Submit(ctx, r)
		if e := class(t, err); e.Class != billing.Ambiguous || e.Code != "timeout" {
			t.Fatalf("got %s (%s), want an ambiguous timeout classified by the transport: %v", e.Class, e.Code, err)
		}
		rec, err := c.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		mustMatch(t, r, rec)
		if n := fake.Charges(r.IdempotencyKey); n != 1 {
			t.Fatalf("charges = %d, want 1", n)
		}
	})

	t.Run("past the key window a duplicate legacy identifier proves an event exists, not what it holds", func(t *testing.T) {
		// A legacy key is the same in every namespace: another tenant's event may hold it.
		fake, c, _ := setup(t)
		r := usageCharge("forgotten-legacy")
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		fake.ForgetKeys()
		rec, err := c.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := billing.Match(r, rec); ok || !m.Missing {
			t.Fatalf("a duplicate legacy identifier's record was adoptable: %+v", rec)
		}
		if n := fake.Charges(r.IdempotencyKey); n != 1 {
			t.Fatalf("charges = %d, want 1", n)
		}
	})

	t.Run("past the key window a duplicate namespaced identifier is this request: its record is the answer", func(t *testing.T) {
		// The identifier is the settlement's namespaced idempotency key, which nothing
		// but that settlement sends (docs/decisions.md "Resend as the lookup").
		fake, c, _ := setup(t)
		r := usageCharge("forgotten")
		r.KeyNamespaced = true
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		fake.ForgetKeys()
		rec, err := c.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		mustMatch(t, r, rec)
		if n := fake.Charges(r.IdempotencyKey); n != 1 {
			t.Fatalf("charges = %d, want 1", n)
		}
	})

	t.Run("a 500 before Stripe executed anything is ambiguous; the resend charges once", func(t *testing.T) {
		fake, c, _ := setup(t)
		r := usageCharge("fivehundred")
		fake.FailNext(1, "/v1/billing/meter_events", http.StatusInternalServerError, "api_error", "", "")
		if e := class(t, func() error { _, err := c.Submit(ctx, r); return err }()); e.Class != billing.Ambiguous {
			t.Fatalf("class %s, want ambiguous", e.Class)
		}
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		if n := fake.Charges(r.IdempotencyKey); n != 1 {
			t.Fatalf("charges = %d, want 1", n)
		}
	})

	t.Run("a rate limit is transient and honours Retry-After", func(t *testing.T) {
		fake, c, _ := setup(t)
		r := usageCharge("ratelimited")
		fake.RateLimitNext(1, 2*time.Second)
		_, err := c.Submit(ctx, r)
		e := class(t, err)
		if e.Class != billing.Transient || e.RetryAfter != 2*time.Second {
			t.Fatalf("got %s retry after %s, want transient after 2s: %v", e.Class, e.RetryAfter, err)
		}
		if n := fake.Charges(r.IdempotencyKey); n != 0 {
			t.Fatalf("charges = %d after a 429, want 0", n)
		}
	})

	t.Run("the same key with other parameters needs reconciliation", func(t *testing.T) {
		fake, c, _ := setup(t)
		r := usageCharge("reused")
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		r2 := r
		r2.Usage = &billing.Usage{Meter: "gpt-tokens", Quantity: "9999", Unit: "tokens"}
		e := class(t, func() error { _, err := c.Submit(ctx, r2); return err }())
		if e.Class != billing.Terminal || !e.KeyReused {
			t.Fatalf("got %+v, want terminal key reused", e)
		}
		if n := fake.Charges(r.IdempotencyKey); n != 1 {
			t.Fatalf("charges = %d, want 1", n)
		}
	})

	t.Run("a request in progress answers 409: in flight, retried", func(t *testing.T) {
		fake, c, _ := setup(t)
		r := usageCharge("inprogress")
		fake.SlowNext(1, "/v1/billing/meter_events", time.Second)
		done := make(chan error, 1)
		go func() { _, err := c.Submit(ctx, r); done <- err }()
		time.Sleep(300 * time.Millisecond)
		e := class(t, func() error { _, err := c.Submit(ctx, r); return err }())
		if e.Class != billing.Transient || !e.InFlight {
			t.Fatalf("got %+v, want transient in flight", e)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := fake.Charges(r.IdempotencyKey); n != 1 {
			t.Fatalf("charges = %d, want 1", n)
		}
	})

	t.Run("refused before anything is sent: too old, fractional, unknown meter", func(t *testing.T) {
		fake, c, _ := setup(t)
		old := usageCharge("old")
		old.OccurredAt = time.Now().Add(-36 * 24 * time.Hour)
		frac := usageCharge("frac")
		frac.Usage.Quantity = "12.5"
		unknown := usageCharge("unknown")
		unknown.Usage.Meter = "gpu-seconds"
		for _, tc := range []struct {
			r    billing.Request
			code string
		}{{old, "event_too_old"}, {frac, "fractional_quantity"}, {unknown, "unknown_meter"}} {
			e := class(t, func() error { _, err := c.Submit(ctx, tc.r); return err }())
			if e.Class != billing.Terminal || e.Code != tc.code {
				t.Fatalf("%s: got %+v", tc.code, e)
			}
			if !e.Local {
				t.Fatalf("%s: a refusal made before sending is not marked Local, so provider health reads it as the endpoint failing", tc.code)
			}
		}
		if n := len(fake.Requests()); n != 0 {
			t.Fatalf("%d requests reached Stripe, want 0", n)
		}
	})

	t.Run("a meter event cannot be looked up: unanswerable, with what to check", func(t *testing.T) {
		_, c, _ := setup(t)
		_, _, err := c.LookupRequest(ctx, usageCharge("lookup"))
		e := class(t, err)
		if !e.Unanswerable || !strings.Contains(e.Message, "dashboard") || !strings.Contains(e.Message, "stl_lookup") {
			t.Fatalf("got %+v", e)
		}
		if e.RepeatHarmless {
			t.Fatal("a meter event sent twice under two keys is two charges: not harmless to repeat")
		}
	})

	t.Run("a meter event's cancellation cannot be looked up, and is harmless to repeat", func(t *testing.T) {
		_, c, _ := setup(t)
		charge := usageCharge("cancelled")
		_, _, err := c.LookupRequest(ctx, voidOf(charge, stripebilling.MeterEventRef(charge.IdempotencyKey), "stl_cancel"))
		e := class(t, err)
		if !e.Unanswerable || !e.RepeatHarmless || !strings.Contains(e.Message, "shows as cancelled") || !strings.Contains(e.Message, "stl_cancelled") {
			t.Fatalf("got %+v", e)
		}
	})
}

func TestMeterEventCancel(t *testing.T) {
	ctx := context.Background()
	fake, c, clk := setup(t)
	charge := usageCharge("tocancel")
	rec, err := c.Submit(ctx, charge)
	if err != nil {
		t.Fatal(err)
	}
	void := voidOf(charge, rec.ID, "stl_void")
	if _, err := c.Submit(ctx, void); err != nil {
		t.Fatal(err)
	}
	if n := fake.Charges(charge.IdempotencyKey); n != 0 {
		t.Fatalf("charges = %d after the cancel, want 0", n)
	}

	late := usageCharge("late")
	rec, err = c.Submit(ctx, late)
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(25 * time.Hour)
	lateVoid := voidOf(late, rec.ID, "stl_latevoid")
	e := class(t, func() error { _, err := c.Submit(ctx, lateVoid); return err }())
	if e.Class != billing.Terminal || !strings.Contains(e.Message, "24 hours") || !strings.Contains(e.Message, "Stripe dashboard") {
		t.Fatalf("got %+v", e)
	}
	if n := fake.Charges(late.IdempotencyKey); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
}

func TestInvoiceItems(t *testing.T) {
	ctx := context.Background()

	t.Run("created once, found by lookup after a lost reply", func(t *testing.T) {
		fake, c, _ := setup(t)
		r := amountCharge("item")
		fake.CommitThenHangNext(1, "/v1/invoiceitems")
		if e := class(t, func() error { _, err := c.Submit(ctx, r); return err }()); e.Class != billing.Ambiguous || e.Code != "timeout" {
			t.Fatalf("got %s (%s)", e.Class, e.Code)
		}
		rec, found, err := c.LookupRequest(ctx, r)
		if err != nil || !found {
			t.Fatalf("lookup: found %v, %v", found, err)
		}
		mustMatch(t, r, rec)
		if rec.Amount.Currency != "USD" || rec.Amount.Minor != 1250 {
			t.Fatalf("record %+v", rec)
		}
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		if n := fake.Charges(r.IdempotencyKey); n != 1 {
			t.Fatalf("charges = %d, want 1", n)
		}
		if _, found, err := c.LookupRequest(ctx, amountCharge("never-sent")); err != nil || found {
			t.Fatalf("lookup of a key never sent: found %v, %v", found, err)
		}
	})

	t.Run("void deletes an uninvoiced item; an invoiced one is refunded instead", func(t *testing.T) {
		fake, c, _ := setup(t)
		r := amountCharge("voidme")
		rec, err := c.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		void := voidOf(r, rec.ID, "stl_voidme_v")
		if _, err := c.Submit(ctx, void); err != nil {
			t.Fatal(err)
		}
		if n := fake.Charges(r.IdempotencyKey); n != 0 {
			t.Fatalf("charges = %d after the void, want 0", n)
		}
		// Stripe answers a deleted item and one that never was alike (404), and does not
		// replay DELETEs: neither a lookup nor a resend proves the void, a human does.
		for _, call := range []func() error{
			func() error { _, _, err := c.LookupRequest(ctx, void); return err },
			func() error { _, err := c.Submit(ctx, void); return err },
		} {
			if e := class(t, call()); !e.Unanswerable || e.Class != billing.Terminal || !strings.Contains(e.Message, "dashboard") {
				t.Fatalf("after the void: %+v", e)
			}
		}
		ghost := void
		ghost.IdempotencyKey, ghost.ReversesRef = "stl_ghost_v", "ii_neverexisted"
		if e := class(t, func() error { _, err := c.Submit(ctx, ghost); return err }()); !e.Unanswerable || e.Code != "invoice_item_missing" {
			t.Fatalf("void of an item that never existed: %+v", e)
		}
		negative := amountCharge("negative")
		negative.Amount = &billing.Amount{Minor: -5, Currency: "USD"}
		if e := class(t, func() error { _, err := c.Submit(ctx, negative); return err }()); e.Code != "negative_amount" {
			t.Fatalf("negative amount: %+v", e)
		}

		r2 := amountCharge("invoiced")
		rec2, err := c.Submit(ctx, r2)
		if err != nil {
			t.Fatal(err)
		}
		if err := fake.Invoice(rec2.ID, "in_1"); err != nil {
			t.Fatal(err)
		}
		void2 := voidOf(r2, rec2.ID, "stl_invoiced_v")
		e := class(t, func() error { _, err := c.Submit(ctx, void2); return err }())
		if e.Class != billing.Terminal || !strings.Contains(e.Message, "refund it instead") {
			t.Fatalf("got %+v", e)
		}
		refund := refundOf(r2, rec2.ID, "stl_invoiced_r", 500)
		rec3, err := c.Submit(ctx, refund)
		if err != nil {
			t.Fatal(err)
		}
		mustMatch(t, refund, rec3)
		var credit *fakestripe.InvoiceItem
		for _, it := range fake.InvoiceItems() {
			if it.ID == rec3.ID {
				credit = &it
			}
		}
		if credit == nil || credit.Amount != -500 || credit.Metadata[stripebilling.MetaReverses] != r2.SettlementKey {
			t.Fatalf("credit %+v", credit)
		}
	})

	t.Run("list pages newest first and leaves out items that are not a settlement's", func(t *testing.T) {
		_, c, _ := setup(t)
		for i := range 3 {
			if _, err := c.Submit(ctx, amountCharge("list"+string(rune('a'+i)))); err != nil {
				t.Fatal(err)
			}
		}
		recs, next, err := c.List(ctx, time.Now().Add(-time.Hour), "")
		if err != nil || next != "" || len(recs) != 3 || recs[0].IdempotencyKey != "stl_listc" {
			t.Fatalf("list: %d records, next %q, %v", len(recs), next, err)
		}
	})
}

func TestKeysAndCredentials(t *testing.T) {
	for key, want := range map[string]stripebilling.Mode{"sk_test_x": stripebilling.ModeTest, "rk_test_x": stripebilling.ModeTest,
		"sk_live_x": stripebilling.ModeLive, "rk_live_x": stripebilling.ModeLive} {
		if m, err := stripebilling.KeyMode(key); err != nil || m != want {
			t.Fatalf("%s: %s, %v", key[:8], m, err)
		}
	}
	for _, key := range []string{"", "sk_test_", "pk_test_notasecret", "whsec_notasecret"} {
		if _, err := stripebilling.KeyMode(key); err == nil {
			t.Fatalf("%q accepted", key)
		} else if strings.Contains(err.Error(), "notasecret") {
			t.Fatalf("the error repeats the key: %v", err)
		}
	}

	fake, _, _ := setup(t)
	c, err := stripebilling.New(stripebilling.Config{Endpoint: fake.URL(), APIKey: "sk_test_wrong", Meters: meters})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(context.Background(), usageCharge("badkey"))
	e := class(t, err)
	if e.Status != http.StatusUnauthorized || e.Class != billing.Transient || strings.Contains(e.Error(), "sk_test_wrong") {
		t.Fatalf("got %+v", e)
	}
	if fmtd := c.String(); strings.Contains(fmtd, "sk_test") {
		t.Fatalf("String shows the key: %s", fmtd)
	}
}

// Every request the adapter sends is valid against Stripe's OpenAPI spec, and every
// reply decodes: stripe-mock validates and answers with fixtures. It keeps no state,
// so nothing here says anything about idempotency or charges (the tests above do).
func TestRequestsAreValidForStripe(t *testing.T) {
	mock, err := stripemock.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer mock.Close()
	c, err := stripebilling.New(stripebilling.Config{Endpoint: mock.URL(), APIKey: "sk_test_123", Meters: meters, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := usageCharge("mock")
	if _, err := c.Submit(ctx, r); err != nil {
		t.Fatalf("meter event: %v", err)
	}
	void := voidOf(r, stripebilling.MeterEventRef(r.IdempotencyKey), "stl_mockvoid")
	if _, err := c.Submit(ctx, void); err != nil {
		t.Fatalf("meter event adjustment: %v", err)
	}
	a := amountCharge("mockitem")
	if _, err := c.Submit(ctx, a); err != nil {
		t.Fatalf("invoice item: %v", err)
	}
	refund := refundOf(a, "ii_123", "stl_mockrefund", 100)
	if _, err := c.Submit(ctx, refund); err != nil {
		t.Fatalf("credit invoice item: %v", err)
	}
	voidItem := voidOf(a, "ii_123", "stl_mockvoiditem")
	if _, err := c.Submit(ctx, voidItem); err != nil {
		t.Fatalf("invoice item delete: %v", err)
	}
	if _, _, err := c.LookupRequest(ctx, a); err != nil {
		t.Fatalf("invoice item list by customer: %v", err)
	}
	if _, _, err := c.List(ctx, time.Now().Add(-time.Hour), ""); err != nil {
		t.Fatalf("invoice item list by time: %v", err)
	}
	// The meter and its event summaries: stripe-mock answers its own fixture meter,
	// so the client maps a usage meter to it as a user would.
	fixture := struct {
		EventName          string `json:"event_name"`
		DefaultAggregation struct {
			Formula string `json:"formula"`
		} `json:"default_aggregation"`
		CustomerMapping struct {
			Key string `json:"event_payload_key"`
		} `json:"customer_mapping"`
		ValueSettings struct {
			Key string `json:"event_payload_key"`
		} `json:"value_settings"`
	}{}
	mreq, _ := http.NewRequest(http.MethodGet, mock.URL()+"/v1/billing/meters/mtr_tokens", nil)
	mreq.Header.Set("Authorization", "Bearer sk_test_123")
	mresp, err := http.DefaultClient.Do(mreq)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(mresp.Body).Decode(&fixture); err != nil {
		t.Fatal(err)
	}
	_ = mresp.Body.Close()
	if fixture.DefaultAggregation.Formula != "sum" {
		t.Fatalf("stripe-mock's fixture meter aggregates by %q; this check needs one that sums", fixture.DefaultAggregation.Formula)
	}
	mc, err := stripebilling.New(stripebilling.Config{Endpoint: mock.URL(), APIKey: "sk_test_123", Timeout: 5 * time.Second,
		Meters: map[string]stripebilling.Meter{"gpt-tokens": {EventName: fixture.EventName, ID: "mtr_tokens",
			CustomerKey: fixture.CustomerMapping.Key, ValueKey: fixture.ValueSettings.Key}}})
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now().Truncate(time.Minute).Add(-time.Hour)
	if _, err := mc.UsageTotal(ctx, "gpt-tokens", "cus_A", from, from.Add(time.Hour)); err != nil {
		t.Fatalf("meter and meter event summaries: %v", err)
	}
	// stripe-mock refuses what Stripe would, so the checks above are not vacuous: an
	// invoice item with a parameter Stripe does not have is a 400.
	req, _ := http.NewRequest(http.MethodPost, mock.URL()+"/v1/invoiceitems",
		strings.NewReader("amount=1&currency=usd&customer=cus_A&not_a_stripe_param=1"))
	req.Header.Set("Authorization", "Bearer sk_test_123")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("stripe-mock answered %d to an invoice item with an unknown parameter, want 400", resp.StatusCode)
	}
}

// Reconciliation compares Stripe's meter event summaries with what the operator sent:
// the total is the sum of the customer's events of the meter's event name in the
// window, cancelled ones left out, read only from a meter that sums what we send.
func TestUsageTotal(t *testing.T) {
	ctx := context.Background()
	fake, c, _ := setup(t)
	start := time.Now().Truncate(time.Minute).Add(-time.Minute)
	end := start.Add(3 * time.Minute)
	for i, q := range []string{"1500", "2500", "7"} {
		r := usageCharge(fmt.Sprintf("total%d", i))
		r.OccurredAt = time.Time{} // dated at Stripe's receipt, as the operator sends them
		r.Usage.Quantity = q
		if i == 2 {
			r.Customer = "cus_B"
		}
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	cancelled := usageCharge("totalcancelled")
	cancelled.OccurredAt = time.Time{}
	rec, err := c.Submit(ctx, cancelled)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, voidOf(cancelled, rec.ID, "stl_totalvoid")); err != nil {
		t.Fatal(err)
	}
	for customer, want := range map[string]string{"cus_A": "4000", "cus_B": "7", "cus_C": "0"} {
		got, err := c.UsageTotal(ctx, "gpt-tokens", customer, start, end)
		if err != nil || got != want {
			t.Fatalf("%s: total %q, %v; want %s", customer, got, err, want)
		}
	}
	if got, err := c.UsageTotal(ctx, "gpt-tokens", "cus_A", end, end.Add(time.Minute)); err != nil || got != "0" {
		t.Fatalf("a window after the events: %q, %v", got, err)
	}
	if len(fake.Requests()) == 0 {
		t.Fatal("no request reached the fake")
	}

	meterReads := func() int {
		n := 0
		for _, r := range fake.Requests() {
			if r.Method == http.MethodGet && r.Path == "/v1/billing/meters/mtr_tokens" {
				n++
			}
		}
		return n
	}
	if n := meterReads(); n != 1 {
		t.Fatalf("the meter was read %d times for four totals, want once (a check is kept 5m)", n)
	}
	if _, err := c.UsageTotal(ctx, "gpt-tokens", "cus_A", start.Add(time.Second), end); class(t, err).Class != billing.Terminal {
		t.Fatalf("a window not on whole minutes: %v", err)
	}
	if _, err := c.UsageTotal(ctx, "other-meter", "cus_A", start, end); !class(t, err).Unanswerable || class(t, err).Code != "unknown_meter" {
		t.Fatalf("an unmapped usage meter: %v", err)
	}
	// One customer's total Stripe refuses is that customer's, not the meter's.
	fake.RefuseNext(1, "/v1/billing/meters/mtr_tokens/event_summaries", http.StatusNotFound, "resource_missing", "customer")
	if e := class(t, func() error { _, err := c.UsageTotal(ctx, "gpt-tokens", "cus_gone", start, end); return err }()); e.Class != billing.Terminal || e.Unanswerable {
		t.Fatalf("a refused customer: %+v, want terminal for this total only", e)
	}
	// Any other refusal is the meter's: one finding, not one per customer.
	fake.RefuseNext(1, "/v1/billing/meters/mtr_tokens/event_summaries", http.StatusBadRequest, "parameter_invalid_integer", "start_time")
	if e := class(t, func() error { _, err := c.UsageTotal(ctx, "gpt-tokens", "cus_A", start, end); return err }()); !e.Unanswerable || e.Code != "summary_refused" {
		t.Fatalf("a refused summary request: %+v", e)
	}
	// A meter deleted since it was checked: the meter's, and checked again next time.
	fake.RefuseNext(1, "/v1/billing/meters/mtr_tokens/event_summaries", http.StatusNotFound, "resource_missing", "")
	if e := class(t, func() error { _, err := c.UsageTotal(ctx, "gpt-tokens", "cus_A", start, end); return err }()); !e.Unanswerable || e.Code != "meter_unreadable" {
		t.Fatalf("a meter gone since its check: %+v", e)
	}
	before := meterReads()
	// Stripe failing is tried again later, by the next pass.
	fake.FailNext(1, "/v1/billing/meters/mtr_tokens/event_summaries", http.StatusInternalServerError, "api_error", "", "")
	if e := class(t, func() error { _, err := c.UsageTotal(ctx, "gpt-tokens", "cus_A", start, end); return err }()); e.Class != billing.Transient {
		t.Fatalf("a Stripe 500 on a read: %+v, want transient", e)
	}
	if got, err := c.UsageTotal(ctx, "gpt-tokens", "cus_A", start, end); err != nil || got != "4000" {
		t.Fatalf("after the 500: %q, %v", got, err)
	}
	if meterReads() != before+1 {
		t.Fatalf("the meter was not checked again after it was gone (%d reads, %d before)", meterReads(), before)
	}

	// Meters whose totals are not the sum of what we send are not compared.
	cases := []struct {
		name  string
		meter fakestripe.Meter
		ours  stripebilling.Meter
		code  string
	}{
		{"no id in the spec", fakestripe.Meter{ID: "mtr_x", EventName: "gpt_tokens"}, stripebilling.Meter{EventName: "gpt_tokens"}, "meter_id_missing"},
		{"counts events", fakestripe.Meter{ID: "mtr_x", EventName: "gpt_tokens", Formula: "count"}, stripebilling.Meter{EventName: "gpt_tokens", ID: "mtr_x"}, "meter_not_comparable"},
		{"another event name", fakestripe.Meter{ID: "mtr_x", EventName: "other"}, stripebilling.Meter{EventName: "gpt_tokens", ID: "mtr_x"}, "meter_not_comparable"},
		{"another value key", fakestripe.Meter{ID: "mtr_x", EventName: "gpt_tokens", ValueKey: "tokens"}, stripebilling.Meter{EventName: "gpt_tokens", ID: "mtr_x"}, "meter_not_comparable"},
		// Meter IDs differ between test and live mode: after a key swap, or a meter deleted.
		{"not in this account and mode", fakestripe.Meter{ID: "mtr_other", EventName: "gpt_tokens"}, stripebilling.Meter{EventName: "gpt_tokens", ID: "mtr_x"}, "meter_unreadable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := fakestripe.Start(fakestripe.Options{APIKey: apiKey, Meters: []fakestripe.Meter{tc.meter}})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cc, err := stripebilling.New(stripebilling.Config{Endpoint: f.URL(), APIKey: apiKey, Timeout: 2 * time.Second,
				Meters: map[string]stripebilling.Meter{"gpt-tokens": tc.ours}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = cc.UsageTotal(ctx, "gpt-tokens", "cus_A", start, end)
			if e := class(t, err); !e.Unanswerable || e.Code != tc.code || e.Class != billing.Terminal || e.Unreadable != (tc.code == "meter_id_missing") {
				t.Fatalf("got %+v, want unanswerable %s", e, tc.code)
			}
		})
	}
	t.Run("a key that may not read meters", func(t *testing.T) {
		f, err := fakestripe.Start(fakestripe.Options{APIKey: apiKey, Meters: []fakestripe.Meter{{ID: "mtr_x", EventName: "gpt_tokens"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cc, err := stripebilling.New(stripebilling.Config{Endpoint: f.URL(), APIKey: apiKey, Timeout: 2 * time.Second,
			Meters: map[string]stripebilling.Meter{"gpt-tokens": {EventName: "gpt_tokens", ID: "mtr_x"}}})
		if err != nil {
			t.Fatal(err)
		}
		f.FailNext(1, "/v1/billing/meters/mtr_x", http.StatusForbidden, "invalid_request_error", "", "")
		_, err = cc.UsageTotal(ctx, "gpt-tokens", "cus_A", start, end)
		if e := class(t, err); !e.Unanswerable || e.Code != "meter_unreadable" || !strings.Contains(e.Message, "read billing meters") {
			t.Fatalf("got %+v", e)
		}
	})
}

// A lost invoice item is found by walking the customer's items newest first, page by
// page (a walk that stopped at the first page would resend past Stripe's 24-hour key
// window: a second item); reconciliation's List pages by cursor; past 1,000 newer items
// the lookup says so instead of answering "not found".
func TestInvoiceItemPaging(t *testing.T) {
	ctx := context.Background()
	start := func(t *testing.T, pageSize int) (*fakestripe.Server, *stripebilling.Client) {
		t.Helper()
		fake, err := fakestripe.Start(fakestripe.Options{APIKey: apiKey, PageSize: pageSize})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fake.Close() })
		c, err := stripebilling.New(stripebilling.Config{Endpoint: fake.URL(), APIKey: apiKey, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return fake, c
	}
	submitN := func(t *testing.T, c *stripebilling.Client, prefix, customer string, n int) {
		t.Helper()
		for i := range n {
			r := amountCharge(fmt.Sprintf("%s%04d", prefix, i))
			r.Customer = customer
			if _, err := c.Submit(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	listCalls := func(fake *fakestripe.Server) int {
		n := 0
		for _, r := range fake.Requests() {
			if r.Method == http.MethodGet && r.Path == "/v1/invoiceitems" {
				n++
			}
		}
		return n
	}

	t.Run("found on the third page; List walks every item once by cursor", func(t *testing.T) {
		fake, c := start(t, 10)
		ours := amountCharge("paged")
		if _, err := c.Submit(ctx, ours); err != nil {
			t.Fatal(err)
		}
		submitN(t, c, "newer", "cus_A", 25)  // newer than ours, same customer
		submitN(t, c, "other", "cus_B", 100) // another customer's
		rec, found, err := c.LookupRequest(ctx, ours)
		if err != nil || !found {
			t.Fatalf("lookup: found %v, %v", found, err)
		}
		mustMatch(t, ours, rec)
		if n := listCalls(fake); n != 3 {
			t.Fatalf("%d list calls, want 3 pages of 10", n)
		}

		seen := map[string]int{}
		cursor, calls := "", 0
		for {
			recs, next, err := c.List(ctx, time.Now().Add(-time.Hour), cursor)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				seen[r.IdempotencyKey]++
			}
			if calls++; next == "" {
				break
			}
			cursor = next
		}
		if len(seen) != 126 || calls != 2 {
			t.Fatalf("listed %d distinct items in %d calls, want 126 in 2 (100 per call)", len(seen), calls)
		}
		for k, n := range seen {
			if n != 1 {
				t.Fatalf("%s listed %d times", k, n)
			}
		}
	})

	t.Run("more than 1,000 newer items: unanswerable, never not found", func(t *testing.T) {
		_, c := start(t, 100)
		ours := amountCharge("buried")
		if _, err := c.Submit(ctx, ours); err != nil {
			t.Fatal(err)
		}
		submitN(t, c, "newer", "cus_A", 1000)
		_, found, err := c.LookupRequest(ctx, ours)
		if e := class(t, err); found || !e.Unanswerable || e.Unreadable || e.Code != "lookup_too_long" ||
			!strings.Contains(e.Message, ours.IdempotencyKey) {
			t.Fatalf("found %v, %+v", found, e)
		}
	})
}

// TestDateUsage: an event is dated at the usage's time only for a meter that asks for
// it, and only while it reaches Stripe within the grace period of that time, less the
// margin — Stripe would accept a later one for a finalized invoice and never bill it.
func TestDateUsage(t *testing.T) {
	c, err := stripebilling.New(stripebilling.Config{Endpoint: "http://127.0.0.1:1", APIKey: apiKey, Meters: map[string]stripebilling.Meter{
		"receipt":    {EventName: "r"},
		"completion": {EventName: "c", DateAtCompletion: true},
		"grace72h":   {EventName: "g", DateAtCompletion: true, GracePeriod: 72 * time.Hour},
	}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		meter string
		ago   time.Duration
		want  time.Time // zero: not dated
	}{
		{"receipt", time.Minute, time.Time{}},
		{"unknown", time.Minute, time.Time{}},
		{"completion", 10 * time.Minute, now.Add(-10 * time.Minute).Add(time.Hour - stripebilling.DateMargin)},
		{"completion", time.Hour - stripebilling.DateMargin - time.Second, now.Add(time.Second)},
		{"completion", time.Hour - stripebilling.DateMargin, time.Time{}},
		{"completion", 3 * time.Hour, time.Time{}},
		{"completion", -10 * time.Minute, time.Time{}}, // ahead of this clock: maybe further ahead of Stripe's
		{"completion", -time.Second, time.Time{}},
		{"completion", 0, now.Add(time.Hour - stripebilling.DateMargin)},
		{"grace72h", 48 * time.Hour, now.Add(-48 * time.Hour).Add(72*time.Hour - stripebilling.DateMargin)},
	} {
		if got := c.DateUsage(tc.meter, now.Add(-tc.ago), now); !got.Equal(tc.want) {
			t.Errorf("%s, %s ago: until %v, want %v", tc.meter, tc.ago, got, tc.want)
		}
	}
	if got := c.DateUsage("completion", time.Time{}, now); !got.IsZero() {
		t.Errorf("no usage time: until %v, want not dated", got)
	}
}

// An amount is ISO 4217 minor units above the adapter and Stripe's unit at Stripe: the
// invoice item carries Stripe's amount, the record reads it back in ISO units so the
// match compares like with like, and an amount Stripe cannot take is refused before
// anything is sent.
func TestInvoiceItemCurrencies(t *testing.T) {
	ctx := context.Background()
	fake, c, _ := setup(t)
	charge := func(key, currency string, minor int64) billing.Request {
		r := amountCharge(key)
		r.Amount = &billing.Amount{Minor: minor, Currency: currency}
		return r
	}
	item := func(id string) fakestripe.InvoiceItem {
		t.Helper()
		for _, it := range fake.InvoiceItems() {
			if it.ID == id {
				return it
			}
		}
		t.Fatalf("no invoice item %s at the fake", id)
		return fakestripe.InvoiceItem{}
	}
	for _, tc := range []struct {
		currency    string
		iso, stripe int64
	}{
		{"JPY", 500, 500}, {"ISK", 5, 500}, {"UGX", 5000, 500000}, {"MGA", 50000, 500},
		{"KWD", 5120, 5120}, {"HUF", 1045, 1045}, {"USD", 1250, 1250},
	} {
		r := charge("cur-"+tc.currency, tc.currency, tc.iso)
		rec, err := c.Submit(ctx, r)
		if err != nil {
			t.Fatalf("%s: %v", tc.currency, err)
		}
		mustMatch(t, r, rec)
		if it := item(rec.ID); it.Amount != tc.stripe || it.Currency != strings.ToLower(tc.currency) {
			t.Fatalf("%s: Stripe holds %d %s, want %d", tc.currency, it.Amount, it.Currency, tc.stripe)
		}
		found, ok, err := c.LookupRequest(ctx, r)
		if err != nil || !ok {
			t.Fatalf("%s: lookup: %v, %v", tc.currency, ok, err)
		}
		mustMatch(t, r, found)
		// A credit of part of it: the same conversion, negative at Stripe.
		refund := refundOf(r, rec.ID, "stl_cur-"+tc.currency+"_r", tc.iso)
		refund.Amount.Currency = tc.currency
		credit, err := c.Submit(ctx, refund)
		if err != nil {
			t.Fatalf("%s refund: %v", tc.currency, err)
		}
		mustMatch(t, refund, credit)
		if it := item(credit.ID); it.Amount != -tc.stripe {
			t.Fatalf("%s: Stripe holds a credit of %d, want %d", tc.currency, it.Amount, -tc.stripe)
		}
	}
	// Reconciliation lists the items back in ISO units.
	recs, _, err := c.List(ctx, time.Now().Add(-time.Hour), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if rec.Amount.Currency == "ISK" && rec.Amount.Minor != 5 || rec.Amount.Currency == "MGA" && rec.Amount.Minor != 50000 {
			t.Fatalf("listed %+v, want ISO units", rec.Amount)
		}
	}

	// Refused, terminally, with nothing sent: a KWD amount whose last digit is not 0,
	// whole ariary only, a currency with no documented Stripe unit, and the same for a
	// credit.
	sent := len(fake.Requests())
	for _, tc := range []struct {
		r          billing.Request
		code, want string
	}{
		{charge("kwd-odd", "KWD", 1234), "amount_not_representable", "1.234 KWD cannot be sent to Stripe exactly"},
		{charge("mga-frac", "MGA", 150), "amount_not_representable", "1.50 MGA cannot be sent to Stripe exactly"},
		{charge("iqd", "IQD", 1000), "currency_unit_unknown", "Stripe documents no amount unit for IQD"},
		{func() billing.Request {
			r := refundOf(amountCharge("x"), "ii_123", "stl_kwd_r", 5)
			r.Amount.Currency = "KWD"
			return r
		}(), "amount_not_representable", "0.005 KWD cannot be sent to Stripe exactly"},
	} {
		_, err := c.Submit(ctx, tc.r)
		if e := class(t, err); e.Class != billing.Terminal || e.Code != tc.code || !strings.Contains(e.Message, tc.want) {
			t.Fatalf("%s: got %+v", tc.r.IdempotencyKey, e)
		}
	}
	if n := len(fake.Requests()); n != sent {
		t.Fatalf("%d requests reached Stripe for amounts it cannot take", n-sent)
	}
}
