// Package lagobilling is the billing adapter for Lago (BillingProvider spec.type Lago),
// a small typed client of Lago's events API (docs/design.md §13). It turns the
// operator's usage charges into Lago usage events and Lago's answers and errors into
// billing.Record and billing.Error, so nothing above it knows Lago's vocabulary:
//
//   - a usage charge is one event (POST /api/v1/events): transaction_id = the
//     settlement's idempotency key, external_subscription_id = the settlement's
//     customer, code = the billable metric the usage meter maps to, properties =
//     {<the metric's field_name>: quantity, settlement_key, settlement_unit}, timestamp
//     = the job's completion while Lago still bills it there, else the operator's first
//     attempt — the same on every attempt;
//   - an event is read back by its transaction_id (GET /api/v1/events/{id}): a lookup
//     by key, compared field by field (billing.Match), never taken on trust; on the
//     ClickHouse pipeline (spec.lago.eventPipeline) Lago ingests asynchronously, so a
//     lookup that does not find it proves nothing and is answered Unanswerable;
//   - Lago's default event pipeline refuses a reused transaction_id with 422
//     value_already_exist and ignores the event: proof that an earlier attempt
//     committed, not of what it holds — so the adapter reads the event back and
//     answers with what Lago holds;
//   - Lago bills usage only, and keeps no reversal of an event: an amount, a refund or
//     a void is refused, terminally, saying what a human does in Lago instead.
//
// docs/decisions.md "Lago adapter" says why.
package lagobilling

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// DefaultEndpoint is Lago Cloud's API host (US); the paths below are appended to it.
const DefaultEndpoint = "https://api.getlago.com"

// Paths of Lago's events API under the endpoint.
const (
	eventsPath = "/api/v1/events"
)

// Properties the adapter writes on every event besides the metric's field, so that an
// event read back or listed names its settlement (Lago keeps properties as sent).
const (
	PropSettlementKey = "settlement_key"
	PropUnit          = "settlement_unit"
)

// Dating an event at the job's completion.
const (
	// DateMargin keeps a dated event clear of the end of the grace period: the
	// reconcile that sends it, the request and clock skew all fit in it.
	DateMargin = 10 * time.Minute
	// MaxFuture is how far ahead of this clock a completion may be and still date an
	// event: further ahead, it would be billed in a period that has not begun.
	MaxFuture = 5 * time.Minute
)

// Metric is the Lago billable metric one usage meter feeds.
type Metric struct {
	// Code is the billable metric's code.
	Code string
	// FieldName is the property the metric aggregates; the quantity is sent under it.
	FieldName string
}

// Config configures a client.
type Config struct {
	// Endpoint is Lago's API host (DefaultEndpoint when empty), without /api/v1.
	Endpoint string
	// APIKey is the Lago organization's API key, sent as a bearer token.
	APIKey string
	// Timeout bounds each call (billing.DefaultTimeout when zero).
	Timeout time.Duration
	// Metrics maps usage meters to billable metrics; a usage charge for a meter not
	// listed is refused (terminal), never sent under a guessed code.
	Metrics map[string]Metric
	// GracePeriod is the organization's invoice grace period: events are dated at the
	// job's completion only while they reach Lago inside it (DateUsage); 0 never dates
	// them at completion.
	GracePeriod time.Duration
	// LateRetry is how long after its first attempt a request may still be sent (the
	// BillingProvider's key window or retry budget, the longer): an undated event is
	// dated when each attempt is built, from the first one, and accepted up to that much
	// later. List reaches back that far by timestamp too (DefaultLateRetry when zero).
	LateRetry time.Duration
	// AsyncIngest: the organization ingests events asynchronously (the ClickHouse
	// pipeline), so a lookup by key proves presence only (Capabilities).
	AsyncIngest bool
	// Now is the clock (time.Now).
	Now func() time.Time
	// HTTPClient overrides the client (billing.NoRedirectClient when nil).
	HTTPClient *http.Client
}

// Client is the Lago adapter.
type Client struct {
	endpoint string
	apiKey   string
	timeout  time.Duration
	metrics  map[string]Metric
	byCode   map[string]string // billable metric code → usage meter
	grace    time.Duration
	late     time.Duration
	async    bool
	now      func() time.Time
	hc       *http.Client
}

var (
	_ billing.Client     = (*Client)(nil)
	_ billing.Capable    = (*Client)(nil)
	_ billing.UsageDater = (*Client)(nil)
)

