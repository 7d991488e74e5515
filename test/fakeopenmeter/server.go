// Package fakeopenmeter is a stateful fake of OpenMeter's events API, as its API
// reference documents it, for the adapter's tests, the integration suite and the demo:
//
//   - POST /api/v1/events takes one CloudEvent (application/cloudevents+json) or a
//     batch (application/cloudevents-batch+json), read with internal/cloudevents, and
//     answers 204; a malformed event is refused 400 with a problem+json body;
//   - with a deduplication window, an event whose source and id it saw inside the
//     window is dropped silently (still 204); without one (a self-hosted install's
//     default), every event is counted, a resend too;
//   - ingestion is asynchronous: an accepted event is listed only after the listing
//     delay (SetListingDelay);
//   - GET /api/v1/events lists events newest first, filtered by id and subject
//     (partial match, as OpenMeter does), from and to (event time), limit (≤ 100);
//     a "from" older than 32 days is refused 400;
//   - a bearer token is required when one is configured (401 problem otherwise);
//   - faults on request: 503, 429 with Retry-After and rate-limit headers, 400, and
//     commit-then-timeout (the event is counted, the reply never comes).
//
// It implements adaptercontract.Fixture. Effects counts what its books bill per id:
// two after a counted resend.
package fakeopenmeter

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/cloudevents"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// Names the fixture's BillingProvider uses.
const (
	// Token is the API token the fake requires by default.
	Token = "om_test_token"
	// Source is the CloudEvents source the fixture's provider sends.
	Source = "settlement-operator/test"
	// Meter is the usage meter mapped, EventType its events' type, ValueProperty where
	// the quantity is.
	Meter         = "tokens"
	EventType     = "prompt.tokens"
	ValueProperty = "tokens"
	// listHorizon is how far back OpenMeter lists (32 days).
	listHorizon = 32 * 24 * time.Hour
)

// Options configures a fake.
type Options struct {
	// Token is the bearer token required ("" requires none).
	Token string
	// Deduplication is how long an event's source and id are remembered; 0: no
	// deduplication (a self-hosted install's default).
	Deduplication time.Duration
	// Addr is where to listen (a free loopback port when empty).
	Addr string
}

// Event is one stored event, as OpenMeter lists it.
type Event struct {
	cloudevents.Event
	IngestedAt time.Time
}

// Request is one call the fake answered.
type Request struct {
	Method, Path, ID string
	Status           int
	// Dropped: a duplicate the deduplication dropped.
	Dropped bool
}

// Server is the fake.
type Server struct {
	opts Options
	ln   net.Listener
	srv  *http.Server

	mu       sync.Mutex
	events   []Event
	seen     map[string]time.Time // source+id → first accepted, with deduplication
	effects  map[string]int       // id → times counted
	faults   []adaptercontract.Fault
	delay    time.Duration
	requests []Request
	hang     chan struct{}
	// readFaults is how many listings still answer 500 (FailLookups).
	readFaults int
}

// Start starts a fake on opts.Addr (a free loopback port when empty).
func Start(opts Options) (*Server, error) {
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, ln: ln, seen: map[string]time.Time{}, effects: map[string]int{}, hang: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/events", s.serveEvents)
	mux.HandleFunc("/_admin/effects", s.serveEffects)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the fake's base URL (the BillingProvider's endpoint).
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the fake, releasing any reply it holds back.
func (s *Server) Close() {
	s.mu.Lock()
	select {
	case <-s.hang:
	default:
		close(s.hang)
	}
	s.mu.Unlock()
	_ = s.srv.Close()
}

// Type is the provider type the fake serves.
func (s *Server) Type() hooksv1alpha1.BillingProviderType {
	return hooksv1alpha1.BillingProviderOpenMeter
}

// Provider is a BillingProvider of type OpenMeter pointed at the fake, usage meter
// Meter sent as EventType with the quantity in ValueProperty, the fake's
// deduplication declared as it is, and the token it requires.
func (s *Server) Provider() (*hooksv1alpha1.BillingProvider, string) {
	bp := &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderOpenMeter,
		Endpoint: s.URL(), AllowInsecureHTTP: true, CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "openmeter-token", Key: "token"},
		OpenMeter: &hooksv1alpha1.OpenMeterSettings{Source: Source,
			Meters: []hooksv1alpha1.OpenMeterMeter{{Meter: Meter, EventType: EventType, ValueProperty: ValueProperty}}}}}
	if s.opts.Deduplication > 0 {
		bp.Spec.OpenMeter.Deduplication = &hooksv1alpha1.OpenMeterDeduplication{Window: metav1.Duration{Duration: s.opts.Deduplication}}
	}
	return bp, s.opts.Token
}

