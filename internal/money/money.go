// Package money formats amounts and usage for people: the CHARGE column of
// `kubectl get billingsettlements` reads "12.50 USD" or "1523 tokens"; and it reads an
// amount a person types (`kubectl settlement refund --amount 12.50`) into minor units,
// exactly, never through a float. Amounts stay integers in the currency's minor unit
// everywhere else (docs/design.md §3).
package money

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// minorExponents lists the ISO 4217 currencies whose minor unit is not 1/100 of the
// major unit. Every other three-letter code is formatted with two decimals, which is
// what ISO 4217 assigns to most currencies (an unknown code is still shown, never
// refused: the column is for reading, the provider decides what it accepts).
var minorExponents = map[string]int{
	// no minor unit
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0,
	"PYG": 0, "RWF": 0, "UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0,
	"XPF": 0,
	// thousandths
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
	// ten-thousandths
	"CLF": 4, "UYW": 4,
}

// Exponent is the number of decimals of a currency's minor unit (ISO 4217).
func Exponent(currency string) int {
	if e, ok := minorExponents[currency]; ok {
		return e
	}
	return 2
}

// FormatAmount writes an amount in minor units as a decimal in the major unit
// followed by the currency code: 1250 USD → "12.50 USD", 500 JPY → "500 JPY",
// -5 USD → "-0.05 USD".
func FormatAmount(minor int64, currency string) string {
	digits := strconv.FormatUint(absU(minor), 10)
	if e := Exponent(currency); e > 0 {
		if len(digits) <= e {
			digits = strings.Repeat("0", e-len(digits)+1) + digits
		}
		digits = digits[:len(digits)-e] + "." + digits[len(digits)-e:]
	}
	if minor < 0 {
		digits = "-" + digits
	}
	return digits + " " + currency
}

// FormatUsage writes a usage quantity with its unit: "1523 tokens", or the bare
// quantity when there is no unit.
func FormatUsage(quantity, unit string) string {
	if unit == "" {
		return quantity
	}
	return quantity + " " + unit
}

func absU(v int64) uint64 {
	if v < 0 {
		return uint64(-(v + 1)) + 1 // no overflow for math.MinInt64
	}
	return uint64(v)
}

// ParseAmount reads a positive decimal in the currency's major unit ("12.50",
// "12.5", "12") into minor units (1250 for USD): digits, at most one ".", no more
// decimals than the currency's minor unit has (ISO 4217), no sign, exponent or
// grouping. Anything else is an error that says what was expected.
func ParseAmount(s, currency string) (int64, error) {
	e := Exponent(currency)
	whole, frac, dotted := strings.Cut(s, ".")
	bad := func(why string) error {
		return fmt.Errorf("amount %q: %s (want a positive decimal in %s such as %s)", s, why, currency,
			FormatAmount(1250*pow10(e)/100, currency))
	}
	digits := func(p string) bool {
		for _, r := range p {
			if r < '0' || r > '9' {
				return false
			}
		}
		return true
	}
	switch {
	case whole == "" || !digits(whole) || !digits(frac) || dotted && frac == "":
		return 0, bad("not a plain decimal")
	case len(frac) > e:
		if e == 0 {
			return 0, bad(currency + " has no minor unit")
		}
		return 0, bad(fmt.Sprintf("%s has %d decimals", currency, e))
	}
	frac += strings.Repeat("0", e-len(frac))
	v, err := strconv.ParseInt(whole+frac, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return 0, bad("too large")
	} else if err != nil {
		return 0, bad("not a plain decimal")
	}
	if v <= 0 {
		return 0, bad("not positive")
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
