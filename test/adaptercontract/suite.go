package adaptercontract

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
)

// Timeout is the request timeout the suite builds every client with: short, so that
// the commit-then-timeout row is quick, and far above a loopback round trip.
const Timeout = 2 * time.Second

// RetryAfterFixture is a Fixture whose platform's rate-limit answer asks for a wait:
// RetryAfter is that wait, as the platform's documented headers carry it, or 0 when the
// platform sends none. A fixture that does not implement it is held to a rate-limit
// answer with some RetryAfter (most platforms send one).
type RetryAfterFixture interface {
	RetryAfter() time.Duration
}

// LookupFaultFixture is a Fixture whose platform can be asked (a lookup by key or by
// listing): FailLookups makes its next n reads (a lookup, a listing page) answer a
// server error, as the platform documents one. Every fixture whose adapter declares a
// lookup implements it: a read that fails must never read as "not found", which would
// send the request again.
type LookupFaultFixture interface {
	FailLookups(n int)
}

// WindowFixture is a Fixture whose platform can be asked: PassWindow makes the
// platform's deduplication window pass for every key it holds (a resend would be new
// usage), while its books and its reads keep everything. Every fixture whose adapter
// declares a lookup implements it: past the window, the lookup is the only answer.
type WindowFixture interface {
	PassWindow()
}

// ClockFixture is a fake whose windows are measured on a clock of its own (moved by
// PassWindow): the adapter is built on the same clock (adapters.Settings.Now), so that
// both see the window pass.
type ClockFixture interface {
	Now() time.Time
}

// many is how many charges the row "many charges" sends: more than one page of any
// platform's listing (100 is the usual largest page).
const many = 130

// concurrency is how many copies of one request the concurrent-duplicate row sends at
// once.
const concurrency = 8

// row is one line of the contract: the billing rows of the failure matrix
// (docs/design.md §9) and what the declared capabilities promise (§14).
type row struct {
	name string
	run  func(c *contract)
}

// rows is the contract, in the order a reader meets the failure matrix.
var rows = []row{
	{"capabilities are declared in one place", (*contract).capabilitiesDeclared},
	{"duplicate delivery, sequential", (*contract).duplicateSequential},
	{"duplicate delivery, concurrent", (*contract).duplicateConcurrent},
	{"billing fails, then a retry with the same key", (*contract).failsThenRetries},
	{"billing commits, the reply is lost", (*contract).commitThenTimeout},
	{"provider down", (*contract).providerDown},
	{"rate limited", (*contract).rateLimited},
	{"refused", (*contract).refused},
	{"lookup of a key never sent", (*contract).lookupNeverSent},
	{"a lookup the platform fails", (*contract).lookupFails},
	{"past the key window", (*contract).pastWindow},
	{"reconciliation finds the charge", (*contract).reconciliationFinds},
	{"many charges", (*contract).manyCharges},
	{"a refused credential", (*contract).refusedCredential},
	{"the client does not show the credential", (*contract).clientHidesCredential},
}

// Option changes how Run holds an adapter to the contract.
type Option func(*options)

type options struct {
	gaps map[string]string // row -> why it fails today
}

// KnownGap names a row the adapter fails today and why: the row still runs, and Run
// requires it to fail — so the gap is written down where the suite runs, and a fix
// that closes it fails the suite until the line is removed. A name that is no row fails.
func KnownGap(row, why string) Option {
	return func(o *options) { o.gaps[row] = why }
}

// Rows are the names of the contract's rows, in order.
func Rows() []string {
	out := make([]string, len(rows))
	for i, rw := range rows {
		out[i] = rw.name
	}
	return out
}

