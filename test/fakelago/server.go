// Package fakelago is a stateful fake of Lago's events API, as Lago documents it and
// its event pipelines behave.
//
// The default (PostgreSQL) pipeline, unless Options.Pipeline says otherwise: POST
// /api/v1/events stores an event unless its transaction_id is already held for the
// subscription, which it answers with 422 validation_errors
// {"transaction_id":["value_already_exist"]} and ignores; GET
// /api/v1/events/{transaction_id} answers the first event held under it or 404
// event_not_found; GET /api/v1/events lists them by timestamp, newest first, paged.
//
// The ClickHouse (high-volume) pipeline (Options.Pipeline ClickHouse): POST
// /api/v1/events saves nothing itself and puts the event on Kafka, answering 200 with
// the event as built (no lago_id, no created_at); a reused transaction_id is never
// refused — the event is stored again and billed again (no deduplication here: Lago
// documents uniqueness on transaction_id and timestamp there, and only as its store
// merges them); the event is ingested into ClickHouse asynchronously, and until then
// neither GET /api/v1/events/{transaction_id} (404 event_not_found) nor the listing
// sees it (SetIngestDelay, IngestNow). Events read back from ClickHouse carry no
// lago_id.
//
// An event for a billable metric code the organization does not have is stored and
// never billed, as Lago does. Faults (adaptercontract.Fault) show Lago's documented
// answers: 500, 429 with its X-RateLimit-* headers, 422 validation errors, and an
// event stored whose reply never comes.
//
// It implements adaptercontract.Fixture, and serves GET /_admin/effects (each
// transaction_id's billed events) for the demo.
package fakelago

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// Metric is a billable metric of the fake organization.
type Metric struct {
	// Code is the metric's code; Meter the usage meter the fixture maps to it.
	Code, Meter string
	// FieldName is the property the metric sums.
	FieldName string
}

// Options configures a fake.
type Options struct {
	// APIKey is the organization's key; every call must bear it.
	APIKey string
	// Addr is the listen address ("127.0.0.1:0" when empty).
	Addr string
	// Metrics are the organization's billable metrics (DefaultMetrics when nil).
	Metrics []Metric
	// HangFor bounds how long a commit-then-timeout reply is held (30s when zero).
	HangFor time.Duration
	// Pipeline is the organization's event pipeline: Postgres (the default, when
	// empty) or ClickHouse.
	Pipeline hooksv1alpha1.LagoEventPipeline
	// IngestDelay is how long after it is accepted an event becomes visible to reads
	// on the ClickHouse pipeline (SetIngestDelay); ignored on Postgres, which stores
	// before it answers.
	IngestDelay time.Duration
}

// DefaultMetrics is the fake's organization: one metric, "tokens", summing "tokens".
var DefaultMetrics = []Metric{{Code: "llm_tokens", Meter: "tokens", FieldName: "tokens"}}

// ClickHouse is Options.Pipeline for an organization on Lago's ClickHouse pipeline.
const ClickHouse = hooksv1alpha1.LagoPipelineClickHouse

// DefaultAPIKey is the key Start uses when Options.APIKey is empty.
const DefaultAPIKey = "lago_test_key"

// Event is one stored event, as Lago holds it.
type Event struct {
	LagoID                 string
	TransactionID          string
	ExternalSubscriptionID string
	Code                   string
	Timestamp              time.Time
	Properties             map[string]json.RawMessage
	CreatedAt              time.Time
	// IngestedAt is when reads see the event: CreatedAt on Postgres; on ClickHouse,
	// when it is ingested from Kafka (later, after the ingest delay).
	IngestedAt time.Time
}

// Request is one call the fake received (for tests' assertions).
type Request struct {
	Method, Path string
	// TransactionID is the event's, for a POST.
	TransactionID string
	// Status is what the fake answered (0: no reply, a commit-then-timeout).
	Status int
}

// Server is a running fake.
type Server struct {
	opts    Options
	ln      net.Listener
	srv     *http.Server
	metrics map[string]Metric

	mu     sync.Mutex
	events []*Event
	faults []adaptercontract.Fault
	// lookupFaults is how many reads (GET by transaction_id, a listing page) still
	// answer 500 (FailLookups).
	lookupFaults int
	requests     []Request
	seq          int
	closing      chan struct{}
	// ingestDelay is the ClickHouse pipeline's lag (SetIngestDelay).
	ingestDelay time.Duration
}

var _ adaptercontract.Fixture = (*Server)(nil)