// Charge is a usage charge under key: 12.5 tokens for customer cus_contract.
func (s *Server) Charge(key string) billing.Request {
	return billing.Request{SettlementKey: identity.FieldsSettlementKey("contract", "billing", key), IdempotencyKey: key,
		Type: billing.TypeCharge, Customer: "cus_contract", Usage: &billing.Usage{Meter: Meter, Quantity: "12.5", Unit: "tokens"},
		KeyNamespaced: true}
}

// Effects is how many times the fake's books count an event with id key.
func (s *Server) Effects(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[key]
}

// Fail shows f on the next n submissions.
func (s *Server) Fail(f adaptercontract.Fault, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults = append(s.faults, f)
	}
}

// SetListingDelay makes events accepted from now on listed only d after they were
// ingested (OpenMeter ingests asynchronously).
func (s *Server) SetListingDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// IngestNow finishes ingesting every accepted event: all are listed from now on.
func (s *Server) IngestNow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i := range s.events {
		if s.events[i].IngestedAt.After(now) {
			s.events[i].IngestedAt = now
		}
	}
}

// Events is every event counted, in the order accepted.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// Requests is every call answered, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// EffectsByKey is every id's count, for GET /_admin/effects.
func (s *Server) EffectsByKey() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.effects))
	for k, v := range s.effects {
		out[k] = v
	}
	return out
}

func (s *Server) serveEffects(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.EffectsByKey())
}

// problem writes an RFC 7807 answer, as OpenMeter does.
func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail})
}

func (s *Server) record(r Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	s.mu.Unlock()
}

