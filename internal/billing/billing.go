// Package billing is the only code that talks to billing providers (docs/design.md §6.1).
//
// Everything above this package reasons in three error classes — Transient, Terminal,
// Ambiguous — and never in HTTP status codes or socket errors: the classification is
// done once, here, so that every caller retries, stops, or asks the provider by key for
// exactly the same reasons (STYLE: "classify provider errors once, in the adapter").
//
// A settlement's idempotency key is chosen by the caller and sent unchanged on every
// attempt; this package never invents keys, never retries on its own and never guesses
// an outcome: when it cannot know whether the provider committed a request it says so
// (Ambiguous) and leaves the authoritative question (Lookup) to the caller.
package billing

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Settlement types on the wire. The API's Charge/Refund/Void map onto these; they are
// lower case because that is what the §6.1 contract says the provider expects.
const (
	// TypeCharge takes money from the customer.
	TypeCharge = "charge"
	// TypeRefund gives money back for a settled charge, as a new operation with its own key.
	TypeRefund = "refund"
	// TypeVoid cancels a charge that has not settled yet, again as its own operation.
	TypeVoid = "void"
)

// Provider-side statuses of a settlement (§6.1). Pending is polled with Lookup until it
// becomes Settled or Failed; callers must not treat Pending as either.
const (
	// StatusPending means the provider accepted the request but has not decided yet.
	StatusPending = "pending"
	// StatusSettled means the money moved; the operation is complete.
	StatusSettled = "settled"
	// StatusFailed means the provider decided against it (e.g. card declined); final.
	StatusFailed = "failed"
)

// Usage is a metered quantity. Quantity stays a decimal string end to end so that no
// amount is ever rounded through float64; it is sent as a JSON number.
type Usage struct {
	// Meter is the provider's name for what was used, e.g. "gpt-tokens".
	Meter string
	// Quantity is a non-negative decimal literal such as "1523" or "12.5".
	Quantity string
	// Unit names the quantity's unit, e.g. "tokens"; informational.
	Unit string
}

// Amount is money in the currency's minor unit, because floats cannot represent cents.
type Amount struct {
	// Minor is the amount in the currency's ISO 4217 minor unit, e.g. 1250 for 12.50 USD,
	// 5 for 5 ISK; an adapter whose provider counts otherwise converts (stripebilling).
	Minor int64
	// Currency is the ISO 4217 code, e.g. "USD".
	Currency string
}

// Request is one logical financial operation as the provider sees it. The same Request
// with the same IdempotencyKey is sent on every attempt and every replay, which is what
// lets the provider deduplicate our retries (docs/design.md §1.5).
type Request struct {
	// SettlementKey is the business identity of the operation, e.g. "<provider>/<jobID>".
	SettlementKey string
	// IdempotencyKey is the provider-side deduplication key, derived once from the
	// settlement key and persisted in the BillingSettlement spec.
	IdempotencyKey string
	// Type is TypeCharge, TypeRefund or TypeVoid.
	Type string
	// Reverses is the settlement key a refund or void compensates; "" (sent as JSON
	// null) for a charge.
	Reverses string
	// Customer is the provider's customer ID.
	Customer string
	// Usage is what to bill for, when the provider prices usage itself; nil to omit.
	Usage *Usage
	// Amount is what to bill, when the amount is known up front; nil to omit.
	Amount *Amount
	// Metadata is descriptive and part of what the provider compares on a repeated key,
	// so it must be derived from stable fields only (never a time or attempt number).
	Metadata map[string]string
	// ReversesRef is the provider's reference of the charge a refund or void reverses
	// (its status.providerRef), for providers that compensate by reference (Stripe);
	// "" for a charge. Not sent by the HTTP adapter, not compared by Match.
	ReversesRef string
	// OccurredAt is when what is billed happened (a job's completion), for providers
	// that date usage (Stripe meter events); zero when unknown. It must be as stable as
	// the rest of the request: it is part of what a provider compares on a repeated key.
	OccurredAt time.Time
	// FirstSubmittedAt is when this settlement first sent the request (zero when it
	// never did). A provider whose records are found by listing lists only those created
	// since, less clock skew: nothing before it can be this request's. Neither sent nor
	// compared.
	FirstSubmittedAt time.Time
	// DatedAt is the usage time this settlement pinned at its first attempt
	// (status.usageDatedAt), carried on every request sent or asked about, whether or
	// not this one is sent dated (OccurredAt): a copy the provider holds under the key
	// may carry it, so it is the earliest timestamp a lookup must reach (Metronome's
	// 34-day search horizon). Zero when nothing was dated. Neither sent nor compared.
	DatedAt time.Time
	// KeyNamespaced: IdempotencyKey is derived from the settlement's namespace and
	// settlement key, so nothing but this settlement ever sends it (a legacy key is the
	// same in every namespace). Neither sent nor compared.
	KeyNamespaced bool
}

