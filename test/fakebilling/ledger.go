package fakebilling

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// usageParams keeps the quantity as the decimal literal that was sent; equality is
// numeric and exact (big.Rat), never through float64.
type usageParams struct {
	Meter, Quantity, Unit string
}

// params are the parameters a provider binds to an idempotency key: a repeated key
// must carry equal params, otherwise it is "idempotency_key_reused" (as Stripe does,
// metadata included, which also catches non-deterministic metadata in the operator).
type params struct {
	SettlementKey string
	Type          string
	Reverses      *string
	Customer      string
	Usage         *usageParams
	Amount        *billing.Amount
	Metadata      map[string]string
}

func (p params) equal(q params) bool {
	if p.SettlementKey != q.SettlementKey || p.Type != q.Type || p.Customer != q.Customer {
		return false
	}
	if (p.Reverses == nil) != (q.Reverses == nil) || (p.Reverses != nil && *p.Reverses != *q.Reverses) {
		return false
	}
	if (p.Usage == nil) != (q.Usage == nil) || (p.Usage != nil && !p.Usage.equal(*q.Usage)) {
		return false
	}
	if (p.Amount == nil) != (q.Amount == nil) || (p.Amount != nil && *p.Amount != *q.Amount) {
		return false
	}
	return maps.Equal(p.Metadata, q.Metadata)
}

func (u usageParams) equal(v usageParams) bool {
	if u.Meter != v.Meter || u.Unit != v.Unit {
		return false
	}
	a, okA := new(big.Rat).SetString(u.Quantity)
	b, okB := new(big.Rat).SetString(v.Quantity)
	return okA && okB && a.Cmp(b) == 0
}

// entry is one ledger line: one accepted idempotency key.
type entry struct {
	params
	seq            int64 // arrival order, the tie-break after CreatedAt
	ID             string
	Status         string
	FailureReason  string
	IdempotencyKey string
	CreatedAt      time.Time
	autoSettle     bool // pending until pollsLeft GETs have seen it, then settled
	// priced is the amount the provider computed for a usage-only request; it is
	// reported but is not part of the request's parameters.
	priced    *billing.Amount
	pollsLeft int
}

// before is the ledger's order: creation time, then arrival.
func (e *entry) before(o *entry) bool {
	if a, b := e.CreatedAt.UnixNano(), o.CreatedAt.UnixNano(); a != b {
		return a < b
	}
	return e.seq < o.seq
}

func (e *entry) record() billing.Record {
	r := billing.Record{
		ID: e.ID, Status: e.Status, FailureReason: e.FailureReason, SettlementKey: e.SettlementKey,
		IdempotencyKey: e.IdempotencyKey, Customer: e.Customer, Type: e.Type, CreatedAt: e.CreatedAt,
	}
	if e.Usage != nil {
		r.Usage = &billing.Usage{Meter: e.Usage.Meter, Quantity: e.Usage.Quantity, Unit: e.Usage.Unit}
	}
	if e.Amount != nil {
		a := *e.Amount
		r.Amount = &a
	} else if e.priced != nil {
		a := *e.priced
		r.Amount = &a
	}
	return r
}

// The wire types below are the §6.1 JSON shapes as the provider writes them, defined
// here independently of internal/billing on purpose. They are exported for end-to-end
// tests that read the admin ledger of a fake running as another process.

// WireUsage is a record's usage; quantity is a JSON number.
type WireUsage struct {
	Meter    string      `json:"meter"`
	Quantity json.Number `json:"quantity"`
	Unit     string      `json:"unit"`
}

// WireAmount is a record's amount in minor units.
type WireAmount struct {
	Minor    int64  `json:"minor"`
	Currency string `json:"currency"`
}

// WireRecord is a ledger record on the wire: GET/POST replies, List items, the admin
// ledger and the admin import body all use it. Every contract field is written, null
// when it has no value; a provider set to omit nulls leaves those out of its replies.
type WireRecord struct {
	ID             string            `json:"id"`
	Status         string            `json:"status"`
	FailureReason  string            `json:"failure_reason,omitempty"`
	SettlementKey  string            `json:"settlement_key"`
	IdempotencyKey string            `json:"idempotency_key"`
	Type           string            `json:"type"`
	Reverses       *string           `json:"reverses"`
	Customer       string            `json:"customer"`
	Usage          *WireUsage        `json:"usage"`
	Amount         *WireAmount       `json:"amount"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"created_at"`
}

func (e *entry) wire() WireRecord {
	w := WireRecord{
		ID: e.ID, Status: e.Status, FailureReason: e.FailureReason, SettlementKey: e.SettlementKey,
		IdempotencyKey: e.IdempotencyKey, Type: e.Type, Customer: e.Customer,
		Metadata: maps.Clone(e.Metadata), CreatedAt: e.CreatedAt,
	}
	if w.Metadata == nil {
		w.Metadata = map[string]string{}
	}
	if e.Reverses != nil {
		r := *e.Reverses
		w.Reverses = &r
	}
	if e.Usage != nil {
		w.Usage = &WireUsage{Meter: e.Usage.Meter, Quantity: json.Number(e.Usage.Quantity), Unit: e.Usage.Unit}
	}
	if e.Amount != nil {
		w.Amount = &WireAmount{Minor: e.Amount.Minor, Currency: e.Amount.Currency}
	} else if e.priced != nil {
		w.Amount = &WireAmount{Minor: e.priced.Minor, Currency: e.priced.Currency}
	}
	return w
}

