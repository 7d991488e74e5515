// Package openmeterbilling is the billing adapter for OpenMeter (BillingProvider
// spec.type OpenMeter): a small typed client of OpenMeter's events API, written
// against its published API reference (docs/design.md §13).
//
//   - a usage charge is one CloudEvent, POST /api/v1/events as
//     application/cloudevents+json (written with internal/cloudevents, the model the
//     receiver reads with): id = the settlement's idempotency key, source = the
//     provider's spec.openMeter.source, type = the usage meter's event type, subject =
//     the settlement's customer, time = when the usage happened (the job's
//     completion), data = {<valueProperty>: quantity, settlement_key, unit};
//   - an amount is refused: OpenMeter meters usage, the price is its business;
//   - a refund or void is refused: OpenMeter has no reversal of ingested usage;
//   - a lookup lists the events (GET /api/v1/events, by id, subject and time) and
//     matches source and id; nothing listed proves nothing, because OpenMeter ingests
//     asynchronously (Capabilities, LookupRequest).
//
// OpenMeter deduplicates by source and id only where the install is configured to
// (a self-hosted install is not, by default): without it a resend is counted as new
// usage, which the capabilities declare (billing.Capabilities.NoDeduplication) and
// the settlement decision honours by never resending after an attempt that may have
// reached OpenMeter.
package openmeterbilling

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/cloudevents"
)

// DefaultEndpoint is OpenMeter Cloud's API.
const DefaultEndpoint = "https://openmeter.cloud"

// EventsPath is the events API: POST ingests, GET lists.
const EventsPath = "/api/v1/events"

// OpenMeter's documented bounds, and ours around them.
const (
	// ListHorizon is how far back OpenMeter lists events (its events API refuses a
	// "from" older than 32 days); an hour is kept in hand. An event dated before it
	// could never be found again, so none is sent so dated.
	ListHorizon = 32*24*time.Hour - time.Hour
	// MaxFuture is how far ahead of this clock a usage may be dated: more is a
	// sender's wrong clock, and would bill the usage in a period that has not begun.
	MaxFuture = 5 * time.Minute
	// MaxListLimit is the most events one listing returns (OpenMeter: 100).
	MaxListLimit = 100
	// listingSkew is how far OpenMeter's clock, or an event's time, may be from ours
	// when a lookup lists from the first submission: generous, since an event hidden
	// by a wrong clock would read as not listed.
	listingSkew = time.Hour
)

// Data properties the adapter writes next to the quantity, so a listed event names its
// settlement (Match compares them); a meter's valueProperty may not be one of them.
const (
	DataSettlementKey = "settlement_key"
	DataUnit          = "unit"
)

// Meter is one usage meter's events.
type Meter struct {
	// EventType is the CloudEvents type an OpenMeter meter aggregates.
	EventType string
	// ValueProperty is the data property carrying the quantity ("value" when empty).
	ValueProperty string
}