// Record is the provider's view of one settlement, as returned by Submit, Lookup and
// List. Fields a provider leaves out of a Submit reply are filled from the Request.
type Record struct {
	// ID is the provider's own reference, shown as PROVIDER-REF in kubectl.
	ID string
	// Status is StatusPending, StatusSettled or StatusFailed.
	Status string
	// FailureReason is the provider's reason when Status is StatusFailed.
	FailureReason string
	// SettlementKey is the business identity the provider recorded.
	SettlementKey string
	// IdempotencyKey is the key the record was created under; reconciliation matches on it.
	IdempotencyKey string
	// Customer is the provider's customer ID.
	Customer string
	// Type is TypeCharge, TypeRefund or TypeVoid.
	Type string
	// Reverses is the settlement key a refund or void compensates ("" for a charge,
	// and when the provider sent null or left it out).
	Reverses string
	// Usage is the billed usage, if any.
	Usage *Usage
	// Amount is the billed amount, if any.
	Amount *Amount
	// Omitted lists fields (wire names, e.g. "customer", "usage") whose value the
	// adapter holds no proof of although the record carries one (Stripe does not say
	// what a duplicate meter event holds): Match treats them as missing. A field a
	// provider leaves out of its JSON is not listed here: it is null, the zero value
	// above, exactly as if the provider had sent null.
	Omitted []string
	// CreatedAt is when the provider created the record (zero when it did not say);
	// List orders and filters by it.
	CreatedAt time.Time
}

// Client is a billing provider behind one interface, so that controllers are written
// once for every provider type (HTTP, Stripe) and tested against a fake.
// Every error it returns carries an *Error (see AsError) that says what to do next.
type Client interface {
	// Submit asks the provider to carry out r under r.IdempotencyKey. Calling it again
	// with the same Request and key is safe: the provider answers with the same record
	// instead of charging twice.
	Submit(ctx context.Context, r Request) (Record, error)
	// Lookup is the authoritative answer for an ambiguous outcome: the provider's record
	// for idempotencyKey, or found=false (and no error) when the provider has none.
	Lookup(ctx context.Context, idempotencyKey string) (rec Record, found bool, err error)
	// List pages through the provider's records created at or after since, for
	// reconciliation. Pass the returned cursor back to get the next page; "" means done.
	List(ctx context.Context, since time.Time, cursor string) (items []Record, next string, err error)
}

// RequestLooker is a Client whose provider cannot be asked by key alone (Stripe has no
// lookup by idempotency key): it finds a request's record from the request itself,
// or answers Unanswerable.
type RequestLooker interface {
	LookupRequest(ctx context.Context, r Request) (rec Record, found bool, err error)
}

// UsageTotaler is a Client whose provider keeps no record of a usage charge that can
// be listed or read back, but totals them per customer and meter (Stripe's meter event
// summaries): reconciliation compares those totals with ours (docs/design.md §13).
type UsageTotaler interface {
	// UsageTotal is the provider's total of usage meter's quantities for customer over
	// [start, end), whole minutes, as a decimal string. An *Error with Unanswerable says
	// this meter's totals cannot be compared at all (Message says why and what to do).
	UsageTotal(ctx context.Context, meter, customer string, start, end time.Time) (string, error)
}

// UsageTotalsOf returns c's UsageTotaler, under any wrappers; ok is false when its
// provider lists every record instead.
func UsageTotalsOf(c Client) (UsageTotaler, bool) {
	t, ok := Unwrap(c).(UsageTotaler)
	return t, ok
}

// UsageDater is a Client whose provider dates usage (Stripe's meter events) and may be
// told when it happened. DateUsage is asked once, at a usage charge's first attempt:
// it returns until when the charge may be sent dated at occurredAt, or zero to let the
// provider date it at receipt. The caller pins both, since the date is part of what
// the provider compares under the key, and sends later attempts undated.
type UsageDater interface {
	DateUsage(meter string, occurredAt, now time.Time) (until time.Time)
}

// UsageDaterOf returns c's UsageDater, under any wrappers.
func UsageDaterOf(c Client) (UsageDater, bool) {
	d, ok := Unwrap(c).(UsageDater)
	return d, ok
}

// SettledVoider is a Client whose provider can still cancel a record after it
// settled (Stripe: a meter event within 24 hours of receipt, an invoice item until it
// is invoiced), so a Void of a settled charge may be sent; the adapter refuses it,
// terminally and saying what to do instead, once the provider no longer can.
type SettledVoider interface {
	VoidsSettled() bool
}

