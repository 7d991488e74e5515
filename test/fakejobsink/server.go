// Package fakejobsink is a job service that speaks the generic job-sink contract
// (docs/design.md §6.2) over a real socket and remembers what it applied.
//
// Tests assert on its books — which version a job holds and how many times a new
// version was applied — rather than on the calls the operator made, so "a redelivered
// completion is not applied twice" and "v1 after v2 never moves the job back" are
// checked where they matter.
package fakejobsink

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// maxBody bounds request bodies; §6.2 bodies are a few hundred bytes.
const maxBody = 1 << 20

// KnownJobs says which jobs the sink accepts completions for.
type KnownJobs int

const (
	// AllJobs accepts a completion for any job ID.
	AllJobs KnownJobs = iota
	// OnlyRegistered answers 404 for a job until Register is called, to exercise the
	// operator's deferral (a completion that arrives before the job exists).
	OnlyRegistered
)

// Options configures a fake job sink.
type Options struct {
	// Token is the required bearer token on /jobs; "" disables authentication.
	Token string
	// Addr is the listen address; default 127.0.0.1:0 (a free loopback port).
	Addr string
	// KnownJobs selects AllJobs (default) or OnlyRegistered.
	KnownJobs KnownJobs
}

// job is the sink's record of one job.
type job struct {
	registered   bool
	applied      bool
	version      int64
	state        string
	completedAt  *time.Time
	usage        *Usage
	applications int
	keys         map[string]int64 // idempotency key -> version it was first used for
}

// Usage is a completion's usage as the sink stores it; quantity is the JSON number
// literal that was sent.
type Usage struct {
	Meter    string      `json:"meter"`
	Quantity json.Number `json:"quantity"`
	Unit     string      `json:"unit"`
}

// Server is a running fake job sink. All methods are safe for concurrent use.
type Server struct {
	opts Options
	srv  *http.Server
	addr string
	wg   sync.WaitGroup

	mu       sync.Mutex
	jobs     map[string]*job
	failNext []int // statuses to answer the next POSTs with, without applying
	requests int
}

// Start listens on opts.Addr and serves the §6.2 API and the /_admin/ API.
func Start(opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("fake job sink: listen on %s: %w", opts.Addr, err)
	}
	s := &Server{opts: opts, addr: ln.Addr().String(), jobs: map[string]*job{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /jobs/{jobID}/completion", s.handleCompletion)
	mux.HandleFunc("GET /_admin/jobs", s.handleAdminJobs)
	mux.HandleFunc("POST /_admin/register", s.handleAdminRegister)
	mux.HandleFunc("POST /_admin/faults", s.handleAdminFaults)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(ln) // returns http.ErrServerClosed on Close
	}()
	return s, nil
}

// URL is the sink's base URL, to use as a JobSink url.
func (s *Server) URL() string { return "http://" + s.addr }

// Close stops serving and waits for the server goroutine.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.wg.Wait()
	if err != nil {
		return fmt.Errorf("fake job sink: close: %w", err)
	}
	return nil
}

// Register makes jobID known, so that (with OnlyRegistered) its completions stop
// answering 404 — the job was created after its completion event arrived.
func (s *Server) Register(jobID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jobLocked(jobID).registered = true
}

func (s *Server) jobLocked(id string) *job {
	j, ok := s.jobs[id]
	if !ok {
		j = &job{keys: map[string]int64{}}
		s.jobs[id] = j
	}
	return j
}

// Applied reports the version and state the sink holds for jobID and how many times
// a new version was applied (a repeat of an applied version does not count). A job
// never applied yields 0, "", 0.
func (s *Server) Applied(jobID string) (version int64, state string, applications int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[jobID]
	if !ok || !j.applied {
		return 0, "", 0
	}
	return j.version, j.state, j.applications
}