// Run holds the adapter that serves newFixture's provider type to the contract: every
// row gets a fresh fixture (a fake with empty books) and a client built by the registry
// (adapters.New) from the fixture's BillingProvider and credential, as the operator
// builds it. Rows speak in billing's terms and the declared capabilities only; every
// assertion names the row and the fixture.
func Run(t *testing.T, newFixture func(t *testing.T) Fixture, opts ...Option) {
	t.Helper()
	o := options{gaps: map[string]string{}}
	for _, opt := range opts {
		opt(&o)
	}
	for name := range o.gaps {
		if !slices.Contains(Rows(), name) {
			t.Errorf("known gap %q names no row of the contract (rows: %s)", name, strings.Join(Rows(), "; "))
		}
	}
	for _, rw := range rows {
		t.Run(rw.name, func(t *testing.T) {
			why, gap := o.gaps[rw.name]
			c := &contract{t: t, row: rw.name, gap: gap}
			c.runRow(func() {
				f := newFixture(t)
				t.Cleanup(f.Close)
				bp, token := f.Provider()
				c.f, c.bp, c.token = f, bp, token
				c.label = fmt.Sprintf("%s fixture %s", f.Type(), fixtureName(t))
				if bp.Spec.Type != f.Type() {
					c.fatalf("the BillingProvider's spec.type is %q, the fixture serves %q", bp.Spec.Type, f.Type())
				}
				c.client = c.build(bp, token)
				rw.run(c)
			})
			switch {
			case gap && !c.failed:
				t.Errorf("%s [%s]: listed as a known gap (%s), yet the row passes: remove it from the list", rw.name, c.label, why)
			case gap:
				t.Logf("%s [%s]: fails, a known gap: %s", rw.name, c.label, why)
			}
		})
	}
}

// gapAbort ends a known gap's row at its first fatal failure.
type gapAbort struct{}

// runRow runs a row; a known gap's fatal failure ends it without failing the test.
func (c *contract) runRow(row func()) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(gapAbort); !ok {
				panic(r)
			}
		}
	}()
	row()
}

// fixtureName is the test's name without the row: the name the list of fixtures gave.
func fixtureName(t *testing.T) string {
	name := t.Name()
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[:i]
	}
	if i := strings.Index(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	return name
}

// contract is one row's world: its fixture, its client and how it reports. In a known
// gap's row, failures are logged and remembered (failed) instead of failing the test.
type contract struct {
	t      *testing.T
	row    string
	gap    bool
	mu     sync.Mutex
	failed bool
	label  string
	f      Fixture
	bp     *hooksv1alpha1.BillingProvider
	token  string
	client billing.Client
}

// errorf and fatalf prefix every message with the row and the fixture.
func (c *contract) errorf(format string, args ...any) {
	c.t.Helper()
	if c.gap {
		c.mu.Lock()
		c.failed = true
		c.mu.Unlock()
		c.t.Logf("%s [%s]: %s", c.row, c.label, fmt.Sprintf(format, args...))
		return
	}
	c.t.Errorf("%s [%s]: %s", c.row, c.label, fmt.Sprintf(format, args...))
}

func (c *contract) fatalf(format string, args ...any) {
	c.t.Helper()
	if c.gap {
		c.errorf(format, args...)
		panic(gapAbort{})
	}
	c.t.Fatalf("%s [%s]: %s", c.row, c.label, fmt.Sprintf(format, args...))
}

func (c *contract) build(bp *hooksv1alpha1.BillingProvider, token string) billing.Client {
	c.t.Helper()
	settings := adapters.Settings{Provider: bp, Token: token, Timeout: Timeout}
	if clock, ok := c.f.(ClockFixture); ok {
		settings.Now = clock.Now
	}
	client, err := adapters.New(settings)
	if err != nil {
		c.noCredential(err)
		c.fatalf("the registry cannot build the adapter: %v", err)
	}
	return client
}

// charge is the fixture's charge under a fresh key, so rows never share a key.
func (c *contract) charge(prefix string) billing.Request {
	c.t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		c.fatalf("random key: %v", err)
	}
	r := c.f.Charge("ct-" + prefix + "-" + hex.EncodeToString(b))
	if !r.KeyNamespaced {
		c.fatalf("the fixture's charge is not KeyNamespaced, as every settlement the operator creates is")
	}
	return r
}

