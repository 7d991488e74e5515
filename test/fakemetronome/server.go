// Package fakemetronome is a stateful fake of Metronome's usage ingestion, as its API
// reference documents it, for the Metronome adapter's tests, the integration suite and
// the demo (test/fakemetronome/cmd):
//
//   - POST /v1/ingest takes a JSON array of 1 to 100 usage events, each with
//     transaction_id, customer_id, event_type, timestamp (RFC 3339 with a 4-digit
//     year, at most 34 days old and at most 24 hours ahead) and string-valued
//     properties, and answers 200 with an empty body; an event whose transaction_id it
//     accepted in the last 34 days is ignored as a duplicate — the FIRST copy is kept,
//     whatever the second holds — and answered 200 all the same;
//   - POST /v1/events/search {"transactionIds": [...]} answers the events it holds
//     under those IDs that are dated within the last 34 days;
//   - POST /v1/usage (window_size NONE) answers, per customer and billable metric
//     asked, the sum of the quantity property of the events it holds whose event_type
//     the metric counts (Options.Metrics), dated in [starting_on, ending_before), for
//     the customer under its ID or any of its ingest aliases (Options.Customers); null
//     when there are none; paged through the next_page query parameter;
//   - GET /v1/customers?ingest_alias= lists the customers with that ingest alias;
//   - errors are {"message": "..."} with 400 (validation), 401 (no or a wrong bearer
//     token), 429 (rate limited, Retry-After) and 500.
//
// Faults (adaptercontract.Fault) are shown on the next ingest requests; FailSearch,
// FailUsage and FailCustomers fail the reads.
package fakemetronome

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// Window is how long Metronome ignores a reused transaction_id, how far back an event
// may be dated, and how far back the events search sees (34 days).
const Window = 34 * 24 * time.Hour

// MaxFuture is how far ahead an event may be dated (24 hours).
const MaxFuture = 24 * time.Hour

// MaxBatch is the most events one ingest request may carry.
const MaxBatch = 100

// Default settings of Start.
const (
	DefaultToken     = "metronome-test-token"
	DefaultMeter     = "tokens"
	DefaultEventType = "tokens_used"
	// DefaultBillableMetricID is the billable metric that sums DefaultEventType's
	// "quantity" when Options.Metrics is nil.
	DefaultBillableMetricID = "6f1c7a52-3b0e-4d8a-9c1f-2e5b7d9a4c10"
	// DefaultCustomerID is the customer known when Options.Customers is nil, under
	// ingest alias DefaultCustomerAlias (the customer of Charge).
	DefaultCustomerID    = "0b8e2f3c-5d41-4a7e-8f2b-9c6d1e0a7b34"
	DefaultCustomerAlias = "cus_contract"
)

// Metric is a billable metric of the fake: it sums Property of the events of EventType.
type Metric struct {
	EventType string
	// Property is the aggregated property ("quantity" when empty).
	Property string
}

// Customer is a Metronome customer: its ID and the ingest aliases usage events may
// name it by.
type Customer struct {
	ID            string
	IngestAliases []string
}

// Options configures a fake.
type Options struct {
	// Addr is the listen address (127.0.0.1:0 when empty).
	Addr string
	// Token is the bearer token every call must carry (DefaultToken when empty).
	Token string
	// Now is the fake's clock (time.Now when nil).
	Now func() time.Time
	// RetryAfter is the Retry-After of a rate-limited answer, whole seconds (1s when 0).
	RetryAfter time.Duration
	// SearchLag is how long after it is accepted an event stays out of the events
	// search: Metronome processes ingested events asynchronously, so the search may not
	// show an event it already holds (and deduplicates). 0 shows it at once.
	SearchLag time.Duration
	// Metrics are the billable metrics by ID (DefaultBillableMetricID counting
	// DefaultEventType when nil).
	Metrics map[string]Metric
	// Customers are the customers (DefaultCustomerID under DefaultCustomerAlias when nil).
	Customers []Customer
	// UsagePages is how many pages a usage answer is split into, the earlier ones empty
	// (1 when 0), so that a client that stops at the first page is seen.
	UsagePages int
}

// Event is a usage event as the fake holds it.
type Event struct {
	ID            string            `json:"id"`
	TransactionID string            `json:"transaction_id"`
	CustomerID    string            `json:"customer_id"`
	EventType     string            `json:"event_type"`
	Timestamp     string            `json:"timestamp"`
	Properties    map[string]string `json:"properties"`
	// AcceptedAt is when the fake ingested it (the 34-day deduplication counts from it).
	AcceptedAt time.Time `json:"-"`
	// Duplicates counts the copies ignored under its transaction_id.
	Duplicates int `json:"-"`
}

