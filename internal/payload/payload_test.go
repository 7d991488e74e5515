package payload

import (
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
)

const testBody = `{
  "type": "job.completed",
  "id": 12345678901234567890,
  "data": {
    "job_id": "job-42",
    "seq": 7,
    "seq_str": "8",
    "neg_str": "-3",
    "plus_str": "+3",
    "frac": 1.5,
    "exp": 1e3,
    "huge": 99999999999999999999,
    "huge_str": "99999999999999999999",
    "ok": true,
    "nothing": null,
    "obj": {"a": 1},
    "lines": [{"id": "l1", "qty": 2, "kind": "cpu"}, {"id": "l2", "qty": 3, "kind": "gpu"}],
    "empty": [],
    "weird.key": "dotted",
    "with-dash": "dash"
  }
}`

func mustDecode(t testing.TB, body string) any {
	t.Helper()
	doc, err := Decode([]byte(body))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return doc
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string
	}{
		{name: "object", body: `{"a": 1}`},
		{name: "object with surrounding whitespace", body: " \n{\"a\": 1}\n "},
		{name: "empty body", body: "", wantErr: "body is empty"},
		{name: "whitespace only", body: "  ", wantErr: "body is empty"},
		{name: "array", body: `[1, 2]`, wantErr: "top-level value is an array, want an object"},
		{name: "string", body: `"x"`, wantErr: "top-level value is a string, want an object"},
		{name: "null", body: `null`, wantErr: "top-level value is null, want an object"},
		{name: "number", body: `42`, wantErr: "top-level value is a number, want an object"},
		{name: "trailing object", body: `{"a": 1}{"b": 2}`, wantErr: "unexpected data after the top-level value"},
		{name: "trailing garbage", body: `{"a": 1} x`, wantErr: "unexpected data after the top-level value"},
		{name: "truncated", body: `{"a": `, wantErr: "decode JSON payload"},
		{name: "syntax error", body: `{"a" 1}`, wantErr: "decode JSON payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, err := Decode([]byte(tt.body))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Decode(%q): %v", tt.body, err)
				}
				if _, ok := doc.(map[string]any); !ok {
					t.Fatalf("Decode(%q) = %T, want map[string]any", tt.body, doc)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decode(%q) succeeded, want error containing %q", tt.body, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Decode(%q) error = %q, want it to contain %q", tt.body, err, tt.wantErr)
			}
		})
	}
}

func TestDecodeKeepsLargeIntegers(t *testing.T) {
	doc := mustDecode(t, `{"id": 12345678901234567890}`)
	got := doc.(map[string]any)["id"]
	if got != json.Number("12345678901234567890") {
		t.Errorf("id = %#v, want json.Number(\"12345678901234567890\")", got)
	}
}

