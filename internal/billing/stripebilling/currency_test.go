package stripebilling_test

import (
	"math"
	"strings"
	"testing"

	"github.com/settlement-operator/settlement-operator/internal/billing/stripebilling"
	"github.com/settlement-operator/settlement-operator/internal/money"
)

// stripeCase is one currency: an ISO 4217 amount, the amount Stripe takes for it
// (written out by hand from docs.stripe.com/currencies, not computed), and an ISO
// amount Stripe cannot take exactly ("" when every ISO amount is fine).
type stripeCase struct {
	iso, stripe int64
	refused     int64
	refusedWhy  string
}

// Every currency of the table, and a sample of ordinary two-decimal ones.
var stripeCases = map[string]stripeCase{
	// Zero-decimal at Stripe and in ISO 4217: 500 is 500.
	"BIF": {iso: 500, stripe: 500}, "CLP": {iso: 500, stripe: 500}, "DJF": {iso: 500, stripe: 500},
	"GNF": {iso: 500, stripe: 500}, "JPY": {iso: 500, stripe: 500}, "KMF": {iso: 500, stripe: 500},
	"KRW": {iso: 500, stripe: 500}, "PYG": {iso: 500, stripe: 500}, "RWF": {iso: 500, stripe: 500},
	"VND": {iso: 500, stripe: 500}, "VUV": {iso: 500, stripe: 500}, "XAF": {iso: 500, stripe: 500},
	"XOF": {iso: 500, stripe: 500}, "XPF": {iso: 500, stripe: 500},
	// Zero-decimal at Stripe, two-decimal in ISO 4217: 500.00 MGA is 500; 1.50 MGA is not whole.
	"MGA": {iso: 50000, stripe: 500, refused: 150, refusedWhy: "1.50 MGA cannot be sent to Stripe exactly (MGA is zero-decimal at Stripe: whole units only)"},
	// Three-decimal: 5.120 KWD is 5120; 5.124 KWD's last digit is not 0.
	"BHD": {iso: 5120, stripe: 5120, refused: 5124, refusedWhy: "5.124 BHD cannot be sent to Stripe exactly"},
	"JOD": {iso: 5120, stripe: 5120, refused: 5124, refusedWhy: "5.124 JOD cannot be sent to Stripe exactly"},
	"KWD": {iso: 5120, stripe: 5120, refused: 5124, refusedWhy: "5.124 KWD cannot be sent to Stripe exactly (KWD is three-decimal at Stripe, and the last digit of an amount must be 0), and the operator does not round money: bill 5.120 KWD or 5.130 KWD instead"},
	"OMR": {iso: 5120, stripe: 5120, refused: 5, refusedWhy: "0.005 OMR cannot be sent to Stripe exactly (OMR is three-decimal at Stripe, and the last digit of an amount must be 0), and the operator does not round money: bill 0.010 OMR instead"},
	"TND": {iso: 5120, stripe: 5120, refused: 5129, refusedWhy: "5.129 TND cannot be sent to Stripe exactly"},
	// Zero-decimal in ISO 4217, two decimals of 00 at Stripe: 5 ISK is 500.
	"ISK": {iso: 5, stripe: 500}, "UGX": {iso: 5, stripe: 500},
	// Two-decimal for charges (their divisible-by-100 rule is for payouts): unchanged.
	"HUF": {iso: 1045, stripe: 1045}, "TWD": {iso: 80045, stripe: 80045},
	// Ordinary two-decimal currencies, not in the table.
	"USD": {iso: 1250, stripe: 1250}, "EUR": {iso: 1, stripe: 1}, "GBP": {iso: 1099, stripe: 1099},
	"CHF": {iso: 50, stripe: 50}, "INR": {iso: 999999999, stripe: 999999999}, "IDR": {iso: 1050, stripe: 1050},
	"COP": {iso: 1050, stripe: 1050}, "SEK": {iso: 300, stripe: 300}, "MXN": {iso: 1000, stripe: 1000},
}

