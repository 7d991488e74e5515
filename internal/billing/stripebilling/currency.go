package stripebilling

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/settlement-operator/settlement-operator/internal/money"
)

// Amounts above this package are in ISO 4217 minor units (internal/money: the CHARGE
// column, `kubectl settlement refund --amount`, the payload's amount). Stripe's
// `amount` is in what Stripe calls the currency's minor unit, which is not always
// ISO's: this file converts between the two, exactly, from Stripe's "Supported
// currencies" page (docs.stripe.com/currencies), and refuses what has no exact
// Stripe amount instead of rounding money.

// CurrencyUnit is how Stripe takes amounts of one currency.
type CurrencyUnit struct {
	// Exponent is the number of decimals of Stripe's amount: 0, 2 or 3.
	Exponent int
	// Multiple is what Stripe's amount must be a multiple of: 1 (any), 10 (the
	// three-decimal currencies' last digit is 0), 100 (ISK and UGX: whole units written
	// with two decimals).
	Multiple int64
	// Rule is Stripe's rule in a few words, for refusals ("<currency> is <Rule>").
	Rule string
}

const (
	ruleZeroDecimal  = "zero-decimal at Stripe: whole units only"
	ruleThreeDecimal = "three-decimal at Stripe, and the last digit of an amount must be 0"
	ruleWholeAsTwo   = "two-decimal at Stripe with decimals always 00: whole units only"
	ruleTwoDecimal   = "two-decimal at Stripe"
)

// currencyUnits are the currencies for which Stripe documents something other than its
// default ("Currencies are two-decimal currencies unless otherwise specified",
// docs.stripe.com/currencies, "Minor units in API amounts"), plus HUF and TWD, listed
// to say that their special case does not apply to charges. A currency not here is
// two-decimal at Stripe.
var currencyUnits = map[string]CurrencyUnit{
	// Zero-decimal currencies (docs.stripe.com/currencies#zero-decimal): "the charge
	// and the amount are the same, without requiring multiplication. For example, to
	// charge 500 JPY, provide an amount value of 500." All are zero-decimal in ISO 4217
	// too except MGA, whose ISO minor unit is 1/100: a MGA amount must be whole.
	// UGX is on that list as well but is a special case below, which governs charges.
	"BIF": {0, 1, ruleZeroDecimal}, "CLP": {0, 1, ruleZeroDecimal}, "DJF": {0, 1, ruleZeroDecimal},
	"GNF": {0, 1, ruleZeroDecimal}, "JPY": {0, 1, ruleZeroDecimal}, "KMF": {0, 1, ruleZeroDecimal},
	"KRW": {0, 1, ruleZeroDecimal}, "MGA": {0, 1, ruleZeroDecimal}, "PYG": {0, 1, ruleZeroDecimal},
	"RWF": {0, 1, ruleZeroDecimal}, "VND": {0, 1, ruleZeroDecimal}, "VUV": {0, 1, ruleZeroDecimal},
	"XAF": {0, 1, ruleZeroDecimal}, "XOF": {0, 1, ruleZeroDecimal}, "XPF": {0, 1, ruleZeroDecimal},

	// Three-decimal currencies (stripe.com/docs/currencies, "Three-decimal
	// currencies"): "these API calls require the least-significant (last) digit to be
	// 0. Your integration must round amounts to the nearest ten. For example, 5.124 KWD
	// must be rounded to 5120 or 5130." Thousandths as in ISO 4217; the operator does
	// not round money, so an amount whose last digit is not 0 is refused.
	"BHD": {3, 10, ruleThreeDecimal}, "JOD": {3, 10, ruleThreeDecimal}, "KWD": {3, 10, ruleThreeDecimal},
	"OMR": {3, 10, ruleThreeDecimal}, "TND": {3, 10, ruleThreeDecimal},

	// Special cases (docs.stripe.com/currencies#special-cases): "ISK transitioned to a
	// zero-decimal currency, but backwards compatibility requires you to represent it
	// as a two-decimal value, where the decimal amount is always 00. For example, to
	// charge 5 ISK, provide an amount value of 500." UGX: the same words, and "For
	// invoices where the amount is fractional after prorations, coupons, or taxes,
	// Stripe automatically rounds that amount to the nearest number evenly divisible by
	// 100" — invoice amounts in hundredths. Both are zero-decimal in ISO 4217: ×100.
	"ISK": {2, 100, ruleWholeAsTwo}, "UGX": {2, 100, ruleWholeAsTwo},

	// Special cases: "Stripe treats HUF [TWD] as a zero-decimal currency for payouts,
	// even though you can charge two-decimal amounts." The operator creates no payouts:
	// for an invoice item they are two-decimal, as in ISO 4217, and unchanged.
	"HUF": {2, 1, ruleTwoDecimal}, "TWD": {2, 1, ruleTwoDecimal},
}

