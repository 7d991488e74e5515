// Package stripebilling is the billing adapter for Stripe (BillingProvider spec.type
// Stripe), built on stripe-go. It turns the operator's settlements into Stripe objects
// and Stripe's answers and errors into billing.Record and billing.Error, so nothing
// above it knows Stripe's vocabulary (docs/design.md §13):
//
//   - a usage charge is a Billing Meter Event: event_name from the meter mapping,
//     payload {customer, value}, identifier = the settlement's idempotency key (Stripe
//     enforces identifier uniqueness for at least 24 h), timestamp = when the usage
//     happened (Stripe takes events up to 35 days old);
//   - an amount charge is an Invoice Item (customer, amount, currency, description,
//     metadata naming the settlement); the settlement's amount is in ISO 4217 minor
//     units and Stripe's in its own (currency.go: JPY alike, ISK ×100, a KWD amount
//     must end in 0), converted both ways, and refused before sending when Stripe
//     cannot take it exactly;
//   - compensation: a void or a usage refund of a meter event is a Meter Event
//     Adjustment (cancel, within Stripe's 24 h); a void of an invoice item deletes it
//     while it is not invoiced; a refund of an amount is a credit (a negative invoice
//     item), whatever the original was.
//
// Every mutating call carries the settlement's idempotency key as Idempotency-Key;
// stripe-go's own retries are off (MaxNetworkRetries 0): the settlement controller
// retries, with the same key. What "asking Stripe" means for each object is in
// LookupRequest; docs/decisions.md "Stripe adapter" says why.
package stripebilling

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// DefaultEndpoint is Stripe's API.
const DefaultEndpoint = "https://api.stripe.com"

// Stripe's documented windows.
const (
	// MaxEventAge is how old a meter event's timestamp may be (35 days); an hour is
	// kept in hand so an event is not refused between our check and Stripe's.
	MaxEventAge = 35*24*time.Hour - time.Hour
	// MaxFuture is how far ahead of Stripe's clock a timestamp may be (5 minutes).
	MaxFuture = 5 * time.Minute
	// CancelWindow is how long after receipt a meter event can be cancelled (24 h).
	CancelWindow = 24 * time.Hour
	// KeyWindow is how long Stripe keeps an idempotency key's result (24 h): the
	// BillingProvider's idempotencyWindow may not exceed it for this type.
	KeyWindow = 24 * time.Hour
)

// Metadata keys the adapter writes on invoice items, so a listed item can be tied to
// its settlement. A settlement's own metadata may not use them.
const (
	MetaSettlementKey  = "settlement_key"
	MetaIdempotencyKey = "settlement_idempotency_key"
	MetaType           = "settlement_type"
	MetaReverses       = "settlement_reverses"
)

// Meter maps one usage meter of the settlements (spec.usage.meter) to a Stripe meter.
type Meter struct {
	// EventName is the Stripe meter's event_name.
	EventName string
	// ID is the Stripe meter's ID (mtr_…), used to read its event summaries in
	// reconciliation; "" leaves the meter out of the comparison.
	ID string
	// CustomerKey and ValueKey are the meter's payload keys (Stripe's defaults
	// stripe_customer_id and value when empty).
	CustomerKey, ValueKey string
	// DateAtCompletion dates events at the usage's time (the job's completion) while
	// Stripe still bills them there (DateUsage); false lets Stripe date them at receipt.
	DateAtCompletion bool
	// GracePeriod is the account's invoice finalization grace period
	// (DefaultGracePeriod when zero).
	GracePeriod time.Duration
}

// DefaultGracePeriod is Stripe's default invoice finalization grace period.
const DefaultGracePeriod = time.Hour

// DateMargin keeps a dated event clear of the end of the grace period: the reconcile
// that sends it, the request (requestTimeout ≤ 1m) and clock skew between replicas
// and Stripe all fit in it.
const DateMargin = 10 * time.Minute

// Config configures a client.
type Config struct {
	// Endpoint is the API base URL (DefaultEndpoint when empty); tests use stripe-mock
	// or the Stripe-shaped fake.
	Endpoint string
	// APIKey is a secret (sk_) or restricted (rk_) key.
	APIKey string
	// Timeout bounds each call.
	Timeout time.Duration
	// Meters maps usage meters to Stripe meters; a usage charge for a meter not listed
	// is refused (terminal), never sent under a guessed name.
	Meters map[string]Meter
	// Now is the clock (time.Now), for the 35-day and 24-hour windows.
	Now func() time.Time
}

// Mode says whether a key is for test or live data, from its prefix.
type Mode string

// Key modes.
const (
	ModeTest Mode = "test"
	ModeLive Mode = "live"
)

// KeyMode reads a Stripe key's mode from its prefix (sk_test_, rk_test_, sk_live_,
// rk_live_); any other key is an error naming what was expected, never the key.
func KeyMode(key string) (Mode, error) {
	for _, p := range []string{"sk_test_", "rk_test_"} {
		if strings.HasPrefix(key, p) && len(key) > len(p) {
			return ModeTest, nil
		}
	}
	for _, p := range []string{"sk_live_", "rk_live_"} {
		if strings.HasPrefix(key, p) && len(key) > len(p) {
			return ModeLive, nil
		}
	}
	return "", errors.New("not a Stripe secret or restricted key (expected sk_test_, rk_test_, sk_live_ or rk_live_)")
}

