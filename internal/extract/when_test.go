package extract

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/payload"
)

// whenSpec is testSpec with conditions: routeWhen on the route, settleWhen on the
// BillingSettlement operation.
func whenSpec(routeWhen, settleWhen string) *hooksv1alpha1.WebhookProviderSpec {
	spec := testSpec()
	spec.Routes[0].When = routeWhen
	spec.Routes[0].Operations[1].When = settleWhen
	return spec
}

func TestWhenCompileErrors(t *testing.T) {
	for _, tc := range []struct{ name, route, op, want string }{
		{"syntax", `payload.type ==`, "", "spec.routes[0].when: ERROR"},
		{"undeclared variable", `nope == 1`, "", "spec.routes[0].when: ERROR"},
		{"item outside forEach", "", `item.x == 1`, "spec.routes[0].operations[1].when: ERROR"},
		{"not bool", `payload.type`, "", "spec.routes[0].when: the expression's type is dyn, want bool"},
		{"string result", "", `jobState(payload.job.state)`, "spec.routes[0].operations[1].when: the expression's type is string, want bool"},
		{"type error", `1 + "a" == 2`, "", "no matching overload"},
		{"jobState arity", `jobState("a", "b") == "x"`, "", "spec.routes[0].when"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile("ns", "p", whenSpec(tc.route, tc.op))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
		})
	}
}

// evaluate runs spec over body the way the receiver does.
func evaluate(t *testing.T, spec *hooksv1alpha1.WebhookProviderSpec, body string) (*Event, error) {
	t.Helper()
	x, err := Compile("ns", "p", spec)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	doc, err := payload.Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := x.Identify(http.Header{"Webhook-Id": {"msg_1"}}, []byte(body), doc)
	if err != nil {
		return nil, err
	}
	if !ev.Routed {
		return ev, nil
	}
	return ev, x.Facts(ev, doc)
}

func stateBody(state string) string {
	return fmt.Sprintf(`{"type":"job.completed","seq":3,"customer":"c1","cents":1250,"env":"prod",
		"job":{"id":"j1","state":%q,"tokens":42,"model":"m"}}`, state)
}

func TestWhen(t *testing.T) {
	const succeededOnly = `jobState(payload.job.state) == "Succeeded"`
	for _, tc := range []struct {
		name, route, op, body string
		routed, conditional   bool
		jobs, settlements     int
		wantErr               string
	}{
		{"no conditions", "", "", stateBody("failed"), true, false, 1, 1, ""},
		{"succeeded job is charged", "", succeededOnly, stateBody("success"), true, false, 1, 1, ""},
		{"failed job completes, is not charged", "", succeededOnly, stateBody("error"), true, false, 1, 0, ""},
		{"cancelled job completes, is not charged", "", succeededOnly, stateBody("canceled"), true, false, 1, 0, ""},
		{"jobState normalises case", "", `jobState(payload.job.state) == "Cancelled"`, stateBody("CANCELLED"), true, false, 1, 1, ""},
		{"route true", `payload.env == "prod"`, "", stateBody("succeeded"), true, false, 1, 1, ""},
		{"route false is unrouted", `payload.env == "staging"`, "", stateBody("succeeded"), false, true, 0, 0, ""},
		{"numbers are numbers", `payload.cents > 1000 && payload.job.tokens == 42.0`, "", stateBody("succeeded"), true, false, 1, 1, ""},
		{"has() guards a missing key", `has(payload.nope) && payload.nope == 1`, "", stateBody("succeeded"), false, true, 0, 0, ""},
		{"missing key", `payload.nope == 1`, "", stateBody("succeeded"), true, false, 0, 0,
			"spec.routes[0].when could not be evaluated: no such key: nope"},
		// An unmapped state is not a payload that fails to fit: the event is stored
		// and shows the state (TestUnmappedStates), never a 400.
		{"unmapped state in a route condition", succeededOnly, "", stateBody("weird"), true, false, 0, 0, ""},
		{"unmapped state in an operation condition", "", succeededOnly, stateBody("weird"), true, false, 0, 0, ""},
		{"wrong type", "", `jobState(payload.job.tokens) == "Succeeded"`, stateBody("succeeded"), true, false, 0, 0,
			"spec.routes[0].operations[1].when could not be evaluated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := evaluate(t, whenSpec(tc.route, tc.op), tc.body)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want an ErrInvalidEvent containing %q, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev.Routed != tc.routed || ev.Store != tc.routed || ev.Conditional != tc.conditional ||
				len(ev.JobCompletions) != tc.jobs || len(ev.Settlements) != tc.settlements {
				t.Fatalf("routed=%v store=%v conditional=%v jobs=%d settlements=%d, want routed=%v conditional=%v jobs=%d settlements=%d",
					ev.Routed, ev.Store, ev.Conditional, len(ev.JobCompletions), len(ev.Settlements),
					tc.routed, tc.conditional, tc.jobs, tc.settlements)
			}
		})
	}
}

