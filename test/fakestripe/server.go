// Package fakestripe is a stateful, Stripe-shaped billing provider for tests: the few
// endpoints of Stripe's API the Stripe adapter uses (meter events and their
// adjustments, meter event summaries, invoice items, meters), Stripe's idempotency
// layer, and the failures that matter for money, over a real socket.
//
// Stripe's official mock server (stripe-mock) checks that every request is valid
// against Stripe's OpenAPI spec, but it keeps no state: it cannot say whether a key
// was reused, whether an identifier is a duplicate, or how many charges a customer
// has. This fake can, so the failure matrix asserts "one charge per settlement key"
// against a ledger. What it models, and where that model is an assumption about
// Stripe rather than Stripe's documented behaviour, is written next to each rule.
//
// The wire format is written here independently of stripe-go: form-encoded requests
// (`payload[stripe_customer_id]=…`), JSON replies, and Stripe's error envelope
// `{"error":{"type","code","message","param"}}`.
package fakestripe

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Windows Stripe documents (and the fake enforces by default).
const (
	// KeyWindow: Stripe keeps an idempotency key's result for at least 24 hours.
	KeyWindow = 24 * time.Hour
	// IdentifierWindow: Stripe enforces a meter event identifier's uniqueness "within a
	// rolling period of at least 24 hours".
	IdentifierWindow = 24 * time.Hour
	// CancelWindow: a meter event can be cancelled within 24 hours of Stripe receiving it.
	CancelWindow = 24 * time.Hour
	// MaxEventAge: a meter event's timestamp must be within the past 35 days.
	MaxEventAge = 35 * 24 * time.Hour
)

// Meter is a billing meter the fake knows: Stripe refuses events for an event name
// no meter has.
type Meter struct {
	ID        string
	EventName string
	// CustomerKey and ValueKey are the meter's payload keys (Stripe's defaults
	// stripe_customer_id and value when empty).
	CustomerKey, ValueKey string
	// Formula is the meter's default aggregation (sum when empty; count, last).
	Formula string
}

// Options configures a fake.
type Options struct {
	// Addr is the listen address; default 127.0.0.1:0.
	Addr string
	// APIKey is the required secret key (Authorization: Bearer …); "" accepts any.
	APIKey string
	// Meters are the billing meters that exist.
	Meters []Meter
	// Now is the fake's clock (time.Now); tests move it to pass Stripe's windows.
	Now func() time.Time
	// PageSize caps a list page (Stripe's limit parameter caps it too); default 100.
	PageSize int
}

// MeterEvent is a meter event in the ledger.
type MeterEvent struct {
	EventName, Identifier, Customer, Value string
	Timestamp                              int64
	Created                                time.Time
	Cancelled                              bool
}

// InvoiceItem is an invoice item in the ledger.
type InvoiceItem struct {
	ID, Customer, Currency, Description, Invoice string
	Amount                                       int64
	Metadata                                     map[string]string
	Created                                      time.Time
	Deleted                                      bool
}

// stored is an idempotency key's saved result.
type stored struct {
	request string // method, path and canonical parameters
	status  int
	body    []byte
	at      time.Time
	done    bool // false while the first request is still executing
}

// Server is a running fake.
type Server struct {
	opts Options
	ln   net.Listener
	srv  *http.Server

	mu       sync.Mutex
	keys     map[string]*stored
	events   []*MeterEvent
	items    []*InvoiceItem
	nextID   int
	faults   []fault
	requests []Request
}

// Request is one request the fake answered, for assertions on what was sent.
type Request struct {
	Method, Path, IdempotencyKey string
	Status                       int
	Replayed                     bool
}

type faultKind int

const (
	// faultError answers with an error before executing anything (nothing is saved).
	faultError faultKind = iota + 1
	// faultCommitThenHang executes the request, saves the result under its key, and
	// never answers: the client's timeout sees an ambiguous outcome.
	faultCommitThenHang
	// faultSlow executes the request after a delay, so a concurrent request with the
	// same key meets it in progress (409 idempotency_key_in_use).
	faultSlow
)

type fault struct {
	kind       faultKind
	path       string // "" matches every path
	status     int
	errType    string
	code       string
	param      string
	retryAfter string
	delay      time.Duration
}

