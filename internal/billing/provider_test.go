package billing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
)

// These tests run the adapter against the fake provider: a real HTTP server with a
// ledger, so every assertion ends in "how many times was the customer charged".

func startFake(t *testing.T, opts fakebilling.Options) *fakebilling.Server {
	t.Helper()
	if opts.Token == "" {
		opts.Token = testToken
	}
	srv, err := fakebilling.Start(opts)
	if err != nil {
		t.Fatalf("start fake provider: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("close fake provider: %v", err)
		}
	})
	return srv
}

func TestSubmitAgainstFakeProvider(t *testing.T) {
	ctx := context.Background()
	req := chargeRequest(7)

	tests := []struct {
		name string
		// arrange queues faults; act submits (or not) and returns the final error.
		arrange     func(*fakebilling.Server)
		wantClass   billing.Class // 0: success
		wantCode    string
		wantRetry   time.Duration
		wantCharges int
		// then, when set, retries with the same key and expects success and still
		// wantCharges ledger entries.
		retry bool
	}{
		{name: "first submit charges once", wantCharges: 1},
		{name: "503 without commit", arrange: func(s *fakebilling.Server) { s.FailNext(1, 503) },
			wantClass: billing.Ambiguous, wantCode: "503", wantCharges: 0, retry: true},
		{name: "429 with Retry-After", arrange: func(s *fakebilling.Server) { s.RateLimitNext(1, 2*time.Second) },
			wantClass: billing.Transient, wantCode: "rate_limited", wantRetry: 2 * time.Second, wantCharges: 0, retry: true},
		{name: "commit then 500", arrange: func(s *fakebilling.Server) { s.CommitThen500Next(1) },
			wantClass: billing.Ambiguous, wantCode: "internal_error", wantCharges: 1, retry: true},
		{name: "terminal rejection", arrange: func(s *fakebilling.Server) { s.RejectNext(1, 400, "invalid_currency") },
			wantClass: billing.Terminal, wantCode: "invalid_currency", wantCharges: 0},
		{name: "slow but within the timeout", arrange: func(s *fakebilling.Server) { s.SlowNext(1, 50*time.Millisecond) },
			wantCharges: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := startFake(t, fakebilling.Options{})
			c := newClient(t, fake.URL(), 2*time.Second)
			if tt.arrange != nil {
				tt.arrange(fake)
			}
			rec, err := c.Submit(ctx, req)
			if tt.wantClass == 0 {
				if err != nil {
					t.Fatalf("Submit: %v", err)
				}
				if rec.ID == "" || rec.Status != billing.StatusSettled || rec.IdempotencyKey != req.IdempotencyKey ||
					rec.Usage == nil || rec.Usage.Quantity != "1523" || rec.CreatedAt.IsZero() {
					t.Errorf("record %+v: want a settled record for %s with quantity 1523", rec, req.IdempotencyKey)
				}
			} else {
				e := wantError(t, err, tt.wantClass, tt.wantCode)
				if e.RetryAfter != tt.wantRetry {
					t.Errorf("RetryAfter = %s, want %s", e.RetryAfter, tt.wantRetry)
				}
			}
			if got := fake.Charges(req.SettlementKey); got != tt.wantCharges {
				t.Fatalf("ledger has %d charges, want %d", got, tt.wantCharges)
			}
			if tt.retry {
				rec, err := c.Submit(ctx, req)
				if err != nil {
					t.Fatalf("retry with the same key: %v", err)
				}
				if got := fake.Charges(req.SettlementKey); got != 1 {
					t.Fatalf("after the retry the ledger has %d charges, want 1", got)
				}
				if recs := fake.Records(); len(recs) != 1 || recs[0].ID != rec.ID {
					t.Fatalf("retry returned %s, ledger holds %+v", rec.ID, recs)
				}
			}
		})
	}
}

