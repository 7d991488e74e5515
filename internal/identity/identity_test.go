package identity

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The vectors below were computed once with Python's hashlib, independently of this
// package. A change to any of them renames existing objects or re-keys settlements:
// that is a migration, never a test update.

func TestHash32(t *testing.T) {
	tests := []struct {
		name  string
		parts []string
		want  string
	}{
		{name: "no parts", parts: nil, want: "e3b0c44298fc1c149afbf4c8996fb924"},
		{name: "one part", parts: []string{"a"}, want: "ca978112ca1bbdcafac231b39a23dc4d"},
		{name: "two parts", parts: []string{"a", "bc"}, want: "40bb547d936bbd31318ee37ac8799e7e"},
		{name: "same bytes split elsewhere", parts: []string{"ab", "c"}, want: "6c032e631d39a14d85aff7e319546af7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Hash32(tt.parts...)
			if got != tt.want {
				t.Errorf("Hash32(%q) = %q, want %q", tt.parts, got, tt.want)
			}
			if again := Hash32(tt.parts...); again != got {
				t.Errorf("Hash32(%q) is not stable: %q then %q", tt.parts, got, again)
			}
		})
	}
}

func TestHash32Separation(t *testing.T) {
	pairs := []struct {
		name string
		a, b []string
	}{
		{name: "boundary moves", a: []string{"a", "bc"}, b: []string{"ab", "c"}},
		{name: "empty part vs none", a: []string{"a", ""}, b: []string{"a"}},
		{name: "order matters", a: []string{"a", "b"}, b: []string{"b", "a"}},
		{name: "slash is not a separator", a: []string{"ns/p", "id"}, b: []string{"ns", "p/id"}},
	}
	for _, tt := range pairs {
		t.Run(tt.name, func(t *testing.T) {
			if Hash32(tt.a...) == Hash32(tt.b...) {
				t.Errorf("Hash32(%q) == Hash32(%q), want different", tt.a, tt.b)
			}
		})
	}
}