// Client is the Stripe adapter.
type Client struct {
	sc     *stripe.Client
	cfg    Config
	mode   Mode
	meters map[string]Meter

	mu      sync.Mutex
	checked map[string]meterCheck // by Stripe meter ID
}

var _ billing.Client = (*Client)(nil)

// New builds a client; a key of unknown shape or an unusable endpoint is an error.
func New(cfg Config) (*Client, error) {
	mode, err := KeyMode(cfg.APIKey)
	if err != nil {
		return nil, err
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("stripe endpoint %q is not an http(s) URL", cfg.Endpoint)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	meters := map[string]Meter{}
	for name, m := range cfg.Meters {
		if m.EventName == "" {
			return nil, fmt.Errorf("stripe meter for usage meter %q has no eventName", name)
		}
		if m.CustomerKey == "" {
			m.CustomerKey = "stripe_customer_id"
		}
		if m.ValueKey == "" {
			m.ValueKey = "value"
		}
		meters[name] = m
	}
	// Each call is bounded by a context deadline, not http.Client.Timeout: the
	// client's own timeout replaces the transport's error with its own text, and the
	// classification (never connected / sent) would be lost.
	hc := billing.NoRedirectClient()
	hc.Transport = &billing.ClassifyingTransport{Base: hc.Transport}
	endpoint := strings.TrimRight(cfg.Endpoint, "/")
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL: stripe.String(endpoint), HTTPClient: hc, MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry: stripe.Bool(false), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return &Client{sc: stripe.NewClient(cfg.APIKey, stripe.WithBackends(backends)), cfg: cfg, mode: mode, meters: meters}, nil
}

// Mode is the key's mode: test or live data.
func (c *Client) Mode() Mode { return c.mode }

// String never shows the key.
func (c *Client) String() string { return fmt.Sprintf("stripe(%s, %s mode)", c.cfg.Endpoint, c.mode) }

// GoString keeps %#v from printing the client's fields, the key among them.
func (c *Client) GoString() string { return c.String() }

// Submit carries out r under r.IdempotencyKey.
func (c *Client) Submit(ctx context.Context, r billing.Request) (billing.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	switch {
	case r.Amount != nil && r.Amount.Minor < 0:
		return billing.Record{}, refused("negative_amount", "an amount is never negative: a refund's amount is what is given back")
	case r.Usage != nil && r.Amount != nil:
		return billing.Record{}, refused("usage_and_amount", "a Stripe settlement is either usage (a meter event) or an amount (an invoice item), not both")
	case r.Type == billing.TypeCharge && r.Usage != nil:
		return c.meterEvent(ctx, r)
	case r.Type == billing.TypeCharge && r.Amount != nil:
		return c.invoiceItem(ctx, r, false)
	case r.Type == billing.TypeCharge:
		return billing.Record{}, refused("nothing_to_charge", "a charge needs usage or an amount")
	case r.Reverses == "" || r.ReversesRef == "":
		return billing.Record{}, refused("reverses_unknown", "a refund or void needs the charge it reverses and that charge's Stripe reference")
	case isMeterEventRef(r.ReversesRef) && r.Amount == nil:
		return c.cancelMeterEvent(ctx, r)
	case r.Type == billing.TypeRefund && r.Amount != nil:
		// A credit: a negative invoice item, for an invoice item or a meter event alike.
		return c.invoiceItem(ctx, r, true)
	case r.Type == billing.TypeVoid && strings.HasPrefix(r.ReversesRef, "ii_"):
		return c.deleteInvoiceItem(ctx, r)
	}
	return billing.Record{}, refused("unsupported_compensation",
		fmt.Sprintf("a %s of %s cannot be expressed in Stripe: void a meter event or an uninvoiced invoice item, or refund an amount (a credit)", r.Type, r.ReversesRef))
}

// Capabilities says what Stripe can answer about r (docs/design.md §14), in one place:
//   - a usage charge (a meter event) cannot be read back (LookupNone); inside Stripe's
//     24-hour window a resend is proof — Stripe replays the first answer under the
//     Idempotency-Key, or answers that it holds the identifier (our idempotency key,
//     which only this settlement sends);
//   - an invoice item (an amount charged, or a refund as a credit) is found by listing
//     the customer's items since the first submission; a resend under the
//     Idempotency-Key inside 24 hours is replayed, never executed twice;
//   - a cancellation of a meter event cannot be read back, and proves nothing when
//     repeated (it cancels once, whatever came before: billing.Error.RepeatHarmless);
//   - a deleted invoice item is read back by its reference.
func (c *Client) Capabilities(r billing.Request) billing.Capabilities { return RequestCapabilities(r) }

// RequestCapabilities is Capabilities without a client, for deciding before one is
// built (a settlement's first exposure).
func RequestCapabilities(r billing.Request) billing.Capabilities {
	switch {
	case r.Type == billing.TypeCharge && r.Usage != nil:
		return billing.Capabilities{Lookup: billing.LookupNone, Window: KeyWindow, ResendIsProof: true}
	case r.Amount != nil && (r.Type == billing.TypeCharge || r.Type == billing.TypeRefund):
		return billing.Capabilities{Lookup: billing.LookupByListing, Window: KeyWindow, ResendIsProof: true}
	case isMeterEventRef(r.ReversesRef):
		return billing.Capabilities{Lookup: billing.LookupNone, Window: KeyWindow}
	}
	return billing.Capabilities{Lookup: billing.LookupByKey, Window: KeyWindow}
}

// MeterEventRef is the provider reference of a meter event: Stripe gives meter events
// no ID, so the reference is the identifier (our idempotency key) under a prefix that
// says so.
func MeterEventRef(identifier string) string { return "meter_event:" + identifier }

func isMeterEventRef(ref string) bool { return strings.HasPrefix(ref, "meter_event:") }

// WholeQuantity returns q as a whole number, or an error: Stripe's meter values are
// whole numbers, so a fractional quantity is refused, never rounded (docs/decisions.md:
// bill in a smaller unit instead).
func WholeQuantity(q string) (string, error) {
	v, ok := new(big.Rat).SetString(q)
	if !ok || v.Sign() < 0 {
		return "", fmt.Errorf("usage quantity %q is not a non-negative decimal", q)
	}
	if !v.IsInt() {
		return "", fmt.Errorf("usage quantity %q has a fraction; Stripe meter values are whole numbers: report the usage in a smaller unit", q)
	}
	return v.Num().String(), nil
}

// meter is the Stripe meter of a usage meter; one not configured is refused, never
// sent under a guessed name.
func (c *Client) meter(name string) (Meter, error) {
	m, ok := c.meters[name]
	if !ok {
		return Meter{}, refused("unknown_meter", fmt.Sprintf("no Stripe meter is configured for usage meter %q (spec.stripe.meters)", name))
	}
	return m, nil
}

func (c *Client) meterEvent(ctx context.Context, r billing.Request) (billing.Record, error) {
	m, err := c.meter(r.Usage.Meter)
	if err != nil {
		return billing.Record{}, err
	}
	value, err := WholeQuantity(r.Usage.Quantity)
	if err != nil {
		return billing.Record{}, refused("fractional_quantity", err.Error())
	}
	p := &stripe.BillingMeterEventCreateParams{
		EventName:  stripe.String(m.EventName),
		Identifier: stripe.String(r.IdempotencyKey),
		Payload:    map[string]string{m.CustomerKey: r.Customer, m.ValueKey: value},
	}
	if !r.OccurredAt.IsZero() {
		now := c.cfg.Now()
		if now.Sub(r.OccurredAt) > MaxEventAge {
			return billing.Record{}, refused("event_too_old", fmt.Sprintf(
				"the usage happened at %s, more than Stripe's 35 days ago: Stripe refuses meter events that old; unless an earlier attempt may have reached Stripe, bill it as an amount (an invoice item) instead",
				r.OccurredAt.UTC().Format(time.RFC3339)))
		}
		if r.OccurredAt.Sub(now) > MaxFuture {
			return billing.Record{}, refused("event_in_future", "the usage time is more than 5 minutes ahead of this clock; Stripe refuses it")
		}
		p.Timestamp = stripe.Int64(r.OccurredAt.Unix())
	}
	p.IdempotencyKey = stripe.String(r.IdempotencyKey)
	ev, err := c.sc.V1BillingMeterEvents.Create(ctx, p)
	if err != nil {
		if se := stripeError(err); se != nil && se.Code == stripe.ErrorCodeResourceAlreadyExists {
			// Stripe holds a meter event with our identifier, inside its uniqueness window.
			// A namespaced idempotency key is derived from the settlement's namespace and
			// settlement key, whose spec is immutable, and sent by nothing but this
			// settlement — so the event is this request, content included, and the answer,
			// as a replay is (docs/decisions.md "Resend as the lookup"). A legacy key is
			// the same in every namespace: another tenant's event may hold it, so its
			// record proves existence only, fails Match, and a human looks.
			rec := meterRecord(r, m, value, r.IdempotencyKey)
			if !r.KeyNamespaced {
				rec.Omitted = []string{"customer", "usage"}
			}
			return rec, nil
		}
		return billing.Record{}, classify(err, true)
	}
	rec := meterRecord(r, m, value, ev.Identifier)
	if ev.Payload[m.CustomerKey] != r.Customer || ev.Payload[m.ValueKey] != value || ev.EventName != m.EventName {
		// Stripe echoes the event; a different one is not provably ours.
		rec.Customer, rec.Usage.Quantity = ev.Payload[m.CustomerKey], ev.Payload[m.ValueKey]
		if ev.EventName != m.EventName {
			rec.Usage.Meter = ""
		}
	}
	return rec, nil
}

func meterRecord(r billing.Request, m Meter, value, identifier string) billing.Record {
	return billing.Record{
		ID: MeterEventRef(identifier), Status: billing.StatusSettled, SettlementKey: r.SettlementKey,
		IdempotencyKey: identifier, Customer: r.Customer, Type: r.Type, Reverses: r.Reverses,
		Usage: &billing.Usage{Meter: r.Usage.Meter, Quantity: value, Unit: r.Usage.Unit},
	}
}

func (c *Client) cancelMeterEvent(ctx context.Context, r billing.Request) (billing.Record, error) {
	identifier := strings.TrimPrefix(r.ReversesRef, "meter_event:")
	if r.Usage == nil {
		return billing.Record{}, refused("usage_required", "cancelling a meter event needs the usage it reverses")
	}
	m, err := c.meter(r.Usage.Meter)
	if err != nil {
		return billing.Record{}, err
	}
	p := &stripe.BillingMeterEventAdjustmentCreateParams{
		EventName: stripe.String(m.EventName), Type: stripe.String("cancel"),
		Cancel: &stripe.BillingMeterEventAdjustmentCreateCancelParams{Identifier: stripe.String(identifier)},
	}
	p.IdempotencyKey = stripe.String(r.IdempotencyKey)
	if _, err := c.sc.V1BillingMeterEventAdjustments.Create(ctx, p); err != nil {
		if se := stripeError(err); se != nil && se.HTTPStatusCode == http.StatusBadRequest && se.Type == stripe.ErrorTypeInvalidRequest {
			e := classify(err, true)
			e.Message = "Stripe refused to cancel the meter event (it cancels only events received in the last 24 hours): " +
				"a meter event has no price at Stripe, so the operator cannot bound a refund of it; correct the customer's " +
				"invoice in the Stripe dashboard (a credit note or a negative invoice item); " + e.Message
			return billing.Record{}, e
		}
		return billing.Record{}, classify(err, true)
	}
	return billing.Record{
		ID: "meter_event_cancel:" + identifier, Status: billing.StatusSettled, SettlementKey: r.SettlementKey,
		IdempotencyKey: r.IdempotencyKey, Customer: r.Customer, Type: r.Type, Reverses: r.Reverses,
		Usage: &billing.Usage{Meter: r.Usage.Meter, Quantity: r.Usage.Quantity, Unit: r.Usage.Unit},
	}, nil
}

// invoiceItem sends r's amount as an invoice item, negative for a credit. r.Amount is
// in ISO 4217 minor units; Stripe's amount is converted from it (currency.go), and an
// amount Stripe cannot take exactly is refused here, before anything is sent.
func (c *Client) invoiceItem(ctx context.Context, r billing.Request, credit bool) (billing.Record, error) {
	minor, err := ToStripeAmount(r.Amount.Currency, r.Amount.Minor)
	if err != nil {
		code := "amount_not_representable"
		if _, unitErr := unitOf(strings.ToUpper(r.Amount.Currency)); unitErr != nil {
			code = "currency_unit_unknown"
		}
		return billing.Record{}, refused(code, err.Error())
	}
	if credit {
		minor = -minor
	}
	md := map[string]string{}
	for k, v := range r.Metadata {
		md[k] = v
	}
	for _, k := range []string{MetaSettlementKey, MetaIdempotencyKey, MetaType, MetaReverses} {
		if _, taken := md[k]; taken {
			return billing.Record{}, refused("metadata_key_reserved", fmt.Sprintf("metadata key %q is the adapter's own", k))
		}
	}
	md[MetaSettlementKey], md[MetaIdempotencyKey], md[MetaType] = r.SettlementKey, r.IdempotencyKey, r.Type
	if r.Reverses != "" {
		md[MetaReverses] = r.Reverses
	}
	p := &stripe.InvoiceItemCreateParams{
		Customer: stripe.String(r.Customer), Amount: stripe.Int64(minor),
		Currency:    stripe.String(strings.ToLower(r.Amount.Currency)),
		Description: stripe.String(description(r)),
	}
	p.Metadata = md
	p.IdempotencyKey = stripe.String(r.IdempotencyKey)
	it, err := c.sc.V1InvoiceItems.Create(ctx, p)
	if err != nil {
		return billing.Record{}, classify(err, true)
	}
	return itemRecord(it), nil
}

func description(r billing.Request) string {
	switch r.Type {
	case billing.TypeRefund:
		return "Credit for " + r.Reverses
	default:
		return "Settlement " + r.SettlementKey
	}
}

// itemRecord reads a settlement's invoice item back; an item without our metadata
// yields a record with those fields empty (Match then refuses it). Its amount is
// converted back to ISO 4217 minor units, the unit of the request, so that Match
// compares in one unit; an amount with no exact ISO value cannot be one we sent, and
// the record carries no amount (Match refuses it: a human looks).
func itemRecord(it *stripe.InvoiceItem) billing.Record {
	rec := billing.Record{
		ID: it.ID, Status: billing.StatusSettled, SettlementKey: it.Metadata[MetaSettlementKey],
		IdempotencyKey: it.Metadata[MetaIdempotencyKey], Type: it.Metadata[MetaType], Reverses: it.Metadata[MetaReverses],
		CreatedAt: time.Unix(it.Date, 0),
	}
	if it.Customer != nil {
		rec.Customer = it.Customer.ID
	}
	currency := strings.ToUpper(string(it.Currency))
	minor, err := FromStripeAmount(currency, it.Amount)
	if err != nil {
		return rec
	}
	if rec.Type == billing.TypeRefund {
		minor = -minor // a credit is negative at Stripe, a positive refund here
	}
	rec.Amount = &billing.Amount{Minor: minor, Currency: currency}
	return rec
}

func (c *Client) deleteInvoiceItem(ctx context.Context, r billing.Request) (billing.Record, error) {
	p := &stripe.InvoiceItemDeleteParams{}
	p.IdempotencyKey = stripe.String(r.IdempotencyKey)
	_, err := c.sc.V1InvoiceItems.Delete(ctx, r.ReversesRef, p)
	if se := stripeError(err); se != nil && se.Code == stripe.ErrorCodeResourceMissing {
		// Gone — deleted by an earlier attempt whose answer was lost (Stripe does not
		// replay DELETEs under a key), by a human — or never in this account and mode.
		return billing.Record{}, missingItem(r.ReversesRef, se.HTTPStatusCode)
	}
	if err != nil {
		if se := stripeError(err); se != nil && se.HTTPStatusCode == http.StatusBadRequest {
			e := classify(err, true)
			e.Message = "Stripe refused to delete the invoice item (it cannot be deleted once invoiced): refund it instead, which Stripe records as a credit; " + e.Message
			return billing.Record{}, e
		}
		return billing.Record{}, classify(err, true)
	}
	return voidRecord(r), nil
}

// voidRecord is the record of a void that deleted the invoice item it reverses.
func voidRecord(r billing.Request) billing.Record {
	rec := billing.Record{ID: "deleted:" + r.ReversesRef, Status: billing.StatusSettled, SettlementKey: r.SettlementKey,
		IdempotencyKey: r.IdempotencyKey, Customer: r.Customer, Type: r.Type, Reverses: r.Reverses}
	if r.Amount != nil {
		a := *r.Amount
		rec.Amount = &a
	}
	return rec
}

// missingItem answers an invoice item Stripe does not have: Stripe says the same of a
// deleted item and of one never in this account and mode, so it proves nothing either
// way and a human looks.
func missingItem(ref string, status int) *billing.Error {
	return &billing.Error{Class: billing.Terminal, Code: "invoice_item_missing", Status: status, Unanswerable: true,
		Message: "Stripe has no invoice item " + ref + " in this account and mode: it was deleted (perhaps by an earlier " +
			"attempt of this void) or the key is for another account or mode; check the dashboard"}
}

// Lookup cannot ask Stripe by key alone: Stripe has no lookup by idempotency key.
// Callers use LookupRequest; this answers a classified error saying so.
func (c *Client) Lookup(context.Context, string) (billing.Record, bool, error) {
	return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "lookup_needs_request", Unanswerable: true,
		Message: "Stripe cannot be asked by idempotency key alone"}
}