// TestCommitThenTimeout is "billing succeeded, the reply was lost": the adapter must say
// Ambiguous, the provider must hold exactly one charge, and both a Lookup and a retry
// with the same key must find that charge instead of making another.
func TestCommitThenTimeout(t *testing.T) {
	ctx := context.Background()
	fake := startFake(t, fakebilling.Options{})
	c := newClient(t, fake.URL(), 300*time.Millisecond)
	req := chargeRequest(1)

	fake.CommitThenTimeoutNext(1)
	start := time.Now()
	_, err := c.Submit(ctx, req)
	wantError(t, err, billing.Ambiguous, "timeout")
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("Submit took %s; the client timeout is 300ms", waited)
	}
	if n := fake.Charges(req.SettlementKey); n != 1 {
		t.Fatalf("ledger has %d charges after the lost reply, want 1", n)
	}
	committed := fake.Records()[0]

	rec, found, err := c.Lookup(ctx, req.IdempotencyKey)
	if err != nil || !found || rec.ID != committed.ID {
		t.Fatalf("Lookup = %+v, %v, %v; want the committed record %s", rec, found, err, committed.ID)
	}
	rec, err = c.Submit(ctx, req)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if rec.ID != committed.ID {
		t.Errorf("retry returned %s, want the committed %s", rec.ID, committed.ID)
	}
	if n := fake.Charges(req.SettlementKey); n != 1 {
		t.Fatalf("ledger has %d charges after the retry, want 1", n)
	}
	if calls := fake.Calls(); calls.Posts != 2 || calls.Gets != 1 || calls.Faults != 1 {
		t.Errorf("calls %+v, want 2 posts, 1 get, 1 fault", calls)
	}
}

func TestKeyReusedWithOtherParams(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(*billing.Request)
		wantSame bool // equal parameters: same record, no error
	}{
		{name: "other customer", mutate: func(r *billing.Request) { r.Customer = "cus_other" }},
		{name: "other quantity", mutate: func(r *billing.Request) {
			r.Usage = &billing.Usage{Meter: "gpt-tokens", Quantity: "1524", Unit: "tokens"}
		}},
		{name: "amount added", mutate: func(r *billing.Request) { r.Amount = &billing.Amount{Minor: 1, Currency: "USD"} }},
		{name: "other metadata", mutate: func(r *billing.Request) { r.Metadata = map[string]string{"job": "job-x"} }},
		{name: "other type", mutate: func(r *billing.Request) { r.Type, r.Reverses = billing.TypeVoid, "inference/job-0" }},
		{name: "same quantity written differently", mutate: func(r *billing.Request) {
			r.Usage = &billing.Usage{Meter: "gpt-tokens", Quantity: "1523.000", Unit: "tokens"}
		}, wantSame: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			fake := startFake(t, fakebilling.Options{})
			c := newClient(t, fake.URL(), 0)
			req := chargeRequest(3)
			first, err := c.Submit(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			other := req
			tt.mutate(&other)
			rec, err := c.Submit(ctx, other)
			if tt.wantSame {
				if err != nil || rec.ID != first.ID {
					t.Fatalf("got %+v, %v; want the first record %s", rec, err, first.ID)
				}
			} else {
				e := wantError(t, err, billing.Terminal, "idempotency_key_reused")
				if !e.KeyReused || e.Status != 422 {
					t.Errorf("KeyReused=%v Status=%d, want true 422", e.KeyReused, e.Status)
				}
			}
			if n := fake.Charges(req.SettlementKey); n != 1 {
				t.Errorf("ledger has %d charges, want 1", n)
			}
		})
	}
}

// TestConcurrentSubmitsChargeOnce fires 20 identical submits at once while the first
// one is slow: the provider sees the key in flight and answers 409, which the adapter
// must report as Transient, and the ledger must hold one charge.
func TestConcurrentSubmitsChargeOnce(t *testing.T) {
	ctx := context.Background()
	fake := startFake(t, fakebilling.Options{})
	c := newClient(t, fake.URL(), 5*time.Second)
	req := chargeRequest(9)
	fake.SlowNext(1, 300*time.Millisecond)

	const n = 20
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		records = make([]billing.Record, n)
		errs    = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			records[i], errs[i] = c.Submit(ctx, req)
		}()
	}
	close(start)
	wg.Wait()

	if got := fake.Charges(req.SettlementKey); got != 1 {
		t.Fatalf("ledger has %d charges after %d concurrent submits, want 1", got, n)
	}
	id := fake.Records()[0].ID
	var ok, inUse int
	for i := range n {
		if errs[i] == nil {
			if records[i].ID != id {
				t.Errorf("submit %d returned record %s, want %s", i, records[i].ID, id)
			}
			ok++
			continue
		}
		e, isErr := billing.AsError(errs[i])
		if !isErr || e.Class != billing.Transient || e.Code != "idempotency_key_in_use" {
			t.Errorf("submit %d: %v; want the record or a transient key-in-use error", i, errs[i])
			continue
		}
		inUse++
	}
	if ok == 0 || inUse == 0 {
		t.Errorf("%d records and %d key-in-use errors; want both (the slow first request holds the key)", ok, inUse)
	}
}