// Request is one ingest request as the fake saw it.
type Request struct {
	// TransactionIDs are the events' IDs, in order.
	TransactionIDs []string
	// Status is what the fake answered (0: no answer, the connection was held).
	Status int
	// Duplicates are the transaction IDs it ignored as duplicates.
	Duplicates []string
}

// Server is a running fake.
type Server struct {
	opts Options
	ln   net.Listener
	srv  *http.Server
	url  string

	mu         sync.Mutex
	aged       atomic.Int64      // ns added to opts.Now by PassWindow
	events     map[string]*Event // by transaction_id
	order      []string
	effects    map[string]int
	requests   []Request
	searches   int
	faults     []adaptercontract.Fault
	searchFail []int
	usageFail  []int
	custFail   []int
	usageRaw   []string
	usageReqs  []UsageRequest
	custReqs   int
	// searchSkip searches are answered before searchFail applies (FailSearchAfter);
	// searchedFor counts the answered searches that asked for each transaction ID.
	searchSkip  int
	searchedFor map[string]int
	seq         int
	hold        chan struct{}
}

var _ adaptercontract.Fixture = (*Server)(nil)

// Start starts a fake on opts.Addr.
func Start(opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.Token == "" {
		opts.Token = DefaultToken
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = time.Second
	}
	if opts.Metrics == nil {
		opts.Metrics = map[string]Metric{DefaultBillableMetricID: {EventType: DefaultEventType}}
	}
	if opts.Customers == nil {
		opts.Customers = []Customer{{ID: DefaultCustomerID, IngestAliases: []string{DefaultCustomerAlias}}}
	}
	if opts.UsagePages <= 0 {
		opts.UsagePages = 1
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("fakemetronome: listen %s: %w", opts.Addr, err)
	}
	s := &Server{opts: opts, ln: ln, url: "http://" + ln.Addr().String(),
		events: map[string]*Event{}, effects: map[string]int{}, searchedFor: map[string]int{}, hold: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/ingest", s.authorized(s.ingest))
	mux.HandleFunc("POST /v1/events/search", s.authorized(s.search))
	mux.HandleFunc("POST /v1/usage", s.authorized(s.usage))
	mux.HandleFunc("GET /v1/customers", s.authorized(s.customers))
	mux.HandleFunc("GET /_admin/effects", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.AllEffects()) })
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the fake's base URL (spec.endpoint).
func (s *Server) URL() string { return s.url }

// Token is the bearer token the fake accepts.
func (s *Server) Token() string { return s.opts.Token }

// Close stops the fake, releasing any held connection.
func (s *Server) Close() {
	s.mu.Lock()
	select {
	case <-s.hold:
	default:
		close(s.hold)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	_ = s.srv.Close()
}

// Type is the provider type this fake serves.
func (s *Server) Type() hooksv1alpha1.BillingProviderType {
	return hooksv1alpha1.BillingProviderMetronome
}

// Provider is a Metronome BillingProvider pointed at the fake: usage meter
// DefaultMeter reported as event type DefaultEventType, totalled by billable metric
// DefaultBillableMetricID, and the fake's token.
func (s *Server) Provider() (*hooksv1alpha1.BillingProvider, string) {
	return &hooksv1alpha1.BillingProvider{
		ObjectMeta: metav1.ObjectMeta{Name: "metronome", Namespace: "default"},
		Spec: hooksv1alpha1.BillingProviderSpec{
			Type: hooksv1alpha1.BillingProviderMetronome, Endpoint: s.url, AllowInsecureHTTP: true,
			Metronome: &hooksv1alpha1.MetronomeSettings{Meters: []hooksv1alpha1.MetronomeMeter{
				{Meter: DefaultMeter, EventType: DefaultEventType, QuantityProperty: "quantity", BillableMetricID: DefaultBillableMetricID}}},
		},
	}, s.opts.Token
}

// Charge is a usage charge of DefaultMeter under key for DefaultCustomerAlias, dated a
// minute ago: every charge is the same customer's, so their usage adds up in one total.
func (s *Server) Charge(key string) billing.Request {
	return billing.Request{SettlementKey: "default/" + key, IdempotencyKey: key, Type: billing.TypeCharge,
		Customer: DefaultCustomerAlias, Usage: &billing.Usage{Meter: DefaultMeter, Quantity: "1523", Unit: "tokens"},
		OccurredAt: s.now().Add(-time.Minute).UTC().Truncate(time.Second), KeyNamespaced: true}
}

// Effects is how many events the fake ingested under key (0 or 1: it deduplicates).
func (s *Server) Effects(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[key]
}

// AllEffects is Effects for every key (GET /_admin/effects).
func (s *Server) AllEffects() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.effects))
	for k, v := range s.effects {
		out[k] = v
	}
	return out
}

