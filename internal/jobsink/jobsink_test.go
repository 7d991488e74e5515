package jobsink_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/jobsink"
	"github.com/settlement-operator/settlement-operator/test/fakejobsink"
)

const token = "sink_token_Zm9vYmFy"

func startSink(t *testing.T, known fakejobsink.KnownJobs) *fakejobsink.Server {
	t.Helper()
	s, err := fakejobsink.Start(fakejobsink.Options{Token: token, KnownJobs: known})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close sink: %v", err)
		}
	})
	return s
}

func completion(job string, version int64, state string) jobsink.Completion {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(version) * time.Minute)
	return jobsink.Completion{JobID: job, Version: version, State: state, CompletedAt: &at,
		Usage: &billing.Usage{Meter: "gpu-seconds", Quantity: fmt.Sprint(100 * version), Unit: "s"}}
}

func key(job string, version int64) string { return fmt.Sprintf("jc_%s_%d", job, version) }

// step is one Apply in a scenario, with what the client must report and what the
// sink must hold afterwards.
type step struct {
	comp         jobsink.Completion
	key          string // default key(job, version)
	register     bool   // register the job at the sink before this step
	wantOutcome  jobsink.Outcome
	wantCurrent  int64
	wantErrCode  string // non-empty: expect a classified error with this code
	wantErrClass billing.Class
	// the sink's books after the step
	wantVersion      int64
	wantState        string
	wantApplications int
}