// Config configures a client.
type Config struct {
	// Endpoint is the API base URL (DefaultEndpoint when empty).
	Endpoint string
	// Token is the API token, sent as a bearer token ("" sends none: a self-hosted
	// install without authentication).
	Token string
	// Timeout bounds each call.
	Timeout time.Duration
	// Source is the CloudEvents source of every event (required).
	Source string
	// Meters maps usage meters to their events; a usage charge for a meter not listed
	// is refused (terminal), never sent under a guessed type.
	Meters map[string]Meter
	// Deduplication is how long the install deduplicates events by source and id; 0
	// when it does not (a self-hosted install's default).
	Deduplication time.Duration
	// HTTPClient is the client calls are made with (billing.NoRedirectClient when nil).
	HTTPClient *http.Client
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Client is the OpenMeter adapter.
type Client struct {
	cfg      Config
	endpoint string
	hc       *http.Client
}

// New validates cfg: a bad BillingProvider is a clear error when it is loaded.
func New(cfg Config) (*Client, error) {
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint
	}
	u, err := url.Parse(cfg.Endpoint)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, errors.New("openmeter: endpoint must be an absolute http(s) URL")
	case u.User != nil:
		return nil, errors.New("openmeter: credentials in the endpoint URL are not allowed; put the token in the Secret")
	case u.RawQuery != "" || u.Fragment != "":
		return nil, errors.New("openmeter: the endpoint may not carry a query or fragment")
	case strings.TrimSpace(cfg.Source) == "":
		return nil, errors.New("openmeter: spec.openMeter.source is empty: events are deduplicated and found again by source and id")
	case len(cfg.Meters) == 0:
		return nil, errors.New("openmeter: spec.openMeter.meters maps no usage meter to an event type")
	case cfg.Deduplication < 0:
		return nil, errors.New("openmeter: a deduplication window is positive")
	}
	for name, m := range cfg.Meters {
		switch v := valueProperty(m); {
		case m.EventType == "":
			return nil, fmt.Errorf("openmeter: usage meter %q has no event type", name)
		case v == DataSettlementKey || v == DataUnit:
			return nil, fmt.Errorf("openmeter: usage meter %q: valueProperty %q is where the adapter writes the %s", name, v, v)
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = billing.NoRedirectClient()
	}
	return &Client{cfg: cfg, endpoint: strings.TrimRight(u.String(), "/"), hc: hc}, nil
}

// String never shows the token.
func (c *Client) String() string {
	return fmt.Sprintf("openmeter(%s, source %s)", c.endpoint, c.cfg.Source)
}

// GoString keeps %#v from printing the client's fields, the token among them.
func (c *Client) GoString() string { return c.String() }

func valueProperty(m Meter) string {
	if m.ValueProperty == "" {
		return "value"
	}
	return m.ValueProperty
}

// Capabilities says what OpenMeter can answer about r (docs/design.md §14), in one
// place (see RequestCapabilities).
func (c *Client) Capabilities(r billing.Request) billing.Capabilities {
	return RequestCapabilities(c.cfg.Deduplication, r)
}

// RequestCapabilities is what OpenMeter can answer about any request, for an install
// that deduplicates for dedup (0: it does not):
//   - a record is found only by listing the events (LookupByListing), and a listing
//     that does not show it proves nothing: OpenMeter ingests asynchronously;
//   - with deduplication, an event sent again under the same source and id inside the
//     window is dropped as a duplicate, and only this settlement sends that id
//     (derived from its namespaced key), so the resend is itself the answer
//     (ResendIsProof) and the window bounds the retry budget; a legacy key is the same
//     in every namespace, so there OpenMeter's silent drop proves only that some event
//     holds the id, not that it is this settlement's (no ResendIsProof);
//   - without it, a resend is counted as new usage (NoDeduplication): nothing is ever
//     sent again after an attempt that may have reached OpenMeter.
//
// Amounts, refunds and voids are refused before anything is sent, so the declaration
// is the same for every kind of request.
func RequestCapabilities(dedup time.Duration, r billing.Request) billing.Capabilities {
	if dedup > 0 {
		return billing.Capabilities{Lookup: billing.LookupByListing, Window: dedup, ResendIsProof: r.KeyNamespaced}
	}
	return billing.Capabilities{Lookup: billing.LookupByListing, NoDeduplication: true}
}

// DateUsage dates every usage event at the usage's time (the job's completion,
// billing.UsageDater): the controller pins it at the first attempt and sends it dated
// until the returned bound. Inside what OpenMeter lists, the bound is when it stops
// listing an event so dated (32 days, less an hour). Outside it — older than that, or
// ahead of this clock by more than MaxFuture — the date is pinned all the same, for an
// hour, so that Submit refuses the charge saying why rather than OpenMeter dating it at
// receipt unseen; a replay after that hour is sent undated, dated by OpenMeter at
// receipt, which is what a human who replays it asks for.
func (c *Client) DateUsage(_ string, occurredAt, now time.Time) time.Time {
	switch {
	case occurredAt.IsZero():
		return time.Time{}
	case occurredAt.Before(now.Add(-ListHorizon)), occurredAt.After(now.Add(MaxFuture)):
		return now.Add(time.Hour)
	}
	return occurredAt.Add(ListHorizon)
}