// LookupRequest is what "asking Stripe" means for each object:
//   - an invoice item (amount charge or credit): the customer's invoice items are
//     listed, newest first, and matched on our metadata's idempotency key; none found
//     is a real "not found" (a deleted item is not listed either, and a charge is only
//     looked up while it is not settled here, so it was never ours to void);
//   - a meter event or a cancellation: Stripe cannot list or read them back. The
//     answer is Unanswerable, with what to check in the Stripe dashboard; inside
//     Stripe's 24-hour key window the controller does not ask at all, it resends with
//     the same key, and the replay or the duplicate identifier is the answer.
//   - a deleted invoice item (void): the item is read; Stripe's "deleted" is proof,
//     a 404 is not (Stripe says the same of an item never in this account and mode).
func (c *Client) LookupRequest(ctx context.Context, r billing.Request) (billing.Record, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	switch {
	case r.Type == billing.TypeVoid && strings.HasPrefix(r.ReversesRef, "ii_"):
		p := &stripe.InvoiceItemRetrieveParams{}
		it, err := c.sc.V1InvoiceItems.Retrieve(ctx, r.ReversesRef, p)
		if se := stripeError(err); se != nil && se.Code == stripe.ErrorCodeResourceMissing {
			// Stripe cannot read a deletion back (a deleted item answers as one never
			// there): a settled void rests on Stripe's answer to its DELETE.
			e := missingItem(r.ReversesRef, se.HTTPStatusCode)
			e.Unreadable = true
			return billing.Record{}, false, e
		}
		if err == nil && it.Deleted {
			return voidRecord(r), true, nil
		}
		if err != nil {
			return billing.Record{}, false, classify(err, false)
		}
		return billing.Record{}, false, nil
	case r.Amount != nil:
		return c.findItem(ctx, r)
	}
	if r.Type != billing.TypeCharge {
		// A cancellation cannot be read back either, but cancelling an event twice
		// cancels it once: sending it is the answer (RepeatHarmless).
		event := strings.TrimPrefix(r.ReversesRef, "meter_event:")
		return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "meter_event_unreadable", Unanswerable: true,
			Unreadable: true, RepeatHarmless: true,
			Message: "Stripe cannot be asked whether the meter event with identifier " + event + " was cancelled (meter events and " +
				"their adjustments cannot be read back): look for the event in the Stripe dashboard (Billing → Meters → the meter's " +
				"events); if it shows as cancelled, the void is done; if not, it can no longer be cancelled after 24 hours: correct " +
				"the customer's invoice in the dashboard"}
	}
	return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "meter_event_unreadable", Unanswerable: true, Unreadable: true,
		Message: "Stripe cannot be asked whether it holds a meter event with identifier " + r.IdempotencyKey + " (meter events cannot " +
			"be read back): look for it in the Stripe dashboard (Billing → Meters → the meter's events); if it is there, the charge " +
			"is done; if not, report the usage to Stripe yourself with this identifier (the operator does not resend past Stripe's " +
			"24-hour key window)"}
}