func (c *contract) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*Timeout)
	c.t.Cleanup(cancel)
	return ctx
}

func (c *contract) caps(r billing.Request) billing.Capabilities {
	return billing.CapabilitiesOf(c.client, r)
}

// submit sends r and checks that no error carries the credential.
func (c *contract) submit(r billing.Request) (billing.Record, error) {
	c.t.Helper()
	rec, err := c.client.Submit(c.ctx(), r)
	c.noCredential(err)
	return rec, err
}

// lookup asks for r's record as the controllers do (billing.LookupFor), r first
// submitted at since.
func (c *contract) lookup(r billing.Request, since time.Time) (billing.Record, bool, error) {
	c.t.Helper()
	r.FirstSubmittedAt = since
	rec, found, err := billing.LookupFor(c.ctx(), c.client, r)
	c.noCredential(err)
	return rec, found, err
}

// classified is err's *billing.Error; an unclassified error fails the row.
func (c *contract) classified(what string, err error) *billing.Error {
	c.t.Helper()
	if err == nil {
		c.fatalf("%s: no error", what)
	}
	e, ok := billing.AsError(err)
	if !ok {
		c.fatalf("%s: error %q carries no billing.Error: the adapter must classify every error", what, err)
	}
	return e
}

// noCredential fails the row when err's text shows the credential.
func (c *contract) noCredential(err error) {
	c.t.Helper()
	if err != nil && c.token != "" && strings.Contains(err.Error(), c.token) {
		c.errorf("an error carries the credential: %s", strings.ReplaceAll(err.Error(), c.token, "<credential>"))
	}
}

// matches fails the row unless rec is provably r.
func (c *contract) matches(what string, r billing.Request, rec billing.Record) {
	c.t.Helper()
	if m, ok := billing.Match(r, rec); !ok {
		c.errorf("%s: the record is not provably the request: %s", what, m)
	}
	switch rec.Status {
	case billing.StatusPending, billing.StatusSettled, billing.StatusFailed:
	default:
		c.errorf("%s: the record's status %q is not pending, settled or failed", what, rec.Status)
	}
}

func (c *contract) effects(what string, r billing.Request, want int) {
	c.t.Helper()
	if n := c.f.Effects(r.IdempotencyKey); n != want {
		c.errorf("%s: the platform's books hold %d effects under the key, want %d", what, n, want)
	}
}

// resent checks a resend of r that the platform already committed: either it answers
// with a record that is provably r, or — only where the capabilities do not make a
// resend proof — it fails with an error that does not say "not committed" or "will be
// refused again", and a lookup by the declared means finds r.
func (c *contract) resent(what string, r billing.Request, rec billing.Record, err error, since time.Time) {
	c.t.Helper()
	caps := c.caps(r)
	if err == nil {
		c.matches(what, r, rec)
		return
	}
	e := c.classified(what, err)
	if caps.ResendIsProof {
		c.errorf("%s: the capabilities make a resend proof, yet it failed: %v", what, err)
		return
	}
	if e.Class == billing.Transient && !e.InFlight {
		c.errorf("%s: a resend of a committed request answered Transient (certainly not committed): %v", what, err)
	}
	if caps.Lookup == billing.LookupNone {
		c.errorf("%s: a resend failed (%v) and the capabilities offer no lookup and no proof by resend: nothing can answer", what, err)
		return
	}
	found, ok, lerr := c.lookup(r, since)
	if lerr != nil || !ok {
		c.errorf("%s: after a failed resend (%v) the lookup finds nothing (found=%t, err=%v)", what, err, ok, lerr)
		return
	}
	c.matches(what+", then looked up", r, found)
}