// A route whose condition is false is stored with storeUnroutedEvents, without facts,
// like an event type with no route.
func TestWhenFalseStoredUnrouted(t *testing.T) {
	spec := whenSpec(`payload.env == "staging"`, "")
	spec.StoreUnroutedEvents = true
	ev, err := evaluate(t, spec, stateBody("succeeded"))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Routed || !ev.Store || len(ev.JobCompletions)+len(ev.Settlements) != 0 {
		t.Fatalf("want an unrouted, stored event without facts: %+v", ev)
	}
}

// lineSpec charges each line item of an invoice, only where when holds.
func lineSpec(when string) *hooksv1alpha1.WebhookProviderSpec {
	spec := testSpec()
	spec.Routes = []hooksv1alpha1.Route{{EventType: "invoice", Operations: []hooksv1alpha1.RouteOperation{{
		Type: hooksv1alpha1.OperationBillingSettlement, ForEach: ".lines", When: when,
		Settlement: &hooksv1alpha1.SettlementMapping{BillingProviderRef: "billing", KeyFrom: []string{".id"},
			Customer: "$.customer", Amount: &hooksv1alpha1.AmountMapping{Minor: ".cents", Currency: "USD"}},
	}}}}
	return spec
}

func linesBody(n int) string {
	var b strings.Builder
	b.WriteString(`{"type":"invoice","customer":"c1","lines":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"l%d","cents":%d,"state":"ok"}`, i, i%3)
	}
	b.WriteString(`]}`)
	return b.String()
}

func TestWhenForEachItem(t *testing.T) {
	ev, err := evaluate(t, lineSpec(`item.cents > 0 && payload.customer == "c1"`), linesBody(9))
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.Settlements) != 6 {
		t.Fatalf("want the 6 lines with a non-zero amount, got %d", len(ev.Settlements))
	}
	for _, s := range ev.Settlements {
		if s.Amount.Minor == 0 {
			t.Fatalf("a zero line was produced: %+v", s)
		}
	}
	// Per item, this costs little; over 2,000 items it is quadratic, and the limit
	// counts the delivery's conditions together.
	_, err = evaluate(t, lineSpec(`payload.lines.exists(l, l.id == item.id)`), linesBody(2000))
	if err == nil || !strings.Contains(err.Error(), "exceed the cost limit of 1000000 together") {
		t.Fatalf("want the delivery's cost limit, got %v", err)
	}
	_, err = evaluate(t, lineSpec(`item.missing == 1`), linesBody(3))
	if err == nil || !strings.Contains(err.Error(), "spec.routes[0].operations[0].when could not be evaluated") ||
		!strings.Contains(err.Error(), "item 0 of .lines") {
		t.Fatalf("want an error naming the operation and item, got %v", err)
	}
}

// The cost limit lets an expression look through a 2,000-item array, and refuses one
// whose cost grows with the square of the payload.
func TestWhenCostLimit(t *testing.T) {
	body := linesBody(2000)
	for _, tc := range []struct{ name, when, wantErr string }{
		{"exists over 2,000 items", `payload.lines.exists(l, l.state == "failed") == false`, ""},
		{"all and size over 2,000 items", `payload.lines.all(l, l.cents >= 0) && size(payload.lines) == 2000`, ""},
		{"filter and map over 2,000 items", `payload.lines.filter(l, l.cents > 0).map(l, l.cents).size() > 0`, ""},
		{"quadratic", `payload.lines.all(a, payload.lines.exists(b, b.id == a.id))`, "cost limit exceeded"},
		{"string blow-up", `payload.lines.map(l, payload.lines.map(m, m.id + l.id)).size() > 0`, "cost limit exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec()
			spec.Routes = []hooksv1alpha1.Route{{EventType: "invoice", When: tc.when, Operations: lineSpec("").Routes[0].Operations}}
			x, err := Compile("ns", "p", spec)
			if err != nil {
				t.Fatal(err)
			}
			doc, _ := payload.Decode([]byte(body))
			ev, err := x.Identify(http.Header{"Webhook-Id": {"msg_1"}}, []byte(body), doc)
			if err != nil {
				t.Fatal(err)
			}
			// Facts reports the route's evaluation error (after the receiver's
			// duplicate check); with a true condition it then refuses 2,000 facts.
			err = x.Facts(ev, doc)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want %q, got %v", tc.wantErr, err)
				}
				return
			}
			if !ev.Routed || err == nil || !strings.Contains(err.Error(), "at most 64") {
				t.Fatalf("want the condition to hold (then too many facts), got routed=%v err=%v", ev.Routed, err)
			}
		})
	}
}