// Fail makes the fake show f on the next n ingest requests.
func (s *Server) Fail(f adaptercontract.Fault, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults = append(s.faults, f)
	}
}

// FailSearch makes the fake answer the next n events searches with status (429 with
// Retry-After, or any error status with a {"message"} body), answering nothing found.
func (s *Server) FailSearch(status, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.searchFail = append(s.searchFail, slices.Repeat([]int{status}, n)...)
}

// FailSearchAfter is FailSearch after the next answered searches: the fault lands on
// a given search of a run of them (the second of a reconciliation pass's lookups).
func (s *Server) FailSearchAfter(answered, status, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.searchSkip = answered
	s.searchFail = append(s.searchFail, slices.Repeat([]int{status}, n)...)
}

// SearchesFor counts the searches for transaction ID id that the fake answered (a
// failed search answers nothing and is not counted).
func (s *Server) SearchesFor(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.searchedFor[id]
}

// Events are the events the fake holds, in ingestion order.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Event, 0, len(s.order))
	for _, id := range s.order {
		e := *s.events[id]
		e.Properties = copyProps(e.Properties)
		out = append(out, e)
	}
	return out
}

// Requests are the ingest requests the fake received, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Searches counts the events search requests served.
func (s *Server) Searches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.searches
}

func (s *Server) authorized(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+s.opts.Token {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"message": "Unauthorized"})
			return
		}
		h(w, r)
	}
}

// wireEvent is an ingested event as sent: properties of any JSON type.
type wireEvent struct {
	TransactionID string         `json:"transaction_id"`
	CustomerID    string         `json:"customer_id"`
	EventType     string         `json:"event_type"`
	Timestamp     string         `json:"timestamp"`
	Properties    map[string]any `json:"properties"`
}

