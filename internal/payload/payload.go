// Package payload decodes webhook bodies and extracts business fields from them with
// JSONPath expressions taken from a WebhookProvider's spec (event ID, type, sequence,
// job ID, usage, forEach lists).
//
// Paths use kubectl's JSONPath dialect (k8s.io/client-go/util/jsonpath), because that
// is what the people writing WebhookProvider objects already know from
// `kubectl get -o jsonpath`. A path is parsed once, when the provider is loaded, and
// evaluated for every delivery.
package payload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"

	"k8s.io/client-go/util/jsonpath"
)

// Decode parses a webhook body into the generic form Lookup works on. Numbers are kept
// as json.Number so that large integer IDs and amounts survive exactly instead of
// being rounded through float64. Only a single JSON object is accepted: every
// provider we support sends one, and rejecting trailing data means the document we
// extract fields from is exactly the one whose signature was checked and whose hash
// is stored.
func Decode(body []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("decode JSON payload: body is empty")
		}
		return nil, fmt.Errorf("decode JSON payload: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decode JSON payload: unexpected data after the top-level value at offset %d", dec.InputOffset())
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, fmt.Errorf("decode JSON payload: top-level value is %s, want an object", jsonKind(doc))
	}
	return doc, nil
}

// Path is a parsed JSONPath expression. The zero value is not usable; create one with
// ParsePath. A Path is immutable after parsing and safe for concurrent use.
type Path struct {
	text     string
	fromRoot bool
	jp       *jsonpath.JSONPath
}

// ParsePath parses a JSONPath expression in kubectl syntax, with or without the
// surrounding braces: ".data.job_id", "{.data.job_id}", "$.data.job_id" and
// "{$.data.job_id}" are all accepted. A path starting with "$" always refers to the
// whole document, even when a per-item context is given to Lookup; this is how a
// forEach route reads a field of the envelope (such as the event ID) while
// extracting the rest from each item.
//
// Only single-value expressions are accepted: free text around the expression,
// several {…} blocks and the range/end template keywords are rejected. Besides
// making no sense for field extraction, range/end make the underlying evaluator
// stateful, which would make a shared Path unsafe for concurrent requests.
//
// Because Decode keeps numbers as json.Number, a filter compares numbers as text:
// write [?(@.version=="2")]; [?(@.version==2)] fails with "incompatible types for
// comparison" when evaluated.
func ParsePath(s string) (Path, error) {
	text := strings.TrimSpace(s)
	expr := text
	if strings.HasPrefix(expr, "{") && strings.HasSuffix(expr, "}") {
		expr = strings.TrimSpace(expr[1 : len(expr)-1])
	}
	if expr == "" {
		return Path{}, fmt.Errorf("parse JSONPath %q: path is empty", s)
	}
	switch expr[0] {
	case '.', '$', '@', '[':
	default:
		return Path{}, fmt.Errorf("parse JSONPath %q: path must start with '.' or '$' (for example .data.id or {.data.id})", s)
	}

	jp, err := compile("{" + expr + "}")
	if err != nil {
		return Path{}, fmt.Errorf("parse JSONPath %q: %w", s, err)
	}
	return Path{text: text, fromRoot: expr[0] == '$', jp: jp}, nil
}

// compile parses template for evaluation and checks that it is a single expression.
// A panic in the third-party parser becomes an error: paths come from user-written
// custom resources and must not be able to crash the manager.
func compile(template string) (jp *jsonpath.JSONPath, err error) {
	defer func() {
		if r := recover(); r != nil {
			jp, err = nil, fmt.Errorf("invalid expression (parser panicked: %v)", r)
		}
	}()
	// JSONPath does not expose its syntax tree, so parse a second time into a Parser
	// to inspect; both happen once per path, never per request.
	parser, err := jsonpath.Parse("payload", template)
	if err != nil {
		return nil, err
	}
	if err := checkSingleExpression(parser.Root); err != nil {
		return nil, err
	}
	// Missing keys yield no result instead of an error, so Lookup can report found=false.
	jp = jsonpath.New("payload").AllowMissingKeys(true)
	if err := jp.Parse(template); err != nil {
		return nil, err
	}
	return jp, nil
}

// checkSingleExpression accepts exactly one {…} action with no surrounding text and no
// range/end (or unknown) identifiers anywhere in it.
func checkSingleExpression(root *jsonpath.ListNode) error {
	if root == nil || len(root.Nodes) != 1 {
		return errors.New("want exactly one expression")
	}
	action, ok := root.Nodes[0].(*jsonpath.ListNode)
	if !ok {
		return errors.New("want an expression, not plain text")
	}
	if len(action.Nodes) == 0 {
		return errors.New("path names no field")
	}
	return checkNodes(action)
}