// Keys lists, sorted, the idempotency keys the sink accepted for jobID: a test can
// check that two tenants (or two versions) never present the same key.
func (s *Server) Keys(jobID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[jobID]
	if !ok {
		return nil
	}
	keys := make([]string, 0, len(j.keys))
	for k := range j.keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Requests is the number of completion POSTs received, including refused ones.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// FailNext makes the next n completion POSTs answer status (0 means 503) without
// applying anything.
func (s *Server) FailNext(n int, status int) {
	if status == 0 {
		status = http.StatusServiceUnavailable
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.failNext = append(s.failNext, status)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"internal_error"}`)
	}
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

type reply struct {
	Status         string `json:"status,omitempty"`
	Error          string `json:"error,omitempty"`
	Message        string `json:"message,omitempty"`
	CurrentVersion *int64 `json:"current_version,omitempty"`
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, reply{Error: code, Message: message})
}

// completion is a decoded §6.2 body.
type completion struct {
	version     int64
	state       string
	completedAt *time.Time
	usage       *Usage
}

func (c completion) sameContent(j *job) bool {
	if c.state != j.state || (c.completedAt == nil) != (j.completedAt == nil) ||
		(c.completedAt != nil && !c.completedAt.Equal(*j.completedAt)) {
		return false
	}
	if (c.usage == nil) != (j.usage == nil) {
		return false
	}
	return c.usage == nil || *c.usage == *j.usage
}

// decodeCompletion parses a §6.2 body strictly: all four fields present, nothing else.
func decodeCompletion(r io.Reader) (completion, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(r)
	if err := dec.Decode(&raw); err != nil || raw == nil {
		return completion{}, errors.New("body is not a JSON object")
	}
	for _, k := range []string{"completion_version", "state", "completed_at", "usage"} {
		if _, ok := raw[k]; !ok {
			return completion{}, fmt.Errorf("field %q is missing", k)
		}
	}
	if len(raw) != 4 {
		return completion{}, errors.New("unknown fields in the body")
	}
	var c completion
	if err := json.Unmarshal(raw["completion_version"], &c.version); err != nil || isNull(raw["completion_version"]) || c.version < 0 {
		return completion{}, errors.New(`"completion_version" must be a non-negative integer`)
	}
	if err := json.Unmarshal(raw["state"], &c.state); err != nil || c.state == "" {
		return completion{}, errors.New(`"state" must be a non-empty string`)
	}
	if !isNull(raw["completed_at"]) {
		var s string
		if err := json.Unmarshal(raw["completed_at"], &s); err != nil {
			return completion{}, errors.New(`"completed_at" must be null or an RFC 3339 string`)
		}
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return completion{}, errors.New(`"completed_at" must be null or an RFC 3339 string`)
		}
		c.completedAt = &t
	}
	if !isNull(raw["usage"]) {
		var u struct {
			Meter    string          `json:"meter"`
			Quantity json.RawMessage `json:"quantity"`
			Unit     string          `json:"unit"`
		}
		d := json.NewDecoder(bytes.NewReader(raw["usage"]))
		d.DisallowUnknownFields()
		lit := ""
		if err := d.Decode(&u); err == nil {
			lit = string(bytes.TrimSpace(u.Quantity))
		}
		// A quoted or malformed quantity is a client bug: the contract sends a number.
		if q, err := billing.QuantityNumber(lit); err != nil || q.String() != lit || u.Meter == "" {
			return completion{}, errors.New(`"usage" must be null or {"meter","quantity": non-negative number,"unit"}`)
		}
		c.usage = &Usage{Meter: u.Meter, Quantity: json.Number(lit), Unit: u.Unit}
	}
	return c, nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func (s *Server) authorized(r *http.Request) bool {
	if s.opts.Token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.opts.Token)) == 1
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()
	if !s.authorized(r) {
		writeError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		writeError(w, http.StatusBadRequest, "missing_idempotency_key", "the Idempotency-Key header is required")
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "send application/json")
		return
	}
	c, err := decodeCompletion(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	jobID := r.PathValue("jobID")

	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failNext) > 0 {
		status := s.failNext[0]
		s.failNext = s.failNext[1:]
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, http.StatusText(status)+"\n")
		return
	}
	j, ok := s.jobs[jobID]
	if s.opts.KnownJobs == OnlyRegistered && (!ok || !j.registered) {
		writeError(w, http.StatusNotFound, "job_not_found", "no such job")
		return
	}
	j = s.jobLocked(jobID)
	if v, used := j.keys[key]; used && v != c.version {
		writeError(w, http.StatusUnprocessableEntity, "idempotency_key_reused",
			"this idempotency key was used for another completion version")
		return
	}
	switch {
	case !j.applied || c.version > j.version:
		j.applied, j.version, j.state, j.completedAt, j.usage = true, c.version, c.state, c.completedAt, c.usage
		j.applications++
		j.keys[key] = c.version
		v := j.version
		writeJSON(w, http.StatusOK, reply{Status: "applied", CurrentVersion: &v})
	case c.version == j.version && c.sameContent(j):
		j.keys[key] = c.version
		v := j.version
		writeJSON(w, http.StatusOK, reply{Status: "already_applied", CurrentVersion: &v})
	case c.version == j.version:
		v := j.version
		writeJSON(w, http.StatusConflict, reply{Error: "version_conflict", CurrentVersion: &v,
			Message: "this version was applied with different content"})
	default:
		v := j.version
		writeJSON(w, http.StatusConflict, reply{Error: "stale_version", CurrentVersion: &v})
	}
}

// JobView is one job in the GET /_admin/jobs reply.
type JobView struct {
	// Registered says Register was called (relevant with OnlyRegistered).
	Registered bool `json:"registered"`
	// Applied says some version was applied; Version, State, CompletedAt and Usage
	// are that version's.
	Applied     bool       `json:"applied"`
	Version     int64      `json:"version"`
	State       string     `json:"state,omitempty"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	Usage       *Usage     `json:"usage,omitempty"`
	// Applications counts how many times a new version was applied.
	Applications int `json:"applications"`
}

// Jobs is the GET /_admin/jobs reply.
type Jobs struct {
	// Jobs maps job ID to what the sink holds for it.
	Jobs map[string]JobView `json:"jobs"`
	// JobIDs lists the job IDs sorted, for stable output in scripts.
	JobIDs []string `json:"job_ids"`
	// Requests counts completion POSTs received, including refused ones.
	Requests int `json:"requests"`
}

func (s *Server) handleAdminJobs(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	out := Jobs{Jobs: map[string]JobView{}, JobIDs: []string{}, Requests: s.requests}
	for id, j := range s.jobs {
		out.Jobs[id] = JobView{Registered: j.registered, Applied: j.applied, Version: j.version, State: j.state,
			CompletedAt: j.completedAt, Usage: j.usage, Applications: j.applications}
		out.JobIDs = append(out.JobIDs, id)
	}
	s.mu.Unlock()
	sort.Strings(out.JobIDs)
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleAdminRegister(w http.ResponseWriter, r *http.Request) {
	var body struct {
		JobID string `json:"job_id"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.JobID == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", `want {"job_id": "..."}`)
		return
	}
	s.Register(body.JobID)
	writeJSON(w, http.StatusOK, reply{Status: "registered"})
}

func (s *Server) handleAdminFaults(w http.ResponseWriter, r *http.Request) {
	var body struct {
		FailNext int `json:"fail_next"`
		Status   int `json:"status"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.FailNext < 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", `want {"fail_next": n, "status": 503}`)
		return
	}
	s.FailNext(body.FailNext, body.Status)
	writeJSON(w, http.StatusOK, reply{Status: "queued"})
}