// Start listens and serves.
func Start(opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 100
	}
	for i := range opts.Meters {
		if opts.Meters[i].CustomerKey == "" {
			opts.Meters[i].CustomerKey = "stripe_customer_id"
		}
		if opts.Meters[i].ValueKey == "" {
			opts.Meters[i].ValueKey = "value"
		}
		if opts.Meters[i].Formula == "" {
			opts.Meters[i].Formula = "sum"
		}
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("fake stripe: listen: %w", err)
	}
	s := &Server{opts: opts, ln: ln, keys: map[string]*stored{}}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the base URL to point the adapter (stripe-go's backend URL) at.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the server, dropping held connections.
func (s *Server) Close() error { return s.srv.Close() }

// FailNext makes the next n requests to path ("" for any) answer status with Stripe's
// error envelope (errType, code) without executing them: nothing is saved under their
// idempotency keys, as Stripe saves no result for a request that did not start
// executing. retryAfter, when set, is sent as Retry-After.
func (s *Server) FailNext(n int, path string, status int, errType, code, retryAfter string) {
	s.addFaults(n, fault{kind: faultError, path: path, status: status, errType: errType, code: code, retryAfter: retryAfter})
}

// RefuseNext makes the next n requests to path answer status with an
// invalid_request_error of code about param, executing nothing (Stripe refusing, say,
// a customer that does not exist: 404 resource_missing, param customer).
func (s *Server) RefuseNext(n int, path string, status int, code, param string) {
	s.addFaults(n, fault{kind: faultError, path: path, status: status, errType: "invalid_request_error", code: code, param: param})
}

// RateLimitNext answers the next n requests 429 as Stripe does (rate_limit, with
// Stripe-Should-Retry and Retry-After), executing nothing.
func (s *Server) RateLimitNext(n int, retryAfter time.Duration) {
	s.addFaults(n, fault{kind: faultError, status: http.StatusTooManyRequests, errType: "invalid_request_error",
		code: "rate_limit", retryAfter: strconv.Itoa(int(retryAfter.Seconds()))})
}

// CommitThenHangNext executes the next n requests to path and saves their results,
// but never answers them: the caller's timeout cannot tell whether they committed.
func (s *Server) CommitThenHangNext(n int, path string) {
	s.addFaults(n, fault{kind: faultCommitThenHang, path: path})
}

// SlowNext makes the next n requests to path execute only after d, holding their
// idempotency keys "in progress" meanwhile.
func (s *Server) SlowNext(n int, path string, d time.Duration) {
	s.addFaults(n, fault{kind: faultSlow, path: path, delay: d})
}

// ClearFaults drops every fault not taken yet: the outage ends.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

func (s *Server) addFaults(n int, f fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults = append(s.faults, f)
	}
}

// takeFault removes and returns the first fault for path.
func (s *Server) takeFault(path string) (fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.faults {
		if f.path == "" || f.path == path {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
			return f, true
		}
	}
	return fault{}, false
}

// Charges counts the live charges carrying idempotencyKey in the ledger: meter events
// whose identifier it is and that were not cancelled, plus invoice items whose
// metadata[settlement_idempotency_key] it is and that were not deleted.
func (s *Server) Charges(idempotencyKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.events {
		if e.Identifier == idempotencyKey && !e.Cancelled {
			n++
		}
	}
	for _, it := range s.items {
		if it.Metadata["settlement_idempotency_key"] == idempotencyKey && !it.Deleted {
			n++
		}
	}
	return n
}

// MeterEvents returns a copy of the meter event ledger.
func (s *Server) MeterEvents() []MeterEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return copies(s.events)
}

// AddMeterEvent records a meter event nobody sent through the API (usage another
// system reported for the same customer and meter), dated now.
func (s *Server) AddMeterEvent(eventName, identifier, customer, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	s.events = append(s.events, &MeterEvent{EventName: eventName, Identifier: identifier, Customer: customer, Value: value,
		Timestamp: now.Unix(), Created: now})
}