// toRecord converts an admin-imported wire record.
func (w WireRecord) toRecord() billing.Record {
	r := billing.Record{
		ID: w.ID, Status: w.Status, FailureReason: w.FailureReason, SettlementKey: w.SettlementKey,
		IdempotencyKey: w.IdempotencyKey, Customer: w.Customer, Type: w.Type, CreatedAt: w.CreatedAt,
	}
	if w.Usage != nil {
		r.Usage = &billing.Usage{Meter: w.Usage.Meter, Quantity: w.Usage.Quantity.String(), Unit: w.Usage.Unit}
	}
	if w.Amount != nil {
		r.Amount = &billing.Amount{Minor: w.Amount.Minor, Currency: w.Amount.Currency}
	}
	return r
}

// Fields of a §6.1 POST body: every one of required must be present (reverses as
// null for a charge), usage and amount may be omitted, nothing else is accepted. Being
// stricter than a real provider makes the adapter's tests catch contract drift.
var (
	requiredFields = []string{"settlement_key", "type", "reverses", "customer", "metadata"}
	optionalFields = []string{"usage", "amount"}
)

// decodeSubmit parses and validates a §6.1 POST body.
func decodeSubmit(body io.Reader) (params, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(body)
	if err := dec.Decode(&raw); err != nil {
		return params{}, fmt.Errorf("body is not a JSON object: %w", err)
	}
	if raw == nil {
		return params{}, errors.New("body is null")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return params{}, errors.New("trailing data after the JSON object")
	}
	known := map[string]bool{}
	for _, k := range requiredFields {
		known[k] = true
		if _, ok := raw[k]; !ok {
			return params{}, fmt.Errorf("field %q is missing", k)
		}
	}
	for _, k := range optionalFields {
		known[k] = true
	}
	for k := range raw {
		if !known[k] {
			return params{}, fmt.Errorf("unknown field %q", k)
		}
	}

	var p params
	var err error
	if p.SettlementKey, err = nonEmptyString(raw, "settlement_key"); err != nil {
		return params{}, err
	}
	if p.Type, err = nonEmptyString(raw, "type"); err != nil {
		return params{}, err
	}
	if p.Type != billing.TypeCharge && p.Type != billing.TypeRefund && p.Type != billing.TypeVoid {
		return params{}, fmt.Errorf("type %q is not charge, refund or void", p.Type)
	}
	if p.Customer, err = nonEmptyString(raw, "customer"); err != nil {
		return params{}, err
	}
	if !isNull(raw["reverses"]) {
		var rev string
		if err := json.Unmarshal(raw["reverses"], &rev); err != nil || rev == "" {
			return params{}, errors.New(`"reverses" must be null or a non-empty string`)
		}
		p.Reverses = &rev
	}
	if isNull(raw["metadata"]) || json.Unmarshal(raw["metadata"], &p.Metadata) != nil {
		return params{}, errors.New(`"metadata" must be an object of strings`)
	}
	if u, ok := raw["usage"]; ok {
		if p.Usage, err = decodeUsage(u); err != nil {
			return params{}, err
		}
	}
	if a, ok := raw["amount"]; ok {
		if p.Amount, err = decodeAmount(a); err != nil {
			return params{}, err
		}
	}
	return p, nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func nonEmptyString(raw map[string]json.RawMessage, field string) (string, error) {
	var s string
	if isNull(raw[field]) || json.Unmarshal(raw[field], &s) != nil || s == "" {
		return "", fmt.Errorf("%q must be a non-empty string", field)
	}
	return s, nil
}

func strictDecode(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// decodeUsage insists that quantity is a JSON number, not a string: the contract sends
// decimals as numbers, and a client that quotes them is wrong.
func decodeUsage(raw json.RawMessage) (*usageParams, error) {
	var u struct {
		Meter    string          `json:"meter"`
		Quantity json.RawMessage `json:"quantity"`
		Unit     string          `json:"unit"`
	}
	if isNull(raw) || strictDecode(raw, &u) != nil {
		return nil, errors.New(`"usage" must be an object {"meter","quantity","unit"}`)
	}
	if u.Meter == "" {
		return nil, errors.New(`"usage.meter" must be a non-empty string`)
	}
	lit := string(bytes.TrimSpace(u.Quantity))
	if q, err := billing.QuantityNumber(lit); err != nil || q.String() != lit {
		return nil, fmt.Errorf(`"usage.quantity" must be a non-negative decimal JSON number, got %.40s`, lit)
	}
	return &usageParams{Meter: u.Meter, Quantity: lit, Unit: u.Unit}, nil
}

func decodeAmount(raw json.RawMessage) (*billing.Amount, error) {
	var a struct {
		Minor    *int64 `json:"minor"`
		Currency string `json:"currency"`
	}
	if isNull(raw) || strictDecode(raw, &a) != nil || a.Minor == nil || a.Currency == "" {
		return nil, errors.New(`"amount" must be an object {"minor": integer, "currency": string}`)
	}
	return &billing.Amount{Minor: *a.Minor, Currency: a.Currency}, nil
}
