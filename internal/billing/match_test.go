package billing

import "testing"

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
		{name: "reverses omitted", mutate: func(r *Record) { r.Omitted = []string{"reverses"} }, field: "reverses", missing: true},
		{name: "reverses set on a charge", mutate: func(r *Record) { r.Reverses = "x" }, field: "reverses"},
		{name: "no amount", mutate: func(r *Record) { r.Amount = nil }, field: "amount", missing: true},
		{name: "other amount", mutate: func(r *Record) { r.Amount.Minor = 99999900 }, field: "amount.minor"},
		{name: "other currency", mutate: func(r *Record) { r.Amount.Currency = "EUR" }, field: "amount.currency"},
		{name: "no usage", mutate: func(r *Record) { r.Usage = nil }, field: "usage", missing: true},
		{name: "other meter", mutate: func(r *Record) { r.Usage.Meter = "gpu" }, field: "usage.meter"},
		{name: "other quantity", mutate: func(r *Record) { r.Usage.Quantity = "13" }, field: "usage.quantity"},
		{name: "other unit", mutate: func(r *Record) { r.Usage.Unit = "" }, field: "usage.unit"},
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