func (c *contract) capabilitiesDeclared() {
	r := c.charge("caps")
	declared, built := adapters.Capabilities(c.bp, r), c.caps(r)
	if declared != built {
		c.errorf("the registry declares %+v for the fixture's charge, the client reports %+v: they must be one declaration", declared, built)
	}
	if built.Lookup == billing.LookupNone && !built.ResendIsProof {
		// Nothing can answer for a charge whose reply was lost: the commit-then-timeout
		// row holds such an adapter to claiming no answer at all.
		c.t.Logf("%s [%s]: neither a lookup nor a resend can prove a charge: every lost reply needs a human", c.row, c.label)
	}
}

// notDeduplicated says whether the capabilities declare that the platform counts a
// resend again: then the operator never sends a request twice once an attempt may
// have reached it, and the rows that resend stop there.
func (c *contract) notDeduplicated(r billing.Request) bool {
	if c.caps(r).NoDeduplication {
		c.t.Logf("%s [%s]: the capabilities declare no deduplication: the operator never resends what may have reached the platform, so the row sends no copy",
			c.row, c.label)
		return true
	}
	return false
}

func (c *contract) duplicateSequential() {
	r := c.charge("dup")
	start := time.Now()
	rec, err := c.submit(r)
	if err != nil {
		c.fatalf("the first submission failed: %v", err)
	}
	c.matches("the first submission", r, rec)
	c.effects("after the first submission", r, 1)
	if c.notDeduplicated(r) {
		return
	}
	for i := 2; i <= 3; i++ {
		rec, err := c.submit(r)
		c.resent(fmt.Sprintf("submission %d of the same request", i), r, rec, err, start)
		c.effects(fmt.Sprintf("after submission %d", i), r, 1)
	}
}

func (c *contract) duplicateConcurrent() {
	r := c.charge("conc")
	start := time.Now()
	if c.notDeduplicated(r) {
		return
	}
	type result struct {
		rec billing.Record
		err error
	}
	results := make([]result, concurrency)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			rec, err := c.client.Submit(context.Background(), r)
			results[i] = result{rec, err}
		}()
	}
	close(gate)
	wg.Wait()
	ok := 0
	for i, res := range results {
		c.noCredential(res.err)
		if res.err == nil {
			ok++
			c.matches(fmt.Sprintf("concurrent submission %d", i+1), r, res.rec)
			continue
		}
		if e := c.classified(fmt.Sprintf("concurrent submission %d", i+1), res.err); e.Class == billing.Terminal {
			c.errorf("concurrent submission %d answered Terminal (stop, refused again) while a copy of it may commit: %v", i+1, res.err)
		}
	}
	c.effects(fmt.Sprintf("after %d concurrent submissions (%d answered a record)", concurrency, ok), r, 1)
	// The settlement's next attempt, after the storm, is answered.
	rec, err := c.submit(r)
	c.resent("the submission after the concurrent ones", r, rec, err, start)
	c.effects("after the concurrent submissions and one more", r, 1)
}

func (c *contract) failsThenRetries() {
	r := c.charge("fail")
	start := time.Now()
	c.f.Fail(Unavailable, 1)
	_, err := c.submit(r)
	e := c.classified("a submission the platform fails", err)
	if e.Class == billing.Terminal {
		c.errorf("a server error answered Terminal: the settlement would stop although a retry may succeed: %v", err)
	}
	c.effects("after the failed submission (the platform committed nothing)", r, 0)
	if e.Class != billing.Transient && c.notDeduplicated(r) {
		return
	}
	rec, err := c.submit(r)
	if err != nil {
		c.fatalf("the retry with the same key failed: %v", err)
	}
	c.matches("the retry", r, rec)
	c.effects("after the retry", r, 1)
	if c.notDeduplicated(r) {
		return
	}
	rec, err = c.submit(r)
	c.resent("a further resend", r, rec, err, start)
	c.effects("after a further resend", r, 1)
}

