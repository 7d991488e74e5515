package identity

import (
	"encoding/json"
	"math/big"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Vectors of the namespaced derivations, computed once with Python's
// hashlib and json.dumps(parts, separators=(",", ":"), ensure_ascii=False),
// independently of this package. As for the legacy vectors: a change is a migration.

func TestKeyVectors(t *testing.T) {
	jobKey := `["job","team-a","inference","job-42"]`
	fieldsKey := `["key","team-a","inference","inv-7","a/b"]`
	tests := []struct {
		name, got, want string
	}{
		{"JobSettlementKey", JobSettlementKey("team-a", "inference", "job-42"), jobKey},
		{"FieldsSettlementKey", FieldsSettlementKey("team-a", "inference", "inv-7", "a/b"), fieldsKey},
		// A job's charge keeps the name it had before keys were namespaced.
		{"SettlementNameFor job key", SettlementNameFor("inference", jobKey), "inference-stl-3d9b3225659a6779d6a377e2fe1ad22a"},
		{"SettlementNameFor job key = legacy name", SettlementNameFor("inference", jobKey),
			SettlementName("inference", DefaultSettlementKey("inference", "job-42"))},
		{"SettlementNameFor fields key", SettlementNameFor("inference", fieldsKey), "inference-stl-2f4d2b901a3980fca527fe1027642606"},
		{"SettlementNameFor legacy key", SettlementNameFor("inference", "inference/job-42"), "inference-stl-3d9b3225659a6779d6a377e2fe1ad22a"},
		{"NamespacedIdempotencyKey", NamespacedIdempotencyKey("team-a", jobKey), "stl_5b692b31d3eb823407eb5328fde119f2"},
		{"NamespacedIdempotencyKey of a legacy key", NamespacedIdempotencyKey("team-a", "inference/job-42"), "stl_4943ee76769b76ca061c669422273e7f"},
		{"JobSinkKey", JobSinkKey("team-a", "inference", "job-42", 3), "job_5a3e95002d43733fffa0d5b900d73d78"},
		{"LegacyJobSinkKey", LegacyJobSinkKey("inference", "job-42", 3), "job_14055cfca4f4e70e3c6891dd22c83369"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestKeysAreScopedAndSeparated(t *testing.T) {
	pairs := []struct {
		name string
		a, b string
	}{
		{"namespace: job key", JobSettlementKey("a", "p", "j"), JobSettlementKey("b", "p", "j")},
		{"namespace: fields key", FieldsSettlementKey("a", "p", "v"), FieldsSettlementKey("b", "p", "v")},
		{"namespace: idempotency key", NamespacedIdempotencyKey("a", "k"), NamespacedIdempotencyKey("b", "k")},
		{"namespace: sink key", JobSinkKey("a", "p", "j", 1), JobSinkKey("b", "p", "j", 1)},
		{"version: sink key", JobSinkKey("a", "p", "j", 1), JobSinkKey("a", "p", "j", 2)},
		{"slash in a value", FieldsSettlementKey("n", "p", "a/b", "c"), FieldsSettlementKey("n", "p", "a", "b/c")},
		{"job key vs fields key", JobSettlementKey("n", "p", "x"), FieldsSettlementKey("n", "p", "x")},
		{"value count", FieldsSettlementKey("n", "p", "a", ""), FieldsSettlementKey("n", "p", "a")},
		{"quote in a value", FieldsSettlementKey("n", "p", `a","b`), FieldsSettlementKey("n", "p", "a", "b")},
		{"job name vs fields name", SettlementNameFor("p", JobSettlementKey("n", "p", "x/y")),
			SettlementNameFor("p", FieldsSettlementKey("n", "p", "x", "y"))},
		{"fields names", SettlementNameFor("p", FieldsSettlementKey("n", "p", "a/b", "c")),
			SettlementNameFor("p", FieldsSettlementKey("n", "p", "a", "b/c"))},
		{"NUL no longer separates", HashParts("a\x00b", "c"), HashParts("a", "b\x00c")},
		{"settlement vs sink hash", NamespacedIdempotencyKey("n", "p")[4:], JobSinkKey("n", "p", "", 0)[4:]},
	}
	for _, tt := range pairs {
		t.Run(tt.name, func(t *testing.T) {
			if tt.a == tt.b {
				t.Errorf("both are %q", tt.a)
			}
		})
	}
}

func TestEncodePartsIsJCS(t *testing.T) {
	for _, parts := range [][]string{
		nil, {""}, {"a", "b"}, {`q"b\s`, "\n\t\b\f\r", "\x00\x01\x1f\x7f", "<>&", "\u2028\u2029", "é€😀", "/"},
	} {
		raw, err := json.Marshal(parts)
		if err != nil {
			t.Fatal(err)
		}
		if parts == nil {
			raw = []byte("[]")
		}
		want, err := jcs.Transform(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := EncodeParts(parts...); got != string(want) {
			t.Errorf("EncodeParts(%q) = %s, want the RFC 8785 form %s", parts, got, want)
		}
	}
	// Bytes that are not UTF-8 are kept, so distinct inputs stay distinct.
	if EncodeParts("\xff") == EncodeParts("\xfe") {
		t.Error("invalid UTF-8 bytes collapse")
	}
}

func TestParseSettlementKey(t *testing.T) {
	k, ok := ParseSettlementKey(JobSettlementKey("team-a", "inference", `j/"1"`))
	if !ok || k.Kind != KeyKindJob || k.Namespace != "team-a" || k.Provider != "inference" || k.JobID() != `j/"1"` ||
		k.LegacyKey() != `inference/j/"1"` {
		t.Errorf("job key: %+v, %v", k, ok)
	}
	k, ok = ParseSettlementKey(FieldsSettlementKey("team-a", "inference", "a/b", "c"))
	if !ok || k.Kind != KeyKindFields || k.JobID() != "" || len(k.Values) != 2 || k.LegacyKey() != "inference/a/b/c" {
		t.Errorf("fields key: %+v, %v", k, ok)
	}
	for _, key := range []string{
		"inference/job-42",                        // legacy
		"refund/inference/job-42",                 // hand-made
		`["job","n","p"]`,                         // too short
		`["job","n","p","j","extra"]`,             // a job key has one value
		`["other","n","p","j"]`,                   // unknown kind
		`["job","","p","j"]`,                      // no namespace
		`["job","n","","j"]`,                      // no provider
		`["job","n","p/q","j"]`,                   // not a provider name
		`[ "job","n","p","j"]`,                    // not canonical
		`["job","n","p","\u006a"]`,                // not canonical
		`["job","n","p","j"] `,                    // trailing data
		`["job","n","p",1]`,                       // not strings
		`["key","n","p","a"],["key","n","p","b"]`, // not one array
	} {
		if k, ok := ParseSettlementKey(key); ok {
			t.Errorf("ParseSettlementKey(%s) = %+v, want not structured", key, k)
		}
	}
}

func TestStructuredNamesAreValid(t *testing.T) {
	provider := strings.Repeat("a", 62) + "z"
	for _, key := range []string{
		JobSettlementKey(strings.Repeat("n", 63), provider, strings.Repeat("J", 256)),
		FieldsSettlementKey("n", provider, "x", "ü"),
	} {
		name := SettlementNameFor(provider, key)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("%s: %v", name, errs)
		}
		if len(NamespacedIdempotencyKey("n", key)) != len("stl_")+32 {
			t.Errorf("idempotency key of %s has the wrong length", key)
		}
	}
}

func TestCanonicalNumber(t *testing.T) {
	tests := []struct {
		in, want string
		err      bool
	}{
		{in: "42", want: "42"},
		{in: "42.0", want: "42"},
		{in: "4.2e1", want: "42"},
		{in: "4.2E+1", want: "42"},
		{in: "420e-1", want: "42"},
		{in: "-0", want: "0"},
		{in: "-0.0e5", want: "0"},
		{in: "1.50", want: "1.5"},
		{in: "0.1", want: "0.1"},
		{in: "1e30", want: "1e+30"},
		{in: "1E-7", want: "1e-7"},
		{in: "-17", want: "-17"},
		{in: "9007199254740992", want: "9007199254740992"},
		// Beyond double precision: exact digits, never rounded into another number.
		{in: "9007199254740993", want: "9007199254740993"},
		{in: "12345678901234567890", want: "12345678901234567890"},
		{in: "1152921504606846976", want: "1152921504606846976"}, // 2^60; RFC 8785 writes 1152921504606847000
		{in: "1152921504606847000", want: "1152921504606847000"},
		{in: "1e399", want: "1" + strings.Repeat("0", 399)},
		{in: "1e400", err: true},
		{in: "0.10000000000000001", err: true},
		{in: "1e-400", err: true},
		{in: "1e1001", err: true},
		{in: "1e99999999999999999999", err: true},
		{in: strings.Repeat("9", 401), err: true},
		{in: "01", err: true},
		{in: "1.", err: true},
		{in: ".5", err: true},
		{in: "+1", err: true},
		{in: "1e", err: true},
		{in: "0x10", err: true},
		{in: "NaN", err: true},
		{in: "", err: true},
	}
	for _, tt := range tests {
		got, err := CanonicalNumber(tt.in)
		switch {
		case tt.err && err == nil:
			t.Errorf("CanonicalNumber(%s) = %q, want an error", tt.in, got)
		case !tt.err && (err != nil || got != tt.want):
			t.Errorf("CanonicalNumber(%s) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// FuzzCanonicalNumber: equal values always share a spelling, different values never
// do, and the spelling is a fixed point.
func FuzzCanonicalNumber(f *testing.F) {
	for _, s := range []string{"42", "4.2e1", "9007199254740993", "1e30", "0.5", "-0"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ca, errA := CanonicalNumber(a)
		cb, errB := CanonicalNumber(b)
		if errA != nil || errB != nil {
			return
		}
		if again, err := CanonicalNumber(ca); err != nil || again != ca {
			t.Fatalf("CanonicalNumber(%q) = %q is not a fixed point (%q, %v)", a, ca, again, err)
		}
		ra, rb := ratOf(t, a), ratOf(t, b)
		if (ra == rb) != (ca == cb) {
			t.Fatalf("%s (%q) and %s (%q): equal values must share a spelling, and only they", a, ca, b, cb)
		}
	})
}

func ratOf(t *testing.T, s string) string {
	t.Helper()
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		t.Fatalf("%q is not a number", s)
	}
	return r.RatString()
}