// TestProviderDown: while the provider refuses connections nothing can have been
// received (Transient); once it is back on the same port the same key charges once.
func TestProviderDown(t *testing.T) {
	ctx := context.Background()
	fake := startFake(t, fakebilling.Options{})
	c := newClient(t, fake.URL(), time.Second)
	req := chargeRequest(5)

	// A first call leaves an idle keep-alive connection that going down must drop too.
	if _, _, err := c.Lookup(ctx, req.IdempotencyKey); err != nil {
		t.Fatal(err)
	}
	if err := fake.SetDown(true); err != nil {
		t.Fatal(err)
	}
	// Give the client a moment to see the dropped idle connection: a request written
	// into it before then could have been read, as far as the client can tell, and is
	// rightly ambiguous (TestCrashAfterReadingIsAmbiguous).
	time.Sleep(100 * time.Millisecond)
	_, err := c.Submit(ctx, req)
	wantError(t, err, billing.Transient, "connection_refused")
	_, _, err = c.Lookup(ctx, req.IdempotencyKey)
	wantError(t, err, billing.Transient, "connection_refused")

	if err := fake.SetDown(false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, req); err != nil {
		t.Fatalf("after coming back: %v", err)
	}
	if n := fake.Charges(req.SettlementKey); n != 1 {
		t.Errorf("ledger has %d charges, want 1", n)
	}
}

// A wrong token is our configuration problem: retried, never a dead-letter by itself.
func TestWrongTokenIsTransient(t *testing.T) {
	fake := startFake(t, fakebilling.Options{})
	c, err := billing.NewHTTP(billing.HTTPConfig{Endpoint: fake.URL(), Token: "sk_wrong"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(context.Background(), chargeRequest(1))
	wantError(t, err, billing.Transient, "unauthorized")
	if n := len(fake.Records()); n != 0 {
		t.Errorf("ledger has %d records after an unauthorized call", n)
	}
}

func TestLookupPollsPendingUntilSettled(t *testing.T) {
	ctx := context.Background()
	fake := startFake(t, fakebilling.Options{PendingPolls: 2})
	c := newClient(t, fake.URL(), 0)
	req := chargeRequest(1)

	rec, err := c.Submit(ctx, req)
	if err != nil || rec.Status != billing.StatusPending {
		t.Fatalf("Submit = %+v, %v; want pending", rec, err)
	}
	for i, want := range []string{billing.StatusPending, billing.StatusPending, billing.StatusSettled, billing.StatusSettled} {
		rec, found, err := c.Lookup(ctx, req.IdempotencyKey)
		if err != nil || !found || rec.Status != want {
			t.Fatalf("Lookup %d = %q, %v, %v; want %q", i+1, rec.Status, found, err, want)
		}
	}

	if err := fake.SetStatus(req.SettlementKey, billing.StatusFailed, "card_declined"); err != nil {
		t.Fatal(err)
	}
	rec, _, err = c.Lookup(ctx, req.IdempotencyKey)
	if err != nil || rec.Status != billing.StatusFailed || rec.FailureReason != "card_declined" {
		t.Errorf("after SetStatus: %+v, %v; want failed card_declined", rec, err)
	}
	if _, found, err := c.Lookup(ctx, "stl_unknown"); err != nil || found {
		t.Errorf("Lookup of an unknown key = found %v, %v; want not found, no error", found, err)
	}
}

func TestListPagesThroughTheLedger(t *testing.T) {
	ctx := context.Background()
	fake := startFake(t, fakebilling.Options{PageSize: 2})
	c := newClient(t, fake.URL(), 0)

	// An out-of-band record from yesterday sorts first.
	yesterday := time.Now().Add(-24 * time.Hour).UTC().Truncate(time.Second)
	if err := fake.Import(billing.Record{IdempotencyKey: "stl_imported", SettlementKey: "manual/1", Customer: "cus_1",
		Amount: &billing.Amount{Minor: 99, Currency: "USD"}, CreatedAt: yesterday}); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 5 {
		rec, err := c.Submit(ctx, chargeRequest(i))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, rec.ID)
	}
	want = append([]string{fake.Records()[0].ID}, want...)

	tests := []struct {
		name      string
		since     time.Time
		wantIDs   []string
		wantPages int
	}{
		{name: "everything", wantIDs: want, wantPages: 3},
		{name: "since an hour ago skips the import", since: time.Now().Add(-time.Hour), wantIDs: want[1:], wantPages: 3},
		{name: "since the future", since: time.Now().Add(time.Hour), wantIDs: nil, wantPages: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			cursor, pages := "", 0
			for {
				items, next, err := c.List(ctx, tt.since, cursor)
				if err != nil {
					t.Fatalf("List page %d: %v", pages+1, err)
				}
				pages++
				if len(items) > 2 {
					t.Fatalf("page %d has %d items, page size is 2", pages, len(items))
				}
				for _, it := range items {
					got = append(got, it.ID)
				}
				if next == "" {
					break
				}
				if pages > 10 {
					t.Fatal("paging does not end")
				}
				cursor = next
			}
			if len(got) != len(tt.wantIDs) || pages != tt.wantPages {
				t.Fatalf("got %v in %d pages, want %v in %d", got, pages, tt.wantIDs, tt.wantPages)
			}
			for i := range got {
				if got[i] != tt.wantIDs[i] {
					t.Fatalf("got %v, want %v (creation order)", got, tt.wantIDs)
				}
			}
		})
	}

	_, _, err := c.List(ctx, time.Time{}, "not-a-cursor")
	wantError(t, err, billing.Terminal, "invalid_cursor")
}

