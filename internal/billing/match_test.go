package billing

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestMatchFailsClosed: a record is ours only if every field we send is present and
// equal; the first field that is not is named, never its value.
func TestMatchFailsClosed(t *testing.T) {
	req := Request{IdempotencyKey: "stl_1", SettlementKey: "k", Type: TypeCharge, Customer: "cus_1",
		Amount: &Amount{Minor: 100, Currency: "USD"}, Usage: &Usage{Meter: "tokens", Quantity: "12.5", Unit: "tokens"}}
	full := func() Record {
		return Record{ID: "r", Status: StatusSettled, IdempotencyKey: "stl_1", SettlementKey: "k", Type: TypeCharge,
			Customer: "cus_1", Amount: &Amount{Minor: 100, Currency: "USD"}, Usage: &Usage{Meter: "tokens", Quantity: "12.50", Unit: "tokens"}}
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*Record)
		field   string
		missing bool
	}{
		{name: "matches (quantity by value)", mutate: func(*Record) {}},
		{name: "no customer", mutate: func(r *Record) { r.Customer = "" }, field: "customer", missing: true},
		{name: "other customer", mutate: func(r *Record) { r.Customer = "cus_2" }, field: "customer"},
		{name: "reverses unproven by the adapter", mutate: func(r *Record) { r.Omitted = []string{"reverses"} }, field: "reverses", missing: true},
		{name: "reverses set on a charge", mutate: func(r *Record) { r.Reverses = "x" }, field: "reverses"},
		{name: "no amount", mutate: func(r *Record) { r.Amount = nil }, field: "amount", missing: true},
		{name: "other amount", mutate: func(r *Record) { r.Amount.Minor = 99999900 }, field: "amount.minor"},
		{name: "other currency", mutate: func(r *Record) { r.Amount.Currency = "EUR" }, field: "amount.currency"},
		{name: "no usage", mutate: func(r *Record) { r.Usage = nil }, field: "usage", missing: true},
		{name: "other meter", mutate: func(r *Record) { r.Usage.Meter = "gpu" }, field: "usage.meter"},
		{name: "other quantity", mutate: func(r *Record) { r.Usage.Quantity = "13" }, field: "usage.quantity"},
		{name: "other unit", mutate: func(r *Record) { r.Usage.Unit = "chars" }, field: "usage.unit"},
		{name: "no unit", mutate: func(r *Record) { r.Usage.Unit = "" }, field: "usage.unit", missing: true},
		{name: "other key", mutate: func(r *Record) { r.IdempotencyKey = "stl_2" }, field: "idempotency_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := full()
			tc.mutate(&rec)
			m, ok := Match(req, rec)
			if ok != (tc.field == "") || m.Field != tc.field || m.Missing != tc.missing {
				t.Fatalf("Match = %+v, %v; want field %q missing %v", m, ok, tc.field, tc.missing)
			}
		})
	}
	// A provider-priced amount is not compared when only usage was sent.
	usageOnly := req
	usageOnly.Amount = nil
	rec := full()
	rec.Amount.Minor = 1
	if m, ok := Match(usageOnly, rec); !ok {
		t.Fatalf("usage-only request: %v", m)
	}
}