// New builds a client; an unusable endpoint, key or metric mapping is an error naming
// what is wrong, never the key.
func New(cfg Config) (*Client, error) {
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint
	}
	u, err := url.Parse(cfg.Endpoint)
	switch {
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
		return nil, fmt.Errorf("lago endpoint %q is not an http(s) URL", cfg.Endpoint)
	case u.User != nil:
		return nil, errors.New("lago endpoint carries credentials; put the API key in the Secret")
	case u.RawQuery != "" || u.Fragment != "":
		return nil, errors.New("lago endpoint has a query or fragment; give the API host only")
	case strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/api/v1"):
		return nil, fmt.Errorf("lago endpoint %q ends in /api/v1: give the API host only (the adapter appends /api/v1/events)", cfg.Endpoint)
	}
	if cfg.APIKey == "" || strings.ContainsAny(cfg.APIKey, " \r\n\t\x00") {
		return nil, errors.New("lago API key is empty or contains whitespace; check the Secret")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("lago timeout %s is negative", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = billing.DefaultTimeout
	}
	if cfg.GracePeriod < 0 {
		return nil, fmt.Errorf("lago grace period %s is negative", cfg.GracePeriod)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Client{endpoint: strings.TrimRight(u.String(), "/"), apiKey: cfg.APIKey, timeout: cfg.Timeout,
		metrics: map[string]Metric{}, byCode: map[string]string{}, grace: cfg.GracePeriod, late: cfg.LateRetry, async: cfg.AsyncIngest, now: cfg.Now, hc: cfg.HTTPClient}
	if c.late <= 0 {
		c.late = DefaultLateRetry
	}
	for meter, m := range cfg.Metrics {
		switch {
		case m.Code == "" || m.FieldName == "":
			return nil, fmt.Errorf("lago metric for usage meter %q needs a code and a fieldName", meter)
		case m.FieldName == PropSettlementKey || m.FieldName == PropUnit:
			return nil, fmt.Errorf("lago metric for usage meter %q: fieldName %q is a property the operator writes itself", meter, m.FieldName)
		}
		if other, ok := c.byCode[m.Code]; ok {
			return nil, fmt.Errorf("lago billable metric %q is mapped from usage meters %q and %q; map it from one", m.Code, other, meter)
		}
		c.metrics[meter], c.byCode[m.Code] = m, meter
	}
	if c.hc == nil {
		// Each call is bounded by a context deadline, not http.Client.Timeout, so the
		// transport's own classification (never sent / sent) survives.
		c.hc = billing.NoRedirectClient()
		c.hc.Transport = &billing.ClassifyingTransport{Base: c.hc.Transport}
	}
	return c, nil
}

// String never shows the key.
func (c *Client) String() string { return fmt.Sprintf("lago(%s)", c.endpoint) }

// GoString keeps %#v from printing the key.
func (c *Client) GoString() string { return c.String() }

// Capabilities says what Lago can answer about r (docs/design.md §14), in one place:
// Lago answers by key (GET /api/v1/events/{transaction_id}: the event, or 404), so on
// the default pipeline a lookup is authoritative and its record is compared field by
// field; a resend proves
// nothing by itself (ResendIsProof false): Lago's 422 value_already_exist says an event
// with the key exists, not what it holds, which is why Submit then reads it back.
// Lago keeps a transaction_id as long as its event (no window of its own): the
// BillingProvider's idempotencyWindow applies. A refund or void is never sent (Lago has
// no reversal of an event), so asking for one finds nothing.
func (c *Client) Capabilities(r billing.Request) billing.Capabilities {
	return PipelineCapabilities(c.async, r)
}

// RequestCapabilities is Capabilities without a client, for deciding before one is
// built (the registry).
func RequestCapabilities(billing.Request) billing.Capabilities {
	return billing.Capabilities{Lookup: billing.LookupByKey}
}

// PipelineCapabilities is RequestCapabilities for an organization on the given event
// pipeline. On ClickHouse events go through Kafka asynchronously: a lookup's "not
// found" proves nothing (AbsenceUnproven), and a transaction_id is not guaranteed
// unique (Lago's reference: several events may share one there, and the lookup shows
// the first), so a resend after an attempt that may have been ingested could bill the
// usage again — it is never sent (NoDeduplication, as for OpenMeter without
// deduplication). A lookup that finds the event still settles the charge; one that
// does not is answered Unanswerable, naming the event (unseen).
func PipelineCapabilities(asyncIngest bool, r billing.Request) billing.Capabilities {
	c := RequestCapabilities(r)
	if asyncIngest {
		c.AbsenceUnproven, c.NoDeduplication = true, true
	}
	return c
}

// DateUsage says, at a usage charge's first attempt, until when its event may be dated
// at occurredAt (zero: date it at the first attempt). Lago bills an event dated in a
// past billing period only while that period's invoice is a draft (the grace period)
// and accepts it silently after, so an event is dated at the completion only if it
// reaches Lago within the grace period of it, less DateMargin.
func (c *Client) DateUsage(meter string, occurredAt, now time.Time) time.Time {
	if _, ok := c.metrics[meter]; !ok || c.grace <= 0 || occurredAt.IsZero() || occurredAt.After(now) {
		return time.Time{}
	}
	until := occurredAt.Add(c.grace - DateMargin)
	if !now.Before(until) {
		return time.Time{}
	}
	return until
}

// wireEvent is Lago's event, as sent (inside {"event": ...}) and as answered.
type wireEvent struct {
	LagoID                 string                     `json:"lago_id,omitempty"`
	TransactionID          string                     `json:"transaction_id"`
	ExternalSubscriptionID string                     `json:"external_subscription_id,omitempty"`
	Code                   string                     `json:"code"`
	Timestamp              json.RawMessage            `json:"timestamp,omitempty"`
	Properties             map[string]json.RawMessage `json:"properties,omitempty"`
	CreatedAt              string                     `json:"created_at,omitempty"`
}

type wireEnvelope struct {
	Event *wireEvent `json:"event"`
}

// Submit sends r as one usage event under r.IdempotencyKey (its transaction_id).
func (c *Client) Submit(ctx context.Context, r billing.Request) (billing.Record, error) {
	ev, err := c.event(r)
	if err != nil {
		return billing.Record{}, err
	}
	body, err := json.Marshal(wireEnvelope{Event: ev})
	if err != nil {
		return billing.Record{}, terminal("unencodable_request", "the event could not be encoded: "+err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPost, eventsPath, body, true)
	if err != nil {
		return billing.Record{}, err
	}
	switch {
	case resp.Status == http.StatusOK || resp.Status == http.StatusCreated:
		got, err := decodeEvent(resp)
		if err != nil {
			return billing.Record{}, &billing.Error{Class: billing.Ambiguous, Code: "unreadable_reply", Status: resp.Status,
				Message: "Lago's reply to the event could not be read; it may have stored the event", Err: err}
		}
		return c.record(got, r), nil
	case alreadyExists(resp):
		// Lago holds an event with this transaction_id and ignored ours: an earlier
		// attempt committed. What it holds is read back and compared (billing.Match),
		// never assumed to be this request.
		rec, found, err := c.lookup(ctx, r.IdempotencyKey, &r)
		switch {
		case err != nil:
			return billing.Record{}, ambiguousAfterExists(err)
		case !found:
			return billing.Record{}, &billing.Error{Class: billing.Ambiguous, Code: "value_already_exist", Status: resp.Status,
				Message: "Lago says it holds an event with this transaction_id but does not find it by that id; asking again"}
		}
		return rec, nil
	}
	return billing.Record{}, c.classify(resp, true)
}

// ambiguousAfterExists is a failed read-back after Lago said it holds the key: the
// event exists, so the outcome is known to have committed something, but not what —
// asked again by key (Ambiguous), never taken as a refusal.
func ambiguousAfterExists(err error) error {
	e, ok := billing.AsError(err)
	if !ok || e.Class == billing.Ambiguous {
		return err
	}
	out := *e
	out.Class = billing.Ambiguous
	out.Message = "Lago holds an event with this transaction_id but it could not be read back (" + e.Message + ")"
	return &out
}

// event is r as Lago's event, or a terminal refusal saying why it cannot be one.
func (c *Client) event(r billing.Request) (*wireEvent, error) {
	switch {
	case r.Type == billing.TypeRefund || r.Type == billing.TypeVoid:
		return nil, terminal("no_reversal", fmt.Sprintf("Lago keeps no reversal of a usage event (its API cannot delete or negate one): "+
			"correct the usage in Lago instead — while the invoice is a draft, edit its fee for subscription %s; once finalized, "+
			"issue a credit note for the usage fee", r.Customer))
	case r.Amount != nil:
		return nil, terminal("amount_not_supported", "Lago bills usage events only: an amount cannot be sent as one; "+
			"bill it in Lago as a one-off invoice (an add-on), or settle usage instead")
	case r.Type != billing.TypeCharge:
		return nil, terminal("unknown_type", fmt.Sprintf("settlement type %q cannot be sent to Lago", r.Type))
	case r.Usage == nil:
		return nil, terminal("nothing_to_charge", "a Lago charge needs usage (a meter and a quantity)")
	case r.Customer == "":
		return nil, terminal("customer_missing", "a Lago event needs the customer's subscription (external_subscription_id)")
	case r.IdempotencyKey == "":
		return nil, terminal("key_missing", "a Lago event needs a transaction_id (the settlement's idempotency key)")
	}
	m, ok := c.metrics[r.Usage.Meter]
	if !ok {
		return nil, terminal("unknown_meter", fmt.Sprintf("no Lago billable metric is configured for usage meter %q (spec.lago.metrics)", r.Usage.Meter))
	}
	q, err := billing.QuantityNumber(r.Usage.Quantity)
	if err != nil {
		return nil, terminal("invalid_quantity", err.Error())
	}
	props := map[string]json.RawMessage{m.FieldName: json.RawMessage(q), PropSettlementKey: mustJSON(r.SettlementKey)}
	if r.Usage.Unit != "" {
		props[PropUnit] = mustJSON(r.Usage.Unit)
	}
	ev := &wireEvent{TransactionID: r.IdempotencyKey, ExternalSubscriptionID: r.Customer, Code: m.Code, Properties: props}
	if at, ok, err := c.timestamp(r); err != nil {
		return nil, err
	} else if ok {
		ev.Timestamp = json.RawMessage(strconv.FormatInt(at.Unix(), 10))
	}
	return ev, nil
}

// timestamp is when the event is dated, the same on every attempt: the job's
// completion when the caller dates it (DateUsage), else the settlement's first
// attempt, in whole seconds (as status keeps it); none when neither is known, and Lago
// dates it on receipt. A completion outside what Lago still bills is refused.
func (c *Client) timestamp(r billing.Request) (time.Time, bool, error) {
	if !r.OccurredAt.IsZero() {
		now := c.now()
		switch {
		case r.OccurredAt.Sub(now) > MaxFuture:
			return time.Time{}, false, terminal("event_in_future", "the usage time is more than 5 minutes ahead of this clock; "+
				"Lago would bill it in a billing period that has not begun")
		case c.grace <= 0 || now.Sub(r.OccurredAt) > c.grace:
			return time.Time{}, false, terminal("event_too_old", fmt.Sprintf("the usage happened at %s, outside the grace period "+
				"(spec.lago.gracePeriod) in which Lago still bills an event dated then: Lago would accept it and never bill it; "+
				"add the usage to the customer's invoice in Lago", r.OccurredAt.UTC().Format(time.RFC3339)))
		}
		return r.OccurredAt.Truncate(time.Second), true, nil
	}
	if !r.FirstSubmittedAt.IsZero() {
		return r.FirstSubmittedAt.Truncate(time.Second), true, nil
	}
	return time.Time{}, false, nil
}

func mustJSON(s string) json.RawMessage {
	b, _ := json.Marshal(s) // a string always encodes
	return b
}

// Lookup reads the event under idempotencyKey (GET /api/v1/events/{transaction_id}):
// Lago's 404 event_not_found is found=false on the default pipeline; on ClickHouse it
// proves nothing and is answered Unanswerable (unseen). The record carries what Lago
// holds, for billing.Match to compare.
func (c *Client) Lookup(ctx context.Context, idempotencyKey string) (billing.Record, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	rec, found, err := c.lookup(ctx, idempotencyKey, nil)
	return rec, found, c.unseen(found, err, idempotencyKey, "")
}

// LookupRequest is Lookup that also compares the event's date with r's, where r is
// dated (billing.LookupFor asks through it).
func (c *Client) LookupRequest(ctx context.Context, r billing.Request) (billing.Record, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	rec, found, err := c.lookup(ctx, r.IdempotencyKey, &r)
	return rec, found, c.unseen(found, err, r.IdempotencyKey, r.Customer)
}

// unseen is a lookup's error: on the ClickHouse pipeline an event Lago does not show
// may still be on its way from Kafka (AbsenceUnproven), so "not found" is answered as
// a lookup Lago cannot answer (billing.Error.Unanswerable), saying which event to look
// for and where — what the person the settlement then stops for needs, as OpenMeter's
// adapter says of an event it does not list (docs/design.md §14).
func (c *Client) unseen(found bool, err error, key, subscription string) error {
	if err != nil || found || !c.async {
		return err
	}
	sub := ""
	if subscription != "" {
		sub = " for subscription " + subscription
	}
	return &billing.Error{Class: billing.Terminal, Code: "event_not_found", Status: http.StatusNotFound, Unanswerable: true,
		Message: fmt.Sprintf("Lago does not show an event with transaction_id %s%s; on the ClickHouse event pipeline it ingests "+
			"events asynchronously, so this does not prove the event was not received: look for it in Lago "+
			"(GET /api/v1/events/%s, or the events list under Developers)", key, sub, url.PathEscape(key))}
}

func (c *Client) lookup(ctx context.Context, key string, r *billing.Request) (billing.Record, bool, error) {
	if key == "" {
		return billing.Record{}, false, terminal("key_missing", "no transaction_id to look up")
	}
	resp, err := c.do(ctx, http.MethodGet, eventsPath+"/"+url.PathEscape(key), nil, false)
	if err != nil {
		return billing.Record{}, false, err
	}
	switch {
	case resp.Status == http.StatusOK:
		got, err := decodeEvent(resp)
		if err != nil {
			return billing.Record{}, false, &billing.Error{Class: billing.Transient, Code: "unreadable_reply", Status: resp.Status,
				Message: "Lago's event could not be read", Err: err}
		}
		if got.TransactionID != key {
			return billing.Record{}, false, &billing.Error{Class: billing.Transient, Code: "wrong_event", Status: resp.Status,
				Message: "Lago answered with another transaction_id than asked for"}
		}
		if r == nil {
			return c.record(got, billing.Request{}), true, nil
		}
		return c.record(got, *r), true, nil
	case resp.Status == http.StatusNotFound:
		if body := lagoError(resp.Body); body.Code == "event_not_found" {
			return billing.Record{}, false, nil
		}
		// A 404 without Lago's answer is a wrong endpoint, never "not found": a resend
		// decided on it could charge twice once the endpoint is right.
		return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "not_lago", Status: resp.Status,
			Message: "the endpoint answered 404 without Lago's event_not_found: check spec.endpoint is Lago's API host (without /api/v1)"}
	}
	return billing.Record{}, false, c.classify(resp, false)
}

// record is Lago's event in billing's terms. r is the request it answers (its zero
// value for a lookup by key alone or a listing): a dated request's event dated
// otherwise holds other usage, so its usage is marked unproven.
func (c *Client) record(ev *wireEvent, r billing.Request) billing.Record {
	rec := billing.Record{ID: ev.LagoID, Status: billing.StatusSettled, IdempotencyKey: ev.TransactionID,
		Customer: ev.ExternalSubscriptionID, Type: billing.TypeCharge, SettlementKey: propString(ev.Properties[PropSettlementKey])}
	if rec.ID == "" {
		rec.ID = "event:" + ev.TransactionID
	}
	if t, err := time.Parse(time.RFC3339, ev.CreatedAt); err == nil {
		rec.CreatedAt = t
	}
	if meter, ok := c.byCode[ev.Code]; ok {
		u := &billing.Usage{Meter: meter, Unit: propString(ev.Properties[PropUnit])}
		u.Quantity = propNumber(ev.Properties[c.metrics[meter].FieldName])
		rec.Usage = u
	} else {
		// A code no usage meter maps to: usage of something we never send.
		rec.Usage = &billing.Usage{Quantity: "0"}
	}
	if !r.OccurredAt.IsZero() {
		if at, ok := eventTime(ev.Timestamp); !ok || !at.Equal(r.OccurredAt.Truncate(time.Second)) {
			rec.Omitted = append(rec.Omitted, "usage")
		}
	}
	return rec
}

// propString is a string property ("" when absent or not a string).
func propString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return ""
}