// Start starts a fake on opts.Addr.
func Start(opts Options) (*Server, error) {
	if opts.APIKey == "" {
		opts.APIKey = DefaultAPIKey
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.Metrics == nil {
		opts.Metrics = DefaultMetrics
	}
	if opts.HangFor == 0 {
		opts.HangFor = 30 * time.Second
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", opts.Addr, err)
	}
	s := &Server{opts: opts, ln: ln, metrics: map[string]Metric{}, closing: make(chan struct{}), ingestDelay: opts.IngestDelay}
	for _, m := range opts.Metrics {
		s.metrics[m.Code] = m
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/events", s.auth(s.create))
	mux.HandleFunc("GET /api/v1/events", s.auth(s.list))
	mux.HandleFunc("GET /api/v1/events/{id}", s.auth(s.get))
	mux.HandleFunc("GET /_admin/effects", s.effects)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the fake's base URL (Lago's API host: the adapter appends /api/v1).
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the fake, cutting any held reply.
func (s *Server) Close() {
	s.mu.Lock()
	select {
	case <-s.closing:
	default:
		close(s.closing)
	}
	s.mu.Unlock()
	_ = s.srv.Close()
}

// clickHouse says whether the organization is on the ClickHouse pipeline.
func (s *Server) clickHouse() bool { return s.opts.Pipeline == hooksv1alpha1.LagoPipelineClickHouse }

// SetIngestDelay makes events accepted from now on visible to reads (the lookup by
// transaction_id, the listing) only d after they were accepted: the ClickHouse
// pipeline's Kafka → ClickHouse lag. It changes nothing on Postgres.
func (s *Server) SetIngestDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ingestDelay = d
}

// IngestNow finishes ingesting every accepted event: reads see all of them from now on.
func (s *Server) IngestNow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	for _, e := range s.events {
		if e.IngestedAt.After(now) {
			e.IngestedAt = now
		}
	}
}

// visible says whether reads see e at now.
func visible(e *Event, now time.Time) bool { return !now.Before(e.IngestedAt) }

// Type is Lago.
func (s *Server) Type() hooksv1alpha1.BillingProviderType { return hooksv1alpha1.BillingProviderLago }

// Provider is a Lago BillingProvider pointed at the fake, its metrics mapped, and the
// organization's API key.
func (s *Server) Provider() (*hooksv1alpha1.BillingProvider, string) {
	bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Name: "lago", Namespace: "default"},
		Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderLago, Endpoint: s.URL(), AllowInsecureHTTP: true,
			Lago: &hooksv1alpha1.LagoSettings{EventPipeline: s.opts.Pipeline}}}
	for _, m := range s.opts.Metrics {
		bp.Spec.Lago.Metrics = append(bp.Spec.Lago.Metrics, hooksv1alpha1.LagoMetric{Meter: m.Meter, Code: m.Code, FieldName: m.FieldName})
	}
	return bp, s.opts.APIKey
}

// Charge is 1523 units of the first metric's meter for subscription sub_<key>.
func (s *Server) Charge(key string) billing.Request {
	return billing.Request{SettlementKey: "contract/" + key, IdempotencyKey: key, Type: billing.TypeCharge,
		Customer: "sub_" + key, Usage: &billing.Usage{Meter: s.opts.Metrics[0].Meter, Quantity: "1523", Unit: "tokens"}, KeyNamespaced: true}
}

// Effects is how many events under key Lago bills: those of a metric it has, ingested
// or still on their way (an accepted event is billed once ingested).
func (s *Server) Effects(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effectsLocked()[key]
}

func (s *Server) effectsLocked() map[string]int {
	out := map[string]int{}
	for _, e := range s.events {
		if _, ok := s.metrics[e.Code]; ok {
			out[e.TransactionID]++
		}
	}
	return out
}

// Fail shows f on the next n submissions (POST /api/v1/events).
func (s *Server) Fail(f adaptercontract.Fault, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults = append(s.faults, f)
	}
}

// Events is every stored event, oldest first.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Event, 0, len(s.events))
	for _, e := range s.events {
		out = append(out, *e)
	}
	return out
}

// Requests is every call received, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Store puts an event into the organization's books directly, as another sender of
// the same transaction_id would (for tests of what a lookup finds); it is visible at
// once unless IngestedAt says otherwise.
func (s *Server) Store(e Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	if e.LagoID == "" && !s.clickHouse() {
		e.LagoID = fmt.Sprintf("lago-%06d", s.seq)
	}
	if e.CreatedAt.IsZero() {
		e.CreatedAt = time.Now().UTC()
	}
	if e.IngestedAt.IsZero() {
		e.IngestedAt = e.CreatedAt
	}
	s.events = append(s.events, &e)
}

func (s *Server) note(r Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	s.mu.Unlock()
}