// InvalidateMeterEvent drops an accepted meter event from the totals, as Stripe does
// with one its asynchronous validation refuses (reported in the meter's error
// reports, never to the request that sent it); false when there is no such event.
func (s *Server) InvalidateMeterEvent(identifier string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events {
		if e.Identifier == identifier && !e.Cancelled {
			e.Cancelled = true
			return true
		}
	}
	return false
}

// AddInvoiceItems creates n invoice items of customer that are not the operator's (no
// settlement metadata), as the dashboard or another system would, dated now.
func (s *Server) AddInvoiceItems(customer string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.nextID++
		s.items = append(s.items, &InvoiceItem{ID: fmt.Sprintf("ii_fake%06d", s.nextID), Customer: customer, Currency: "usd",
			Amount: 100, Metadata: map[string]string{}, Created: s.opts.Now()})
	}
}

// DeleteInvoiceItem deletes an item as someone in the dashboard would; false when
// there is no such item or it is invoiced.
func (s *Server) DeleteInvoiceItem(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range s.items {
		if it.ID == id && !it.Deleted && it.Invoice == "" {
			it.Deleted = true
			return true
		}
	}
	return false
}

// InvoiceItems returns a copy of the invoice item ledger, deleted ones included.
func (s *Server) InvoiceItems() []InvoiceItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return copies(s.items)
}

// copies returns the values behind a ledger's pointers (callers hold s.mu).
func copies[T any](in []*T) []T {
	out := make([]T, 0, len(in))
	for _, p := range in {
		out = append(out, *p)
	}
	return out
}

// Invoice marks an invoice item as included in an invoice: it can no longer be deleted.
func (s *Server) Invoice(itemID, invoiceID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range s.items {
		if it.ID == itemID {
			it.Invoice = invoiceID
			return nil
		}
	}
	return fmt.Errorf("fake stripe: no invoice item %s", itemID)
}

// Requests returns what the fake answered, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// ForgetKeys drops every saved idempotency result, as Stripe does once a key is older
// than its window: a request with an old key then executes again.
func (s *Server) ForgetKeys() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = map[string]*stored{}
}

// apiError is Stripe's error envelope.
type apiError struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
}

func errorBody(e apiError) []byte {
	b, _ := json.Marshal(map[string]apiError{"error": e})
	return b
}

func (s *Server) log(r *http.Request, status int, replayed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path,
		IdempotencyKey: r.Header.Get("Idempotency-Key"), Status: status, Replayed: replayed})
}