// DateUsage says, at a usage charge's first attempt, until when its meter event may be
// dated at occurredAt (zero: do not date it; Stripe dates it at receipt). Stripe bills
// an event dated in a past billing period only until that period's invoice is
// finalized, grace period included, and accepts it silently after: an event is dated
// only if it reaches Stripe within the grace period of occurredAt — so within the
// grace period of any period's end after it — less DateMargin.
func (c *Client) DateUsage(meter string, occurredAt, now time.Time) time.Time {
	m, ok := c.meters[meter]
	if !ok || !m.DateAtCompletion || occurredAt.IsZero() || occurredAt.After(now) {
		return time.Time{} // a time ahead of this clock may be further ahead of Stripe's
	}
	grace := m.GracePeriod
	if grace <= 0 {
		grace = DefaultGracePeriod
	}
	until := occurredAt.Add(grace - DateMargin)
	if !now.Before(until) {
		return time.Time{}
	}
	return until
}

// VoidsSettled says a Void of a settled charge may be sent: Stripe cancels a meter
// event within 24 hours of receiving it and deletes an invoice item until it is
// invoiced, and refuses either after (the refusal says what to do instead).
func (c *Client) VoidsSettled() bool { return true }

// findItem looks for the invoice item carrying r's idempotency key among the
// customer's items, newest first, up to maxLookupItems: those created since r was
// first submitted (less listingSkew for the two clocks), since nothing created before
// can be r's — so a busy customer's older items never crowd ours out of the listing.
// A request this settlement never submitted lists them all.
func (c *Client) findItem(ctx context.Context, r billing.Request) (billing.Record, bool, error) {
	p := &stripe.InvoiceItemListParams{Customer: stripe.String(r.Customer)}
	p.Limit = stripe.Int64(100)
	if !r.FirstSubmittedAt.IsZero() {
		p.CreatedRange = &stripe.RangeQueryParams{GreaterThanOrEqual: r.FirstSubmittedAt.Add(-listingSkew).Unix()}
	}
	seen := 0
	for it, err := range c.sc.V1InvoiceItems.List(ctx, p) {
		if err != nil {
			return billing.Record{}, false, classify(err, false)
		}
		if it.Metadata[MetaIdempotencyKey] == r.IdempotencyKey {
			return itemRecord(it), true, nil
		}
		if seen++; seen >= maxLookupItems {
			return billing.Record{}, false, &billing.Error{Class: billing.Terminal, Code: "lookup_too_long", Unanswerable: true,
				Message: fmt.Sprintf("the customer has more than %d invoice items%s and none of the newest carries this settlement's key: "+
					"search the Stripe dashboard for invoice items with metadata %s=%s", maxLookupItems, since(r), MetaIdempotencyKey, r.IdempotencyKey)}
		}
	}
	return billing.Record{}, false, nil
}