func (c *contract) commitThenTimeout() {
	r := c.charge("lost")
	start := time.Now()
	c.f.Fail(CommitThenTimeout, 1)
	_, err := c.submit(r)
	if e := c.classified("a submission whose reply is lost", err); e.Class != billing.Ambiguous {
		c.fatalf("a submission the platform committed without replying answered %s, want Ambiguous (it may have committed): %v", e.Class, err)
	}
	c.effects("after the lost reply (the platform committed)", r, 1)
	caps := c.caps(r)
	switch caps.Lookup {
	case billing.LookupByKey, billing.LookupByListing:
		rec, found, err := c.lookup(r, start)
		switch {
		case err != nil:
			c.errorf("the lookup (%s) after a lost reply failed: %v", caps.Lookup, err)
		case !found:
			c.errorf("the lookup (%s) after a lost reply finds nothing, yet the platform committed the request", caps.Lookup)
		default:
			c.matches("the lookup after a lost reply", r, rec)
		}
	case billing.LookupNone:
		rec, found, err := c.lookup(r, start)
		if err == nil && found {
			if _, ok := billing.Match(r, rec); ok {
				c.errorf("the capabilities declare no lookup, yet the lookup claims a record that matches: an answer the adapter says it cannot give")
			}
		}
		if err != nil {
			if e := c.classified("the lookup the capabilities say cannot answer", err); !e.Unanswerable {
				c.errorf("the lookup the capabilities say cannot answer failed without saying so (Unanswerable): %v", err)
			}
		}
	}
	if caps.ResendIsProof {
		rec, err := c.submit(r)
		if err != nil {
			c.errorf("the capabilities make a resend inside the window proof, yet the resend failed: %v", err)
		} else {
			c.matches("the resend after a lost reply", r, rec)
		}
		c.effects("after the resend", r, 1)
	} else if caps.Lookup == billing.LookupNone {
		c.t.Logf("%s [%s]: neither a lookup nor a resend is proof (Lookup %s, ResendIsProof false): the adapter claims no answer",
			c.row, c.label, caps.Lookup)
	}
}

func (c *contract) providerDown() {
	r := c.charge("down")
	bp := c.bp.DeepCopy()
	down, err := refusingEndpoint(bp.Spec.Endpoint)
	if err != nil {
		c.fatalf("%v", err)
	}
	bp.Spec.Endpoint = down
	client := c.build(bp, c.token)
	_, err = client.Submit(c.ctx(), r)
	c.noCredential(err)
	if e := c.classified("a submission to a provider that refuses connections", err); e.Class != billing.Transient {
		c.errorf("a refused connection answered %s, want Transient (certainly not received): %v", e.Class, err)
	}
	c.effects("after a refused connection", r, 0)
}

// refusingEndpoint is endpoint with its host:port replaced by a loopback port nothing
// listens on: a connection to it is refused.
func refusingEndpoint(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("the fixture's endpoint %q is not a URL with a host", endpoint)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	u.Host = ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", fmt.Errorf("free the port: %w", err)
	}
	return u.String(), nil
}

func (c *contract) rateLimited() {
	r := c.charge("rate")
	c.f.Fail(RateLimited, 1)
	_, err := c.submit(r)
	e := c.classified("a rate-limited submission", err)
	if e.Class != billing.Transient {
		c.errorf("a rate limit answered %s, want Transient (nothing committed): %v", e.Class, err)
	}
	if ra, ok := c.f.(RetryAfterFixture); ok {
		want := ra.RetryAfter()
		if d := e.RetryAfter - want; d < -time.Second || d > time.Second {
			c.errorf("a rate limit asking for %s carries RetryAfter %s", want, e.RetryAfter)
		}
	} else if e.RetryAfter <= 0 {
		c.errorf("a rate limit carries no RetryAfter: the platform's wait is lost (a fixture whose platform sends none says so with RetryAfterFixture)")
	}
	c.effects("after the rate limit", r, 0)
	rec, err := c.submit(r)
	if err != nil {
		c.fatalf("the retry after the rate limit failed: %v", err)
	}
	c.matches("the retry after the rate limit", r, rec)
	c.effects("after the retry", r, 1)
}