func TestCurrencyUnitsEveryCurrency(t *testing.T) {
	for cur := range stripebilling.CurrencyUnits() {
		if _, ok := stripeCases[cur]; !ok {
			t.Errorf("%s is in the table but not tested here", cur)
		}
	}
	for cur, c := range stripeCases {
		for _, code := range []string{cur, strings.ToLower(cur)} {
			got, err := stripebilling.ToStripeAmount(code, c.iso)
			if err != nil || got != c.stripe {
				t.Errorf("ToStripeAmount(%s, %d) = %d, %v; want %d", code, c.iso, got, err, c.stripe)
			}
			back, err := stripebilling.FromStripeAmount(code, c.stripe)
			if err != nil || back != c.iso {
				t.Errorf("FromStripeAmount(%s, %d) = %d, %v; want %d", code, c.stripe, back, err, c.iso)
			}
		}
		// A credit is the same amount, negative.
		if got, err := stripebilling.ToStripeAmount(cur, -c.iso); err != nil || got != -c.stripe {
			t.Errorf("ToStripeAmount(%s, %d) = %d, %v; want %d", cur, -c.iso, got, err, -c.stripe)
		}
		if c.refusedWhy == "" {
			continue
		}
		for _, amount := range []int64{c.refused, -c.refused} {
			if got, err := stripebilling.ToStripeAmount(cur, amount); err == nil || !strings.Contains(err.Error(), c.refusedWhy) ||
				!strings.Contains(err.Error(), "does not round") {
				t.Errorf("ToStripeAmount(%s, %d) = %d, %v; want a refusal saying %q", cur, amount, got, err, c.refusedWhy)
			}
		}
	}
}

func TestCurrencyUnitsRefusals(t *testing.T) {
	// ISO 4217 gives these another minor unit than two and Stripe documents none for
	// them: there is no conversion to trust either way.
	for _, cur := range []string{"IQD", "LYD", "CLF", "UYW", "UYI"} {
		if got, err := stripebilling.ToStripeAmount(cur, 1000); err == nil || !strings.Contains(err.Error(), "Stripe documents no amount unit for "+cur) {
			t.Errorf("ToStripeAmount(%s) = %d, %v; want a refusal", cur, got, err)
		}
		if got, err := stripebilling.FromStripeAmount(cur, 1000); err == nil {
			t.Errorf("FromStripeAmount(%s) = %d; want a refusal", cur, got)
		}
	}
	// Stripe's amount for a whole-unit currency that is not whole has no ISO value.
	for _, cur := range []string{"ISK", "UGX"} {
		if got, err := stripebilling.FromStripeAmount(cur, 550); err == nil || !strings.Contains(err.Error(), "no exact value") {
			t.Errorf("FromStripeAmount(%s, 550) = %d, %v; want a refusal", cur, got, err)
		}
	}
	// Too large to multiply: an error, never a wrapped-around amount.
	for _, amount := range []int64{math.MaxInt64, math.MinInt64, math.MaxInt64/100 + 1} {
		if got, err := stripebilling.ToStripeAmount("ISK", amount); err == nil || !strings.Contains(err.Error(), "too large") {
			t.Errorf("ToStripeAmount(ISK, %d) = %d, %v; want too large", amount, got, err)
		}
	}
	if got, err := stripebilling.FromStripeAmount("MGA", math.MaxInt64); err == nil {
		t.Errorf("FromStripeAmount(MGA, max) = %d; want too large", got)
	}
	if got, err := stripebilling.ToStripeAmount("ISK", math.MaxInt64/100); err != nil || got != math.MaxInt64/100*100 {
		t.Errorf("ToStripeAmount(ISK, max/100) = %d, %v", got, err)
	}
}

// What a person types (`kubectl settlement refund --amount`, read by money.ParseAmount
// in ISO 4217's unit, as the CHARGE column shows it) is what Stripe is sent.
func TestTypedAmountsReachStripe(t *testing.T) {
	for _, c := range []struct {
		typed, currency string
		stripe          int64
	}{
		{"12.50", "USD", 1250}, {"500", "JPY", 500}, {"5", "ISK", 500}, {"5000", "UGX", 500000},
		{"500", "MGA", 500}, {"5.120", "KWD", 5120}, {"10.45", "HUF", 1045},
	} {
		iso, err := money.ParseAmount(c.typed, c.currency)
		if err != nil {
			t.Fatal(err)
		}
		got, err := stripebilling.ToStripeAmount(c.currency, iso)
		if err != nil || got != c.stripe {
			t.Errorf("%s %s: Stripe amount %d, %v; want %d", c.typed, c.currency, got, err, c.stripe)
		}
		back, err := stripebilling.FromStripeAmount(c.currency, got)
		if err != nil || money.FormatAmount(back, c.currency) != money.FormatAmount(iso, c.currency) {
			t.Errorf("%s %s: read back as %s, %v", c.typed, c.currency, money.FormatAmount(back, c.currency), err)
		}
	}
}