// EventRef is the provider reference of an event: OpenMeter gives an event no ID of
// its own, so the reference is our id under a prefix that says so.
func EventRef(id string) string { return "openmeter_event:" + id }

func terminal(code, msg string) *billing.Error {
	return &billing.Error{Class: billing.Terminal, Code: code, Message: msg}
}

// Submit sends r's usage as one event under r.IdempotencyKey.
func (c *Client) Submit(ctx context.Context, r billing.Request) (billing.Record, error) {
	switch {
	case r.Type == billing.TypeRefund || r.Type == billing.TypeVoid:
		return billing.Record{}, terminal("no_reversal", fmt.Sprintf("OpenMeter has no reversal of ingested usage, so a %s cannot be sent: "+
			"correct the customer's bill where it is invoiced (a credit), or ingest a correcting event yourself", r.Type))
	case r.Type != billing.TypeCharge:
		return billing.Record{}, terminal("unsupported_type", fmt.Sprintf("settlement type %q is not a charge", r.Type))
	case r.Amount != nil:
		return billing.Record{}, terminal("usage_only", "OpenMeter meters usage and prices it itself: a charge of an amount cannot be sent to it "+
			"(map the route to usage, or bill amounts through another provider)")
	case r.Usage == nil:
		return billing.Record{}, terminal("nothing_to_charge", "a charge to OpenMeter needs usage")
	case r.Customer == "":
		return billing.Record{}, terminal("no_subject", "a usage event needs the customer as its subject")
	}
	body, err := c.encode(r)
	if err != nil {
		return billing.Record{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := c.newRequest(ctx, http.MethodPost, EventsPath, bytes.NewReader(body))
	if err != nil {
		return billing.Record{}, err
	}
	req.Header.Set("Content-Type", cloudevents.StructuredMediaType)
	resp, err := billing.Do(c.hc, req, true)
	if err != nil {
		return billing.Record{}, err
	}
	if resp.Status < 200 || resp.Status > 299 {
		return billing.Record{}, c.classify(resp, true)
	}
	// Accepted (204): the event is OpenMeter's to count. Its answer carries nothing,
	// so the record is what was sent.
	q, _ := billing.QuantityNumber(r.Usage.Quantity)
	return billing.Record{ID: EventRef(r.IdempotencyKey), Status: billing.StatusSettled, SettlementKey: r.SettlementKey,
		IdempotencyKey: r.IdempotencyKey, Customer: r.Customer, Type: billing.TypeCharge,
		Usage: &billing.Usage{Meter: r.Usage.Meter, Quantity: q.String(), Unit: r.Usage.Unit}}, nil
}

// encode is r's event, refused (terminal) where OpenMeter or a later lookup could not
// take it: a meter not configured, a quantity that is no decimal, a date outside the
// listing horizon or ahead of this clock.
func (c *Client) encode(r billing.Request) ([]byte, error) {
	m, ok := c.cfg.Meters[r.Usage.Meter]
	if !ok {
		names := make([]string, 0, len(c.cfg.Meters))
		for n := range c.cfg.Meters {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, terminal("meter_not_configured", fmt.Sprintf("usage meter %q has no event type in spec.openMeter.meters (it maps %s): "+
			"add it, then replay the settlement", r.Usage.Meter, strings.Join(names, ", ")))
	}
	q, err := billing.QuantityNumber(r.Usage.Quantity)
	if err != nil {
		return nil, terminal("invalid_quantity", err.Error())
	}
	ev := cloudevents.Event{ID: r.IdempotencyKey, Source: c.cfg.Source, Type: m.EventType, Subject: r.Customer}
	if !r.OccurredAt.IsZero() {
		now := c.cfg.Now()
		switch {
		case r.OccurredAt.Before(now.Add(-ListHorizon)):
			return nil, terminal("usage_too_old", fmt.Sprintf("the usage happened at %s, more than 32 days ago: OpenMeter lists events only "+
				"from the last 32 days, so an event dated then could never be found again to prove what was billed; "+
				"bill it in OpenMeter yourself", r.OccurredAt.UTC().Format(time.RFC3339)))
		case r.OccurredAt.After(now.Add(MaxFuture)):
			return nil, terminal("usage_in_future", fmt.Sprintf("the usage is dated %s, ahead of this clock by more than %s: "+
				"check the sender's completion time", r.OccurredAt.UTC().Format(time.RFC3339), MaxFuture))
		}
		ev.Time = r.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	data := map[string]any{valueProperty(m): q, DataSettlementKey: r.SettlementKey}
	if r.Usage.Unit != "" {
		data[DataUnit] = r.Usage.Unit
	}
	if ev.Data, err = json.Marshal(data); err != nil {
		return nil, terminal("invalid_usage", err.Error())
	}
	b, err := ev.MarshalStructured()
	if err != nil {
		return nil, terminal("invalid_event", err.Error())
	}
	return b, nil
}

func (c *Client) newRequest(ctx context.Context, method, path string, body *bytes.Reader) (*http.Request, error) {
	var req *http.Request
	var err error
	if body == nil {
		req, err = http.NewRequestWithContext(ctx, method, c.endpoint+path, nil)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, c.endpoint+path, body)
	}
	if err != nil {
		return nil, terminal("invalid_request", "cannot build the request: "+err.Error())
	}
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	return req, nil
}

// problem is OpenMeter's error body (RFC 7807, application/problem+json).
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// classify turns a non-2xx answer into a billing.Error, once: billing.StatusError's
// rule (429, 408, 401/403 transient; other 4xx terminal; 5xx ambiguous for the POST,
// transient for a read), with OpenMeter's problem detail as the message.
func (c *Client) classify(resp billing.Response, mutating bool) *billing.Error {
	e := billing.StatusError(resp, mutating, c.cfg.Token)
	var p problem
	if json.Unmarshal(resp.Body, &p) == nil && (p.Detail != "" || p.Title != "") {
		what := p.Detail
		if what == "" {
			what = p.Title
		}
		what = billing.Sanitize(what, c.cfg.Token)
		switch {
		case resp.Status == http.StatusTooManyRequests:
			e.Message = "rate limited by OpenMeter: " + what
		case resp.Status >= 400 && resp.Status < 500 && e.Class == billing.Terminal:
			e.Message = "OpenMeter refused it: " + what
		}
	}
	return e
}

// Lookup cannot ask OpenMeter by key alone: events are listed by subject and time
// too, and what a listing proves depends on the request. Callers use LookupRequest.
func (c *Client) Lookup(context.Context, string) (billing.Record, bool, error) {
	return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "lookup_needs_request", Unanswerable: true,
		Message: "OpenMeter events are found by listing, which needs the request"}
}

// LookupRequest is what asking OpenMeter means: its events are listed by id, subject
// (the customer) and time (from the first submission, or the usage's date, less an
// hour of skew) and the one with our source and id is r's record. Nothing listed is
// not a "not found": OpenMeter ingests asynchronously, so an accepted event may not
// be listed yet; the answer is Unanswerable, saying where to look. A refund or void is
// never sent (OpenMeter has no reversal), so there is never one to find.
func (c *Client) LookupRequest(ctx context.Context, r billing.Request) (billing.Record, bool, error) {
	if r.Type != billing.TypeCharge || r.Usage == nil || r.Amount != nil {
		return billing.Record{}, false, nil
	}
	horizon := c.cfg.Now().Add(-ListHorizon)
	var from time.Time
	for _, t := range []time.Time{r.FirstSubmittedAt, r.OccurredAt} {
		if !t.IsZero() && (from.IsZero() || t.Before(from)) {
			from = t
		}
	}
	if from = from.Add(-listingSkew); from.Before(horizon) {
		from = horizon // also when neither is known
	}
	q := url.Values{"id": {r.IdempotencyKey}, "subject": {r.Customer}, "from": {from.UTC().Format(time.RFC3339)},
		"limit": {strconv.Itoa(MaxListLimit)}}
	events, err := c.list(ctx, q)
	if err != nil {
		return billing.Record{}, false, err
	}
	for _, ie := range events {
		if ie.event.ID == r.IdempotencyKey && ie.event.Source == c.cfg.Source {
			rec := c.record(ie, r.Usage.Meter)
			if !r.KeyNamespaced {
				// A legacy key is the same in every namespace: the settlement key the
				// event names is its word, not proof that it is this settlement's.
				rec.Omitted = append(rec.Omitted, "settlement_key")
			}
			return rec, true, nil
		}
	}
	return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "event_not_listed", Unanswerable: true,
		Message: fmt.Sprintf("OpenMeter lists no event with id %s from source %s for subject %s since %s; it ingests asynchronously, "+
			"so this does not prove the event was not counted: look for it in OpenMeter (events API or the console's event "+
			"debugger, id %s, subject %s)", r.IdempotencyKey, c.cfg.Source, r.Customer, from.UTC().Format(time.RFC3339),
			r.IdempotencyKey, r.Customer)}
}

// ingested is one listed event: OpenMeter's IngestedEvent.
type ingested struct {
	event           cloudevents.Event
	validationError string
	ingestedAt      time.Time
}

// wireIngested is IngestedEvent as OpenMeter writes it.
type wireIngested struct {
	Event           json.RawMessage `json:"event"`
	ValidationError string          `json:"validationError,omitempty"`
	IngestedAt      time.Time       `json:"ingestedAt"`
}

// list asks GET /api/v1/events with q and reads the events with the CloudEvents
// model the receiver uses. A "from" OpenMeter refuses as too old says the request
// cannot be searched for (Unanswerable).
func (c *Client) list(ctx context.Context, q url.Values) ([]ingested, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := c.newRequest(ctx, http.MethodGet, EventsPath+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := billing.Do(c.hc, req, false)
	if err != nil {
		return nil, err
	}
	if resp.Status != http.StatusOK {
		e := c.classify(resp, false)
		if resp.Status == http.StatusBadRequest && strings.Contains(string(resp.Body), "too old") {
			e.Unanswerable, e.Code = true, "listing_too_old"
			e.Message = "OpenMeter lists events only from the last 32 days, and this request is older: " +
				"look for the event in OpenMeter's meter queries, which reach further back"
		}
		return nil, e
	}
	var wire []wireIngested
	if resp.Truncated || json.Unmarshal(resp.Body, &wire) != nil {
		return nil, &billing.Error{Class: billing.Transient, Code: "unreadable_response", Status: resp.Status,
			Message: "OpenMeter's list of events could not be read"}
	}
	out := make([]ingested, 0, len(wire))
	for _, w := range wire {
		ev, err := cloudevents.ReadStructured(w.Event)
		if err != nil {
			continue // not an event of ours: ours are written with the same model
		}
		out = append(out, ingested{event: *ev, validationError: w.ValidationError, ingestedAt: w.IngestedAt})
	}
	return out, nil
}

// record is a listed event as the operator sees it; meter is the usage meter to name
// when the event's type is the one configured for it (else the first configured for
// that type). An event OpenMeter stored with a validation error may not be counted
// by its meters: its usage is not proof (Omitted).
func (c *Client) record(ie ingested, meter string) billing.Record {
	ev := ie.event
	rec := billing.Record{ID: EventRef(ev.ID), Status: billing.StatusSettled, IdempotencyKey: ev.ID, Customer: ev.Subject,
		Type: billing.TypeCharge, CreatedAt: ie.ingestedAt}
	if m, ok := c.cfg.Meters[meter]; !ok || m.EventType != ev.Type {
		meter = c.meterOf(ev.Type)
	}
	var data map[string]json.RawMessage
	_ = json.Unmarshal(ev.Data, &data)
	if meter != "" {
		rec.Usage = &billing.Usage{Meter: meter, Quantity: quantity(data[valueProperty(c.cfg.Meters[meter])]), Unit: text(data[DataUnit])}
	} else {
		rec.Usage = &billing.Usage{Meter: "event type " + ev.Type, Quantity: quantity(data["value"])}
	}
	rec.SettlementKey = text(data[DataSettlementKey])
	if ie.validationError != "" {
		rec.Omitted = append(rec.Omitted, "usage")
	}
	return rec
}

// meterOf is the first usage meter (by name) whose events have type t, or "".
func (c *Client) meterOf(t string) string {
	names := make([]string, 0, len(c.cfg.Meters))
	for n, m := range c.cfg.Meters {
		if m.EventType == t {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return ""
	}
	return names[0]
}

// quantity reads a JSON number or a numeric string; "" when it is neither.
func quantity(raw json.RawMessage) string {
	var n json.Number
	if json.Unmarshal(raw, &n) == nil && n != "" {
		if _, err := billing.QuantityNumber(n.String()); err == nil {
			return n.String()
		}
	}
	return ""
}

func text(raw json.RawMessage) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

// List pages through this source's events dated at or after since, newest first as
// OpenMeter lists them, for reconciliation. OpenMeter's listing has no cursor: the
// cursor is the oldest time of a full page, and the next page lists up to it. Events
// of that same instant beyond the page may be listed twice (reconciliation keys by
// idempotency key); a page whose events all share one instant moves the bound past
// it, which can leave some of that instant unlisted, never resent.
func (c *Client) List(ctx context.Context, since time.Time, cursor string) ([]billing.Record, string, error) {
	now := c.cfg.Now()
	if since.Before(now.Add(-ListHorizon)) {
		since = now.Add(-ListHorizon)
	}
	q := url.Values{"from": {since.UTC().Format(time.RFC3339Nano)}, "limit": {strconv.Itoa(MaxListLimit)}}
	var page listCursor
	if cursor != "" {
		if err := json.Unmarshal([]byte(cursor), &page); err != nil || page.To.IsZero() {
			return nil, "", terminal("invalid_cursor", "the listing cursor is not one this adapter wrote")
		}
		q.Set("to", page.To.UTC().Format(time.RFC3339Nano))
	}
	events, err := c.list(ctx, q)
	if err != nil {
		return nil, "", err
	}
	var out []billing.Record
	oldest := time.Time{}
	for _, ie := range events {
		t := eventTime(ie)
		if !page.To.IsZero() && t.Equal(page.To) && slices.Contains(page.Seen, ie.event.Source+"\x00"+ie.event.ID) {
			// the previous page listed it: "to" is inclusive
			continue
		}
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
		if ie.event.Source == c.cfg.Source {
			out = append(out, c.record(ie, ""))
		}
	}
	if len(events) < MaxListLimit {
		return out, "", nil
	}
	if oldest.IsZero() {
		// A whole page of events dated at the previous page's last time, every one listed
		// before: OpenMeter's listing pages by time only, so the rest of that instant cannot
		// be reached. Said, never skipped.
		return nil, "", &billing.Error{Class: billing.Transient, Code: "listing_stuck", Message: fmt.Sprintf(
			"more than %d events are dated %s: OpenMeter's listing, paged by time, cannot list past them",
			MaxListLimit, page.To.UTC().Format(time.RFC3339Nano))}
	}
	// The next page ends at this page's oldest time, inclusive: the events at that time
	// listed here are carried in the cursor and left out there.
	next := listCursor{To: oldest}
	if oldest.Equal(page.To) {
		next.Seen = page.Seen
	}
	for _, ie := range events {
		if eventTime(ie).Equal(oldest) {
			next.Seen = append(next.Seen, ie.event.Source+"\x00"+ie.event.ID)
		}
	}
	raw, err := json.Marshal(next)
	if err != nil {
		return nil, "", err
	}
	return out, string(raw), nil
}

// listCursor is List's cursor: the next page lists events dated up to To, inclusive,
// less those dated exactly To that earlier pages listed (Seen: source NUL id).
type listCursor struct {
	To   time.Time `json:"to"`
	Seen []string  `json:"seen,omitempty"`
}

// eventTime is when an event is dated: its time, else when it was ingested.
func eventTime(ie ingested) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, ie.event.Time); err == nil {
		return t
	}
	return ie.ingestedAt
}