func write(w http.ResponseWriter, status int, body []byte, header map[string]string) {
	for k, v := range header {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_fake")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ServeHTTP authenticates, applies faults and the idempotency layer, and routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.opts.APIKey != "" && r.Header.Get("Authorization") != "Bearer "+s.opts.APIKey {
		s.log(r, http.StatusUnauthorized, false)
		write(w, http.StatusUnauthorized, errorBody(apiError{Type: "invalid_request_error",
			Message: "Invalid API Key provided."}), nil)
		return
	}
	if err := r.ParseForm(); err != nil {
		s.log(r, http.StatusBadRequest, false)
		write(w, http.StatusBadRequest, errorBody(apiError{Type: "invalid_request_error", Message: "Invalid request body."}), nil)
		return
	}
	f, faulted := s.takeFault(r.URL.Path)
	if faulted && f.kind == faultError {
		s.log(r, f.status, false)
		h := map[string]string{}
		if f.retryAfter != "" {
			h["Retry-After"] = f.retryAfter
			h["Stripe-Should-Retry"] = "true"
		}
		if f.status == http.StatusTooManyRequests {
			h["Stripe-Rate-Limited-Reason"] = "global-rate"
		}
		write(w, f.status, errorBody(apiError{Type: f.errType, Code: f.code, Param: f.param, Message: "injected failure"}), h)
		return
	}

	// Stripe's idempotency layer covers POSTs only: a key on a GET or DELETE has no effect.
	key := r.Header.Get("Idempotency-Key")
	if key == "" || r.Method != http.MethodPost {
		if faulted && f.kind == faultSlow {
			time.Sleep(f.delay)
		}
		status, body := s.route(r)
		if faulted && f.kind == faultCommitThenHang {
			s.log(r, 0, false)
			s.hang(w)
			return
		}
		s.log(r, status, false)
		write(w, status, body, nil)
		return
	}

	// Stripe's idempotency layer: the first request with a key saves its result (once
	// the endpoint started executing — a 500 included); the same key with the same
	// parameters replays it; with other parameters it is an idempotency_error; while
	// the first is executing, 409 idempotency_key_in_use.
	canon := r.Method + " " + r.URL.Path + "?" + r.PostForm.Encode()
	s.mu.Lock()
	now := s.opts.Now()
	st, ok := s.keys[key]
	if ok && now.Sub(st.at) >= KeyWindow {
		delete(s.keys, key)
		ok = false
	}
	switch {
	case ok && st.request != canon:
		s.mu.Unlock()
		s.log(r, http.StatusBadRequest, false)
		write(w, http.StatusBadRequest, errorBody(apiError{Type: "idempotency_error",
			Message: "Keys for idempotent requests can only be used with the same parameters they were first used with."}), nil)
		return
	case ok && !st.done:
		s.mu.Unlock()
		s.log(r, http.StatusConflict, false)
		write(w, http.StatusConflict, errorBody(apiError{Type: "invalid_request_error", Code: "idempotency_key_in_use",
			Message: "There is currently another in-progress request using this Idempotent Key."}), nil)
		return
	case ok:
		status, body := st.status, st.body
		s.mu.Unlock()
		s.log(r, status, true)
		write(w, status, body, map[string]string{"Idempotent-Replayed": "true", "Original-Request": "req_fake"})
		return
	}
	st = &stored{request: canon, at: now}
	s.keys[key] = st
	s.mu.Unlock()

	if faulted && f.kind == faultSlow {
		time.Sleep(f.delay)
	}
	status, body := s.route(r)
	s.mu.Lock()
	if status == http.StatusBadRequest && !executed(body) {
		delete(s.keys, key) // a request refused by validation saves nothing
	} else {
		st.status, st.body, st.done = status, body, true
	}
	s.mu.Unlock()
	if faulted && f.kind == faultCommitThenHang {
		s.log(r, 0, false)
		s.hang(w)
		return
	}
	s.log(r, status, false)
	write(w, status, body, nil)
}

