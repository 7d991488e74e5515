package money

import (
	"math"
	"strings"
	"testing"
)

func TestFormatAmount(t *testing.T) {
	for _, c := range []struct {
		minor    int64
		currency string
		want     string
	}{
		{1250, "USD", "12.50 USD"},
		{5, "USD", "0.05 USD"},
		{0, "EUR", "0.00 EUR"},
		{100, "EUR", "1.00 EUR"},
		{500, "JPY", "500 JPY"},
		{0, "JPY", "0 JPY"},
		{1234, "KWD", "1.234 KWD"},
		{7, "BHD", "0.007 BHD"},
		{12345, "CLF", "1.2345 CLF"},
		{-5, "USD", "-0.05 USD"},
		{-1250, "JPY", "-1250 JPY"},
		{math.MaxInt64, "USD", "92233720368547758.07 USD"},
		{math.MinInt64, "USD", "-92233720368547758.08 USD"},
		{199, "ZZZ", "1.99 ZZZ"}, // an unknown code keeps two decimals
	} {
		if got := FormatAmount(c.minor, c.currency); got != c.want {
			t.Errorf("FormatAmount(%d, %q) = %q, want %q", c.minor, c.currency, got, c.want)
		}
	}
}

func TestFormatUsage(t *testing.T) {
	for _, c := range []struct{ quantity, unit, want string }{
		{"1523", "tokens", "1523 tokens"},
		{"12.5", "gpu-seconds", "12.5 gpu-seconds"},
		{"7", "", "7"},
	} {
		if got := FormatUsage(c.quantity, c.unit); got != c.want {
			t.Errorf("FormatUsage(%q, %q) = %q, want %q", c.quantity, c.unit, got, c.want)
		}
	}
}

func TestParseAmount(t *testing.T) {
	for _, c := range []struct {
		in, currency string
		want         int64
	}{
		{"12.50", "USD", 1250}, {"12.5", "USD", 1250}, {"12", "USD", 1200}, {"0.01", "USD", 1},
		{"500", "JPY", 500}, {"1.234", "KWD", 1234}, {"0012.30", "EUR", 1230},
		{"92233720368547758.07", "USD", 9223372036854775807},
	} {
		got, err := ParseAmount(c.in, c.currency)
		if err != nil || got != c.want {
			t.Errorf("ParseAmount(%q, %s) = %d, %v; want %d", c.in, c.currency, got, err, c.want)
		}
	}
	for _, c := range []struct{ in, currency, why string }{
		{"", "USD", "not a plain decimal"}, {"-1", "USD", "not a plain decimal"}, {"+1", "USD", "not a plain decimal"},
		{"1e3", "USD", "not a plain decimal"}, {"1,000", "USD", "not a plain decimal"}, {"12.", "USD", "not a plain decimal"},
		{".5", "USD", "not a plain decimal"}, {"1.2.3", "USD", "not a plain decimal"}, {" 1", "USD", "not a plain decimal"},
		{"12.345", "USD", "USD has 2 decimals"}, {"1.5", "JPY", "JPY has no minor unit"}, {"0", "USD", "not positive"},
		{"0.00", "USD", "not positive"}, {"92233720368547758.08", "USD", "too large"},
	} {
		_, err := ParseAmount(c.in, c.currency)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("ParseAmount(%q, %s): error %v, want one saying %q", c.in, c.currency, err, c.why)
		}
	}
}
