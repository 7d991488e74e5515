package metronomebilling_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/metronomebilling"
	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
)

const (
	acmeID    = "11111111-2222-4333-8444-555555555555"
	globexID  = "99999999-8888-4777-8666-555555555555"
	metricID  = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
	gpuMetric = "12345678-1234-4234-8234-123456789abc"
)

// startTotals runs a fake with two customers (acme under two aliases, globex under
// one; "shared" names both) and a billable metric summing tokens_used's quantity, and a
// client mapping usage meter "tokens" to it and "gpu" to a metric with no ID.
func startTotals(t *testing.T, opts fakemetronome.Options) (*fakemetronome.Server, *metronomebilling.Client) {
	t.Helper()
	opts.Customers = []fakemetronome.Customer{
		{ID: acmeID, IngestAliases: []string{"acme", "acme-eu", "shared"}},
		{ID: globexID, IngestAliases: []string{"globex", "shared"}},
	}
	opts.Metrics = map[string]fakemetronome.Metric{metricID: {EventType: fakemetronome.DefaultEventType}}
	fake, err := fakemetronome.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	c, err := metronomebilling.New(metronomebilling.Config{Endpoint: fake.URL(), Token: fake.Token(), Timeout: 2 * time.Second,
		Meters: map[string]metronomebilling.Meter{
			"tokens": {EventType: fakemetronome.DefaultEventType, BillableMetricID: metricID},
			"gpu":    {EventType: "gpu_seconds"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	return fake, c
}

// put stores a usage event of customer (an ID or alias) dated at.
func put(fake *fakemetronome.Server, key, customer, eventType, quantity string, at time.Time) {
	fake.Put(fakemetronome.Event{TransactionID: key, CustomerID: customer, EventType: eventType,
		Timestamp: at.UTC().Format(time.RFC3339), Properties: map[string]string{"quantity": quantity}}, time.Now())
}

func TestUsageTotalSumsTheCustomersEventsInTheWindow(t *testing.T) {
	fake, c := startTotals(t, fakemetronome.Options{})
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	end := start.Add(30 * time.Minute)
	put(fake, "in-1", "acme", fakemetronome.DefaultEventType, "1523", start)                           // first instant: in
	put(fake, "in-2", acmeID, fakemetronome.DefaultEventType, "0.25", start.Add(10*time.Minute))       // under the ID
	put(fake, "in-3", "acme-eu", fakemetronome.DefaultEventType, "2.5", end.Add(-time.Second))         // another alias
	put(fake, "out-end", "acme", fakemetronome.DefaultEventType, "1000", end)                          // ending_before: out
	put(fake, "out-start", "acme", fakemetronome.DefaultEventType, "1000", start.Add(-time.Second))    // before: out
	put(fake, "other-customer", "globex", fakemetronome.DefaultEventType, "7", start.Add(time.Minute)) // another customer
	put(fake, "other-type", "acme", "gpu_seconds", "9", start.Add(time.Minute))                        // another metric

	total, err := c.UsageTotal(context.Background(), "tokens", "acme", start, end)
	if err != nil {
		t.Fatal(err)
	}
	if total != "1525.75" {
		t.Fatalf("total %s, want 1525.75 (exactly, no float)", total)
	}
	reqs := fake.UsageRequests()
	if len(reqs) != 1 {
		t.Fatalf("usage requests %+v", reqs)
	}
	r := reqs[0]
	if r.WindowSize != "NONE" || r.StartingOn != start.UTC().Format(time.RFC3339) || r.EndingBefore != end.UTC().Format(time.RFC3339) ||
		len(r.CustomerIDs) != 1 || r.CustomerIDs[0] != acmeID || len(r.BillableMetricIDs) != 1 || r.BillableMetricIDs[0] != metricID {
		t.Fatalf("the request asks for the alias's customer ID, the meter's billable metric and the window as given: %+v", r)
	}

	// A customer given by its ID is asked for as is; the alias was resolved once.
	if total, err := c.UsageTotal(context.Background(), "tokens", globexID, start, end); err != nil || total != "7" {
		t.Fatalf("globex: %s, %v", total, err)
	}
	if total, err := c.UsageTotal(context.Background(), "tokens", "acme", start, end); err != nil || total != "1525.75" {
		t.Fatalf("acme again: %s, %v", total, err)
	}
	if n := fake.CustomerRequests(); n != 1 {
		t.Fatalf("the alias is resolved once and cached; the customer list was read %d times", n)
	}

	// No usage: Metronome answers null, which is 0.
	if total, err := c.UsageTotal(context.Background(), "tokens", "globex", end, end.Add(time.Minute)); err != nil || total != "0" {
		t.Fatalf("a window without usage: %s, %v", total, err)
	}
}

func TestUsageTotalReadsEveryPage(t *testing.T) {
	fake, c := startTotals(t, fakemetronome.Options{UsagePages: 3})
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	put(fake, "k", acmeID, fakemetronome.DefaultEventType, "42", start.Add(time.Minute))
	total, err := c.UsageTotal(context.Background(), "tokens", acmeID, start, start.Add(time.Hour))
	if err != nil || total != "42" {
		t.Fatalf("total %s, %v: the row is on the last page", total, err)
	}
	reqs := fake.UsageRequests()
	if len(reqs) != 3 || reqs[0].NextPage != "" || reqs[1].NextPage != "page-1" || reqs[2].NextPage != "page-2" {
		t.Fatalf("pages %+v", reqs)
	}
}

// What cannot be compared says so (Unanswerable), with what to do; nothing is guessed.
func TestUsageTotalUnanswerable(t *testing.T) {
	fake, c := startTotals(t, fakemetronome.Options{})
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	end := start.Add(time.Hour)
	unanswerable := func(name, meter, customer, code, says string) *billing.Error {
		t.Helper()
		_, err := c.UsageTotal(context.Background(), meter, customer, start, end)
		e := classOf(t, err)
		if !e.Unanswerable || e.Code != code || !strings.Contains(e.Message, says) {
			t.Fatalf("%s: want Unanswerable %s saying %q, got %+v", name, code, says, e)
		}
		return e
	}
	e := unanswerable("a meter without billableMetricID", "gpu", "acme", "billable_metric_missing", "set it to the ID of the Metronome billable metric")
	if !e.Unreadable {
		t.Fatalf("a meter without an ID is only counted (Unreadable), as a Stripe meter without one: %+v", e)
	}
	if len(fake.UsageRequests()) != 0 || fake.CustomerRequests() != 0 {
		t.Fatal("nothing is asked for a meter without billableMetricID")
	}
	// An alias that names no customer, or several, is that customer's problem, not the
	// meter's: Terminal without Unanswerable, so the pass reports this customer and goes
	// on comparing the meter's other customers.
	oneCustomer := func(name, customer, code, says string) {
		t.Helper()
		_, err := c.UsageTotal(context.Background(), "tokens", customer, start, end)
		e := classOf(t, err)
		if e.Unanswerable || e.Class != billing.Terminal || e.Code != code || !strings.Contains(e.Message, says) {
			t.Fatalf("%s: want Terminal (not Unanswerable) %s saying %q, got %+v", name, code, says, e)
		}
	}
	oneCustomer("an unknown alias", "initech", "alias_unknown", `no Metronome customer has ingest alias "initech"`)
	oneCustomer("an alias of two customers", "shared", "alias_ambiguous", `more than one Metronome customer answers to ingest alias "shared"`)
	if len(fake.UsageRequests()) != 0 {
		t.Fatal("no usage is read for an alias that does not name one customer")
	}
	unanswerable("an unmapped meter", "nope", "acme", "unknown_meter", "nope")

	// Values that are not an exact decimal.
	for _, raw := range []string{"1.5e3", "1e-7", "12E2"} {
		fake.AnswerUsageValue(raw)
		unanswerable("value "+raw, "tokens", acmeID, "total_not_exact", raw)
	}
	// An exact value is returned as Metronome wrote it.
	fake.AnswerUsageValue("12.50")
	if total, err := c.UsageTotal(context.Background(), "tokens", acmeID, start, end); err != nil || total != "12.50" {
		t.Fatalf("an exact value: %s, %v", total, err)
	}

	// A billable metric this account does not have: Metronome refuses the request, and the
	// whole meter is out (not one customer).
	other, err := metronomebilling.New(metronomebilling.Config{Endpoint: fake.URL(), Token: fake.Token(),
		Meters: map[string]metronomebilling.Meter{"tokens": {EventType: fakemetronome.DefaultEventType, BillableMetricID: gpuMetric}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.UsageTotal(context.Background(), "tokens", acmeID, start, end)
	if e := classOf(t, err); !e.Unanswerable || e.Status != http.StatusNotFound || !strings.Contains(e.Message, gpuMetric) {
		t.Fatalf("an unknown billable metric: %+v", e)
	}

	// Two usage meters reported as one event type: one metric totals both.
	shared, err := metronomebilling.New(metronomebilling.Config{Endpoint: fake.URL(), Token: fake.Token(),
		Meters: map[string]metronomebilling.Meter{
			"tokens":       {EventType: fakemetronome.DefaultEventType, BillableMetricID: metricID},
			"tokens-batch": {EventType: fakemetronome.DefaultEventType}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = shared.UsageTotal(context.Background(), "tokens", acmeID, start, end)
	if e := classOf(t, err); !e.Unanswerable || e.Code != "event_type_shared" {
		t.Fatalf("a shared event type: %+v", e)
	}
}

// Errors are classified as the adapter's other reads: the window is compared again later.
func TestUsageTotalErrors(t *testing.T) {
	fake, c := startTotals(t, fakemetronome.Options{RetryAfter: 3 * time.Second})
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	end := start.Add(time.Hour)
	for _, tc := range []struct {
		name      string
		fail      func()
		status    int
		retryWait time.Duration
	}{
		{"usage rate limited", func() { fake.FailUsage(http.StatusTooManyRequests, 1) }, 429, 3 * time.Second},
		{"usage down", func() { fake.FailUsage(http.StatusInternalServerError, 1) }, 500, 0},
		{"usage token refused", func() { fake.FailUsage(http.StatusUnauthorized, 1) }, 401, 0},
		{"usage token without access", func() { fake.FailUsage(http.StatusForbidden, 1) }, 403, 0},
		{"customers rate limited", func() { fake.FailCustomers(http.StatusTooManyRequests, 1) }, 429, 3 * time.Second},
		{"customers down", func() { fake.FailCustomers(http.StatusBadGateway, 1) }, 502, 0},
	} {
		tc.fail()
		customer := acmeID
		if strings.HasPrefix(tc.name, "customers") {
			customer = "globex" // not resolved yet: the list is read
		}
		_, err := c.UsageTotal(context.Background(), "tokens", customer, start, end)
		e := classOf(t, err)
		if e.Class != billing.Transient || e.Unanswerable || e.Status != tc.status || e.Local {
			t.Fatalf("%s: want Transient %d, got %+v", tc.name, tc.status, e)
		}
		if tc.retryWait != 0 && e.RetryAfter != tc.retryWait {
			t.Fatalf("%s: RetryAfter %s, want %s", tc.name, e.RetryAfter, tc.retryWait)
		}
	}
	// Then answered.
	if total, err := c.UsageTotal(context.Background(), "tokens", "globex", start, end); err != nil || total != "0" {
		t.Fatalf("after the failures: %s, %v", total, err)
	}

	// A window not in whole minutes is refused before sending.
	before := len(fake.UsageRequests())
	_, err := c.UsageTotal(context.Background(), "tokens", acmeID, start.Add(time.Second), end)
	if e := classOf(t, err); e.Class != billing.Terminal || !e.Local {
		t.Fatalf("a window not in whole minutes: %+v", e)
	}
	if len(fake.UsageRequests()) != before {
		t.Fatal("nothing is sent for a refused window")
	}
}
