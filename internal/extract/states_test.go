package extract

import (
	"reflect"
	"testing"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// statesSpec completes the job and charges it only when it succeeded.
func statesSpec(states ...hooksv1alpha1.JobStateMapping) *hooksv1alpha1.WebhookProviderSpec {
	spec := whenSpec("", `jobState(payload.job.state) == "Succeeded"`)
	spec.States = states
	return spec
}

func TestUnmappedStates(t *testing.T) {
	for _, tc := range []struct {
		name, route, op, state string
		want                   []hooksv1alpha1.UnmappedJobState
	}{
		{"read by the JobCompletion operation and a condition: reported once, with the job", "",
			`jobState(payload.job.state) == "Succeeded"`, "TIMED_OUT", []hooksv1alpha1.UnmappedJobState{{JobID: "j1", State: "TIMED_OUT"}}},
		{"read by the route's condition: no operation runs", `jobState(payload.job.state) != "Cancelled"`, "", "timed_out",
			[]hooksv1alpha1.UnmappedJobState{{State: "timed_out"}}},
		{"read by the JobCompletion operation only: its job's settlement is not charged", "", "", "weird",
			[]hooksv1alpha1.UnmappedJobState{{JobID: "j1", State: "weird"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := evaluate(t, whenSpec(tc.route, tc.op), stateBody(tc.state))
			if err != nil {
				t.Fatalf("an unmapped state must not refuse the delivery: %v", err)
			}
			if !ev.Routed || !ev.Store || len(ev.JobCompletions) != 0 || len(ev.Settlements) != 0 {
				t.Fatalf("want a stored event with no job completion and no charge: %+v", ev)
			}
			if !reflect.DeepEqual(ev.UnmappedJobStates, tc.want) {
				t.Fatalf("unmapped %+v, want %+v", ev.UnmappedJobStates, tc.want)
			}
		})
	}
}

func TestStatesTable(t *testing.T) {
	failed := hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobFailed)
	spec := statesSpec(hooksv1alpha1.JobStateMapping{State: "TIMED_OUT", As: failed},
		hooksv1alpha1.JobStateMapping{State: "IN_PROGRESS", As: hooksv1alpha1.JobStateIgnored},
		// A table entry overrides the built-in spelling.
		hooksv1alpha1.JobStateMapping{State: "completed", As: hooksv1alpha1.JobStateIgnored})
	for _, tc := range []struct {
		state             string
		jobs, settlements int
		jobState          hooksv1alpha1.JobState
	}{
		{"timed_out", 1, 0, hooksv1alpha1.JobFailed}, // compared ignoring case
		{" TIMED_OUT ", 1, 0, hooksv1alpha1.JobFailed},
		{"IN_PROGRESS", 0, 0, ""},
		{"COMPLETED", 0, 0, ""},
		{"success", 1, 1, hooksv1alpha1.JobSucceeded}, // not listed: read as before
		{"Cancelled", 1, 0, hooksv1alpha1.JobCancelled},
	} {
		ev, err := evaluate(t, spec, stateBody(tc.state))
		if err != nil {
			t.Fatalf("%q: %v", tc.state, err)
		}
		if len(ev.JobCompletions) != tc.jobs || len(ev.Settlements) != tc.settlements || len(ev.UnmappedJobStates) != 0 {
			t.Fatalf("%q: %+v", tc.state, ev)
		}
		if tc.jobs > 0 && ev.JobCompletions[0].State != tc.jobState {
			t.Fatalf("%q: state %s, want %s", tc.state, ev.JobCompletions[0].State, tc.jobState)
		}
	}
}

// An Ignored state drops the job's own settlement even without a condition: Ignored
// means nothing is created for the job.
func TestIgnoredStateIsNotCharged(t *testing.T) {
	spec := whenSpec("", "")
	spec.States = []hooksv1alpha1.JobStateMapping{{State: "skipped", As: hooksv1alpha1.JobStateIgnored}}
	ev, err := evaluate(t, spec, stateBody("skipped"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.JobCompletions)+len(ev.Settlements)+len(ev.UnmappedJobStates) != 0 || !ev.Store {
		t.Fatalf("want a stored event with nothing to do: %+v", ev)
	}
}

func TestStatesRefusedAtCompile(t *testing.T) {
	for _, states := range [][]hooksv1alpha1.JobStateMapping{
		{{State: "a", As: "Failed"}, {State: " A", As: "Failed"}},
		{{State: "a", As: "Maybe"}},
	} {
		if _, err := Compile("ns", "p", statesSpec(states...)); err == nil {
			t.Fatalf("%+v: want a compile error", states)
		}
	}
}