// TestMatchReadsLookupRecordsTheJSONWay decodes lookup records as a provider writes
// them and matches them with what we sent. A field left out of the JSON and a field
// sent as null are the same thing, null, and give the same answer: a field we sent as
// null (a charge's reverses, the amount of a usage charge, the usage of an amount
// charge, an empty unit) may be null in the record, while a field we sent a value for
// (customer, the keys, type, usage and amount as sent, a refund's or void's reverses)
// must be there and equal, or the record is not provably ours.
func TestMatchReadsLookupRecordsTheJSONWay(t *testing.T) {
	usageCharge := Request{IdempotencyKey: "stl_1", SettlementKey: "k", Type: TypeCharge, Customer: "cus_1",
		Usage: &Usage{Meter: "tokens", Quantity: "12.5", Unit: "tokens"}}
	unitless := usageCharge
	unitless.Usage = &Usage{Meter: "tokens", Quantity: "12.5"}
	amountCharge := Request{IdempotencyKey: "stl_1", SettlementKey: "k", Type: TypeCharge, Customer: "cus_1",
		Amount: &Amount{Minor: 1250, Currency: "USD"}}
	refund := amountCharge
	refund.Type, refund.Reverses = TypeRefund, "k0"
	void := refund
	void.Type = TypeVoid

	// record is what a provider that sends nulls answers for r: every field, null
	// where r has none.
	record := func(r Request) map[string]any {
		m := map[string]any{"id": "set_1", "status": "settled", "idempotency_key": r.IdempotencyKey,
			"settlement_key": r.SettlementKey, "type": r.Type, "customer": r.Customer, "reverses": nil,
			"usage": nil, "amount": nil, "created_at": "2026-01-02T03:04:05Z"}
		if r.Reverses != "" {
			m["reverses"] = r.Reverses
		}
		if u := r.Usage; u != nil {
			m["usage"] = map[string]any{"meter": u.Meter, "quantity": json.Number(u.Quantity), "unit": u.Unit}
		}
		if a := r.Amount; a != nil {
			m["amount"] = map[string]any{"minor": a.Minor, "currency": a.Currency}
		}
		return m
	}
	// set changes the record at a dotted path: omit removes the field, otherwise it
	// becomes v (nil: JSON null).
	type change struct {
		path string
		omit bool
		v    any
	}
	set := func(m map[string]any, c change) {
		parts := strings.Split(c.path, ".")
		for _, p := range parts[:len(parts)-1] {
			m = m[p].(map[string]any)
		}
		if c.omit {
			delete(m, parts[len(parts)-1])
		} else {
			m[parts[len(parts)-1]] = c.v
		}
	}

	type want struct {
		field   string // "" matches
		missing bool
	}
	ok := want{}
	missing := func(f string) want { return want{field: f, missing: true} }
	differs := func(f string) want { return want{field: f} }
	type fieldCase struct {
		path  string
		null  want // the field omitted, or sent as null
		other any  // another value, which must not match...
		diff  want // ...with this answer
	}
	tests := []struct {
		name   string
		req    Request
		fields []fieldCase
	}{
		{name: "usage charge", req: usageCharge, fields: []fieldCase{
			{path: "reverses", null: ok, other: "k0", diff: differs("reverses")},
			{path: "customer", null: missing("customer"), other: "cus_2", diff: differs("customer")},
			{path: "settlement_key", null: missing("settlement_key"), other: "k2", diff: differs("settlement_key")},
			{path: "idempotency_key", null: missing("idempotency_key"), other: "stl_2", diff: differs("idempotency_key")},
			{path: "type", null: missing("type"), other: TypeRefund, diff: differs("type")},
			{path: "usage", null: missing("usage"), other: map[string]any{"meter": "gpu", "quantity": 1, "unit": "s"}, diff: differs("usage.meter")},
			{path: "usage.meter", null: missing("usage.meter"), other: "gpu", diff: differs("usage.meter")},
			{path: "usage.quantity", null: missing("usage.quantity"), other: 13, diff: differs("usage.quantity")},
			{path: "usage.unit", null: missing("usage.unit"), other: "chars", diff: differs("usage.unit")},
			// The provider priced the usage: its amount is its own, not compared.
			{path: "amount", null: ok, other: map[string]any{"minor": 1, "currency": "USD"}, diff: ok},
		}},
		{name: "usage charge without a unit", req: unitless, fields: []fieldCase{
			{path: "usage.unit", null: ok, other: "tokens", diff: differs("usage.unit")},
		}},
		{name: "amount charge", req: amountCharge, fields: []fieldCase{
			{path: "reverses", null: ok, other: "k0", diff: differs("reverses")},
			{path: "customer", null: missing("customer"), other: "cus_2", diff: differs("customer")},
			{path: "amount", null: missing("amount"), other: map[string]any{"minor": 99999900, "currency": "USD"}, diff: differs("amount.minor")},
			{path: "amount.minor", null: missing("amount"), other: 1251, diff: differs("amount.minor")},
			{path: "amount.currency", null: missing("amount.currency"), other: "EUR", diff: differs("amount.currency")},
			// Usage we did not send: not our request.
			{path: "usage", null: ok, other: map[string]any{"meter": "tokens", "quantity": 1, "unit": ""}, diff: differs("usage")},
			// A usage object with every member null is null.
			{path: "usage", null: ok, other: map[string]any{"meter": nil, "quantity": nil, "unit": nil}, diff: ok},
		}},
		{name: "refund", req: refund, fields: []fieldCase{
			{path: "reverses", null: missing("reverses"), other: "k9", diff: differs("reverses")},
			{path: "customer", null: missing("customer"), other: "cus_2", diff: differs("customer")},
			{path: "amount", null: missing("amount"), other: map[string]any{"minor": 1, "currency": "USD"}, diff: differs("amount.minor")},
			{path: "type", null: missing("type"), other: TypeVoid, diff: differs("type")},
			{path: "usage", null: ok, other: map[string]any{"meter": "tokens", "quantity": 1, "unit": ""}, diff: differs("usage")},
		}},
		{name: "void", req: void, fields: []fieldCase{
			{path: "reverses", null: missing("reverses"), other: "k9", diff: differs("reverses")},
			{path: "amount.currency", null: missing("amount.currency"), other: "EUR", diff: differs("amount.currency")},
		}},
	}
	match := func(t *testing.T, r Request, m map[string]any, w want) {
		t.Helper()
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := decodeRecord(raw)
		if err != nil {
			t.Fatalf("decode %s: %v", raw, err)
		}
		got, matched := Match(r, rec)
		if matched != (w.field == "") || got.Field != w.field || got.Missing != w.missing {
			t.Errorf("record %s: Match = %+v, %v; want field %q missing %v", raw, got, matched, w.field, w.missing)
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("every field, nulls sent", func(t *testing.T) { match(t, tc.req, record(tc.req), ok) })
			t.Run("every null omitted", func(t *testing.T) {
				m := record(tc.req)
				for k, v := range m {
					if v == nil {
						delete(m, k)
					}
				}
				match(t, tc.req, m, ok)
			})
			for _, f := range tc.fields {
				t.Run(f.path+" omitted", func(t *testing.T) {
					m := record(tc.req)
					set(m, change{path: f.path, omit: true})
					match(t, tc.req, m, f.null)
				})
				t.Run(f.path+" null", func(t *testing.T) {
					m := record(tc.req)
					set(m, change{path: f.path})
					match(t, tc.req, m, f.null)
				})
				t.Run(f.path+" other", func(t *testing.T) {
					m := record(tc.req)
					set(m, change{path: f.path, v: f.other})
					match(t, tc.req, m, f.diff)
				})
			}
		})
	}
}

// TestMatchCannotConfirmACompensationWhoseOriginalIsUnknown: a Refund or Void whose
// original we cannot name (gone, or lost by an archive behind the cluster) has nothing
// to compare the record's reverses with, so no record is confirmed as it — with or
// without a reverses.
func TestMatchCannotConfirmACompensationWhoseOriginalIsUnknown(t *testing.T) {
	for _, typ := range []string{TypeRefund, TypeVoid} {
		r := Request{IdempotencyKey: "stl_1", SettlementKey: "k", Type: typ, Customer: "cus_1", Amount: &Amount{Minor: 5, Currency: "USD"}}
		for _, reverses := range []string{"", "k0"} {
			rec := Record{IdempotencyKey: "stl_1", SettlementKey: "k", Type: typ, Customer: "cus_1", Reverses: reverses,
				Amount: &Amount{Minor: 5, Currency: "USD"}}
			if m, ok := Match(r, rec); ok || m.Field != "reverses" {
				t.Errorf("%s, record reverses %q: Match = %+v, %v; want reverses not confirmed", typ, reverses, m, ok)
			}
		}
	}
}