func TestParsePath(t *testing.T) {
	tests := []struct {
		path     string
		wantErr  string
		fromRoot bool
	}{
		{path: ".data.job_id"},
		{path: "{.data.job_id}"},
		{path: " { .data.job_id } "},
		{path: "$.data.job_id", fromRoot: true},
		{path: "{$.data.job_id}", fromRoot: true},
		{path: "@.id"},
		{path: "{['type']}"},
		{path: ".data.lines[0].id"},
		{path: ".data.lines[-1].id"},
		{path: `.data.lines[?(@.id=="l2")].qty`},
		{path: `.data.weird\.key`},
		{path: "", wantErr: "path is empty"},
		{path: "{}", wantErr: "path is empty"},
		{path: "   ", wantErr: "path is empty"},
		{path: "{$}", wantErr: "path names no field"},
		{path: "data.job_id", wantErr: "must start with '.' or '$'"},
		{path: "{.data.job_id", wantErr: "must start with '.' or '$'"},
		{path: "{.a}{.b}", wantErr: "want exactly one expression"},
		{path: ".a}x{.b", wantErr: "want exactly one expression"},
		{path: "{range .items[*]}{.id}{end}", wantErr: "must start with '.' or '$'"},
		{path: ".items[*] range", wantErr: `keyword "range" is not supported`},
		{path: ".data.lines[0", wantErr: "unterminated array"},
		{path: ".data.lines[x]", wantErr: "invalid array index"},
		{path: `.data.lines[?(@.id=="l2"]`, wantErr: "parse JSONPath"},
		{path: ".a\n.b", wantErr: "parse JSONPath"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			p, err := ParsePath(tt.path)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("ParsePath(%q) succeeded, want error containing %q", tt.path, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("ParsePath(%q) error = %q, want it to contain %q", tt.path, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePath(%q): %v", tt.path, err)
			}
			if p.String() != strings.TrimSpace(tt.path) {
				t.Errorf("String() = %q, want %q", p.String(), strings.TrimSpace(tt.path))
			}
			if p.FromRoot() != tt.fromRoot {
				t.Errorf("FromRoot() = %v, want %v", p.FromRoot(), tt.fromRoot)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	doc := mustDecode(t, testBody)
	line0 := doc.(map[string]any)["data"].(map[string]any)["lines"].([]any)[0]

	tests := []struct {
		name      string
		path      string
		item      any
		want      any
		wantFound bool
		wantErr   string
	}{
		{name: "nested field", path: ".data.job_id", want: "job-42", wantFound: true},
		{name: "braces", path: "{.data.job_id}", want: "job-42", wantFound: true},
		{name: "dollar", path: "$.data.job_id", want: "job-42", wantFound: true},
		{name: "bracket key", path: "{['type']}", want: "job.completed", wantFound: true},
		{name: "escaped dot in key", path: `.data.weird\.key`, want: "dotted", wantFound: true},
		{name: "dash in key", path: ".data.with-dash", want: "dash", wantFound: true},
		{name: "large integer kept exact", path: ".id", want: json.Number("12345678901234567890"), wantFound: true},
		{name: "index", path: ".data.lines[1].id", want: "l2", wantFound: true},
		{name: "negative index", path: ".data.lines[-1].id", want: "l2", wantFound: true},
		{name: "filter on string", path: `.data.lines[?(@.kind=="gpu")].id`, want: "l2", wantFound: true},
		{name: "filter on number as text", path: `.data.lines[?(@.qty=="3")].id`, want: "l2", wantFound: true},
		{name: "filter on number literal is unsupported", path: ".data.lines[?(@.qty==3)].id", wantErr: "incompatible types for comparison"},
		{name: "object value", path: ".data.obj", want: map[string]any{"a": json.Number("1")}, wantFound: true},
		{name: "explicit null is found", path: ".data.nothing", want: nil, wantFound: true},
		{name: "missing leaf", path: ".data.missing", wantFound: false},
		{name: "missing parent", path: ".nope.job_id", wantFound: false},
		{name: "field below null", path: ".data.nothing.x", wantFound: false},
		{name: "field below string", path: ".data.job_id.x", wantFound: false},
		{name: "filter without match", path: `.data.lines[?(@.kind=="tpu")].id`, wantFound: false},
		{name: "wildcard with several values", path: ".data.lines[*].id", wantErr: "yields 2 values, want exactly one"},
		{name: "recursive descent with several values", path: "..id", wantErr: "want exactly one"},
		{name: "index out of range", path: ".data.lines[5].id", wantErr: "out of bounds"},
		{name: "index into object", path: ".data.obj[0]", wantErr: "not array or slice"},

		{name: "relative path uses item", path: ".id", item: line0, want: "l1", wantFound: true},
		{name: "@ uses item", path: "@.qty", item: line0, want: json.Number("2"), wantFound: true},
		{name: "dollar ignores item", path: "$.type", item: line0, want: "job.completed", wantFound: true},
		{name: "braced dollar ignores item", path: "{$.data.job_id}", item: line0, want: "job-42", wantFound: true},
		{name: "relative path missing in item", path: ".type", item: line0, wantFound: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := MustParsePath(tt.path)
			got, found, err := p.Lookup(doc, tt.item)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Lookup(%s) = %#v, %v, want error containing %q", tt.path, got, found, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), tt.path) {
					t.Errorf("Lookup(%s) error = %q, want it to name the path and contain %q", tt.path, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Lookup(%s): %v", tt.path, err)
			}
			if found != tt.wantFound || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Lookup(%s) = %#v, %v, want %#v, %v", tt.path, got, found, tt.want, tt.wantFound)
			}
		})
	}
}

func TestLookupString(t *testing.T) {
	doc := mustDecode(t, testBody)
	tests := []struct {
		path      string
		want      string
		wantFound bool
		wantErr   string
	}{
		{path: ".data.job_id", want: "job-42", wantFound: true},
		{path: ".id", want: "12345678901234567890", wantFound: true},
		{path: ".data.seq", want: "7", wantFound: true},
		{path: ".data.frac", want: "1.5", wantFound: true},
		{path: ".data.exp", want: "1e3", wantFound: true},
		{path: ".data.ok", want: "true", wantFound: true},
		{path: ".data.nothing", wantFound: false},
		{path: ".data.missing", wantFound: false},
		{path: ".data.obj", wantErr: "value is an object, want a string, number or boolean"},
		{path: ".data.lines", wantErr: "value is an array, want a string, number or boolean"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, found, err := MustParsePath(tt.path).LookupString(doc, nil)
			checkResult(t, tt.path, got, found, err, tt.want, tt.wantFound, tt.wantErr)
		})
	}
}

func TestLookupInt64(t *testing.T) {
	doc := mustDecode(t, testBody)
	tests := []struct {
		path      string
		want      int64
		wantFound bool
		wantErr   string
	}{
		{path: ".data.seq", want: 7, wantFound: true},
		{path: ".data.seq_str", want: 8, wantFound: true},
		{path: ".data.neg_str", want: -3, wantFound: true},
		{path: ".data.lines[0].qty", want: 2, wantFound: true},
		{path: ".data.nothing", wantFound: false},
		{path: ".data.missing", wantFound: false},
		{path: ".data.plus_str", wantErr: `"+3" is not a decimal integer`},
		{path: ".data.frac", wantErr: `"1.5" is not a decimal integer`},
		{path: ".data.exp", wantErr: `"1e3" is not a decimal integer`},
		{path: ".data.job_id", wantErr: `"job-42" is not a decimal integer`},
		{path: ".id", wantErr: "out of the int64 range"},
		{path: ".data.huge", wantErr: "out of the int64 range"},
		{path: ".data.huge_str", wantErr: "out of the int64 range"},
		{path: ".data.ok", wantErr: "value is a boolean, want an integer"},
		{path: ".data.obj", wantErr: "value is an object, want an integer"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, found, err := MustParsePath(tt.path).LookupInt64(doc, nil)
			checkResult(t, tt.path, got, found, err, tt.want, tt.wantFound, tt.wantErr)
		})
	}
}