func TestErrorsUnwrap(t *testing.T) {
	fake := startFake(t, fakebilling.Options{})
	c := newClient(t, fake.URL(), 200*time.Millisecond)
	fake.CommitThenTimeoutNext(1)
	_, err := c.Submit(context.Background(), chargeRequest(1))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%v, DeadlineExceeded) = false; the cause must stay reachable", err)
	}
}

// TestCrashAfterReadingIsAmbiguous: a provider that reads a whole charge on a kept-alive
// connection and goes away without answering may have committed it. Go's transport
// then sends a request carrying an Idempotency-Key again on a new connection by itself,
// and that dial is refused — which once made the whole exchange "never reached the
// provider" (Transient), so the charge could be sent elsewhere or past the key window.
// Found by the envtest "holds a settlement whose provider now points elsewhere".
func TestCrashAfterReadingIsAmbiguous(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var received atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"no settlement under this key"}}`))
			return
		}
		if _, err := io.ReadAll(r.Body); err != nil {
			t.Errorf("read the charge: %v", err)
		}
		received.Add(1)
		_ = ln.Close() // down: every new connection is refused
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close() // and the reply never comes
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	c := newClient(t, "http://"+ln.Addr().String(), 2*time.Second)
	req := chargeRequest(9)
	if _, found, err := c.Lookup(context.Background(), req.IdempotencyKey); err != nil || found {
		t.Fatalf("lookup: found %v, %v", found, err) // leaves a kept-alive connection
	}
	_, err = c.Submit(context.Background(), req)
	if received.Load() != 1 {
		t.Fatalf("the provider read %d charges, want 1", received.Load())
	}
	if e, ok := billing.AsError(err); !ok || e.Class != billing.Ambiguous {
		t.Fatalf("got %v, want an ambiguous error: the provider read the charge", err)
	}
}

// TestLookupAfterLostReplyMatchesWithOrWithoutNulls is the lost reply against a
// provider that sends null fields and one that leaves them out: either way the
// lookup's record is provably ours (a charge's reverses carries nothing; a refund's or
// void's is there and equal) and the ledger holds one charge.
func TestLookupAfterLostReplyMatchesWithOrWithoutNulls(t *testing.T) {
	ctx := context.Background()
	usage := chargeRequest(1)
	amount := chargeRequest(2)
	amount.Usage, amount.Amount = nil, &billing.Amount{Minor: 1250, Currency: "USD"}
	unitless := chargeRequest(3)
	unitless.Usage.Unit = ""
	refund := chargeRequest(4)
	refund.Type, refund.Reverses, refund.Usage = billing.TypeRefund, amount.SettlementKey, nil
	refund.Amount = &billing.Amount{Minor: 250, Currency: "USD"}
	void := refund
	void.SettlementKey, void.IdempotencyKey, void.Type = "inference/job-5", "stl_void_5", billing.TypeVoid
	for _, omitNulls := range []bool{false, true} {
		t.Run(fmt.Sprintf("omit nulls %v", omitNulls), func(t *testing.T) {
			fake := startFake(t, fakebilling.Options{OmitNulls: omitNulls, UsagePrice: 2})
			c := newClient(t, fake.URL(), 300*time.Millisecond)
			for _, req := range []billing.Request{usage, amount, unitless, refund, void} {
				fake.CommitThenTimeoutNext(1)
				_, err := c.Submit(ctx, req)
				wantError(t, err, billing.Ambiguous, "timeout")
				rec, found, err := c.Lookup(ctx, req.IdempotencyKey)
				if err != nil || !found {
					t.Fatalf("%s: Lookup = %v, %v", req.SettlementKey, found, err)
				}
				if m, ok := billing.Match(req, rec); !ok {
					t.Errorf("%s %s: the committed record does not match: %s", req.Type, req.SettlementKey, m)
				}
				if n := fake.Charges(req.SettlementKey); n != 1 {
					t.Errorf("%s: ledger has %d entries, want 1", req.SettlementKey, n)
				}
			}
		})
	}
}
