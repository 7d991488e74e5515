// Package fakebilling is a billing provider that speaks the generic HTTP contract
// (docs/design.md §6.1) over a real socket, keeps a ledger, and misbehaves on request.
//
// It exists so that "exactly one charge" can be asserted against the provider's own
// books rather than against calls a mock recorded: tests and the demo inject the
// failures that matter for money — a 5xx, a rate limit, a commit whose reply is lost, a
// provider that is down — and then check Charges(settlementKey) is 0 or 1.
//
// The wire format is implemented here independently of internal/billing (its own JSON
// types, strict decoding), so the adapter's tests catch a drift from the contract
// instead of agreeing with themselves.
package fakebilling

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// holdFor is how long a commit-then-timeout connection is kept open without a reply;
// any sane client timeout is shorter, and the connection closes earlier when the
// client hangs up or the server closes.
const holdFor = 30 * time.Second

// Errors returned by SetStatus and Import, so the admin API can map them to 404/409.
var (
	errNoRecord  = errors.New("no record")
	errDuplicate = errors.New("already has a record")
)

// Options configures a fake provider.
type Options struct {
	// Token is the required bearer token on /settlements; "" disables authentication.
	Token string
	// Addr is the listen address; default 127.0.0.1:0 (a free loopback port).
	Addr string
	// PendingPolls is how many GETs a new record answers "pending" before it answers
	// "settled", to exercise the operator's polling; 0 settles at once.
	PendingPolls int
	// UsagePrice, when set, prices usage: a usage-only request is charged UsagePrice
	// minor units of USD per whole unit of quantity, reported as the record's amount
	// (as a provider that prices usage itself does). 0 reports no amount.
	UsagePrice int64
	// PageSize is the List page size, default 100; small values exercise paging.
	PageSize int
	// OmitNulls leaves every null field out of the records it answers with (GET,
	// POST and List), as a provider that follows the common JSON convention does: a
	// charge's record then has no "reverses" at all. Without it, every contract field
	// is present, null when it has no value. See SetOmitNulls.
	OmitNulls bool
}

// CallCounts is how often each §6.1 endpoint was called, so tests can assert that a
// path was (or was not) exercised — e.g. that an ambiguous outcome led to a GET.
type CallCounts struct {
	// Posts counts POST /settlements requests, including rejected and faulted ones.
	Posts int `json:"posts"`
	// Gets counts GET /settlements/{key} requests.
	Gets int `json:"gets"`
	// Lists counts GET /settlements requests.
	Lists int `json:"lists"`
	// Faults counts injected faults that were served.
	Faults int `json:"faults"`
}

// Server is a running fake provider. All methods are safe for concurrent use.
type Server struct {
	opts    Options
	handler http.Handler

	mu    sync.Mutex
	byKey map[string]*entry // idempotency key -> ledger entry
	// forgotten holds entries whose key the provider no longer deduplicates (its
	// idempotency window passed, see ForgetKeys): they still count as charges, and a
	// lookup by key still finds the newest entry of a key.
	forgotten []*entry
	// sorted caches the ledger in List order (nil: rebuild); new entries sort last.
	sorted       []*entry
	lookupFaults []fault         // consumed one per GET /settlements/{key}
	listFaults   []fault         // consumed one per GET /settlements
	minimal      bool            // lookups answer only id, status and the keys (see MinimalLookups)
	omitNulls    bool            // records leave out their null fields (see SetOmitNulls)
	log          []Call          // every §6.1 call, in order
	inFlight     map[string]bool // idempotency keys being processed right now
	faults       []fault         // consumed one per POST, in the order they were queued
	calls        CallCounts
	seq          int64

	netMu   sync.Mutex // guards the listener lifecycle below
	addr    string     // resolved host:port, reused when coming back up
	httpSrv *http.Server
	ln      *onceCloseListener // httpSrv's listener, so it can stop accepting first
	down    bool
	downGen int // bumps on every SetDown, so a stale down_for_ms timer does nothing
	closed  bool
	held    map[net.Conn]struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

// Start listens on opts.Addr and serves the §6.1 API and the /_admin/ API.
func Start(opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 100
	}
	if opts.PendingPolls < 0 {
		return nil, fmt.Errorf("fake billing: PendingPolls %d is negative", opts.PendingPolls)
	}
	s := &Server{
		opts:      opts,
		omitNulls: opts.OmitNulls,
		byKey:     map[string]*entry{},
		inFlight:  map[string]bool{},
		held:      map[net.Conn]struct{}{},
		done:      make(chan struct{}),
	}
	s.handler = s.routes()
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("fake billing: listen on %s: %w", opts.Addr, err)
	}
	s.addr = ln.Addr().String()
	s.netMu.Lock()
	s.serveLocked(ln)
	s.netMu.Unlock()
	return s, nil
}