func checkNodes(list *jsonpath.ListNode) error {
	if list == nil {
		return nil
	}
	for _, n := range list.Nodes {
		switch n := n.(type) {
		case *jsonpath.IdentifierNode:
			return fmt.Errorf("keyword %q is not supported in a field path", n.Name)
		case *jsonpath.ListNode:
			if err := checkNodes(n); err != nil {
				return err
			}
		case *jsonpath.FilterNode:
			if err := checkNodes(n.Left); err != nil {
				return err
			}
			if err := checkNodes(n.Right); err != nil {
				return err
			}
		case *jsonpath.UnionNode:
			for _, l := range n.Nodes {
				if err := checkNodes(l); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// MustParsePath is ParsePath for paths fixed at compile time (defaults and tests); it
// panics on an invalid path.
func MustParsePath(s string) Path {
	p, err := ParsePath(s)
	if err != nil {
		panic(err)
	}
	return p
}

// String returns the path as it was written, for error messages and status
// conditions that point a human back at the spec field.
func (p Path) String() string {
	return p.text
}

// FromRoot reports whether the path starts with "$" and therefore ignores the
// per-item context given to Lookup.
func (p Path) FromRoot() bool {
	return p.fromRoot
}

// Lookup evaluates the path. Relative paths are evaluated against item, or against
// root when item is nil; paths starting with "$" are always evaluated against root.
//
// found is false, with no error, when a field on the path is missing, so callers can
// apply defaults or report a missing field in their own terms. An explicit JSON null
// is found and returned as nil. A path that yields several values (a wildcard or a
// filter matching more than once) is an error: a business field must be unambiguous.
func (p Path) Lookup(root, item any) (value any, found bool, err error) {
	if p.jp == nil {
		return nil, false, errors.New("evaluate JSONPath: path was not created with ParsePath")
	}
	data := item
	if p.fromRoot || item == nil {
		data = root
	}
	results, err := p.findResults(data)
	if err != nil {
		return nil, false, fmt.Errorf("evaluate JSONPath %s: %w", p.text, err)
	}
	var values []reflect.Value
	for _, r := range results {
		values = append(values, r...)
	}
	switch len(values) {
	case 0:
		return nil, false, nil
	case 1:
		return interfaceOf(values[0]), true, nil
	default:
		return nil, false, fmt.Errorf("evaluate JSONPath %s: yields %d values, want exactly one", p.text, len(values))
	}
}

// findResults runs the evaluator, turning a panic into an error: the document is
// attacker-controlled and the evaluator is third-party reflection code.
func (p Path) findResults(data any) (results [][]reflect.Value, err error) {
	defer func() {
		if r := recover(); r != nil {
			results, err = nil, fmt.Errorf("evaluation panicked: %v", r)
		}
	}()
	return p.jp.FindResults(data)
}

func interfaceOf(v reflect.Value) any {
	if !v.IsValid() || !v.CanInterface() {
		return nil
	}
	return v.Interface()
}

// LookupString evaluates the path and renders a scalar as a string: strings as they
// are, numbers and booleans in their JSON text form ("12345678901234567890", "1.5",
// "true"), so that IDs sent as numbers work like IDs sent as strings. JSON null
// counts as missing, because providers send null for unset optional fields. Objects
// and arrays are an error: they have no single textual form to key on.
func (p Path) LookupString(root, item any) (string, bool, error) {
	v, found, err := p.Lookup(root, item)
	if err != nil || !found || v == nil {
		return "", false, err
	}
	switch v := v.(type) {
	case string:
		return v, true, nil
	case json.Number:
		return v.String(), true, nil
	case bool:
		return strconv.FormatBool(v), true, nil
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true, nil
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32), true, nil
	case int:
		return strconv.Itoa(v), true, nil
	case int64:
		return strconv.FormatInt(v, 10), true, nil
	default:
		return "", false, fmt.Errorf("evaluate JSONPath %s: value is %s, want a string, number or boolean", p.text, jsonKind(v))
	}
}

// LookupInt64 evaluates the path and returns an integer: a JSON integer, or a string
// of decimal digits with an optional leading '-' (providers often quote large
// numbers). Fractions, exponents, booleans and out-of-range values are errors rather
// than being truncated, because these values are sequence numbers, versions and
// quantities that must not silently change. JSON null counts as missing.
func (p Path) LookupInt64(root, item any) (int64, bool, error) {
	v, found, err := p.Lookup(root, item)
	if err != nil || !found || v == nil {
		return 0, false, err
	}
	var text string
	switch v := v.(type) {
	case json.Number:
		text = v.String()
	case string:
		text = v
	case int:
		return int64(v), true, nil
	case int64:
		return v, true, nil
	case float64:
		// Documents decoded without UseNumber: accept only exactly representable integers.
		if v == math.Trunc(v) && v >= -(1<<53) && v <= 1<<53 {
			return int64(v), true, nil
		}
		return 0, false, fmt.Errorf("evaluate JSONPath %s: number %v is not an exact integer", p.text, v)
	default:
		return 0, false, fmt.Errorf("evaluate JSONPath %s: value is %s, want an integer", p.text, jsonKind(v))
	}
	if !isDecimalInteger(text) {
		return 0, false, fmt.Errorf("evaluate JSONPath %s: %q is not a decimal integer", p.text, truncate(text))
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("evaluate JSONPath %s: %q is out of the int64 range", p.text, truncate(text))
	}
	return n, true, nil
}

// LookupList evaluates the path for a forEach route and returns the items of the
// array it points to. The path must point at the array itself (".items", not
// ".items[*]"), so that one item and many items behave the same. A missing field or
// JSON null is not found; any other non-array value is an error.
func (p Path) LookupList(root, item any) ([]any, bool, error) {
	v, found, err := p.Lookup(root, item)
	if err != nil || !found || v == nil {
		return nil, false, err
	}
	list, ok := v.([]any)
	if !ok {
		return nil, false, fmt.Errorf("evaluate JSONPath %s: value is %s, want an array", p.text, jsonKind(v))
	}
	return list, true, nil
}

func isDecimalInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// truncate bounds how much of a payload value ends up in an error message.
func truncate(s string) string {
	const maxLen = 32
	if len(s) > maxLen {
		return s[:maxLen] + "…"
	}
	return s
}

// jsonKind names the JSON type of a decoded value for error messages, without
// echoing the value itself.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number, float64, float32, int, int64:
		return "a number"
	case bool:
		return "a boolean"
	default:
		return fmt.Sprintf("a %T", v)
	}
}
