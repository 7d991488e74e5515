// Package metronomebilling is the billing adapter for Metronome (BillingProvider
// spec.type Metronome), a small typed HTTP client written against Metronome's
// published API reference (Metronome publishes no Go client the module proxy serves).
// It turns the operator's usage charges into Metronome usage events and Metronome's
// answers into billing.Record and billing.Error, so nothing above it knows Metronome's
// vocabulary (docs/design.md §13):
//
//   - a usage charge is one usage event, sent as a batch of one to POST /v1/ingest:
//     transaction_id = the settlement's idempotency key, customer_id = the request's
//     customer (a Metronome customer ID or ingest alias), event_type from the meter
//     mapping, timestamp = when the usage happened (RFC 3339; Metronome takes events
//     backdated up to 34 days and refuses those more than 24 hours ahead), properties
//     = the quantity (as a decimal string, under the meter's quantity property), the
//     settlement key and the unit;
//   - Metronome ignores an event whose transaction_id it accepted in the last 34 days
//     and answers 200 all the same, keeping the FIRST copy whatever the second holds;
//   - an event is found again by transaction ID through POST /v1/events/search, which
//     covers events of the last 34 days: that is the lookup, and billing.Match compares
//     what it returns;
//   - reconciliation compares usage totals per customer and billable metric (POST
//     /v1/usage, UsageTotal in totals.go), since Metronome lists no events by time;
//   - Metronome bills usage only, and offers no deletion or negation of an ingested
//     event: an amount, a refund and a void are refused unsent, terminally, saying
//     what a human does instead.
package metronomebilling

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// DefaultEndpoint is Metronome's API.
const DefaultEndpoint = "https://api.metronome.com"

// Paths of the endpoints the adapter calls.
const (
	IngestPath = "/v1/ingest"
	SearchPath = "/v1/events/search"
	// UsagePath is Metronome's batched usage (aggregated per customer and billable
	// metric), read by reconciliation's usage totals.
	UsagePath = "/v1/usage"
	// CustomersPath lists customers; filtered by ingest_alias it resolves an alias to the
	// Metronome customer ID the usage API is keyed by.
	CustomersPath = "/v1/customers"
)

// Metronome's documented windows.
const (
	// KeyWindow is how long Metronome ignores an event whose transaction_id it has
	// accepted (34 days): the key window of every usage charge.
	KeyWindow = 34 * 24 * time.Hour
	// MaxEventAge is how far back an event may be dated (34 days); an hour is kept in
	// hand so an event is not refused between our check and Metronome's.
	MaxEventAge = KeyWindow - time.Hour
	// MaxFuture is how far ahead of Metronome's clock an event may be dated (24 hours),
	// less the same hour.
	MaxFuture = 24*time.Hour - time.Hour
	// SearchHorizon is how far back the events search sees (events of the last 34
	// days), less the same hour: an event dated before it may be there unseen.
	SearchHorizon = KeyWindow - time.Hour
)

// Property names the adapter writes beside the quantity, so that a searched event can
// be tied to its settlement. A meter's quantity property may not use them.
const (
	PropSettlementKey = "settlement_key"
	PropUnit          = "settlement_unit"
)

// DefaultQuantityProperty is the property that carries the quantity when a meter
// names none.
const DefaultQuantityProperty = "quantity"

// Meter maps one usage meter of the settlements (spec.usage.meter) to Metronome.
type Meter struct {
	// EventType is the usage events' event_type (what the billable metric filters on).
	EventType string
	// QuantityProperty is the property the billable metric aggregates
	// (DefaultQuantityProperty when empty).
	QuantityProperty string
	// BillableMetricID is the Metronome billable metric that sums these events, whose
	// totals reconciliation reads (UsageTotal); empty: not compared.
	BillableMetricID string
}