// executed tells a refusal by the endpoint's own logic (saved, like Stripe saves any
// result of a request that started executing) from a parameter validation error.
func executed(body []byte) bool {
	var e struct {
		Error apiError `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return e.Error.Code == "resource_already_exists" || e.Error.Code == "resource_missing"
}

// hang keeps the connection open without answering until the client gives up.
func (s *Server) hang(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	go func() {
		time.Sleep(30 * time.Second)
		_ = conn.Close()
	}()
}

func (s *Server) route(r *http.Request) (int, []byte) {
	p := r.URL.Path
	switch {
	case r.Method == http.MethodPost && p == "/v1/billing/meter_events":
		return s.createMeterEvent(r.PostForm)
	case r.Method == http.MethodPost && p == "/v1/billing/meter_event_adjustments":
		return s.createAdjustment(r.PostForm)
	case r.Method == http.MethodGet && p == "/v1/billing/meters":
		return s.listMeters()
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/billing/meters/") && !strings.Contains(strings.TrimPrefix(p, "/v1/billing/meters/"), "/"):
		return s.getMeter(strings.TrimPrefix(p, "/v1/billing/meters/"))
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/billing/meters/") && strings.HasSuffix(p, "/event_summaries"):
		return s.eventSummaries(strings.TrimSuffix(strings.TrimPrefix(p, "/v1/billing/meters/"), "/event_summaries"), r.Form)
	case r.Method == http.MethodPost && p == "/v1/invoiceitems":
		return s.createInvoiceItem(r.PostForm)
	case r.Method == http.MethodGet && p == "/v1/invoiceitems":
		return s.listInvoiceItems(r.Form)
	case r.Method == http.MethodDelete && strings.HasPrefix(p, "/v1/invoiceitems/"):
		return s.deleteInvoiceItem(strings.TrimPrefix(p, "/v1/invoiceitems/"))
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/invoiceitems/"):
		return s.getInvoiceItem(strings.TrimPrefix(p, "/v1/invoiceitems/"))
	}
	return http.StatusNotFound, errorBody(apiError{Type: "invalid_request_error",
		Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, p)})
}

func invalid(param, msg string) (int, []byte) {
	return http.StatusBadRequest, errorBody(apiError{Type: "invalid_request_error", Message: msg, Param: param})
}

func (s *Server) meterByEvent(name string) (Meter, bool) {
	for _, m := range s.opts.Meters {
		if m.EventName == name {
			return m, true
		}
	}
	return Meter{}, false
}

func (s *Server) livemode() bool {
	return strings.HasPrefix(s.opts.APIKey, "sk_live_") || strings.HasPrefix(s.opts.APIKey, "rk_live_")
}

func (s *Server) createMeterEvent(f url.Values) (int, []byte) {
	name, id := f.Get("event_name"), f.Get("identifier")
	if name == "" {
		return invalid("event_name", "Missing required param: event_name.")
	}
	m, ok := s.meterByEvent(name)
	if !ok {
		// Stripe reports an unknown event name asynchronously (no_meter error report);
		// the fake refuses it at once so a misconfigured test fails loudly.
		return invalid("event_name", "No active meter was found for event_name "+name+".")
	}
	customer, value := f.Get("payload["+m.CustomerKey+"]"), f.Get("payload["+m.ValueKey+"]")
	if customer == "" || value == "" {
		return invalid("payload", "The payload must contain "+m.CustomerKey+" and "+m.ValueKey+".")
	}
	if _, err := strconv.ParseInt(value, 10, 64); err != nil {
		// Stripe's usage values are whole numbers.
		return invalid("payload", "The meter event value must be a whole number.")
	}
	if len(id) > 100 {
		return invalid("identifier", "identifier is longer than 100 characters.")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	ts := now.Unix()
	if t := f.Get("timestamp"); t != "" {
		v, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			return invalid("timestamp", "Invalid integer: "+t)
		}
		if now.Sub(time.Unix(v, 0)) > MaxEventAge || time.Unix(v, 0).Sub(now) > 5*time.Minute {
			return invalid("timestamp", "The timestamp must be within the past 35 days and at most 5 minutes in the future.")
		}
		ts = v
	}
	if id == "" {
		s.nextID++
		id = fmt.Sprintf("fake_%d", s.nextID)
	}
	for _, e := range s.events {
		// Assumption: Stripe answers a duplicate identifier inside its uniqueness window
		// with resource_already_exists. Its documentation promises the uniqueness, not
		// the code; the adapter treats this code, and only it, as proof of existence.
		if e.Identifier == id && now.Sub(e.Created) < IdentifierWindow {
			return http.StatusBadRequest, errorBody(apiError{Type: "invalid_request_error", Code: "resource_already_exists",
				Param: "identifier", Message: "A meter event with identifier " + id + " already exists."})
		}
	}
	e := &MeterEvent{EventName: name, Identifier: id, Customer: customer, Value: value, Timestamp: ts, Created: now}
	s.events = append(s.events, e)
	return http.StatusOK, mustJSON(map[string]any{
		"object": "billing.meter_event", "created": now.Unix(), "event_name": name, "identifier": id,
		"livemode": s.livemode(), "payload": map[string]string{m.CustomerKey: customer, m.ValueKey: value}, "timestamp": ts,
	})
}

func (s *Server) createAdjustment(f url.Values) (int, []byte) {
	name, typ, id := f.Get("event_name"), f.Get("type"), f.Get("cancel[identifier]")
	if name == "" || typ != "cancel" || id == "" {
		return invalid("cancel", "event_name, type=cancel and cancel[identifier] are required.")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	for _, e := range s.events {
		if e.Identifier != id || e.EventName != name {
			continue
		}
		if now.Sub(e.Created) >= CancelWindow {
			return invalid("cancel[identifier]", "Meter events can only be cancelled within 24 hours of being received.")
		}
		e.Cancelled = true
		return http.StatusOK, mustJSON(map[string]any{
			"object": "billing.meter_event_adjustment", "livemode": s.livemode(), "status": "pending",
			"event_name": name, "type": "cancel", "cancel": map[string]string{"identifier": id},
		})
	}
	return http.StatusNotFound, errorBody(apiError{Type: "invalid_request_error", Code: "resource_missing",
		Param: "cancel[identifier]", Message: "No meter event with identifier " + id + "."})
}

func (s *Server) listMeters() (int, []byte) {
	data := []map[string]any{}
	for _, m := range s.opts.Meters {
		data = append(data, meterJSON(m))
	}
	return http.StatusOK, mustJSON(map[string]any{"object": "list", "url": "/v1/billing/meters", "has_more": false, "data": data})
}

func (s *Server) getMeter(id string) (int, []byte) {
	for _, m := range s.opts.Meters {
		if m.ID == id {
			return http.StatusOK, mustJSON(meterJSON(m))
		}
	}
	return http.StatusNotFound, errorBody(apiError{Type: "invalid_request_error", Code: "resource_missing", Message: "No such billing meter: " + id})
}

func meterJSON(m Meter) map[string]any {
	return map[string]any{"id": m.ID, "object": "billing.meter", "event_name": m.EventName, "status": "active",
		"default_aggregation": map[string]string{"formula": m.Formula},
		"customer_mapping":    map[string]string{"event_payload_key": m.CustomerKey, "type": "by_id"},
		"value_settings":      map[string]string{"event_payload_key": m.ValueKey}}
}

func (s *Server) eventSummaries(meterID string, f url.Values) (int, []byte) {
	var m *Meter
	for i := range s.opts.Meters {
		if s.opts.Meters[i].ID == meterID {
			m = &s.opts.Meters[i]
		}
	}
	if m == nil {
		return http.StatusNotFound, errorBody(apiError{Type: "invalid_request_error", Code: "resource_missing", Message: "No such billing meter: " + meterID})
	}
	customer := f.Get("customer")
	start, err1 := strconv.ParseInt(f.Get("start_time"), 10, 64)
	end, err2 := strconv.ParseInt(f.Get("end_time"), 10, 64)
	if customer == "" || err1 != nil || err2 != nil || end <= start {
		return invalid("customer", "customer, start_time and end_time (after start_time) are required.")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum int64
	for _, e := range s.events {
		if e.EventName == m.EventName && e.Customer == customer && !e.Cancelled && e.Timestamp >= start && e.Timestamp < end {
			v, _ := strconv.ParseInt(e.Value, 10, 64)
			sum += v
		}
	}
	return http.StatusOK, mustJSON(map[string]any{"object": "list", "has_more": false,
		"url": "/v1/billing/meters/" + meterID + "/event_summaries",
		"data": []map[string]any{{"id": "mtrusg_fake", "object": "billing.meter_event_summary", "aggregated_value": sum,
			"start_time": start, "end_time": end, "meter": meterID, "livemode": s.livemode()}}})
}

func (s *Server) createInvoiceItem(f url.Values) (int, []byte) {
	customer, currency := f.Get("customer"), f.Get("currency")
	if customer == "" {
		return invalid("customer", "Missing required param: customer.")
	}
	amount, err := strconv.ParseInt(f.Get("amount"), 10, 64)
	if err != nil || currency == "" || currency != strings.ToLower(currency) {
		return invalid("amount", "amount (an integer in minor units) and a lower-case currency are required.")
	}
	if code, msg := refusedAmount(currency, amount); code != "" {
		return http.StatusBadRequest, errorBody(apiError{Type: "invalid_request_error", Code: code, Message: msg, Param: "amount"})
	}
	md := map[string]string{}
	for k, v := range f {
		if strings.HasPrefix(k, "metadata[") && strings.HasSuffix(k, "]") && len(v) > 0 {
			md[strings.TrimSuffix(strings.TrimPrefix(k, "metadata["), "]")] = v[0]
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	it := &InvoiceItem{ID: fmt.Sprintf("ii_fake%06d", s.nextID), Customer: customer, Currency: currency, Amount: amount,
		Description: f.Get("description"), Metadata: md, Created: s.opts.Now()}
	s.items = append(s.items, it)
	return http.StatusOK, mustJSON(s.itemJSON(it))
}

// refusedAmount is Stripe's refusal of an amount its currency cannot take
// (docs.stripe.com/currencies), written here independently of the adapter's table:
// ISK and UGX are sent with two decimals that are always 00 (Stripe's refusal of
// fractional ISK is documented as invalid_charge_amount_no_decimal_compatible); the
// three-decimal currencies' last digit must be 0 (the code of that refusal is not
// documented: an assumption). Zero-decimal amounts are whole by construction.
func refusedAmount(currency string, amount int64) (code, msg string) {
	switch currency {
	case "isk", "ugx":
		if amount%100 != 0 {
			return "invalid_charge_amount_no_decimal_compatible", "Invalid amount. Currency " + strings.ToUpper(currency) +
				" has become effectively zero-decimal and charged amounts must be evenly divisible by 100."
		}
	case "bhd", "jod", "kwd", "omr", "tnd":
		if amount%10 != 0 {
			return "amount_invalid", "Invalid amount. Amounts in " + strings.ToUpper(currency) + " must end in 0."
		}
	}
	return "", ""
}

func (s *Server) itemJSON(it *InvoiceItem) map[string]any {
	var invoice any
	if it.Invoice != "" {
		invoice = it.Invoice
	}
	return map[string]any{"id": it.ID, "object": "invoiceitem", "amount": it.Amount, "currency": it.Currency,
		"customer": it.Customer, "description": it.Description, "metadata": it.Metadata, "invoice": invoice,
		"date": it.Created.Unix(), "livemode": s.livemode(), "quantity": 1}
}

func (s *Server) findItem(id string) *InvoiceItem {
	for _, it := range s.items {
		if it.ID == id && !it.Deleted {
			return it
		}
	}
	return nil
}

func (s *Server) getInvoiceItem(id string) (int, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it := s.findItem(id)
	if it == nil {
		return http.StatusNotFound, errorBody(apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "id", Message: "No such invoiceitem: '" + id + "'"})
	}
	return http.StatusOK, mustJSON(s.itemJSON(it))
}

func (s *Server) deleteInvoiceItem(id string) (int, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it := s.findItem(id)
	if it == nil {
		return http.StatusNotFound, errorBody(apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "id", Message: "No such invoiceitem: '" + id + "'"})
	}
	if it.Invoice != "" {
		return invalid("id", "This invoice item is attached to an invoice that is no longer editable.")
	}
	it.Deleted = true
	return http.StatusOK, mustJSON(map[string]any{"id": id, "object": "invoiceitem", "deleted": true})
}

// listInvoiceItems lists live items newest first, as Stripe lists: customer and
// created[gte] filter, starting_after pages, limit caps (≤ 100).
func (s *Server) listInvoiceItems(f url.Values) (int, []byte) {
	limit := s.opts.PageSize
	if l := f.Get("limit"); l != "" {
		v, err := strconv.Atoi(l)
		if err != nil || v < 1 || v > 100 {
			return invalid("limit", "limit must be between 1 and 100.")
		}
		limit = min(v, s.opts.PageSize)
	}
	var gte int64
	if g := f.Get("created[gte]"); g != "" {
		v, err := strconv.ParseInt(g, 10, 64)
		if err != nil {
			return invalid("created[gte]", "Invalid integer: "+g)
		}
		gte = v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Newest first: items are appended in creation order.
	var live []*InvoiceItem
	for i := len(s.items) - 1; i >= 0; i-- {
		it := s.items[i]
		if !it.Deleted && it.Created.Unix() >= gte && (f.Get("customer") == "" || it.Customer == f.Get("customer")) {
			live = append(live, it)
		}
	}
	if after := f.Get("starting_after"); after != "" {
		i := 0
		for i < len(live) && live[i].ID != after {
			i++
		}
		if i == len(live) {
			return invalid("starting_after", "No such invoiceitem: '"+after+"'")
		}
		live = live[i+1:]
	}
	more := len(live) > limit
	if more {
		live = live[:limit]
	}
	data := make([]map[string]any, 0, len(live))
	for _, it := range live {
		data = append(data, s.itemJSON(it))
	}
	return http.StatusOK, mustJSON(map[string]any{"object": "list", "url": "/v1/invoiceitems", "has_more": more, "data": data})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