func (c *contract) refused() {
	r := c.charge("refused")
	c.f.Fail(Refused, 2)
	for i := 1; i <= 2; i++ {
		_, err := c.submit(r)
		e := c.classified(fmt.Sprintf("refused submission %d", i), err)
		if e.Class != billing.Terminal {
			c.errorf("refused submission %d answered %s, want Terminal (refused again): %v", i, e.Class, err)
		}
		if e.KeyReused || e.InFlight || e.Message == "" {
			c.errorf("refused submission %d is not a plain refusal with a reason (KeyReused %t, InFlight %t, message %q)",
				i, e.KeyReused, e.InFlight, e.Message)
		}
		c.effects(fmt.Sprintf("after refused submission %d", i), r, 0)
	}
}

func (c *contract) lookupNeverSent() {
	r := c.charge("never")
	caps := c.caps(r)
	rec, found, err := c.lookup(r, time.Time{})
	switch {
	case caps.Lookup == billing.LookupNone:
		if err == nil {
			c.errorf("the capabilities declare no lookup, yet the lookup answered (found=%t, record %q) instead of Unanswerable", found, rec.ID)
		} else if e := c.classified("the lookup the capabilities say cannot answer", err); !e.Unanswerable {
			c.errorf("the capabilities declare no lookup, and the lookup failed without saying it cannot answer (Unanswerable): %v", err)
		}
	case err != nil:
		// A platform that ingests asynchronously cannot prove an absence: it may say so.
		if e := c.classified("the lookup of a key never sent", err); !e.Unanswerable {
			c.errorf("the lookup (%s) of a key never sent failed, want not found (or Unanswerable): %v", caps.Lookup, err)
		}
	case found:
		c.errorf("the lookup (%s) of a key never sent found record %q", caps.Lookup, rec.ID)
	}
	c.effects("after the lookup", r, 0)
}

// lookupFails: a read the platform fails is an error that says "ask again", never
// "not found"; the next lookup answers.
func (c *contract) lookupFails() {
	r := c.charge("lookupfail")
	start := time.Now()
	caps := c.caps(r)
	if caps.Lookup == billing.LookupNone {
		// Nothing is read: the lookup answers Unanswerable without asking the platform
		// (the rows "billing commits, the reply is lost" and "lookup of a key never
		// sent" hold it to that).
		return
	}
	faulty, ok := c.f.(LookupFaultFixture)
	if !ok {
		c.fatalf("the capabilities declare a lookup (%s), and the fixture cannot fail one (LookupFaultFixture)", caps.Lookup)
	}
	if _, err := c.submit(r); err != nil {
		c.fatalf("the submission failed: %v", err)
	}
	faulty.FailLookups(1)
	_, found, err := c.lookup(r, start)
	switch {
	case err == nil:
		c.errorf("a lookup the platform failed answered found=%t without an error: a failed read must never read as an answer", found)
	default:
		if e := c.classified("a lookup the platform failed", err); e.Class != billing.Transient || e.Unanswerable {
			c.errorf("a lookup the platform failed answered %s (Unanswerable %t), want Transient: asking again will answer: %v",
				e.Class, e.Unanswerable, err)
		}
	}
	rec, found, err := c.lookup(r, start)
	if err != nil || !found {
		c.fatalf("the lookup after the failed one finds nothing (found=%t, err=%v)", found, err)
	}
	c.matches("the lookup after the failed one", r, rec)
	c.effects("after the lookups", r, 1)
}