// VoidsSettled reports whether c's provider can cancel a settled record (see
// SettledVoider), under any wrappers.
func VoidsSettled(c Client) bool {
	v, ok := Unwrap(c).(SettledVoider)
	return ok && v.VoidsSettled()
}

// LookupFor asks c for r's record: from the request where the adapter needs it, by
// r.IdempotencyKey otherwise. Controllers always ask through it.
func LookupFor(ctx context.Context, c Client, r Request) (Record, bool, error) {
	if l, ok := c.(RequestLooker); ok {
		return l.LookupRequest(ctx, r)
	}
	return c.Lookup(ctx, r.IdempotencyKey)
}

// Unwrap returns the adapter under any wrappers that implement Unwrap() Client.
func Unwrap(c Client) Client {
	for {
		u, ok := c.(interface{ Unwrap() Client })
		if !ok {
			return c
		}
		c = u.Unwrap()
	}
}

// Class says what a caller should do about a failed provider call. It is the only
// property of an error that controllers branch on.
type Class int

const (
	// Transient: the provider certainly did not act on the request (it was never
	// received, or was refused before processing: 429, 409 key in use, connection
	// refused). Retry with the same key after backoff (or RetryAfter).
	Transient Class = iota + 1
	// Terminal: the provider rejected the request and will reject it again (4xx,
	// idempotency key reused with other parameters). Stop retrying; a human or a new
	// operation must fix it.
	Terminal
	// Ambiguous: the provider may or may not have committed the request (5xx, timeout
	// or connection lost after the request was sent, unreadable success reply). Never
	// assume either way: retry with the same key or ask with Lookup.
	Ambiguous
)

// String returns the class name used in conditions and events.
func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Terminal:
		return "terminal"
	case Ambiguous:
		return "ambiguous"
	default:
		return fmt.Sprintf("Class(%d)", int(c))
	}
}

// Error is a classified provider failure. Callers decide retry, stop or look-up from
// Class alone; the other fields are for backoff (RetryAfter), the KeyReused special
// case (which needs reconciliation, not a retry) and human-readable status.
//
// Error never contains the provider credential nor a dump of a response body, so it is
// safe to put into status conditions and logs.
type Error struct {
	// Class is what to do next.
	Class Class
	// Code is the provider's error code when it sent one (e.g. "idempotency_key_reused"),
	// else the HTTP status as digits (e.g. "503"), else a network condition such as
	// "timeout", "connection_refused" or "connection_reset".
	Code string
	// Status is the HTTP status, or 0 when no response arrived.
	Status int
	// RetryAfter is the provider's requested wait (Retry-After), 0 when it gave none.
	RetryAfter time.Duration
	// KeyReused marks a 422 idempotency_key_reused: the key is bound to other
	// parameters at the provider, which no retry can fix (RequiresReconciliation).
	KeyReused bool
	// InFlight marks a 409 idempotency_key_in_use: the call itself was refused, but a
	// request with the same key is being processed right now and may still commit, so
	// money may move even though this call did not reach the provider's books.
	InFlight bool
	// Unanswerable marks a lookup the provider cannot answer at all (Stripe cannot
	// read meter events back): asking again will not help; Message says what a human
	// should check.
	Unanswerable bool
	// Unreadable, with Unanswerable, says the provider can never be asked about this
	// kind of record at all (Stripe's meter events): its answer to the submission is
	// all there is. Without it, this lookup could not answer (too many records to
	// search, a record that is gone), which a reconciliation pass reports.
	Unreadable bool
	// RepeatHarmless, with Unanswerable, says that carrying the request out twice moves
	// no more money than once (Stripe: a cancellation cancels its meter event at most
	// once), so a record that never sent it may send it although nobody can say
	// whether an earlier record under the same key did.
	RepeatHarmless bool
	// Local marks a refusal by the adapter itself, before anything was sent (a usage
	// meter with no mapping, a request the platform cannot express): it says nothing
	// about the provider — whether it is reachable, whether it takes the credentials —
	// so the provider's health ignores it.
	Local bool
	// Message is a short, human-readable explanation without secrets.
	Message string
	// Err is the underlying network or decoding error, if any.
	Err error
}

// RateLimited reports a call the provider refused for its rate limit (HTTP 429, after
// RetryAfter when it gave one): every adapter keeps the status of such an answer.
func (e *Error) RateLimited() bool {
	return e != nil && e.Status == http.StatusTooManyRequests
}

// Error describes the failure in one line, e.g.
// "ambiguous provider error (HTTP 503), retry after 2s: provider failed; it may have committed the request".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Class.String())
	b.WriteString(" provider error")
	switch {
	case e.Status != 0 && e.Code != "" && e.Code != fmt.Sprint(e.Status):
		fmt.Fprintf(&b, " (HTTP %d %s)", e.Status, e.Code)
	case e.Status != 0:
		fmt.Fprintf(&b, " (HTTP %d)", e.Status)
	case e.Code != "":
		fmt.Fprintf(&b, " (%s)", e.Code)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, ", retry after %s", e.RetryAfter)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap exposes the underlying cause, so errors.Is(err, context.DeadlineExceeded) and