// rfc3339Year4 is RFC 3339 with a 4-digit year, as Metronome requires.
var rfc3339Year4 = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$`)

func (s *Server) ingest(w http.ResponseWriter, r *http.Request) {
	var batch []wireEvent
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&batch); err != nil {
		s.note(Request{Status: http.StatusBadRequest})
		writeJSON(w, http.StatusBadRequest, map[string]string{"message": "body must be a JSON array of usage events"})
		return
	}
	ids := make([]string, len(batch))
	for i, e := range batch {
		ids[i] = e.TransactionID
	}
	s.mu.Lock()
	var fault adaptercontract.Fault
	if len(s.faults) > 0 {
		fault, s.faults = s.faults[0], s.faults[1:]
	}
	s.mu.Unlock()
	switch fault {
	case adaptercontract.Unavailable:
		s.note(Request{TransactionIDs: ids, Status: http.StatusInternalServerError})
		writeJSON(w, http.StatusInternalServerError, map[string]string{"message": "Internal server error"})
		return
	case adaptercontract.RateLimited:
		s.note(Request{TransactionIDs: ids, Status: http.StatusTooManyRequests})
		w.Header().Set("Retry-After", fmt.Sprint(int(s.opts.RetryAfter.Round(time.Second)/time.Second)))
		writeJSON(w, http.StatusTooManyRequests, map[string]string{"message": "Too many requests"})
		return
	case adaptercontract.Refused:
		s.note(Request{TransactionIDs: ids, Status: http.StatusBadRequest})
		writeJSON(w, http.StatusBadRequest, map[string]string{"message": "event_type is not accepted"})
		return
	}
	if msg := s.validate(batch); msg != "" {
		s.note(Request{TransactionIDs: ids, Status: http.StatusBadRequest})
		writeJSON(w, http.StatusBadRequest, map[string]string{"message": msg})
		return
	}
	dups := s.commit(batch)
	if fault == adaptercontract.CommitThenTimeout {
		s.note(Request{TransactionIDs: ids, Duplicates: dups})
		select { // committed; the answer never comes
		case <-r.Context().Done():
		case <-s.hold:
		}
		return
	}
	s.note(Request{TransactionIDs: ids, Status: http.StatusOK, Duplicates: dups})
	w.WriteHeader(http.StatusOK)
}

// validate says why Metronome would refuse the batch ("" when it takes it): the whole
// batch is refused when one event is invalid.
func (s *Server) validate(batch []wireEvent) string {
	if len(batch) == 0 || len(batch) > MaxBatch {
		return fmt.Sprintf("a batch holds 1 to %d usage events", MaxBatch)
	}
	now := s.now()
	for i, e := range batch {
		switch {
		case e.TransactionID == "" || len(e.TransactionID) > 128:
			return fmt.Sprintf("event %d: transaction_id is required (at most 128 characters)", i)
		case e.CustomerID == "":
			return fmt.Sprintf("event %d: customer_id is required", i)
		case e.EventType == "":
			return fmt.Sprintf("event %d: event_type is required", i)
		case !rfc3339Year4.MatchString(e.Timestamp):
			return fmt.Sprintf("event %d: timestamp must be RFC 3339 with a 4-digit year", i)
		}
		t, err := time.Parse(time.RFC3339Nano, e.Timestamp)
		switch {
		case err != nil:
			return fmt.Sprintf("event %d: timestamp must be RFC 3339 with a 4-digit year", i)
		case t.Sub(now) > MaxFuture:
			return fmt.Sprintf("event %d: timestamp is more than 24 hours in the future", i)
		case now.Sub(t) > Window:
			return fmt.Sprintf("event %d: timestamp is more than 34 days in the past", i)
		}
	}
	return ""
}

// commit ingests every event whose transaction_id is not held within the window and
// returns those it ignored as duplicates (the first copy is kept, whatever this holds).
func (s *Server) commit(batch []wireEvent) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var dups []string
	for _, e := range batch {
		if held, ok := s.events[e.TransactionID]; ok && now.Sub(held.AcceptedAt) <= Window {
			held.Duplicates++
			dups = append(dups, e.TransactionID)
			continue
		}
		s.seq++
		props := map[string]string{}
		for k, v := range e.Properties {
			if str, ok := v.(string); ok {
				props[k] = str
			} else {
				b, _ := json.Marshal(v)
				props[k] = string(b)
			}
		}
		if _, ok := s.events[e.TransactionID]; !ok {
			s.order = append(s.order, e.TransactionID)
		}
		s.events[e.TransactionID] = &Event{ID: fmt.Sprintf("evt-%06d", s.seq), TransactionID: e.TransactionID, CustomerID: e.CustomerID,
			EventType: e.EventType, Timestamp: e.Timestamp, Properties: props, AcceptedAt: now}
		s.effects[e.TransactionID]++
	}
	return dups
}

// searchedEvent is the events search's answer shape.
type searchedEvent struct {
	ID            string            `json:"id"`
	TransactionID string            `json:"transaction_id"`
	CustomerID    string            `json:"customer_id"`
	EventType     string            `json:"event_type"`
	Timestamp     string            `json:"timestamp"`
	Properties    map[string]string `json:"properties"`
	ProcessedAt   string            `json:"processed_at"`
	IsDuplicate   bool              `json:"is_duplicate"`
}

func (s *Server) search(w http.ResponseWriter, r *http.Request) {
	var body struct {
		TransactionIDs []string `json:"transactionIds"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil || len(body.TransactionIDs) == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"message": "transactionIds is required"})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.searches++
	if s.searchSkip > 0 {
		s.searchSkip--
	} else if len(s.searchFail) > 0 {
		status := s.searchFail[0]
		s.searchFail = s.searchFail[1:]
		if status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", fmt.Sprint(int(s.opts.RetryAfter.Round(time.Second)/time.Second)))
		}
		writeJSONLocked(w, status, map[string]string{"message": http.StatusText(status)})
		return
	}
	now := s.now()
	out := []searchedEvent{}
	for _, id := range body.TransactionIDs {
		s.searchedFor[id]++
		e, ok := s.events[id]
		if !ok {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, e.Timestamp); err != nil || now.Sub(t) > Window {
			continue // the search covers events of the last 34 days
		}
		if now.Sub(e.AcceptedAt) < s.opts.SearchLag {
			continue // held, not processed yet
		}
		out = append(out, searchedEvent{ID: e.ID, TransactionID: e.TransactionID, CustomerID: e.CustomerID, EventType: e.EventType,
			Timestamp: e.Timestamp, Properties: copyProps(e.Properties), ProcessedAt: e.AcceptedAt.UTC().Format(time.RFC3339Nano)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TransactionID < out[j].TransactionID })
	writeJSONLocked(w, http.StatusOK, out)
}

// Put stores an event as if ingested at acceptedAt, without a request: a test's way to
// hold a key another sender used, or an event older than the search sees.
func (s *Server) Put(e Event, acceptedAt time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	e.ID, e.AcceptedAt, e.Properties = fmt.Sprintf("evt-%06d", s.seq), acceptedAt, copyProps(e.Properties)
	if _, ok := s.events[e.TransactionID]; !ok {
		s.order = append(s.order, e.TransactionID)
	}
	s.events[e.TransactionID] = &e
	s.effects[e.TransactionID]++
}

func (s *Server) note(r Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, r)
}

func copyProps(p map[string]string) map[string]string {
	out := make(map[string]string, len(p))
	for k, v := range p {
		out[k] = v
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) { writeJSONLocked(w, status, v) }

// writeJSONLocked writes v; it takes no lock (the name says a caller may hold one).
func writeJSONLocked(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