// maxLookupItems bounds how many of a customer's invoice items one lookup reads.
const maxLookupItems = 1000

// since says from when findItem listed ("" when it listed them all).
func since(r billing.Request) string {
	if r.FirstSubmittedAt.IsZero() {
		return ""
	}
	return " created since this settlement was first sent (" + r.FirstSubmittedAt.UTC().Format(time.RFC3339) + ")"
}

// listingSkew is how far Stripe's clock may be behind ours when an invoice item's
// creation time is compared with our first submission: generous (an hour, where
// Stripe itself refuses meter events only 5 minutes in the future), since an item
// hidden by a wrong clock would read as "not found" — it still keeps a busy
// customer's history out of the listing.
const listingSkew = time.Hour

// List pages through the invoice items created at or after since (newest first, as
// Stripe lists), for reconciliation; items without our metadata are someone else's
// and are left out. Meter events cannot be listed: they are compared through the
// meters' event summaries instead (Summaries).
func (c *Client) List(ctx context.Context, since time.Time, cursor string) ([]billing.Record, string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	p := &stripe.InvoiceItemListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: since.Unix()}}
	p.Limit = stripe.Int64(pageSize)
	if cursor != "" {
		p.StartingAfter = stripe.String(cursor)
	}
	var out []billing.Record
	n, last := 0, ""
	for it, err := range c.sc.V1InvoiceItems.List(ctx, p) {
		if err != nil {
			return nil, "", classify(err, false)
		}
		n, last = n+1, it.ID
		if it.Metadata[MetaIdempotencyKey] != "" {
			out = append(out, itemRecord(it))
		}
		if n == pageSize {
			return out, last, nil // perhaps more: the next call starts after this item
		}
	}
	return out, "", nil
}