// writeError answers Lago's error body.
func writeError(w http.ResponseWriter, status int, code string, details map[string][]string) {
	body := map[string]any{"status": status, "error": http.StatusText(status)}
	if code != "" {
		body["code"] = code
	}
	if details != nil {
		body["error_details"] = details
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// auth checks the bearer key as Lago does: 401 {"status":401,"error":"Unauthorized"}.
func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Limit", "500")
		w.Header().Set("X-RateLimit-Remaining", "499")
		w.Header().Set("X-RateLimit-Reset", "1")
		if r.Header.Get("Authorization") != "Bearer "+s.opts.APIKey {
			s.note(Request{Method: r.Method, Path: r.URL.Path, Status: http.StatusUnauthorized})
			writeError(w, http.StatusUnauthorized, "", nil)
			return
		}
		h(w, r)
	}
}

// wireIn is the event as posted.
type wireIn struct {
	Event *struct {
		TransactionID          string                     `json:"transaction_id"`
		ExternalSubscriptionID string                     `json:"external_subscription_id"`
		ExternalCustomerID     string                     `json:"external_customer_id"`
		Code                   string                     `json:"code"`
		Timestamp              json.RawMessage            `json:"timestamp"`
		Properties             map[string]json.RawMessage `json:"properties"`
	} `json:"event"`
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var in wireIn
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.UseNumber()
	if err := dec.Decode(&in); err != nil || in.Event == nil {
		s.note(Request{Method: r.Method, Path: r.URL.Path, Status: http.StatusBadRequest})
		writeJSON(w, http.StatusBadRequest, map[string]any{"status": 400, "error": "BadRequest: param is missing or the value is empty: event"})
		return
	}
	ev := in.Event
	req := Request{Method: r.Method, Path: r.URL.Path, TransactionID: ev.TransactionID}

	s.mu.Lock()
	var fault adaptercontract.Fault
	if len(s.faults) > 0 {
		fault, s.faults = s.faults[0], s.faults[1:]
	}
	s.mu.Unlock()
	switch fault {
	case adaptercontract.Unavailable:
		req.Status = http.StatusInternalServerError
		s.note(req)
		writeError(w, http.StatusInternalServerError, "", nil)
		return
	case adaptercontract.RateLimited:
		req.Status = http.StatusTooManyRequests
		s.note(req)
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset", "2")
		writeError(w, http.StatusTooManyRequests, "", nil)
		return
	case adaptercontract.Refused:
		req.Status = http.StatusUnprocessableEntity
		s.note(req)
		writeError(w, http.StatusUnprocessableEntity, "validation_errors", map[string][]string{"properties": {"value_is_invalid"}})
		return
	}

	details := map[string][]string{}
	if ev.TransactionID == "" {
		details["transaction_id"] = []string{"value_is_mandatory"}
	}
	if ev.Code == "" {
		details["code"] = []string{"value_is_mandatory"}
	}
	if ev.ExternalSubscriptionID == "" && ev.ExternalCustomerID == "" {
		details["external_subscription_id"] = []string{"value_is_mandatory"}
	}
	at, ok := parseTimestamp(ev.Timestamp)
	if !ok {
		details["timestamp"] = []string{"invalid_format"}
	}
	if len(details) > 0 {
		req.Status = http.StatusUnprocessableEntity
		s.note(req)
		writeError(w, http.StatusUnprocessableEntity, "validation_errors", details)
		return
	}
	now := time.Now().UTC()
	if at.IsZero() {
		at = now
	}

	s.mu.Lock()
	for _, e := range s.events {
		// Lago's default pipeline: transaction_id is unique per subscription; the
		// resend is refused and ignored. The ClickHouse pipeline checks nothing
		// before it answers: the resend is another event.
		if !s.clickHouse() && e.TransactionID == ev.TransactionID && e.ExternalSubscriptionID == ev.ExternalSubscriptionID {
			s.mu.Unlock()
			req.Status = http.StatusUnprocessableEntity
			s.note(req)
			writeError(w, http.StatusUnprocessableEntity, "validation_errors", map[string][]string{"transaction_id": {"value_already_exist"}})
			return
		}
	}
	s.seq++
	stored := &Event{TransactionID: ev.TransactionID, ExternalSubscriptionID: ev.ExternalSubscriptionID, Code: ev.Code,
		Timestamp: at, Properties: ev.Properties, CreatedAt: now, IngestedAt: now}
	var reply map[string]any
	if s.clickHouse() {
		// Put on Kafka, saved nowhere yet: the reply is the event as built, without a
		// Lago id or a creation time; reads see it once ClickHouse ingests it.
		stored.IngestedAt = now.Add(s.ingestDelay)
		reply = wireOut(stored)
		reply["created_at"] = nil
	} else {
		stored.LagoID = fmt.Sprintf("1a901a90-0000-4000-8000-%012d", s.seq)
		reply = wireOut(stored)
	}
	s.events = append(s.events, stored)
	s.mu.Unlock()

	if fault == adaptercontract.CommitThenTimeout {
		// Stored; the reply never comes before the client gives up.
		s.note(req)
		select {
		case <-r.Context().Done():
		case <-s.closing:
		case <-time.After(s.opts.HangFor):
		}
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
			}
		}
		return
	}
	req.Status = http.StatusOK
	s.note(req)
	writeJSON(w, http.StatusOK, map[string]any{"event": reply})
}