// propNumber is a quantity property as a decimal string: Lago keeps a property as sent
// (a JSON number) and may answer it as a string; "" when absent or not a number.
func propNumber(raw json.RawMessage) string {
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&n) == nil {
		return n.String()
	}
	if s := propString(raw); s != "" {
		if _, err := strconv.ParseFloat(s, 64); err == nil {
			return s
		}
	}
	return ""
}

// eventTime reads an event's timestamp: Lago answers ISO 8601 (with milliseconds).
func eventTime(raw json.RawMessage) (time.Time, bool) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}

func decodeEvent(resp billing.Response) (*wireEvent, error) {
	if resp.Truncated {
		return nil, errors.New("reply too long")
	}
	var env wireEnvelope
	if err := json.Unmarshal(resp.Body, &env); err != nil {
		return nil, fmt.Errorf("decode event: %w", err)
	}
	if env.Event == nil || env.Event.TransactionID == "" {
		return nil, errors.New("reply holds no event")
	}
	return env.Event, nil
}

// PageSize is how many events one List call asks Lago for.
const PageSize = 100

// wirePage is Lago's page of events.
type wirePage struct {
	Events []wireEvent `json:"events"`
	Meta   struct {
		CurrentPage int  `json:"current_page"`
		NextPage    *int `json:"next_page"`
		TotalPages  int  `json:"total_pages"`
	} `json:"meta"`
}

