package fakebilling

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// maxBody bounds request bodies; §6.1 bodies are a few hundred bytes.
const maxBody = 1 << 20

type faultKind int

const (
	faultFail faultKind = iota + 1
	faultRateLimit
	faultCommitThenTimeout
	faultCommitThen500
	faultSlow
	faultCommitLater
	faultReject
)

// fault is one injected misbehaviour, consumed by one POST.
type fault struct {
	kind   faultKind
	status int
	code   string
	delay  time.Duration
	// key, when set, makes the fault wait for a POST with this idempotency key: a spec
	// aims it at its own settlement, never at another tenant's retry that happens to
	// come first.
	key string
}

func (s *Server) enqueue(n int, f fault) { s.enqueueOn(&s.faults, n, f) }

// enqueueOn appends n copies of f to one of the fault queues.
func (s *Server) enqueueOn(queue *[]fault, n int, f fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		*queue = append(*queue, f)
	}
}

// Faults queue in the order they are added and are consumed one per POST
// /settlements that passes authentication, validation and the in-flight check (a 401,
// 400 or 409 consumes nothing), so a test knows exactly which request misbehaves.

// FailNext makes the next n POSTs answer status (e.g. 503) with a plain-text body,
// like a proxy in front of the provider, WITHOUT committing anything.
// A status outside 500-599 is allowed (e.g. 502 from a gateway, or 418 for fun); 0
// means 503.
func (s *Server) FailNext(n int, status int) {
	if status == 0 {
		status = http.StatusServiceUnavailable
	}
	s.enqueue(n, fault{kind: faultFail, status: status})
}

// FailNextFor is FailNext for the POSTs with one idempotency key only.
func (s *Server) FailNextFor(key string, n int, status int) {
	if status == 0 {
		status = http.StatusServiceUnavailable
	}
	s.enqueue(n, fault{kind: faultFail, status: status, key: key})
}

// RateLimitNext makes the next n POSTs answer 429 with Retry-After (whole seconds,
// rounded up), without committing.
func (s *Server) RateLimitNext(n int, retryAfter time.Duration) {
	s.enqueue(n, fault{kind: faultRateLimit, delay: retryAfter})
}

// CommitThenTimeoutNext makes the next n POSTs commit the charge and then never
// answer: the connection is held open until the client gives up. This is "billing
// succeeded but the reply was lost", the case that must not become a second charge.
func (s *Server) CommitThenTimeoutNext(n int) { s.enqueue(n, fault{kind: faultCommitThenTimeout}) }

// CommitThen500Next makes the next n POSTs commit the charge and then answer 500.
func (s *Server) CommitThen500Next(n int) { s.enqueue(n, fault{kind: faultCommitThen500}) }

// SlowNext delays the next n POSTs by d before handling them normally. The key counts
// as in flight during the delay, so concurrent requests with it get 409.
func (s *Server) SlowNext(n int, d time.Duration) { s.enqueue(n, fault{kind: faultSlow, delay: d}) }

// SlowNextFor is SlowNext for the POSTs with one idempotency key only.
func (s *Server) SlowNextFor(key string, n int, d time.Duration) {
	s.enqueue(n, fault{kind: faultSlow, delay: d, key: key})
}

// CommitLaterNext makes the next n POSTs be processed for d whatever the client does:
// the key stays in flight (other requests with it get 409 in use) and the charge
// commits after d even if the client gave up long before — a provider still working
// on a request our side has timed out.
func (s *Server) CommitLaterNext(n int, d time.Duration) {
	s.enqueue(n, fault{kind: faultCommitLater, delay: d})
}

// RejectNext makes the next n POSTs answer status with {"error": code}, without
// committing: a terminal rejection such as 400 invalid_currency.
// Status 0 means 400 and an empty code means "rejected".
func (s *Server) RejectNext(n int, status int, code string) {
	if status == 0 {
		status = http.StatusBadRequest
	}
	if code == "" {
		code = "rejected"
	}
	s.enqueue(n, fault{kind: faultReject, status: status, code: code})
}

// begin marks key in flight and takes the next fault; ok is false when the key is
// already in flight (409). The caller must call end(key).
func (s *Server) begin(key string) (f *fault, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[key] {
		return nil, false
	}
	s.inFlight[key] = true
	for i, next := range s.faults {
		if next.key != "" && next.key != key {
			continue
		}
		s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
		s.calls.Faults++
		return &next, true
	}
	return nil, true
}

func (s *Server) end(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inFlight, key)
}

