package extract

import (
	"net/http"
	"testing"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/payload"
)

// TestHeldFacts: an event with an unmapped state holds, per meaning, exactly what a
// delivery would yield once spec.states maps the state to it, conditions over
// jobState() included, beyond what it yields now.
func TestHeldFacts(t *testing.T) {
	const succeededOnly = `jobState(payload.job.state) == "Succeeded"`
	type want struct{ jobs, settlements int }
	for _, tc := range []struct {
		name, route, op, state string
		want                   map[hooksv1alpha1.JobStateMeaning]want
	}{
		{"a charge only for succeeded jobs", "", succeededOnly, "FINISHED", map[hooksv1alpha1.JobStateMeaning]want{
			"Succeeded": {1, 1}, "Failed": {1, 0}, "Cancelled": {1, 0}}},
		{"a charge whatever the state", "", "", "FINISHED", map[hooksv1alpha1.JobStateMeaning]want{
			"Succeeded": {1, 1}, "Failed": {1, 1}, "Cancelled": {1, 1}}},
		{"a route condition over the state", `jobState(payload.job.state) != "Cancelled"`, succeededOnly, "odd",
			map[hooksv1alpha1.JobStateMeaning]want{"Succeeded": {1, 1}, "Failed": {1, 0}, "Cancelled": {0, 0}}},
		{"a mapped state holds nothing", "", succeededOnly, "success", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := evaluate(t, whenSpec(tc.route, tc.op), stateBody(tc.state))
			if err != nil {
				t.Fatal(err)
			}
			if len(ev.HeldFacts) != len(tc.want) {
				t.Fatalf("held %+v, want one entry per meaning of %v", ev.HeldFacts, tc.want)
			}
			for _, h := range ev.HeldFacts {
				w, ok := tc.want[h.As]
				if !ok || len(h.JobCompletions) != w.jobs || len(h.Settlements) != w.settlements {
					t.Fatalf("held for %s: %d jobs, %d settlements; want %+v", h.As, len(h.JobCompletions), len(h.Settlements), w)
				}
				for _, j := range h.JobCompletions {
					if string(j.State) != string(h.As) || j.JobID != "j1" || j.Version != 3 || j.Usage == nil {
						t.Fatalf("held completion %+v: want job j1, version 3, usage, in state %s", j, h.As)
					}
				}
				for _, s := range h.Settlements {
					if s.SettlementKey == "" || s.Amount == nil || s.Amount.Minor != 1250 {
						t.Fatalf("held settlement %+v: want the key and amount a delivery derives", s)
					}
				}
			}
		})
	}
}

// TestHeldFactsCompiledOnce: a sender that keeps writing one unmapped state costs a
// compile per meaning once per compiled spec, not per delivery.
func TestHeldFactsCompiledOnce(t *testing.T) {
	x, err := Compile("ns", "p", whenSpec("", `jobState(payload.job.state) == "Succeeded"`))
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(state string) {
		t.Helper()
		body := stateBody(state)
		doc, err := payload.Decode([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		ev, err := x.Identify(http.Header{"Webhook-Id": {"msg_1"}}, []byte(body), doc)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Facts(ev, doc); err != nil {
			t.Fatal(err)
		}
		if len(ev.HeldFacts) != 3 {
			t.Fatalf("held %+v", ev.HeldFacts)
		}
	}
	for range 5 {
		deliver("IN_PROGRESS")
	}
	deliver("in_progress ") // the same state as the table compares it
	if x.held.compiles != 3 {
		t.Fatalf("%d compiles for one unmapped state delivered 6 times; want 3 (one per meaning)", x.held.compiles)
	}
	deliver("PAUSED")
	if x.held.compiles != 6 {
		t.Fatalf("%d compiles after a second state; want 6", x.held.compiles)
	}
}