// URL is the provider's base URL, to use as the BillingProvider endpoint.
func (s *Server) URL() string { return "http://" + s.addr }

// Addr is the host:port the provider listens on.
func (s *Server) Addr() string { return s.addr }

// Close stops serving, drops held connections and waits for the server's goroutines.
// It is idempotent.
func (s *Server) Close() error {
	s.netMu.Lock()
	if s.closed {
		s.netMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	var err error
	if s.httpSrv != nil {
		err = s.httpSrv.Close()
		s.httpSrv = nil
	}
	for c := range s.held {
		_ = c.Close()
	}
	s.netMu.Unlock()
	s.wg.Wait()
	if err != nil {
		return fmt.Errorf("fake billing: close: %w", err)
	}
	return nil
}

// serveLocked serves on ln with a fresh http.Server (one cannot be restarted after
// Close). netMu must be held.
func (s *Server) serveLocked(ln net.Listener) {
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	s.httpSrv = srv
	s.ln = &onceCloseListener{Listener: ln}
	ln = s.ln
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = srv.Serve(ln) // returns http.ErrServerClosed on SetDown/Close
	}()
}

// SetDown takes the provider off the network (down=true): the listener is closed and
// every open connection dropped, so clients see "connection refused" — the provably
// not-received case. down=false listens again on the same port.
func (s *Server) SetDown(down bool) error {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	s.downGen++
	return s.setDownLocked(down)
}

func (s *Server) setDownLocked(down bool) error {
	if s.closed {
		return errors.New("fake billing: server is closed")
	}
	if down == s.down {
		return nil
	}
	if down {
		err := s.httpSrv.Close()
		s.httpSrv, s.down = nil, true
		if err != nil {
			return fmt.Errorf("fake billing: go down: %w", err)
		}
		return nil
	}
	ln, err := listenAgain(s.addr)
	if err != nil {
		return fmt.Errorf("fake billing: come back up on %s: %w", s.addr, err)
	}
	s.serveLocked(ln)
	s.down = false
	return nil
}

// stopAccepting closes the listener and leaves open connections alone, so a reply
// still being written reaches its client while a new dial is refused.
func (s *Server) stopAccepting() {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	if s.ln != nil {
		_ = s.ln.Close()
	}
}

// onceCloseListener lets stopAccepting and http.Server.Close both close the listener.
type onceCloseListener struct {
	net.Listener
	once sync.Once
	err  error
}

func (l *onceCloseListener) Close() error {
	l.once.Do(func() { l.err = l.Listener.Close() })
	return l.err
}

// downFor goes down now and comes back after d, unless SetDown or Close intervened.
func (s *Server) downFor(d time.Duration) error {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	s.downGen++
	gen := s.downGen
	if err := s.setDownLocked(true); err != nil {
		return err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-time.After(d):
		case <-s.done:
			return
		}
		s.netMu.Lock()
		defer s.netMu.Unlock()
		if s.downGen == gen && !s.closed {
			_ = s.setDownLocked(false) // best effort: the port could have been taken meanwhile
		}
	}()
	return nil
}

// listenAgain re-binds a port just released; the kernel may need a moment.
func listenAgain(addr string) (net.Listener, error) {
	var err error
	for range 50 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, err
}

// hold keeps a hijacked connection open without answering until the client hangs up,
// holdFor passes or the server closes: the client's view of a lost reply.
func (s *Server) hold(conn net.Conn) {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	if s.closed {
		_ = conn.Close()
		return
	}
	s.held[conn] = struct{}{}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = conn.SetReadDeadline(time.Now().Add(holdFor))
		_, _ = io.Copy(io.Discard, conn) // returns when the client closes or the deadline passes
		_ = conn.Close()
		s.netMu.Lock()
		delete(s.held, conn)
		s.netMu.Unlock()
	}()
}