func (s *Server) count(f func(*CallCounts)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.calls)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /settlements", s.handleSubmit)
	mux.HandleFunc("GET /settlements/{key}", s.handleLookup)
	mux.HandleFunc("GET /settlements", s.handleList)
	mux.HandleFunc("GET /_admin/ledger", s.handleAdminLedger)
	mux.HandleFunc("POST /_admin/faults", s.handleAdminFaults)
	mux.HandleFunc("POST /_admin/status", s.handleAdminStatus)
	mux.HandleFunc("POST /_admin/import", s.handleAdminImport)
	mux.HandleFunc("POST /_admin/record-format", s.handleAdminRecordFormat)
	return mux
}

// authorized checks the bearer token in constant time.
func (s *Server) authorized(r *http.Request) bool {
	if s.opts.Token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.opts.Token)) == 1
}

// writeJSON answers with a fixed Content-Length, so a reply flushed right before the
// connection is dropped (down_for_ms) still arrives complete.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"internal_error"}`)
	}
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, errorBody{Error: code, Message: message})
}

func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request) {
	rw := &statusRecorder{ResponseWriter: w}
	defer func() { s.logCall(http.MethodPost, r.Header.Get("Idempotency-Key"), rw.status) }()
	s.submit(rw, r)
}

// statusRecorder remembers the status a handler wrote (0 when it hijacked the
// connection), for the call log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Hijack lets commit-then-timeout hold the connection through the recorder.
func (w *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("fake billing: connection cannot be hijacked")
	}
	return hj.Hijack()
}

func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	s.count(func(c *CallCounts) { c.Posts++ })
	if !s.authorized(r) {
		writeError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		writeError(w, http.StatusBadRequest, "missing_idempotency_key", "the Idempotency-Key header is required")
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "send application/json")
		return
	}
	p, err := decodeSubmit(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	f, ok := s.begin(key)
	if !ok {
		writeError(w, http.StatusConflict, "idempotency_key_in_use", "a request with this key is in progress")
		return
	}
	inFlight := true
	release := func() {
		if inFlight {
			s.end(key)
			inFlight = false
		}
	}
	defer release()

	if f != nil {
		switch f.kind {
		case faultSlow:
			select {
			case <-time.After(f.delay):
			case <-r.Context().Done():
				return
			case <-s.done:
				return
			}
		case faultCommitLater:
			inFlight = false // the goroutine below owns the key now
			go func() {
				defer s.end(key)
				select {
				case <-time.After(f.delay):
					s.commit(key, p)
				case <-s.done:
				}
			}()
			select {
			case <-time.After(f.delay):
			case <-r.Context().Done():
			case <-s.done:
			}
			return
		case faultFail:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(f.status)
			_, _ = io.WriteString(w, http.StatusText(f.status)+"\n")
			return
		case faultRateLimit:
			w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(f.delay.Seconds())), 10))
			writeError(w, http.StatusTooManyRequests, "rate_limited", "slow down")
			return
		case faultReject:
			writeError(w, f.status, f.code, "rejected by fault injection")
			return
		case faultCommitThen500:
			s.commit(key, p)
			writeError(w, http.StatusInternalServerError, "internal_error", "something went wrong")
			return
		case faultCommitThenTimeout:
			s.commit(key, p)
			release() // committed: a retry must now find the record, not a key in use
			hj, ok := w.(http.Hijacker)
			if !ok {
				writeError(w, http.StatusInternalServerError, "internal_error", "cannot hold the connection")
				return
			}
			conn, _, err := hj.Hijack()
			if err != nil {
				return
			}
			s.hold(conn)
			return
		}
	}

	rec, created, reused := s.commit(key, p)
	switch {
	case reused:
		writeError(w, http.StatusUnprocessableEntity, "idempotency_key_reused",
			"this idempotency key was used with different parameters")
	case created:
		writeJSON(w, http.StatusCreated, s.recordBody(rec))
	default:
		writeJSON(w, http.StatusOK, s.recordBody(rec))
	}
}

// lookup returns the record for key, advancing the pending -> settled clock.
func (s *Server) lookup(key string) (WireRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byKey[key]
	if !ok {
		// A forgotten key no longer deduplicates, but its record is still found.
		for i := len(s.forgotten) - 1; i >= 0 && !ok; i-- {
			if s.forgotten[i].IdempotencyKey == key {
				e, ok = s.forgotten[i], true
			}
		}
	}
	if !ok {
		return WireRecord{}, false
	}
	if e.autoSettle && e.Status == billing.StatusPending {
		if e.pollsLeft > 0 {
			e.pollsLeft--
		} else {
			e.Status, e.autoSettle = billing.StatusSettled, false
		}
	}
	return e.wire(), true
}