func TestNames(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{
			name: "EventName",
			got:  EventName("payments", "stripe", "evt_1NG8Du2eZvKYlo2CUI79vXWy"),
			want: "stripe-27c509a4875723ff93a6b9eae594a117",
		},
		{
			name: "JobCompletionName",
			got:  JobCompletionName("acme", "job-42"),
			want: "acme-job-5359ae12ca11e5d628161c38de88522b",
		},
		{
			name: "SettlementName",
			got:  SettlementName("acme", "acme/job-42"),
			want: "acme-stl-fac1b9637befda7e706f5ce3a28124bd",
		},
		{
			name: "IdempotencyKey",
			got:  IdempotencyKey("acme/job-42"),
			want: "stl_fac1b9637befda7e706f5ce3a28124bd",
		},
		{
			name: "DefaultSettlementKey",
			got:  DefaultSettlementKey("acme", "job-42"),
			want: "acme/job-42",
		},
		{
			name: "QuarantineName from canonical hash",
			got:  QuarantineName("stripe-27c509a4875723ff93a6b9eae594a117", "sha256:e0eb5a1be42f0c58ff6cde38c6c063147f621cdaa8f26ff3c4c6880f510bf409"),
			want: "stripe-27c509a4875723ff93a6b9eae594a117-conflict-e0eb5a1b",
		},
		{
			// Not a hash CanonicalHash produces: the name must still be deterministic and valid.
			name: "QuarantineName from malformed hash",
			got:  QuarantineName("p-x", "sha256:NOT-HEX"),
			want: "p-x-conflict-" + Hash32("sha256:NOT-HEX")[:8],
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestEventNameScope(t *testing.T) {
	base := EventName("ns", "p", "id")
	others := map[string]string{
		"other namespace": EventName("ns2", "p", "id"),
		"other event":     EventName("ns", "p", "id2"),
		"slash moved":     EventName("ns/p", "", "id"),
	}
	for name, other := range others {
		if other == base {
			t.Errorf("%s: EventName collides with %q", name, base)
		}
	}
	// The provider is part of the name so that `kubectl get whe` groups by sender.
	if got := EventName("ns", "p2", "id"); !strings.HasPrefix(got, "p2-") || got == base {
		t.Errorf("EventName with provider p2 = %q, want a distinct name starting with p2-", got)
	}
}

func TestNamesAreValidForLongestProvider(t *testing.T) {
	provider := strings.Repeat("a", 62) + "z" // 63 chars: the longest DNS-1123 label
	if errs := validation.IsDNS1123Subdomain(provider); len(errs) > 0 {
		t.Fatalf("test provider is not a valid name: %v", errs)
	}
	event := EventName("some-namespace", provider, "evt_"+strings.Repeat("x", 1000))
	names := map[string]string{
		"EventName":         event,
		"QuarantineName":    QuarantineName(event, "sha256:"+strings.Repeat("f", 64)),
		"JobCompletionName": JobCompletionName(provider, strings.Repeat("J", 500)),
		"SettlementName":    SettlementName(provider, "Key With Spaces/ünïcode"),
	}
	for kind, name := range names {
		t.Run(kind, func(t *testing.T) {
			if len(name) > validation.DNS1123SubdomainMaxLength {
				t.Errorf("%s is %d characters, want <= %d", name, len(name), validation.DNS1123SubdomainMaxLength)
			}
			if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
				t.Errorf("%s is not a DNS-1123 subdomain: %v", name, errs)
			}
		})
	}
}

var canonicalHashRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func TestCanonicalHash(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    string
	}{
		{
			// The Standard Webhooks test payload; canonical form {"test":2432232314}.
			name:    "standard webhooks payload",
			payload: `{"test": 2432232314}`,
			want:    "sha256:e0eb5a1be42f0c58ff6cde38c6c063147f621cdaa8f26ff3c4c6880f510bf409",
		},
		{
			// RFC 8785 §3.2.2 example (jcs testdata/input/values.json); the hash is of
			// the RFC's published canonical output.
			name: "RFC 8785 values",
			payload: `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`,
			want: "sha256:2d5e01a318d0f0879ab568c4be289c8b1f64ef8921a53c6277d5e069978baacb",
		},
		{
			// RFC 8785 §3.2.3 sorting example (jcs testdata/input/structures.json).
			name: "RFC 8785 structures",
			payload: `{
  "1": {"f": {"f": "hi","F": 5} ,"\n": 56.0},
  "10": { },
  "": "empty",
  "a": { },
  "111": [ {"e": "yes","E": "no" } ],
  "A": { }
}`,
			want: "sha256:605f65004ec2db7692522a0852c22f1c989e036d547e88963d1a3143cf3195d5",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalHash([]byte(tt.payload))
			if err != nil {
				t.Fatalf("CanonicalHash: %v", err)
			}
			if got != tt.want {
				t.Errorf("CanonicalHash = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCanonicalHashEquivalence(t *testing.T) {
	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{name: "key order", a: `{"a":1,"b":2}`, b: `{"b":2,"a":1}`, same: true},
		{name: "whitespace", a: `{"a":[1,2],"b":{"c":true}}`, b: "{ \"a\" : [ 1 , 2 ] ,\n\t\"b\" : { \"c\" : true } }", same: true},
		{name: "number spelling", a: `{"n":1.0,"m":1e2,"k":0.50}`, b: `{"n":1,"m":100,"k":0.5}`, same: true},
		{name: "string escapes", a: `{"s":"\u0041\/"}`, b: `{"s":"A/"}`, same: true},
		{name: "nested key order", a: `{"o":{"y":1,"x":[{"b":1,"a":2}]}}`, b: `{"o":{"x":[{"a":2,"b":1}],"y":1}}`, same: true},
		{name: "different value", a: `{"a":1}`, b: `{"a":2}`, same: false},
		{name: "array order matters", a: `{"a":[1,2]}`, b: `{"a":[2,1]}`, same: false},
		{name: "string vs number", a: `{"a":"1"}`, b: `{"a":1}`, same: false},
		{name: "null vs missing", a: `{"a":null}`, b: `{}`, same: false},
		// Documented limitation of RFC 8785: numbers are IEEE-754 doubles, so these two
		// integers (2^53+1 and 2^53) canonicalise identically. Pinned so that a change in
		// behaviour is noticed.
		{name: "integers beyond 2^53 collapse", a: `{"a":9007199254740993}`, b: `{"a":9007199254740992}`, same: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ha, err := CanonicalHash([]byte(tt.a))
			if err != nil {
				t.Fatalf("CanonicalHash(%s): %v", tt.a, err)
			}
			hb, err := CanonicalHash([]byte(tt.b))
			if err != nil {
				t.Fatalf("CanonicalHash(%s): %v", tt.b, err)
			}
			if !canonicalHashRE.MatchString(ha) {
				t.Errorf("CanonicalHash(%s) = %q, not of the form sha256:<64 hex>", tt.a, ha)
			}
			if (ha == hb) != tt.same {
				t.Errorf("CanonicalHash(%s) = %s, CanonicalHash(%s) = %s, want equal=%v", tt.a, ha, tt.b, hb, tt.same)
			}
		})
	}
}

func TestCanonicalHashRejectsMalformedJSON(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
	}{
		{name: "nil", payload: nil},
		{name: "empty", payload: []byte{}},
		{name: "truncated", payload: []byte(`{"a":`)},
		{name: "trailing data", payload: []byte(`{"a":1} {"b":2}`)},
		{name: "bare word", payload: []byte(`hello`)},
		{name: "duplicate key", payload: []byte(`{"a":1,"a":2}`)},
		{name: "invalid UTF-8", payload: []byte("{\"a\":\"\xff\"}")},
		{name: "leading zero", payload: []byte(`{"a":01}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalHash(tt.payload)
			if err == nil {
				t.Fatalf("CanonicalHash(%q) = %q, want an error", tt.payload, got)
			}
			if !strings.Contains(err.Error(), "canonicalize JSON payload") {
				t.Errorf("error %q lacks context", err)
			}
		})
	}
}

func TestCanonicalHashOf(t *testing.T) {
	fields := map[string]any{
		"job_id": "job-42",
		"usage":  json.Number("12.50"),
		"final":  true,
	}
	got, err := CanonicalHashOf(fields)
	if err != nil {
		t.Fatalf("CanonicalHashOf: %v", err)
	}
	want, err := CanonicalHash([]byte(`{"usage": 12.5, "job_id": "job-42", "final": true}`))
	if err != nil {
		t.Fatalf("CanonicalHash: %v", err)
	}
	if got != want {
		t.Errorf("CanonicalHashOf(map) = %q, want the hash of the equivalent document %q", got, want)
	}

	// HTML-escaping by encoding/json must not change the hash.
	esc, err := CanonicalHashOf(map[string]string{"s": "<a&b>"})
	if err != nil {
		t.Fatalf("CanonicalHashOf: %v", err)
	}
	raw, err := CanonicalHash([]byte(`{"s":"<a&b>"}`))
	if err != nil {
		t.Fatalf("CanonicalHash: %v", err)
	}
	if esc != raw {
		t.Errorf("HTML escaping changed the hash: %q vs %q", esc, raw)
	}

	if _, err := CanonicalHashOf(map[string]any{"f": func() {}}); err == nil {
		t.Error("CanonicalHashOf(func) succeeded, want an error")
	}
}