// Config configures a client.
type Config struct {
	// Endpoint is the API base URL (DefaultEndpoint when empty); tests use the fake.
	Endpoint string
	// Token is the Metronome API bearer token.
	Token string
	// Timeout bounds each call.
	Timeout time.Duration
	// Meters maps usage meters to Metronome event types; a usage charge for a meter not
	// listed is refused (terminal), never sent under a guessed event type.
	Meters map[string]Meter
	// Now is the clock (time.Now), for the 34-day and 24-hour bounds.
	Now func() time.Time
	// HTTPClient makes the calls (billing.NoRedirectClient when nil).
	HTTPClient *http.Client
}

// Client is the Metronome adapter.
type Client struct {
	cfg      Config
	endpoint string
	hc       *http.Client
	meters   map[string]Meter
	aliases  aliasCache
}

var (
	_ billing.Client        = (*Client)(nil)
	_ billing.RequestLooker = (*Client)(nil)
	_ billing.Capable       = (*Client)(nil)
	_ billing.UsageDater    = (*Client)(nil)
	_ billing.UsageTotaler  = (*Client)(nil)
)

// New builds a client; an empty token, an unusable endpoint or a meter without an
// event type is an error naming what is wrong (never the token).
func New(cfg Config) (*Client, error) {
	if strings.TrimSpace(cfg.Token) == "" {
		return nil, errors.New("metronome: the credentials Secret holds an empty API token")
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("metronome endpoint %q is not an http(s) base URL", cfg.Endpoint)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	meters := map[string]Meter{}
	for name, m := range cfg.Meters {
		if m.EventType == "" {
			return nil, fmt.Errorf("metronome meter for usage meter %q has no eventType", name)
		}
		if m.QuantityProperty == "" {
			m.QuantityProperty = DefaultQuantityProperty
		}
		if m.QuantityProperty == PropSettlementKey || m.QuantityProperty == PropUnit {
			return nil, fmt.Errorf("metronome meter for usage meter %q: quantityProperty %q is written by the operator itself", name, m.QuantityProperty)
		}
		if m.BillableMetricID != "" && !uuidPattern.MatchString(m.BillableMetricID) {
			return nil, fmt.Errorf("metronome meter for usage meter %q: billableMetricID %q is not a UUID", name, m.BillableMetricID)
		}
		meters[name] = m
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = billing.NoRedirectClient()
	}
	return &Client{cfg: cfg, endpoint: strings.TrimRight(cfg.Endpoint, "/"), hc: hc, meters: meters}, nil
}

// String never shows the token.
func (c *Client) String() string { return "metronome(" + c.endpoint + ")" }

// GoString keeps %#v from printing the client's fields, the token among them.
func (c *Client) GoString() string { return c.String() }

// EventRef is the provider reference of a usage event: the ingest answer carries no
// ID, so the reference is the transaction ID (our idempotency key) under a prefix that
// says so.
func EventRef(transactionID string) string { return "metronome_event:" + transactionID }

// Capabilities says what Metronome can answer about r (docs/design.md §14); see
// RequestCapabilities.
func (c *Client) Capabilities(r billing.Request) billing.Capabilities { return RequestCapabilities(r) }

// RequestCapabilities is what Metronome can answer about r, in one place, without a
// client (a settlement's first exposure is decided before one is built):
//
//   - a usage charge is found by its transaction ID (the events search, LookupByKey,
//     within the 34 days the search covers: LookupRequest answers Unanswerable past
//     them); inside Metronome's 34-day window a resend is proof — Metronome either
//     ingests it (nothing was there) or ignores it as a duplicate of an event it holds
//     under our key, and since only this settlement sends a namespaced key, what it
//     holds is this request (a legacy key's held copy is read back and compared).
//     ResendIsProof itself is read by the decision only for a provider with no lookup
//     (LookupNone), so it changes nothing here: the resend inside the window comes from
//     the search's "not found", decided as unanswerable because the search is
//     asynchronous (AbsenceUnproven: a "not found" proves nothing, never "nothing
//     charged");
//   - anything else is refused before it is sent: nothing of it is ever at Metronome.
func RequestCapabilities(r billing.Request) billing.Capabilities {
	if r.Type == billing.TypeCharge && r.Usage != nil && r.Amount == nil {
		return billing.Capabilities{Lookup: billing.LookupByKey, Window: KeyWindow, ResendIsProof: true, AbsenceUnproven: true}
	}
	return billing.Capabilities{Lookup: billing.LookupNone, Window: KeyWindow}
}

// DateUsage dates a usage event at the usage's time (the job's completion) while
// Metronome takes it so dated: until the event would be MaxEventAge old; an occurredAt
// more than MaxFuture ahead, or already too old, is not dated (zero: the event is
// dated when it is sent, as an undated request is).
func (c *Client) DateUsage(meter string, occurredAt, now time.Time) time.Time {
	if _, ok := c.meters[meter]; !ok || occurredAt.IsZero() || occurredAt.Sub(now) > MaxFuture {
		return time.Time{}
	}
	until := occurredAt.Add(MaxEventAge)
	if !now.Before(until) {
		return time.Time{}
	}
	return until
}

// event is one usage event on the wire (POST /v1/ingest takes an array of them).
type event struct {
	TransactionID string            `json:"transaction_id"`
	CustomerID    string            `json:"customer_id"`
	EventType     string            `json:"event_type"`
	Timestamp     string            `json:"timestamp"`
	Properties    map[string]string `json:"properties"`
}

// Submit sends r as one usage event under r.IdempotencyKey. Metronome answers 200 for
// an event it ingested and for a duplicate it ignored alike.
func (c *Client) Submit(ctx context.Context, r billing.Request) (billing.Record, error) {
	switch {
	case r.Type != billing.TypeCharge:
		return billing.Record{}, terminal("no_reversal", fmt.Sprintf(
			"Metronome offers no deletion or negation of an ingested usage event, so a %s cannot be sent: correct the customer's "+
				"invoice in Metronome (an invoice credit or adjustment for the event with transaction ID %s), then mark this settlement resolved",
			r.Type, r.Reverses))
	case r.Amount != nil:
		return billing.Record{}, terminal("amount_not_supported",
			"Metronome bills usage only (events priced by its rate cards): a charge of an amount cannot be sent to it; bill it as usage, or through another BillingProvider")
	case r.Usage == nil:
		return billing.Record{}, terminal("nothing_to_charge", "a Metronome charge needs usage")
	case r.Customer == "":
		return billing.Record{}, terminal("customer_missing", "a Metronome usage event needs a customer (a Metronome customer ID or ingest alias)")
	}
	m, ok := c.meters[r.Usage.Meter]
	if !ok {
		return billing.Record{}, terminal("unknown_meter", fmt.Sprintf("no Metronome event type is configured for usage meter %q (spec.metronome.meters)", r.Usage.Meter))
	}
	if q, ok := new(big.Rat).SetString(r.Usage.Quantity); !ok || q.Sign() < 0 || strings.ContainsAny(r.Usage.Quantity, "/eE") {
		return billing.Record{}, terminal("invalid_quantity", fmt.Sprintf("usage quantity %q is not a non-negative decimal", r.Usage.Quantity))
	}
	now := c.cfg.Now()
	at := r.OccurredAt
	if at.IsZero() {
		at = now // undated: Metronome needs a time, and this is when it is reported
	}
	if now.Sub(at) > MaxEventAge {
		return billing.Record{}, terminal("event_too_old", fmt.Sprintf(
			"the usage happened at %s, more than Metronome's 34 days ago: Metronome refuses events backdated that far; "+
				"unless an earlier attempt may have reached Metronome, add the usage to the customer's invoice in Metronome by hand",
			at.UTC().Format(time.RFC3339)))
	}
	if at.Sub(now) > MaxFuture {
		return billing.Record{}, terminal("event_in_future", fmt.Sprintf(
			"the usage time %s is more than 24 hours ahead of this clock; Metronome refuses it", at.UTC().Format(time.RFC3339)))
	}
	props := map[string]string{m.QuantityProperty: r.Usage.Quantity, PropSettlementKey: r.SettlementKey}
	if r.Usage.Unit != "" {
		props[PropUnit] = r.Usage.Unit
	}
	body, err := json.Marshal([]event{{TransactionID: r.IdempotencyKey, CustomerID: r.Customer, EventType: m.EventType,
		Timestamp: wireTime(at), Properties: props}})
	if err != nil {
		return billing.Record{}, terminal("unencodable", "the usage event could not be encoded: "+err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := c.post(ctx, IngestPath, body, true)
	if err != nil {
		return billing.Record{}, err
	}
	if resp.Status != http.StatusOK {
		return billing.Record{}, c.classify(resp, true)
	}
	// Ingested now, or ignored as a duplicate of what Metronome holds under our key
	// (its first copy, whatever this one holds). A namespaced key is derived from the
	// settlement's namespace and immutable settlement key and sent by nothing but this
	// settlement, so what Metronome holds is this request (docs/decisions.md "Resend as
	// the lookup"). A legacy key is the same in every namespace: another tenant's event
	// may hold it, so what Metronome holds is read back through the search for Match to
	// compare; when the search cannot show it yet, the record proves existence only,
	// fails Match, and a human looks.
	if r.KeyNamespaced {
		return requestRecord(r), nil
	}
	if held, found, err := c.search(ctx, r.IdempotencyKey, r); err == nil && found {
		return held, nil
	}
	rec := requestRecord(r)
	rec.Omitted = []string{"customer", "usage"}
	return rec, nil
}

// wireTime is t as Metronome's documented examples write a timestamp: RFC 3339 in UTC,
// a 4-digit year, whole seconds (a usage time's fraction of a second bills nothing).
func wireTime(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

func requestRecord(r billing.Request) billing.Record {
	u := *r.Usage
	return billing.Record{ID: EventRef(r.IdempotencyKey), Status: billing.StatusSettled, SettlementKey: r.SettlementKey,
		IdempotencyKey: r.IdempotencyKey, Customer: r.Customer, Type: billing.TypeCharge, Usage: &u}
}

// searchedEvent is one event of the events search's answer.
type searchedEvent struct {
	ID            string                     `json:"id"`
	TransactionID string                     `json:"transaction_id"`
	CustomerID    string                     `json:"customer_id"`
	EventType     string                     `json:"event_type"`
	Timestamp     string                     `json:"timestamp"`
	Properties    map[string]json.RawMessage `json:"properties"`
	IsDuplicate   bool                       `json:"is_duplicate"`
	ProcessedAt   string                     `json:"processed_at"`
}

// LookupRequest asks the events search for r's usage event by its transaction ID and
// returns what Metronome holds, for billing.Match to compare. The search sees events
// of the last 34 days only, so it is asked only while every copy of r's event that
// Metronome may hold is inside them (searchAnchor). Otherwise (older, or an undated
// request this record never sent) the answer is Unanswerable: a missing event would
// prove nothing. Within them a "not found" still proves nothing by itself — the search
// is asynchronous (Capabilities.AbsenceUnproven): the decision resends inside the
// 34-day window, which Metronome ignores if it holds the key, and otherwise asks a
// human.
func (c *Client) LookupRequest(ctx context.Context, r billing.Request) (billing.Record, bool, error) {
	if r.Type != billing.TypeCharge || r.Usage == nil || r.Amount != nil {
		// Refused unsent by Submit, always: nothing of it is at Metronome.
		return billing.Record{}, false, nil
	}
	anchor := searchAnchor(r)
	if anchor.IsZero() || c.cfg.Now().Sub(anchor) > SearchHorizon {
		return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "outside_search_horizon", Unanswerable: true,
			Message: "Metronome's events search sees only events of the last 34 days, and this usage event may be older: look for transaction ID " +
				r.IdempotencyKey + " in Metronome (Usage → Events); if it is there, the charge is done; if not, add the usage to the customer's invoice by hand " +
				"(the operator does not resend past Metronome's 34-day window)"}
	}
	return c.search(ctx, r.IdempotencyKey, r)
}

// searchAnchor is the earliest timestamp an event Metronome holds for r may carry: the
// usage time the first attempt was dated at (r.DatedAt, carried after datedUntil when
// r itself goes undated), r's own date, or — undated — its first attempt (an undated
// event is dated when sent, at or after it). Zero when r was never sent undated and
// carries no date.
func searchAnchor(r billing.Request) time.Time {
	var anchor time.Time
	for _, t := range []time.Time{r.OccurredAt, r.DatedAt, r.FirstSubmittedAt} {
		if !t.IsZero() && (anchor.IsZero() || t.Before(anchor)) {
			anchor = t
		}
	}
	return anchor
}

// Lookup asks the events search by key alone. Without the request's dates a missing
// event proves nothing (it may be older than the 34 days the search covers), so "not
// found" is Unanswerable here; controllers ask through billing.LookupFor, which uses
// LookupRequest.
func (c *Client) Lookup(ctx context.Context, idempotencyKey string) (billing.Record, bool, error) {
	rec, found, err := c.search(ctx, idempotencyKey, billing.Request{})
	if err == nil && !found {
		return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "not_found_by_key_alone", Unanswerable: true,
			Message: "Metronome's events search does not show transaction ID " + idempotencyKey + ", but it sees only the last 34 days"}
	}
	return rec, found, err
}

func (c *Client) search(ctx context.Context, key string, r billing.Request) (billing.Record, bool, error) {
	body, err := json.Marshal(map[string][]string{"transactionIds": {key}})
	if err != nil {
		return billing.Record{}, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := c.post(ctx, SearchPath, body, false)
	if err != nil {
		return billing.Record{}, false, err
	}
	if resp.Status != http.StatusOK {
		return billing.Record{}, false, c.classify(resp, false)
	}
	var events []searchedEvent
	if resp.Truncated || json.Unmarshal(resp.Body, &events) != nil {
		return billing.Record{}, false, &billing.Error{Class: billing.Transient, Code: "unreadable_reply", Status: resp.Status,
			Message: "Metronome's events search answer could not be read"}
	}
	var kept, dup *searchedEvent
	for i := range events {
		switch e := &events[i]; {
		case e.TransactionID != key:
		case !e.IsDuplicate && kept == nil:
			kept = e
		case e.IsDuplicate && dup == nil:
			dup = e
		}
	}
	switch {
	case kept != nil:
		return c.searchedRecord(*kept, r), true, nil
	case dup != nil:
		// Only an ignored copy shows: Metronome holds the key, but what its first copy
		// holds is not shown, so nothing of its content is proven.
		rec := c.searchedRecord(*dup, r)
		rec.Omitted = []string{"customer", "usage"}
		return rec, true, nil
	}
	return billing.Record{}, false, nil
}

// searchedRecord is what Metronome shows of an event, in billing's terms: the usage
// meter is the one mapped to its event type (the request's own when it is), the
// quantity and unit are its properties, as Metronome holds them.
func (c *Client) searchedRecord(e searchedEvent, r billing.Request) billing.Record {
	rec := billing.Record{ID: EventRef(e.TransactionID), Status: billing.StatusSettled, IdempotencyKey: e.TransactionID,
		Customer: e.CustomerID, Type: billing.TypeCharge, SettlementKey: property(e.Properties, PropSettlementKey)}
	meter, m, ok := "", Meter{}, false
	if r.Usage != nil {
		if mm, found := c.meters[r.Usage.Meter]; found && mm.EventType == e.EventType {
			meter, m, ok = r.Usage.Meter, mm, true
		}
	}
	if !ok {
		for name, mm := range c.meters {
			if mm.EventType == e.EventType && (meter == "" || name < meter) {
				meter, m, ok = name, mm, true
			}
		}
	}
	u := &billing.Usage{Meter: meter, Unit: property(e.Properties, PropUnit)}
	if ok {
		u.Quantity = property(e.Properties, m.QuantityProperty)
	}
	rec.Usage = u
	for _, ts := range []string{e.ProcessedAt, e.Timestamp} {
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			rec.CreatedAt = t
			break
		}
	}
	return rec
}

// property reads an event property as a string: Metronome advises strings for
// numbers, and a number is taken as its literal.
func property(props map[string]json.RawMessage, name string) string {
	raw, ok := props[name]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// List returns nothing: Metronome lists no usage events by time (its events search
// finds events by transaction ID only), so reconciliation asks about each settled
// charge of the window through LookupRequest instead, and compares usage totals
// (UsageTotal; docs/design.md §13).
func (c *Client) List(context.Context, time.Time, string) ([]billing.Record, string, error) {
	return nil, "", nil
}

func (c *Client) post(ctx context.Context, path string, body []byte, mutating bool) (billing.Response, error) {
	return c.call(ctx, http.MethodPost, path, body, mutating)
}

func (c *Client) call(ctx context.Context, method, path string, body []byte, mutating bool) (billing.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.endpoint+path, rd)
	if err != nil {
		return billing.Response{}, &billing.Error{Class: billing.Terminal, Code: "bad_request", Message: "the request could not be built", Err: err, Local: true}
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	return billing.Do(c.hc, req, mutating)
}

// terminal is a request the adapter refuses before sending anything (Local).
func terminal(code, msg string) *billing.Error {
	return &billing.Error{Class: billing.Terminal, Code: code, Message: msg, Local: true}
}

// classify turns a Metronome answer other than 200 into the operator's three classes,
// once (docs/design.md §13):
//
//   - 400 (the event failed validation) and other 4xx: Terminal, refused again;
//   - 401, 403: Transient — the token is wrong or lacks permission, our configuration,
//     fixed without a replay (as for every adapter);
//   - 429: Transient, refused before processing, after Retry-After when Metronome
//     sends it;
//   - 5xx: Ambiguous for the ingest (it may have ingested the event before failing),
//     Transient for the search;
//   - another 2xx to the ingest (202, a proxy's 204): Ambiguous — the event was taken,
//     or may have been, and is asked about by key;
//   - anything else (a redirect: never followed): Terminal.
func (c *Client) classify(resp billing.Response, mutating bool) *billing.Error {
	e := &billing.Error{Status: resp.Status, Code: strconv.Itoa(resp.Status)}
	msg := c.message(resp.Body)
	switch s := resp.Status; {
	case s == http.StatusTooManyRequests:
		e.Class = billing.Transient
		e.RetryAfter = billing.RetryAfter(resp.Header, time.Now())
		e.Message = "rate limited by Metronome"
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		e.Class = billing.Transient
		e.Message = "Metronome refused the API token (check the credentials Secret, and the token's access)"
	case s >= 400 && s < 500:
		e.Class = billing.Terminal
		e.Message = "Metronome rejected the request"
		if msg != "" {
			e.Message += ": " + msg
		}
	case s >= 500 && s < 600:
		e.RetryAfter = billing.RetryAfter(resp.Header, time.Now())
		if mutating {
			e.Class, e.Message = billing.Ambiguous, "Metronome failed; it may have ingested the event"
		} else {
			e.Class, e.Message = billing.Transient, "Metronome failed"
		}
	case s >= 200 && s < 300 && mutating:
		e.Class = billing.Ambiguous
		e.Message = fmt.Sprintf("Metronome answered HTTP %d to the ingest: it may have ingested the event (asking by key)", s)
	default:
		e.Class = billing.Terminal
		e.Message = fmt.Sprintf("unexpected HTTP status %d from Metronome (check the endpoint)", s)
	}
	return e
}

// message is Metronome's error text ({"message": "..."}), made safe for status and
// logs (billing.Sanitize).
func (c *Client) message(body []byte) string {
	var b struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &b) != nil || b.Message == "" {
		return ""
	}
	return billing.Sanitize(b.Message, c.cfg.Token)
}