// Calls returns how often each endpoint was called so far.
func (s *Server) Calls() CallCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Call is one §6.1 request as the fake saw it, for tests whose assertion is the order
// of what reached the provider (e.g. "no POST before a lookup answered").
type Call struct {
	// Method is POST (submit) or GET (lookup or list).
	Method string
	// Key is the Idempotency-Key of a POST or the key of a lookup; "" for a list.
	Key string
	// Status is the HTTP status the fake answered (0 when it held the connection).
	Status int
}

// CallLog returns every §6.1 call so far, in arrival order.
func (s *Server) CallLog() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.log...)
}

// Posts counts the submissions (POSTs) among calls.
func Posts(calls []Call) int {
	n := 0
	for _, c := range calls {
		if c.Method == http.MethodPost {
			n++
		}
	}
	return n
}

// CallsFor returns the calls for one idempotency key, in order.
func (s *Server) CallsFor(key string) []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Call
	for _, c := range s.log {
		if c.Key == key {
			out = append(out, c)
		}
	}
	return out
}

func (s *Server) logCall(method, key string, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, Call{Method: method, Key: key, Status: status})
}

// ForgetKeys makes the provider forget every key it knows for deduplication, as one
// whose idempotency window has passed: a POST with a known key then creates a second
// record (a second charge), while a lookup by key still finds the record. This is the
// world in which only asking before resubmitting prevents a double charge.
func (s *Server) ForgetKeys() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.byKey {
		s.forgotten = append(s.forgotten, e)
		delete(s.byKey, k)
	}
}

// FailNextLookups makes the next n GET /settlements/{key} answer status (0 means
// 503) without looking anything up; 403 models a token without read scope.
func (s *Server) FailNextLookups(n int, status int) {
	if status == 0 {
		status = http.StatusServiceUnavailable
	}
	s.enqueueOn(&s.lookupFaults, n, fault{kind: faultFail, status: status})
}

// ClearLookupFaults drops the lookup and list faults not consumed yet.
func (s *Server) ClearLookupFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookupFaults, s.listFaults = nil, nil
}

// FailNextLists makes the next n GET /settlements (the listing a reconciliation
// pass walks) answer status (0 means 503) without listing anything.
func (s *Server) FailNextLists(n int, status int) {
	if status == 0 {
		status = http.StatusServiceUnavailable
	}
	s.enqueueOn(&s.listFaults, n, fault{kind: faultFail, status: status})
}

// MinimalLookups makes lookups answer only id, status, idempotency_key and
// settlement_key, like a provider whose GET omits the amount and usage: such a record
// proves nothing about what was charged.
func (s *Server) MinimalLookups(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.minimal = on
}

// SetOmitNulls switches, from the next reply on, between records that leave out their
// null fields (on) and records that send them as null (off); Options.OmitNulls is
// the starting value.
func (s *Server) SetOmitNulls(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.omitNulls = on
}

// Records returns the ledger in creation order (created_at, then arrival).
func (s *Server) Records() []billing.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries := s.sortedLocked()
	out := make([]billing.Record, len(entries))
	for i, e := range entries {
		out[i] = e.record()
	}
	return out
}

// Charges is the number of ledger entries for settlementKey. In any correct run it is
// 0 or 1, whatever faults were injected: that is the exactly-once assertion.
func (s *Server) Charges(settlementKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.allLocked() {
		if e.SettlementKey == settlementKey {
			n++
		}
	}
	return n
}

// allLocked is every ledger entry, forgotten keys included. mu must be held.
func (s *Server) allLocked() []*entry {
	out := make([]*entry, 0, len(s.byKey)+len(s.forgotten))
	for _, e := range s.byKey {
		out = append(out, e)
	}
	return append(out, s.forgotten...)
}

// chargeCounts is Charges for every settlement key, for the admin ledger.
func (s *Server) chargeCounts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, e := range s.allLocked() {
		out[e.SettlementKey]++
	}
	return out
}