// friends keep working through the classification.
func (e *Error) Unwrap() error { return e.Err }

// AsError finds the classified *Error in err's chain. Callers use it instead of
// errors.As so that the common case reads as one line; ok is false only for errors that
// did not come from this package (which callers should treat as Ambiguous).
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) && e != nil {
		return e, true
	}
	return nil, false
}

// Mismatch says why a provider's record is not provably the operation we asked for.
// It names the field, never its values: the record may be another tenant's.
type Mismatch struct {
	// Field is the contract's name of what differed or was missing, e.g. "customer",
	// "amount.currency", "usage.meter".
	Field string
	// Missing is true when the provider did not return the field at all.
	Missing bool
}

// String reads "customer differs" or "amount is missing".
func (m Mismatch) String() string {
	if m.Missing {
		return m.Field + " is missing from the provider's record"
	}
	return m.Field + " differs at the provider"
}

// Match fails closed: rec is the operation r only if every field we sent a value for
// is in rec and equal, and every field we sent as null is null in rec. A lookup record
// that lacks a field we gave a value (a provider that answers only id and status) is
// not proof that what it holds under our key is what we asked for, so it must never be
// adopted; a field we sent as null carries nothing to compare, so its absence decides
// nothing (a charge's reverses, the amount or usage we did not send, an empty unit),
// while a value there is not our request. Which fields carry a value follows from the
// settlement's type: a charge sends customer and its usage or amount; a refund or void
// also sends the key of what it reverses. Amounts a provider computed for a
// usage-priced request (no amount sent) are not compared: they are the provider's to
// decide. Fields an adapter lists in rec.Omitted are missing whatever their value.
func Match(r Request, rec Record) (Mismatch, bool) {
	checks := []fieldCheck{
		sameString("idempotency_key", r.IdempotencyKey, rec.IdempotencyKey),
		sameString("settlement_key", r.SettlementKey, rec.SettlementKey),
		sameString("type", r.Type, rec.Type),
		sameString("customer", r.Customer, rec.Customer),
		sameString("reverses", r.Reverses, rec.Reverses),
	}
	if r.Type == TypeRefund || r.Type == TypeVoid {
		// A compensation's record must name what it reverses; when we cannot name it
		// ourselves (the original is gone, or the archive that held it lost it), the
		// record cannot be confirmed as this compensation.
		checks = append(checks, fieldCheck{"reverses", r.Reverses != "" && rec.Reverses != "", true})
	}
	if r.Amount != nil {
		checks = append(checks, fieldCheck{"amount", rec.Amount != nil, true})
		if a := rec.Amount; a != nil {
			checks = append(checks, fieldCheck{"amount.minor", true, a.Minor == r.Amount.Minor},
				sameString("amount.currency", r.Amount.Currency, a.Currency))
		}
	}
	if r.Usage != nil {
		checks = append(checks, fieldCheck{"usage", rec.Usage != nil, true})
		if u := rec.Usage; u != nil {
			checks = append(checks, sameString("usage.meter", r.Usage.Meter, u.Meter),
				fieldCheck{"usage.quantity", u.Quantity != "", SameQuantity(u.Quantity, r.Usage.Quantity)},
				sameString("usage.unit", r.Usage.Unit, u.Unit))
		}
	} else {
		// We sent no usage: a record that bills usage is another request.
		checks = append(checks, fieldCheck{"usage", true, rec.Usage == nil})
	}
	for _, c := range checks {
		if !c.present || slices.Contains(rec.Omitted, c.field) {
			return Mismatch{Field: c.field, Missing: true}, false
		}
		if !c.equal {
			return Mismatch{Field: c.field}, false
		}
	}
	return Mismatch{}, true
}

// fieldCheck is one field of Match: whether the record holds what the field needs
// (present) and whether it equals what we sent.
type fieldCheck struct {
	field          string
	present, equal bool
}

// sameString checks a string field: "" is null, which is what an omitted JSON field
// reads as. A value we sent must be there and equal; a null we sent must stay null.
func sameString(field, sent, got string) fieldCheck {
	return fieldCheck{field: field, present: got != "" || sent == "", equal: got == sent}
}

// SameQuantity compares two decimal quantities by value ("12.50" equals "12.5").
func SameQuantity(a, b string) bool {
	x, ok1 := new(big.Rat).SetString(a)
	y, ok2 := new(big.Rat).SetString(b)
	if !ok1 || !ok2 {
		return a == b
	}
	return x.Cmp(y) == 0
}