func TestLookupInt64WithoutUseNumber(t *testing.T) {
	// Documents built by other code (tests, hashFields subsets) may hold float64.
	doc := map[string]any{"exact": float64(42), "frac": 1.25, "big": 1e300}
	tests := []struct {
		path    string
		want    int64
		wantErr string
	}{
		{path: ".exact", want: 42},
		{path: ".frac", wantErr: "not an exact integer"},
		{path: ".big", wantErr: "not an exact integer"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, found, err := MustParsePath(tt.path).LookupInt64(doc, nil)
			checkResult(t, tt.path, got, found, err, tt.want, tt.wantErr == "", tt.wantErr)
		})
	}
}

func TestLookupList(t *testing.T) {
	doc := mustDecode(t, testBody)
	tests := []struct {
		path      string
		wantLen   int
		wantFound bool
		wantErr   string
	}{
		{path: ".data.lines", wantLen: 2, wantFound: true},
		{path: "{.data.empty}", wantLen: 0, wantFound: true},
		{path: ".data.nothing", wantFound: false},
		{path: ".data.missing", wantFound: false},
		{path: ".data.obj", wantErr: "value is an object, want an array"},
		{path: ".data.lines[0]", wantErr: "value is an object, want an array"},
		{path: ".data.lines[*]", wantErr: "yields 2 values"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, found, err := MustParsePath(tt.path).LookupList(doc, nil)
			checkResult(t, tt.path, len(got), found, err, tt.wantLen, tt.wantFound, tt.wantErr)
		})
	}
}