func TestApply(t *testing.T) {
	tests := []struct {
		name  string
		known fakejobsink.KnownJobs
		steps []step
	}{
		{
			name: "applied, then a repeat is not applied again",
			steps: []step{
				{comp: completion("job-1", 1, "Succeeded"), wantOutcome: jobsink.Applied, wantCurrent: 1, wantVersion: 1, wantState: "Succeeded", wantApplications: 1},
				{comp: completion("job-1", 1, "Succeeded"), wantOutcome: jobsink.Applied, wantCurrent: 1, wantVersion: 1, wantState: "Succeeded", wantApplications: 1},
			},
		},
		{
			name: "a newer version is applied, an older one is superseded and never moves the job back",
			steps: []step{
				{comp: completion("job-2", 2, "Failed"), wantOutcome: jobsink.Applied, wantCurrent: 2, wantVersion: 2, wantState: "Failed", wantApplications: 1},
				{comp: completion("job-2", 1, "Succeeded"), wantOutcome: jobsink.Superseded, wantCurrent: 2, wantVersion: 2, wantState: "Failed", wantApplications: 1},
				{comp: completion("job-2", 3, "Succeeded"), wantOutcome: jobsink.Applied, wantCurrent: 3, wantVersion: 3, wantState: "Succeeded", wantApplications: 2},
			},
		},
		{
			name:  "an unknown job is deferred until it exists",
			known: fakejobsink.OnlyRegistered,
			steps: []step{
				{comp: completion("job-3", 1, "Succeeded"), wantOutcome: jobsink.Deferred},
				{comp: completion("job-3", 1, "Succeeded"), register: true, wantOutcome: jobsink.Applied, wantCurrent: 1, wantVersion: 1, wantState: "Succeeded", wantApplications: 1},
			},
		},
		{
			name: "same version with other content is a terminal conflict",
			steps: []step{
				{comp: completion("job-4", 1, "Succeeded"), wantOutcome: jobsink.Applied, wantCurrent: 1, wantVersion: 1, wantState: "Succeeded", wantApplications: 1},
				{comp: completion("job-4", 1, "Failed"), key: "jc_other", wantErrClass: billing.Terminal, wantErrCode: "version_conflict", wantVersion: 1, wantState: "Succeeded", wantApplications: 1},
			},
		},
		{
			name: "a key reused for another version is terminal",
			steps: []step{
				{comp: completion("job-5", 1, "Succeeded"), key: "jc_fixed", wantOutcome: jobsink.Applied, wantCurrent: 1, wantVersion: 1, wantState: "Succeeded", wantApplications: 1},
				{comp: completion("job-5", 2, "Succeeded"), key: "jc_fixed", wantErrClass: billing.Terminal, wantErrCode: "idempotency_key_reused", wantVersion: 1, wantState: "Succeeded", wantApplications: 1},
			},
		},
		{
			name: "job IDs with slashes and spaces travel escaped",
			steps: []step{
				{comp: completion("team a/job 6", 1, "Cancelled"), wantOutcome: jobsink.Applied, wantCurrent: 1, wantVersion: 1, wantState: "Cancelled", wantApplications: 1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := startSink(t, tt.known)
			c := jobsink.New(sink.URL()+"/", token, time.Second, nil)
			for i, st := range tt.steps {
				if st.register {
					sink.Register(st.comp.JobID)
				}
				k := st.key
				if k == "" {
					k = key(st.comp.JobID, st.comp.Version)
				}
				res, err := c.Apply(context.Background(), k, st.comp)
				if st.wantErrCode != "" {
					e, ok := billing.AsError(err)
					if !ok || e.Class != st.wantErrClass || e.Code != st.wantErrCode {
						t.Fatalf("step %d: got %+v, %v; want %s %s", i, res, err, st.wantErrClass, st.wantErrCode)
					}
				} else {
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if res.Outcome != st.wantOutcome || res.CurrentVersion != st.wantCurrent {
						t.Fatalf("step %d: got %s v%d, want %s v%d", i, res.Outcome, res.CurrentVersion, st.wantOutcome, st.wantCurrent)
					}
				}
				v, state, n := sink.Applied(st.comp.JobID)
				if v != st.wantVersion || state != st.wantState || n != st.wantApplications {
					t.Fatalf("step %d: sink holds v%d %q applied %d times, want v%d %q %d times",
						i, v, state, n, st.wantVersion, st.wantState, st.wantApplications)
				}
			}
		})
	}
}

func TestApplyClassifiesFailures(t *testing.T) {
	sink := startSink(t, fakejobsink.AllJobs)
	ctx := context.Background()
	comp := completion("job-1", 1, "Succeeded")

	sink.FailNext(1, http.StatusServiceUnavailable)
	_, err := jobsink.New(sink.URL(), token, time.Second, nil).Apply(ctx, key("job-1", 1), comp)
	if e, ok := billing.AsError(err); !ok || e.Class != billing.Ambiguous || e.Code != "503" {
		t.Fatalf("503: got %v, want ambiguous 503", err)
	}
	if _, _, n := sink.Applied("job-1"); n != 0 {
		t.Fatalf("a failed call was applied %d times", n)
	}

	_, err = jobsink.New(sink.URL(), "wrong", time.Second, nil).Apply(ctx, key("job-1", 1), comp)
	// A wrong token is our configuration problem: retried, not a terminal refusal.
	if e, ok := billing.AsError(err); !ok || e.Class != billing.Transient || e.Code != "unauthorized" {
		t.Fatalf("wrong token: got %v, want transient unauthorized", err)
	}

	for name, bad := range map[string]jobsink.Completion{
		"no job ID":    {Version: 1, State: "Succeeded"},
		"no state":     {JobID: "job-1", Version: 1},
		"bad quantity": {JobID: "job-1", Version: 1, State: "Succeeded", Usage: &billing.Usage{Meter: "m", Quantity: "1e3"}},
	} {
		_, err := jobsink.New(sink.URL(), token, time.Second, nil).Apply(ctx, "k", bad)
		if e, ok := billing.AsError(err); !ok || e.Class != billing.Terminal || e.Code != "invalid_request" {
			t.Errorf("%s: got %v, want terminal invalid_request", name, err)
		}
	}
	if n := sink.Requests(); n != 2 {
		t.Errorf("sink saw %d requests, want 2 (invalid input is never sent)", n)
	}
}

func TestApplySendsTheContract(t *testing.T) {
	tests := []struct {
		name     string
		comp     jobsink.Completion
		wantPath string
		wantBody string
	}{
		{
			name:     "all fields",
			comp:     completion("job/1", 2, "Succeeded"),
			wantPath: "/jobs/job%2F1/completion",
			wantBody: `{"completion_version":2,"state":"Succeeded","completed_at":"2026-03-01T12:02:00Z","usage":{"meter":"gpu-seconds","quantity":200,"unit":"s"}}`,
		},
		{
			name:     "unknown time and usage are null",
			comp:     jobsink.Completion{JobID: "j", Version: 1, State: "Failed"},
			wantPath: "/jobs/j/completion",
			wantBody: `{"completion_version":1,"state":"Failed","completed_at":null,"usage":null}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var gotPath, gotBody string
			var gotHeader http.Header
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gotPath, gotHeader = r.URL.EscapedPath(), r.Header.Clone()
				b, _ := io.ReadAll(r.Body)
				gotBody = string(b)
				w.WriteHeader(http.StatusOK) // no body: the status alone means applied
			}))
			defer srv.Close()
			res, err := jobsink.New(srv.URL, token, 0, nil).Apply(context.Background(), "jc_key", tt.comp)
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != jobsink.Applied || res.CurrentVersion != tt.comp.Version {
				t.Errorf("got %s v%d, want Applied v%d", res.Outcome, res.CurrentVersion, tt.comp.Version)
			}
			if gotPath != tt.wantPath {
				t.Errorf("path %q, want %q", gotPath, tt.wantPath)
			}
			if gotBody != tt.wantBody {
				t.Errorf("body\n got %s\nwant %s", gotBody, tt.wantBody)
			}
			if gotHeader.Get("Idempotency-Key") != "jc_key" || gotHeader.Get("Authorization") != "Bearer "+token ||
				gotHeader.Get("Content-Type") != "application/json" {
				t.Errorf("headers %v", gotHeader)
			}
		})
	}
}

func TestClientHidesToken(t *testing.T) {
	c := jobsink.New("http://127.0.0.1:1", token, 0, nil)
	for _, s := range []string{fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c)} {
		if strings.Contains(s, token) {
			t.Errorf("formatted client contains the token: %s", s)
		}
	}
	_, err := c.Apply(context.Background(), "k", completion("j", 1, "Succeeded"))
	if e, ok := billing.AsError(err); !ok || e.Class != billing.Transient || e.Code != "connection_refused" {
		t.Errorf("got %v, want transient connection_refused", err)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[jobsink.Outcome]string{
		jobsink.Applied: "Applied", jobsink.Superseded: "Superseded", jobsink.Deferred: "Deferred", 0: "Outcome(0)",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", int(o), got, want)
		}
	}
}
