package fakejobsink

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

const token = "sink_token"

func start(t *testing.T, opts Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func call(t *testing.T, method, url string, header map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func headers(key string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + token, "Idempotency-Key": key, "Content-Type": "application/json"}
}

func TestCompletionContract(t *testing.T) {
	s := start(t, Options{Token: token})
	const v1 = `{"completion_version":1,"state":"Succeeded","completed_at":"2026-03-01T12:00:00Z","usage":{"meter":"gpu","quantity":12.5,"unit":"s"}}`
	tests := []struct {
		name        string
		key         string
		body        string
		header      map[string]string
		wantStatus  int
		wantInReply string
	}{
		{name: "apply v1", key: "k1", body: v1, wantStatus: 200, wantInReply: `"status":"applied","current_version":1`},
		{name: "repeat v1", key: "k1", body: v1, wantStatus: 200, wantInReply: `"status":"already_applied"`},
		{name: "v0 is stale", key: "k0", body: strings.Replace(v1, `"completion_version":1`, `"completion_version":0`, 1), wantStatus: 409, wantInReply: `"error":"stale_version","current_version":1`},
		{name: "quantity as a string", key: "k2", body: strings.Replace(v1, `12.5`, `"12.5"`, 1), wantStatus: 400},
		{name: "missing usage field", key: "k2", body: `{"completion_version":2,"state":"Succeeded","completed_at":null}`, wantStatus: 400},
		{name: "extra field", key: "k2", body: `{"completion_version":2,"state":"Succeeded","completed_at":null,"usage":null,"x":1}`, wantStatus: 400},
		{name: "bad time", key: "k2", body: `{"completion_version":2,"state":"Succeeded","completed_at":"yesterday","usage":null}`, wantStatus: 400},
		{name: "no token", key: "k2", body: v1, header: map[string]string{"Idempotency-Key": "k2", "Content-Type": "application/json"}, wantStatus: 401},
		{name: "no key", body: v1, header: map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"}, wantStatus: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.header
			if h == nil {
				h = headers(tt.key)
			}
			status, body := call(t, http.MethodPost, s.URL()+"/jobs/job-1/completion", h, tt.body)
			if status != tt.wantStatus || !strings.Contains(body, tt.wantInReply) {
				t.Fatalf("got %d %s, want %d containing %s", status, body, tt.wantStatus, tt.wantInReply)
			}
		})
	}
	if v, state, n := s.Applied("job-1"); v != 1 || state != "Succeeded" || n != 1 {
		t.Errorf("Applied = v%d %q %d, want v1 Succeeded 1", v, state, n)
	}
	if n := s.Requests(); n != len(tests) {
		t.Errorf("Requests = %d, want %d", n, len(tests))
	}
}

func TestAdminAPI(t *testing.T) {
	s := start(t, Options{Token: token, KnownJobs: OnlyRegistered})
	body := `{"completion_version":3,"state":"Failed","completed_at":null,"usage":null}`
	if status, _ := call(t, http.MethodPost, s.URL()+"/jobs/job-9/completion", headers("k"), body); status != 404 {
		t.Fatalf("unregistered job: %d, want 404", status)
	}
	if status, b := call(t, http.MethodPost, s.URL()+"/_admin/register", nil, `{"job_id":"job-9"}`); status != 200 {
		t.Fatalf("register: %d %s", status, b)
	}
	if status, b := call(t, http.MethodPost, s.URL()+"/_admin/faults", nil, `{"fail_next":1,"status":502}`); status != 200 {
		t.Fatalf("faults: %d %s", status, b)
	}
	for i, want := range []int{502, 200} {
		if status, b := call(t, http.MethodPost, s.URL()+"/jobs/job-9/completion", headers("k"), body); status != want {
			t.Fatalf("POST %d: %d %s, want %d", i+1, status, b, want)
		}
	}
	status, b := call(t, http.MethodGet, s.URL()+"/_admin/jobs", nil, "")
	if status != 200 {
		t.Fatalf("jobs: %d %s", status, b)
	}
	var jobs Jobs
	if err := json.Unmarshal([]byte(b), &jobs); err != nil {
		t.Fatal(err)
	}
	got := jobs.Jobs["job-9"]
	if !got.Registered || !got.Applied || got.Version != 3 || got.State != "Failed" || got.Applications != 1 || jobs.Requests != 3 {
		t.Errorf("jobs %+v, want job-9 registered, v3 Failed applied once, 3 requests", jobs)
	}
}