// CurrencyUnits is the table: every currency for which Stripe documents a unit other
// than two decimals, or a special case (a copy; the caller may keep it).
func CurrencyUnits() map[string]CurrencyUnit {
	out := make(map[string]CurrencyUnit, len(currencyUnits))
	for k, v := range currencyUnits {
		out[k] = v
	}
	return out
}

// unitOf is how Stripe takes currency (upper case). A currency Stripe documents nothing
// for is two-decimal at Stripe; if ISO 4217 gives it another minor unit (IQD, LYD,
// CLF, UYW, UYI), there is no documented conversion and it is refused, never guessed.
func unitOf(currency string) (CurrencyUnit, error) {
	if u, ok := currencyUnits[currency]; ok {
		return u, nil
	}
	if e := money.Exponent(currency); e != 2 {
		return CurrencyUnit{}, fmt.Errorf("Stripe documents no amount unit for %s, whose ISO 4217 minor unit has %d decimals "+
			"(Stripe's default is two): it is not sent under a guessed unit", currency, e)
	}
	return CurrencyUnit{Exponent: 2, Multiple: 1, Rule: ruleTwoDecimal}, nil
}

// ToStripeAmount converts an amount in ISO 4217 minor units (1250 for 12.50 USD, 5 for
// 5 ISK) to Stripe's `amount` (1250; 500), exactly. An amount Stripe cannot take as
// it is (1.234 KWD, 1.50 MGA) or a currency without a documented unit is an error
// that says why: the adapter refuses it before anything is sent.
func ToStripeAmount(currency string, isoMinor int64) (int64, error) {
	cur := strings.ToUpper(currency)
	u, err := unitOf(cur)
	if err != nil {
		return 0, err
	}
	iso := money.Exponent(cur)
	v, err := rescale(isoMinor, iso, u.Exponent)
	if err == nil && v%u.Multiple != 0 {
		err = errNotExact
	}
	switch {
	case errors.Is(err, errNotExact):
		// The nearest amounts Stripe takes, in ISO units: a whole MGA, a KWD hundredth.
		step := u.Multiple * pow10(max(iso-u.Exponent, 0)) / pow10(max(u.Exponent-iso, 0))
		a := isoMinor
		if a < 0 {
			a = -a
		}
		lower, instead := a-a%step, ""
		if lower > 0 {
			instead = money.FormatAmount(lower, cur) + " or "
		}
		instead += money.FormatAmount(lower+step, cur)
		return 0, fmt.Errorf("%s cannot be sent to Stripe exactly (%s is %s), and the operator does not round money: "+
			"bill %s instead", money.FormatAmount(isoMinor, cur), cur, u.Rule, instead)
	case err != nil:
		return 0, fmt.Errorf("%s is too large for Stripe's amount", money.FormatAmount(isoMinor, cur))
	}
	return v, nil
}

// FromStripeAmount converts Stripe's `amount` of currency back to ISO 4217 minor units,
// exactly (the inverse of ToStripeAmount); an amount with no exact ISO value (550 ISK
// at Stripe, 5.50 krónur) is an error: it cannot be one the operator sent.
func FromStripeAmount(currency string, stripeAmount int64) (int64, error) {
	cur := strings.ToUpper(currency)
	u, err := unitOf(cur)
	if err != nil {
		return 0, err
	}
	v, err := rescale(stripeAmount, u.Exponent, money.Exponent(cur))
	switch {
	case errors.Is(err, errNotExact):
		return 0, fmt.Errorf("Stripe's amount %d %s has no exact value in ISO 4217 minor units (%s is %s)", stripeAmount, cur, cur, u.Rule)
	case err != nil:
		return 0, fmt.Errorf("Stripe's amount %d %s is too large to convert", stripeAmount, cur)
	}
	return v, nil
}

var (
	errNotExact = errors.New("not exact")
	errOverflow = errors.New("overflow")
)

// rescale writes v, an integer with from decimals, with to decimals: exact or an error.
func rescale(v int64, from, to int) (int64, error) {
	switch {
	case to > from:
		f := pow10(to - from)
		if v > math.MaxInt64/f || v < math.MinInt64/f {
			return 0, errOverflow
		}
		return v * f, nil
	case to < from:
		f := pow10(from - to)
		if v%f != 0 {
			return 0, errNotExact
		}
		return v / f, nil
	}
	return v, nil
}

func pow10(e int) int64 {
	v := int64(1)
	for range e {
		v *= 10
	}
	return v
}