func TestForEachExtraction(t *testing.T) {
	// The shape a forEach route uses: iterate the items, read per-item fields with
	// relative paths and envelope fields with $-paths.
	doc := mustDecode(t, testBody)
	items, found, err := MustParsePath(".data.lines").LookupList(doc, nil)
	if err != nil || !found {
		t.Fatalf("LookupList = %v, %v", found, err)
	}
	lineID, qty, jobID := MustParsePath(".id"), MustParsePath(".qty"), MustParsePath("$.data.job_id")
	var got []string
	for _, item := range items {
		id, _, err := lineID.LookupString(doc, item)
		if err != nil {
			t.Fatal(err)
		}
		n, _, err := qty.LookupInt64(doc, item)
		if err != nil {
			t.Fatal(err)
		}
		job, _, err := jobID.LookupString(doc, item)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, job+"/"+id+"="+string(rune('0'+n)))
	}
	want := []string{"job-42/l1=2", "job-42/l2=3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestZeroPath(t *testing.T) {
	var p Path
	if _, _, err := p.Lookup(map[string]any{}, nil); err == nil {
		t.Error("Lookup on the zero Path succeeded, want an error")
	}
}

func TestMustParsePathPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("MustParsePath(invalid) did not panic")
		}
	}()
	MustParsePath("no-dot")
}

// TestPathConcurrentUse guards the claim that a parsed Path can be shared by
// concurrent requests (run with -race to make it meaningful).
func TestPathConcurrentUse(t *testing.T) {
	doc := mustDecode(t, testBody)
	paths := []Path{
		MustParsePath(".data.lines[-1].id"),
		MustParsePath(`.data.lines[?(@.kind=="cpu")].id`),
		MustParsePath(".data.lines[0:1]"),
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				for _, p := range paths {
					if _, _, err := p.Lookup(doc, nil); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

func checkResult[T comparable](t *testing.T, path string, got T, found bool, err error, want T, wantFound bool, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil {
			t.Fatalf("%s: got %v, %v, want error containing %q", path, got, found, wantErr)
		}
		if !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: error = %q, want it to contain %q", path, err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if got != want || found != wantFound {
		t.Errorf("%s: got %v, %v, want %v, %v", path, got, found, want, wantFound)
	}
}

func FuzzParsePathAndLookup(f *testing.F) {
	seeds := []struct{ path, body string }{
		{".data.job_id", testBody},
		{"{$.data.lines[-1].qty}", testBody},
		{`.data.lines[?(@.kind=="gpu")].id`, testBody},
		{".data.lines[*].id", testBody},
		{"..id", testBody},
		{".data.lines[0:2:1]", testBody},
		{"{['a','b']}", `{"a":1,"b":2}`},
		{".a[?(@.x>1)]", `{"a":[{"x":1},{"x":2}]}`},
		{".a", `[]`},
		{"{range .a}{end}", `{"a":[1]}`},
	}
	for _, s := range seeds {
		f.Add(s.path, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		p, err := ParsePath(path)
		if err != nil {
			if strings.Contains(err.Error(), "panicked") {
				t.Fatalf("ParsePath(%q) hit a recovered panic: %v", path, err)
			}
			return
		}
		doc, err := Decode(body)
		if err != nil {
			return
		}
		var item any
		if m, ok := doc.(map[string]any); ok {
			for _, v := range m {
				item = v
				break
			}
		}
		for _, it := range []any{nil, item} {
			// Lookup recovers from panics in the third-party evaluator; the fuzzer
			// should still never find one.
			if _, _, err := p.Lookup(doc, it); err != nil && strings.Contains(err.Error(), "panicked") {
				t.Fatalf("Lookup(%q) hit a recovered panic: %v", path, err)
			}
			_, _, _ = p.LookupString(doc, it)
			_, _, _ = p.LookupInt64(doc, it)
			_, _, _ = p.LookupList(doc, it)
		}
	})
}