// pastWindow: once the platform's deduplication window has passed, a resend would be
// new usage, so a lookup must never say "not found" of a charge the platform holds: a
// declared lookup finds it, or — a platform that cannot read that far back — says it
// cannot answer (Unanswerable); a provider with no lookup says it cannot answer.
func (c *contract) pastWindow() {
	r := c.charge("window")
	start := time.Now()
	caps := c.caps(r)
	if _, err := c.submit(r); err != nil {
		c.fatalf("the submission failed: %v", err)
	}
	if caps.Lookup != billing.LookupNone {
		aging, ok := c.f.(WindowFixture)
		if !ok {
			c.fatalf("the capabilities declare a lookup (%s), and the fixture cannot pass its window (WindowFixture)", caps.Lookup)
		}
		aging.PassWindow()
	}
	rec, found, err := c.lookup(r, start)
	switch {
	case caps.Lookup == billing.LookupNone:
		if err == nil {
			c.errorf("the capabilities declare no lookup, yet the lookup answered found=%t instead of Unanswerable", found)
		} else if e := c.classified("the lookup the capabilities say cannot answer", err); !e.Unanswerable {
			c.errorf("the capabilities declare no lookup, and the lookup failed without saying it cannot answer (Unanswerable): %v", err)
		}
	case err != nil:
		if e := c.classified("the lookup past the window", err); !e.Unanswerable {
			c.errorf("the lookup (%s) past the window failed without saying it cannot answer (Unanswerable): %v", caps.Lookup, err)
		}
	case !found:
		c.errorf("the lookup (%s) past the window says not found, yet the platform holds the charge: a resend now would charge again", caps.Lookup)
	default:
		c.matches("the lookup past the window", r, rec)
	}
	c.effects("past the window", r, 1)
}

// reconciliationFinds: what reconciliation reads back finds the charge — a listing
// since a time before it holds its record under its idempotency key, or, where the
// platform totals usage instead of listing it (billing.UsageTotaler), the customer's
// total for the meter counts its quantity.
func (c *contract) reconciliationFinds() {
	r := c.charge("list")
	since := time.Now() // just before the charge: the listing's lower bound is inclusive
	rec, err := c.submit(r)
	if err != nil {
		c.fatalf("the submission failed: %v", err)
	}
	c.matches("the submission", r, rec)
	listed, pages, err := c.listAll(since)
	if err != nil {
		c.fatalf("List since %s failed: %v", since.Format(time.RFC3339), err)
	}
	for _, l := range listed {
		if l.IdempotencyKey == r.IdempotencyKey {
			c.matches("the listed record", r, l)
			return
		}
	}
	totaler, ok := billing.UsageTotalsOf(c.client)
	if !ok || r.Usage == nil {
		c.errorf("List since before the charge (%d records, %d pages) does not hold it under its idempotency key, and the adapter totals no usage instead",
			len(listed), pages)
		return
	}
	start, end := totalWindow(r, since)
	total, err := totaler.UsageTotal(c.ctx(), r.Usage.Meter, r.Customer, start, end)
	c.noCredential(err)
	if err != nil {
		c.fatalf("the charge is not listed, and the usage total of meter %q for the customer failed: %v", r.Usage.Meter, err)
	}
	if !billing.SameQuantity(total, r.Usage.Quantity) {
		c.errorf("the usage total of meter %q for the customer is %s, want the charge's %s", r.Usage.Meter, total, r.Usage.Quantity)
	}
}