func (s *Server) serveEvents(w http.ResponseWriter, req *http.Request) {
	if s.opts.Token != "" && req.Header.Get("Authorization") != "Bearer "+s.opts.Token {
		s.record(Request{Method: req.Method, Path: req.URL.Path, Status: http.StatusUnauthorized})
		problem(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	switch req.Method {
	case http.MethodPost:
		s.ingest(w, req)
	case http.MethodGet:
		s.list(w, req)
	default:
		problem(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

func (s *Server) ingest(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		return // the client went away before sending it whole: nothing was taken
	}
	var fault adaptercontract.Fault
	s.mu.Lock()
	if len(s.faults) > 0 {
		fault, s.faults = s.faults[0], s.faults[1:]
	}
	s.mu.Unlock()
	switch fault {
	case adaptercontract.Unavailable:
		s.record(Request{Method: req.Method, Path: req.URL.Path, Status: http.StatusServiceUnavailable})
		problem(w, http.StatusServiceUnavailable, "service unavailable")
		return
	case adaptercontract.RateLimited:
		s.record(Request{Method: req.Method, Path: req.URL.Path, Status: http.StatusTooManyRequests})
		w.Header().Set("Retry-After", "1")
		w.Header().Set("X-RateLimit-Limit", "100")
		w.Header().Set("X-RateLimit-Remaining", "0")
		problem(w, http.StatusTooManyRequests, "rate limit exceeded")
		return
	case adaptercontract.Refused:
		s.record(Request{Method: req.Method, Path: req.URL.Path, Status: http.StatusBadRequest})
		problem(w, http.StatusBadRequest, "invalid event: the event is refused")
		return
	}
	var events []cloudevents.Event
	ct := req.Header.Get("Content-Type")
	switch {
	case cloudevents.IsBatch(ct):
		evs, err := cloudevents.ReadBatch(body)
		if err != nil {
			s.record(Request{Method: req.Method, Path: req.URL.Path, Status: http.StatusBadRequest})
			problem(w, http.StatusBadRequest, err.Error())
			return
		}
		events = evs
	case strings.HasPrefix(ct, cloudevents.StructuredMediaType) || strings.HasPrefix(ct, "application/json"):
		ev, err := cloudevents.ReadStructured(body)
		if err != nil {
			s.record(Request{Method: req.Method, Path: req.URL.Path, Status: http.StatusBadRequest})
			problem(w, http.StatusBadRequest, err.Error())
			return
		}
		events = []cloudevents.Event{*ev}
	default:
		s.record(Request{Method: req.Method, Path: req.URL.Path, Status: http.StatusBadRequest})
		problem(w, http.StatusBadRequest, "unsupported content type: send application/cloudevents+json or application/cloudevents-batch+json")
		return
	}
	for _, ev := range events {
		if ev.Subject == "" {
			s.record(Request{Method: req.Method, Path: req.URL.Path, ID: ev.ID, Status: http.StatusBadRequest})
			problem(w, http.StatusBadRequest, "invalid event: subject is required")
			return
		}
		if ev.Time != "" {
			if _, err := time.Parse(time.RFC3339Nano, ev.Time); err != nil {
				s.record(Request{Method: req.Method, Path: req.URL.Path, ID: ev.ID, Status: http.StatusBadRequest})
				problem(w, http.StatusBadRequest, "invalid event: time is not RFC 3339")
				return
			}
		}
	}
	now := time.Now()
	s.mu.Lock()
	for _, ev := range events {
		k := ev.Source + "\x00" + ev.ID
		if first, ok := s.seen[k]; ok && s.opts.Deduplication > 0 && now.Sub(first) < s.opts.Deduplication {
			s.requests = append(s.requests, Request{Method: req.Method, Path: req.URL.Path, ID: ev.ID, Status: http.StatusNoContent, Dropped: true})
			continue
		}
		s.seen[k] = now
		s.effects[ev.ID]++
		s.events = append(s.events, Event{Event: ev, IngestedAt: now.Add(s.delay)})
		s.requests = append(s.requests, Request{Method: req.Method, Path: req.URL.Path, ID: ev.ID, Status: http.StatusNoContent})
	}
	hang := s.hang
	s.mu.Unlock()
	if fault == adaptercontract.CommitThenTimeout {
		// Counted; the reply never comes before the client gives up.
		select {
		case <-req.Context().Done():
		case <-hang:
		case <-time.After(2 * time.Minute):
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) list(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	if s.failRead(w, req) {
		return
	}
	now := time.Now()
	from, to := now.Add(-24*time.Hour), time.Time{}
	if v := q.Get("from"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			problem(w, http.StatusBadRequest, "invalid from")
			return
		}
		from = t
	}
	if from.Before(now.Add(-listHorizon)) {
		problem(w, http.StatusBadRequest, "from date is too old: "+from.UTC().Format(time.RFC3339))
		return
	}
	if v := q.Get("to"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil || t.Before(from) {
			problem(w, http.StatusBadRequest, "invalid to: before from, or not a date-time")
			return
		}
		to = t
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			problem(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = n
	}
	id, subject := q.Get("id"), q.Get("subject")
	type wire struct {
		Event      json.RawMessage `json:"event"`
		IngestedAt time.Time       `json:"ingestedAt"`
		StoredAt   time.Time       `json:"storedAt"`
	}
	s.mu.Lock()
	var picked []Event
	for _, e := range s.events {
		at := e.IngestedAt
		if e.Time != "" {
			at, _ = time.Parse(time.RFC3339Nano, e.Time)
		}
		switch {
		case now.Before(e.IngestedAt): // not ingested yet
		case id != "" && !strings.Contains(e.ID, id):
		case subject != "" && !strings.Contains(e.Subject, subject):
		case at.Before(from), !to.IsZero() && at.After(to):
		default:
			picked = append(picked, e)
		}
	}
	s.mu.Unlock()
	sort.SliceStable(picked, func(i, j int) bool { return eventTime(picked[i]).After(eventTime(picked[j])) })
	if len(picked) > limit {
		picked = picked[:limit]
	}
	out := make([]wire, 0, len(picked))
	for _, e := range picked {
		b, err := e.MarshalStructured()
		if err != nil {
			continue
		}
		out = append(out, wire{Event: b, IngestedAt: e.IngestedAt, StoredAt: e.IngestedAt})
	}
	s.record(Request{Method: req.Method, Path: req.URL.Path, ID: id, Status: http.StatusOK})
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func eventTime(e Event) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, e.Time); err == nil {
		return t
	}
	return e.IngestedAt
}

// String names the fake.
func (s *Server) String() string { return fmt.Sprintf("fakeopenmeter(%s)", s.URL()) }

// The fake is held to the contract every billing adapter's fake implements.
var _ adaptercontract.Fixture = (*Server)(nil)

// StartFixture starts a fake as the adapter contract suite uses it: a token required,
// no deduplication (a self-hosted install's default, the case where a resend counts).
func StartFixture() (*Server, error) { return Start(Options{Token: Token}) }