// SetStatus moves every record of settlementKey to status ("pending", "settled" or
// "failed") with reason, as the provider deciding later would. Records changed this
// way no longer settle by themselves after PendingPolls.
func (s *Server) SetStatus(settlementKey, status, reason string) error {
	switch status {
	case billing.StatusPending, billing.StatusSettled, billing.StatusFailed:
	default:
		return fmt.Errorf("fake billing: status %q is not pending, settled or failed", status)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.allLocked() {
		if e.SettlementKey == settlementKey {
			e.Status, e.FailureReason, e.autoSettle = status, reason, false
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("fake billing: settlement key %q: %w", settlementKey, errNoRecord)
	}
	return nil
}

// Import adds a record the operator never submitted (created out of band, or by a
// previous installation), for reconciliation tests. Missing ID, status, type and
// creation time are filled in.
func (s *Server) Import(rec billing.Record) error {
	if rec.IdempotencyKey == "" || rec.SettlementKey == "" {
		return errors.New("fake billing: an imported record needs an idempotency key and a settlement key")
	}
	e := &entry{
		ID: rec.ID, Status: rec.Status, FailureReason: rec.FailureReason, IdempotencyKey: rec.IdempotencyKey,
		CreatedAt: rec.CreatedAt,
		params: params{
			SettlementKey: rec.SettlementKey, Type: rec.Type, Customer: rec.Customer,
			Metadata: map[string]string{},
		},
	}
	if rec.Usage != nil {
		q, err := billing.QuantityNumber(rec.Usage.Quantity)
		if err != nil {
			return fmt.Errorf("fake billing: import: %w", err)
		}
		e.Usage = &usageParams{Meter: rec.Usage.Meter, Quantity: q.String(), Unit: rec.Usage.Unit}
	}
	if rec.Amount != nil {
		a := *rec.Amount
		e.Amount = &a
	}
	if e.Status == "" {
		e.Status = billing.StatusSettled
	}
	if e.Type == "" {
		e.Type = billing.TypeCharge
	}
	if e.CreatedAt.IsZero() {
		e.CreatedAt = time.Now().UTC()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byKey[e.IdempotencyKey]; ok {
		return fmt.Errorf("fake billing: idempotency key %q: %w", e.IdempotencyKey, errDuplicate)
	}
	s.seq++
	e.seq = s.seq
	if e.ID == "" {
		e.ID = fmt.Sprintf("imp_%06d", e.seq)
	}
	s.byKey[e.IdempotencyKey] = e
	s.addedLocked(e)
	return nil
}

// sortedLocked returns the ledger in List order; callers must not modify it. mu must
// be held. It is cached: a reconciliation pass lists page after page of a ledger
// that a benchmark grows to tens of thousands of records.
func (s *Server) sortedLocked() []*entry {
	if s.sorted == nil {
		s.sorted = s.allLocked()
		sort.Slice(s.sorted, func(i, j int) bool { return s.sorted[i].before(s.sorted[j]) })
	}
	return s.sorted
}

// addedLocked keeps the cached order when e is a new entry. mu must be held.
func (s *Server) addedLocked(e *entry) {
	if n := len(s.sorted); n > 0 && s.sorted[n-1].before(e) {
		s.sorted = append(s.sorted, e)
		return
	}
	s.sorted = nil
}

// commit applies the provider-side idempotency rule: a new key becomes one ledger
// entry; a known key with equal parameters returns the existing record; a known key
// with other parameters is refused (reused=true). It returns a snapshot, because the
// entry may change (SetStatus) while the reply is written.
func (s *Server) commit(key string, p params) (rec WireRecord, created, reused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.byKey[key]; ok {
		if !e.params.equal(p) {
			return WireRecord{}, false, true
		}
		return e.wire(), false, false
	}
	s.seq++
	e := &entry{
		seq: s.seq, ID: fmt.Sprintf("set_%06d", s.seq), Status: billing.StatusSettled,
		IdempotencyKey: key, CreatedAt: time.Now().UTC(), params: p,
	}
	if s.opts.PendingPolls > 0 {
		e.Status, e.autoSettle, e.pollsLeft = billing.StatusPending, true, s.opts.PendingPolls
	}
	if s.opts.UsagePrice > 0 && p.Amount == nil && p.Usage != nil {
		whole, _, _ := strings.Cut(p.Usage.Quantity, ".")
		if n, err := strconv.ParseInt(whole, 10, 64); err == nil {
			e.priced = &billing.Amount{Minor: n * s.opts.UsagePrice, Currency: "USD"}
		}
	}
	s.byKey[key] = e
	s.addedLocked(e)
	return e.wire(), true, false
}