const pageSize = 100

var _ billing.UsageTotaler = (*Client)(nil)

// maxExactTotal is the largest aggregate compared: Stripe sends a summary's
// aggregated_value as a JSON number and stripe-go decodes it as a float64, which holds
// every whole number up to 2^53 exactly, and nothing past it.
const maxExactTotal = 1 << 53

// UsageTotal is Stripe's total of a usage meter's events for customer over [start,
// end) — the meter's event summary — compared by reconciliation with the quantities
// the operator sent (meter events cannot be listed or read back one by one). The
// Stripe meter is read first: only a meter that sums the value key of the events of
// our event name, for the customer key we send, totals what we sent. A meter without
// an ID in spec.stripe.meters, or that does not sum, answers Unanswerable.
//
// Errors: Unanswerable with Unreadable for a mapping without an ID (nothing to compare,
// by the user's choice); Unanswerable for a meter that cannot total what we send, or
// that this key cannot read (403) or this account and mode does not have (404: meter
// IDs differ between test and live mode) — the whole meter is out; Terminal for one
// customer's total that cannot be read or compared (Stripe refuses the customer, a
// total past 2^53); Transient for the rest (try the window again later). Any other
// refusal of a summary request is the meter's (Unanswerable), never one per customer.
func (c *Client) UsageTotal(ctx context.Context, meter, customer string, start, end time.Time) (string, error) {
	m, ok := c.meters[meter]
	if !ok {
		return "", &billing.Error{Class: billing.Terminal, Unanswerable: true, Code: "unknown_meter",
			Message: fmt.Sprintf("no Stripe meter is configured for usage meter %q (spec.stripe.meters) any more", meter)}
	}
	if m.ID == "" {
		return "", &billing.Error{Class: billing.Terminal, Unanswerable: true, Unreadable: true, Code: "meter_id_missing",
			Message: fmt.Sprintf("spec.stripe.meters has no id (mtr_...) for usage meter %q: Stripe's totals cannot be read without it", meter)}
	}
	if start.Truncate(time.Minute) != start || end.Truncate(time.Minute) != end || !end.After(start) {
		return "", refused("window_not_whole_minutes", "a meter event summary covers whole minutes, start before end")
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if err := c.checkMeter(ctx, meter, m); err != nil {
		return "", err
	}
	p := &stripe.BillingMeterEventSummaryListParams{ID: stripe.String(m.ID), Customer: stripe.String(customer),
		StartTime: stripe.Int64(start.Unix()), EndTime: stripe.Int64(end.Unix())}
	total := new(big.Int)
	for sum, err := range c.sc.V1BillingMeterEventSummaries.List(ctx, p) {
		if err != nil {
			e := classify(err, false)
			se := stripeError(err)
			switch {
			case se != nil && se.Param == "customer" && e.Class == billing.Terminal:
				return "", e // this customer's total only (Stripe refuses the customer)
			case e.Status == http.StatusForbidden || e.Status == http.StatusNotFound:
				c.forgetMeter(m.ID) // deleted or no longer readable since it was checked
				return "", meterUnreadable(m, meter, e)
			case e.Class == billing.Terminal:
				return "", &billing.Error{Class: billing.Terminal, Unanswerable: true, Code: "summary_refused", Status: e.Status,
					Message: fmt.Sprintf("Stripe refused the event summaries of meter %s: %s", m.ID, e.Message)}
			}
			return "", e
		}
		v := sum.AggregatedValue
		if v < 0 || v > maxExactTotal || v != math.Trunc(v) {
			return "", terminal("total_not_exact", fmt.Sprintf(
				"Stripe meter %s's total for this customer is not a whole number up to 2^53, which cannot be compared exactly", m.ID))
		}
		total.Add(total, new(big.Int).SetInt64(int64(v)))
	}
	return total.String(), nil
}

// meterCheckTTL is how long a meter's check is reused: a pass reads many customers'
// totals of one meter.
const meterCheckTTL = 5 * time.Minute

type meterCheck struct {
	at  time.Time
	err *billing.Error // nil: the meter totals what we send
}

// checkMeter reads the Stripe meter (once per meterCheckTTL) and says whether its
// totals are the sum of what the operator sends for usage meter name.
func (c *Client) checkMeter(ctx context.Context, name string, m Meter) error {
	c.mu.Lock()
	prior, ok := c.checked[m.ID]
	c.mu.Unlock()
	if ok && c.cfg.Now().Sub(prior.at) < meterCheckTTL {
		if prior.err != nil {
			return prior.err
		}
		return nil
	}
	var result *billing.Error
	sm, err := c.sc.V1BillingMeters.Retrieve(ctx, m.ID, nil)
	if err != nil {
		e := classify(err, false)
		if e.Status != http.StatusForbidden && e.Status != http.StatusNotFound {
			return e // not kept: try again
		}
		result = meterUnreadable(m, name, e)
	} else if why := meterMismatch(sm, m); why != "" {
		result = &billing.Error{Class: billing.Terminal, Unanswerable: true, Code: "meter_not_comparable",
			Message: fmt.Sprintf("Stripe meter %s %s: its totals are not the sum of what the operator sends for usage meter %q", m.ID, why, name)}
	}
	c.mu.Lock()
	if c.checked == nil {
		c.checked = map[string]meterCheck{}
	}
	c.checked[m.ID] = meterCheck{at: c.cfg.Now(), err: result}
	c.mu.Unlock()
	if result != nil {
		return result
	}
	return nil
}

func (c *Client) forgetMeter(id string) {
	c.mu.Lock()
	delete(c.checked, id)
	c.mu.Unlock()
}

// meterUnreadable is a meter this key may not read (403) or this account and mode does
// not have (404).
func meterUnreadable(m Meter, name string, e *billing.Error) *billing.Error {
	why := "this key may not read it (allow the restricted key to read billing meters)"
	if e.Status == http.StatusNotFound {
		why = "it does not exist in this account and mode (meter IDs differ between test and live mode)"
	}
	return &billing.Error{Class: billing.Terminal, Unanswerable: true, Code: "meter_unreadable", Status: e.Status,
		Message: fmt.Sprintf("Stripe meter %s of usage meter %q cannot be read: %s", m.ID, name, why)}
}

// meterMismatch says why a Stripe meter does not total what the operator sends for m
// ("" when it does).
func meterMismatch(sm *stripe.BillingMeter, m Meter) string {
	switch {
	case sm.EventName != m.EventName:
		return "counts another event name than spec.stripe.meters says"
	case sm.DefaultAggregation == nil || sm.DefaultAggregation.Formula != stripe.BillingMeterDefaultAggregationFormulaSum:
		return "does not sum its events (its aggregation formula is not sum)"
	case sm.CustomerMapping == nil || sm.CustomerMapping.EventPayloadKey != m.CustomerKey:
		return "reads the customer from another payload key than spec.stripe.meters says"
	case sm.ValueSettings == nil || sm.ValueSettings.EventPayloadKey != m.ValueKey:
		return "reads the value from another payload key than spec.stripe.meters says"
	}
	return ""
}

func stripeError(err error) *stripe.Error {
	var se *stripe.Error
	if errors.As(err, &se) {
		return se
	}
	return nil
}

func terminal(code, msg string) *billing.Error {
	return &billing.Error{Class: billing.Terminal, Code: code, Message: msg}
}

// refused is a terminal refusal made before anything was sent to Stripe (Local: it
// says nothing about Stripe's health).
func refused(code, msg string) *billing.Error {
	e := terminal(code, msg)
	e.Local = true
	return e
}

// classify turns a stripe-go error into the operator's three classes, once
// (docs/design.md §13): what to do next, never Stripe's vocabulary above this package.
func classify(err error, mutating bool) *billing.Error {
	if e, ok := billing.AsError(err); ok {
		return e // a transport failure, classified by the transport
	}
	se := stripeError(err)
	if se == nil {
		// No Stripe error and no transport error: the reply was unreadable.
		// stripe-go's error may quote the reply's body: it is not kept (billing.Error
		// never carries a body).
		e := &billing.Error{Class: billing.Ambiguous, Code: "unreadable_reply", Message: "Stripe's reply could not be read"}
		if !mutating {
			e.Class = billing.Transient
		}
		return e
	}
	e := &billing.Error{Status: se.HTTPStatusCode, Code: string(se.Code)}
	if e.Code == "" {
		e.Code = string(se.Type)
	}
	if e.Code == "" {
		e.Code = strconv.Itoa(se.HTTPStatusCode)
	}
	var header http.Header
	if se.LastResponse != nil {
		header = se.LastResponse.Header
	}
	switch {
	case se.HTTPStatusCode == http.StatusConflict:
		// First, whatever its type says: a request under this key may still commit.
		e.Class, e.InFlight = billing.Transient, true
		e.Message = "a request with the same idempotency key is in progress at Stripe"
	case se.Type == stripe.ErrorTypeIdempotency:
		// The key was used with other parameters: no retry can fix it.
		e.Class, e.KeyReused = billing.Terminal, true
		e.Message = "Stripe holds this idempotency key with other parameters"
	case se.HTTPStatusCode == http.StatusTooManyRequests:
		e.Class = billing.Transient
		e.RetryAfter = billing.RetryAfter(header, time.Now())
		e.Message = "rate limited by Stripe"
	case se.HTTPStatusCode == http.StatusUnauthorized || se.HTTPStatusCode == http.StatusForbidden:
		e.Class = billing.Transient
		e.Message = "Stripe refused the API key (check the Secret, and the restricted key's permissions)"
	case se.Type == stripe.ErrorTypeCard:
		e.Class = billing.Terminal
		e.Message = "Stripe declined: " + string(se.DeclineCode)
	case se.HTTPStatusCode >= 500 || se.Type == stripe.ErrorTypeAPI:
		e.RetryAfter = billing.RetryAfter(header, time.Now())
		if mutating {
			e.Class = billing.Ambiguous
			e.Message = "Stripe failed; it may have committed the request"
		} else {
			e.Class = billing.Transient
			e.Message = "Stripe failed"
		}
	case se.HTTPStatusCode >= 400:
		e.Class = billing.Terminal
		e.Message = "Stripe rejected the request"
		if se.Param != "" {
			e.Message += " (parameter " + se.Param + ")"
		}
	default:
		e.Class = billing.Ambiguous
		e.Message = "unexpected answer from Stripe"
	}
	return e
}