func (s *Server) handleLookup(w http.ResponseWriter, r *http.Request) {
	s.count(func(c *CallCounts) { c.Gets++ })
	key := r.PathValue("key")
	status := http.StatusOK
	defer func() { s.logCall(http.MethodGet, key, status) }()
	if !s.authorized(r) {
		status = http.StatusUnauthorized
		writeError(w, status, "unauthorized", "missing or wrong bearer token")
		return
	}
	if f := s.nextLookupFault(); f != nil {
		status = f.status
		writeError(w, status, "lookup_failed", "failed by fault injection")
		return
	}
	rec, ok := s.lookup(key)
	if !ok {
		status = http.StatusNotFound
		writeError(w, status, "not_found", "no settlement with this idempotency key")
		return
	}
	if s.minimalLookups() {
		writeJSON(w, status, map[string]string{"id": rec.ID, "status": rec.Status,
			"idempotency_key": rec.IdempotencyKey, "settlement_key": rec.SettlementKey})
		return
	}
	writeJSON(w, status, s.recordBody(rec))
}

func (s *Server) nextLookupFault() *fault { return s.nextFaultOf(&s.lookupFaults) }

// nextFaultOf takes the next fault of queue, nil when it is empty.
func (s *Server) nextFaultOf(queue *[]fault) *fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(*queue) == 0 {
		return nil
	}
	f := (*queue)[0]
	*queue = (*queue)[1:]
	s.calls.Faults++
	return &f
}

// recordBody is rec as this provider writes it in a reply: as is, or without its
// null fields when it omits nulls.
func (s *Server) recordBody(rec WireRecord) any {
	s.mu.Lock()
	omit := s.omitNulls
	s.mu.Unlock()
	return recordBody(rec, omit)
}

func recordBody(rec WireRecord, omitNulls bool) any {
	if !omitNulls {
		return rec
	}
	return withoutNulls(rec)
}

// withoutNulls is v's JSON object with every null member left out, at any depth.
func withoutNulls(v any) json.RawMessage {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("fake billing: encode record: %v", err)) // WireRecord always encodes
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return raw // not an object
	}
	for name, value := range fields {
		switch {
		case isNull(value):
			delete(fields, name)
		case len(bytes.TrimSpace(value)) > 0 && bytes.TrimSpace(value)[0] == '{':
			fields[name] = withoutNulls(value)
		}
	}
	out, err := json.Marshal(fields)
	if err != nil {
		panic(fmt.Sprintf("fake billing: encode record: %v", err))
	}
	return out
}

func (s *Server) minimalLookups() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.minimal
}

// cursor positions List after one record, by the ledger's sort key, so pages stay
// stable while new records are appended.
type cursor struct {
	nanos int64
	seq   int64
}

func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d:%d", c.nanos, c.seq))
}

func parseCursor(s string) (cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, errors.New("malformed cursor")
	}
	var c cursor
	if _, err := fmt.Sscanf(string(raw), "%d:%d", &c.nanos, &c.seq); err != nil {
		return cursor{}, errors.New("malformed cursor")
	}
	return c, nil
}

func (c cursor) before(e *entry) bool {
	if n := e.CreatedAt.UnixNano(); n != c.nanos {
		return c.nanos < n
	}
	return c.seq < e.seq
}

type listPage struct {
	Items []any `json:"items"` // WireRecord, or its JSON without nulls

	NextCursor string `json:"next_cursor"`
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	s.count(func(c *CallCounts) { c.Lists++ })
	if !s.authorized(r) {
		writeError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token")
		return
	}
	if f := s.nextFaultOf(&s.listFaults); f != nil {
		writeError(w, f.status, "list_failed", "failed by fault injection")
		return
	}
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_since", "since must be RFC 3339")
			return
		}
		since = t
	}
	var after *cursor
	if v := r.URL.Query().Get("cursor"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_cursor", err.Error())
			return
		}
		after = &c
	}

	s.mu.Lock()
	page := listPage{Items: []any{}}
	var last *entry
	more := false
	sorted := s.sortedLocked()
	// The page starts at the first record at or after since and after the cursor
	// (both hold for a suffix of the List order).
	first := sort.Search(len(sorted), func(i int) bool {
		e := sorted[i]
		return !e.CreatedAt.Before(since) && (after == nil || after.before(e))
	})
	for _, e := range sorted[first:] {
		if len(page.Items) == s.opts.PageSize {
			more = true
			break
		}
		page.Items = append(page.Items, recordBody(e.wire(), s.omitNulls))
		last = e
	}
	if more {
		page.NextCursor = cursor{nanos: last.CreatedAt.UnixNano(), seq: last.seq}.String()
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, page)
}