// manyCharges: with more charges than a page holds, reconciliation reads back each of
// them exactly once (a listing whose pages overlap or skip would report a charge twice
// or not at all), and the lookup of the oldest still finds it behind the newer ones.
func (c *contract) manyCharges() {
	since := time.Now()
	charges := make([]billing.Request, many)
	for i := range charges {
		charges[i] = c.charge(fmt.Sprintf("many%03d", i))
		if _, err := c.submit(charges[i]); err != nil {
			c.fatalf("submission %d of %d failed: %v", i+1, many, err)
		}
	}
	first := charges[0]
	if c.caps(first).Lookup != billing.LookupNone {
		rec, found, err := c.lookup(first, since)
		if err != nil || !found {
			c.errorf("the lookup of the oldest of %d charges finds nothing (found=%t, err=%v)", many, found, err)
		} else {
			c.matches("the lookup of the oldest charge", first, rec)
		}
	}
	listed, pages, err := c.listAll(since)
	if err != nil {
		c.fatalf("List since before %d charges failed: %v", many, err)
	}
	seen := map[string]int{}
	for _, l := range listed {
		seen[l.IdempotencyKey]++
	}
	missing := 0
	for _, r := range charges {
		switch n := seen[r.IdempotencyKey]; {
		case n > 1:
			c.errorf("List (%d pages) holds charge %s %d times", pages, r.IdempotencyKey, n)
		case n == 0:
			missing++
		}
	}
	if missing == 0 {
		for _, l := range listed {
			for _, r := range charges {
				if r.IdempotencyKey == l.IdempotencyKey {
					c.matches("a listed record", r, l)
				}
			}
		}
		return
	}
	totaler, ok := billing.UsageTotalsOf(c.client)
	if missing < many || !ok || first.Usage == nil {
		c.errorf("List since before %d charges (%d pages) misses %d of them, and the adapter totals no usage instead", many, pages, missing)
		return
	}
	want := new(big.Rat)
	for _, r := range charges {
		q, ok := new(big.Rat).SetString(r.Usage.Quantity)
		if !ok {
			c.fatalf("the fixture's quantity %q is not a decimal", r.Usage.Quantity)
		}
		want.Add(want, q)
	}
	start, end := totalWindow(first, since)
	total, err := totaler.UsageTotal(c.ctx(), first.Usage.Meter, first.Customer, start, end)
	c.noCredential(err)
	if err != nil {
		c.fatalf("the usage total of %d charges failed: %v", many, err)
	}
	if !billing.SameQuantity(total, want.RatString()) {
		c.errorf("the usage total of %d charges is %s, want %s", many, total, want.RatString())
	}
}

// totalWindow is a window of whole minutes around r's usage, sent after since.
func totalWindow(r billing.Request, since time.Time) (start, end time.Time) {
	start = since.Add(-time.Hour)
	if !r.OccurredAt.IsZero() && r.OccurredAt.Before(start) {
		start = r.OccurredAt.Add(-time.Hour)
	}
	return start.Truncate(time.Minute), time.Now().Truncate(time.Minute).Add(2 * time.Minute)
}

// listAll pages through List since since; a cursor that does not advance is an error.
func (c *contract) listAll(since time.Time) ([]billing.Record, int, error) {
	var out []billing.Record
	cursor, seen := "", map[string]bool{}
	for pages := 1; ; pages++ {
		items, next, err := c.client.List(c.ctx(), since, cursor)
		c.noCredential(err)
		if err != nil {
			return nil, pages, err
		}
		out = append(out, items...)
		if next == "" {
			return out, pages, nil
		}
		if seen[next] || pages > 1000 {
			return nil, pages, errors.New("List's cursor does not advance")
		}
		seen[next], cursor = true, next
	}
}

// refusedCredential: a credential the platform does not accept is refused, commits
// nothing, and the error does not show it.
func (c *contract) refusedCredential() {
	r := c.charge("cred")
	wrong := c.token + "x9"
	c.token = wrong // noCredential now looks for the wrong one, which is as secret
	client := c.build(c.bp, wrong)
	rec, err := client.Submit(c.ctx(), r)
	c.noCredential(err)
	if err == nil {
		c.fatalf("a credential the platform does not hold was accepted (record %q): the fake must check it", rec.ID)
	}
	c.classified("a submission with a refused credential", err)
	c.effects("after a refused credential", r, 0)
}

// clientHidesCredential: however the client is printed (a log line, a %#v in a debug
// message), the credential is not in it.
func (c *contract) clientHidesCredential() {
	for _, verb := range []string{"%v", "%+v", "%s", "%#v"} {
		if out := fmt.Sprintf(verb, c.client); strings.Contains(out, c.token) {
			c.errorf("the client printed with %s shows the credential", verb)
		}
	}
}