// DefaultLateRetry is Config.LateRetry's default: spec.idempotencyWindow's default.
const DefaultLateRetry = 24 * time.Hour

// List pages through Lago's events for reconciliation (GET /api/v1/events). Lago
// filters events by their timestamp, not by when it received them, and an event may be
// dated up to the grace period before it was sent — or, undated, at its first attempt,
// accepted up to LateRetry later: the listing starts the longer of the two before
// since, and keeps the events Lago created at or after since. It ends at the first
// call's clock (timestamp_to, carried in the cursor), so the pages of one pass stay put
// while new events arrive. Events that do not carry a settlement key are someone
// else's and are left out.
func (c *Client) List(ctx context.Context, since time.Time, cursor string) ([]billing.Record, string, error) {
	page, until := 1, c.now().UTC().Truncate(time.Second).Add(time.Second)
	if cursor != "" {
		p, u, ok := strings.Cut(cursor, "@")
		n, err1 := strconv.Atoi(p)
		secs, err2 := strconv.ParseInt(u, 10, 64)
		if !ok || err1 != nil || err2 != nil || n < 1 {
			return nil, "", terminal("bad_cursor", "the listing cursor is not one this adapter gave")
		}
		page, until = n, time.Unix(secs, 0).UTC()
	}
	q := url.Values{}
	q.Set("page", strconv.Itoa(page))
	q.Set("per_page", strconv.Itoa(PageSize))
	q.Set("timestamp_from", since.Add(-max(c.grace, c.late)).UTC().Format(time.RFC3339))
	q.Set("timestamp_to", until.Format(time.RFC3339))
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.do(ctx, http.MethodGet, eventsPath+"?"+q.Encode(), nil, false)
	if err != nil {
		return nil, "", err
	}
	if resp.Status != http.StatusOK {
		return nil, "", c.classify(resp, false)
	}
	var p wirePage
	if resp.Truncated || json.Unmarshal(resp.Body, &p) != nil {
		return nil, "", &billing.Error{Class: billing.Transient, Code: "unreadable_reply", Status: resp.Status, Message: "Lago's page of events could not be read"}
	}
	// Lago's created_at is in whole seconds: an event created in since's own second
	// reads as created before since, so the bound is that second's start.
	from := since.Truncate(time.Second)
	var out []billing.Record
	for i := range p.Events {
		rec := c.record(&p.Events[i], billing.Request{})
		if rec.SettlementKey == "" || (!rec.CreatedAt.IsZero() && rec.CreatedAt.Before(from)) {
			continue
		}
		out = append(out, rec)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	if p.Meta.NextPage == nil || *p.Meta.NextPage <= page {
		return out, "", nil
	}
	return out, fmt.Sprintf("%d@%d", *p.Meta.NextPage, until.Unix()), nil
}

// do sends one request to Lago and reads the reply; a failed exchange is classified by
// the transport (billing.Do).
func (c *Client) do(ctx context.Context, method, path string, body []byte, mutating bool) (billing.Response, error) {
	var rd *bytes.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, c.endpoint+path, rd)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, c.endpoint+path, nil)
	}
	if err != nil {
		return billing.Response{}, terminal("bad_request", "the request to Lago could not be built: "+err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return billing.Do(c.hc, req, mutating)
}

// terminal is a request the adapter refuses before sending anything (Local): it says
// nothing about Lago's health.
func terminal(code, msg string) *billing.Error {
	return &billing.Error{Class: billing.Terminal, Code: code, Message: msg, Local: true}
}