// parseTimestamp reads Lago's timestamp: Unix seconds as an integer, or as a string
// with optional decimals; absent is zero (Lago dates the event on receipt).
func parseTimestamp(raw json.RawMessage) (time.Time, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return time.Time{}, true
	}
	v := strings.Trim(string(bytes.TrimSpace(raw)), `"`)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		return time.Time{}, false
	}
	sec := int64(f)
	return time.Unix(sec, int64((f-float64(sec))*1e9)).UTC().Truncate(time.Millisecond), true
}

// wireOut is an event as Lago answers it.
func wireOut(e *Event) map[string]any {
	props := e.Properties
	if props == nil {
		props = map[string]json.RawMessage{}
	}
	var lagoID any // null when Lago keeps no id (the ClickHouse pipeline)
	if e.LagoID != "" {
		lagoID = e.LagoID
	}
	return map[string]any{
		"lago_id": lagoID, "transaction_id": e.TransactionID, "lago_customer_id": nil, "external_customer_id": nil,
		"code": e.Code, "timestamp": e.Timestamp.UTC().Format("2006-01-02T15:04:05.000Z"),
		"lago_subscription_id": "1a901a90-1a90-1a90-1a90-1a901a901a90", "external_subscription_id": e.ExternalSubscriptionID,
		"precise_total_amount_cents": nil, "properties": props, "created_at": e.CreatedAt.UTC().Format(time.RFC3339),
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.failRead(w, r) {
		return
	}
	req := Request{Method: r.Method, Path: r.URL.Path, TransactionID: id, Status: http.StatusNotFound}
	s.mu.Lock()
	var found map[string]any
	now := time.Now()
	for _, e := range s.events {
		if e.TransactionID == id && visible(e, now) {
			found, req.Status = wireOut(e), http.StatusOK // the first found
			break
		}
	}
	s.mu.Unlock()
	s.note(req)
	if found == nil {
		writeError(w, http.StatusNotFound, "event_not_found", nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"event": found})
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if s.failRead(w, r) {
		return
	}
	s.note(Request{Method: r.Method, Path: r.URL.Path + "?" + q.Encode(), Status: http.StatusOK})
	page, perPage := atoiOr(q.Get("page"), 1), atoiOr(q.Get("per_page"), 20)
	if page < 1 || perPage < 1 || perPage > 100 {
		writeJSON(w, http.StatusBadRequest, map[string]any{"status": 400, "error": "BadRequest: invalid pagination"})
		return
	}
	from, errFrom := parseTime(q.Get("timestamp_from"))
	to, errTo := parseTime(q.Get("timestamp_to"))
	if errFrom != nil || errTo != nil {
		writeError(w, http.StatusUnprocessableEntity, "validation_errors", map[string][]string{"timestamp": {"invalid_date"}})
		return
	}
	s.mu.Lock()
	var hits []*Event
	now := time.Now()
	for _, e := range s.events {
		if !visible(e, now) || (!from.IsZero() && e.Timestamp.Before(from)) || (!to.IsZero() && e.Timestamp.After(to)) ||
			(q.Get("code") != "" && e.Code != q.Get("code")) ||
			(q.Get("external_subscription_id") != "" && e.ExternalSubscriptionID != q.Get("external_subscription_id")) {
			continue
		}
		hits = append(hits, e)
	}
	sort.SliceStable(hits, func(i, j int) bool { return hits[i].Timestamp.After(hits[j].Timestamp) })
	total := len(hits)
	pages := (total + perPage - 1) / perPage
	var out []map[string]any
	for i := (page - 1) * perPage; i < total && i < page*perPage; i++ {
		out = append(out, wireOut(hits[i]))
	}
	s.mu.Unlock()
	meta := map[string]any{"current_page": page, "next_page": nil, "prev_page": nil, "total_pages": pages, "total_count": total}
	if page < pages {
		meta["next_page"] = page + 1
	}
	if page > 1 {
		meta["prev_page"] = page - 1
	}
	if out == nil {
		out = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": out, "meta": meta})
}

func atoiOr(s string, def int) int {
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	return time.Time{}, errors.New("not a date")
}

// effects answers GET /_admin/effects: each transaction_id's billed events.
func (s *Server) effects(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	e := s.effectsLocked()
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, e)
}

// EscapedEventPath is the path a lookup of key reads (for tests).
func EscapedEventPath(key string) string { return "/api/v1/events/" + url.PathEscape(key) }
