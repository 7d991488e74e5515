package fakebilling

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"
)

// The /_admin/ API lets the demo and end-to-end tests drive a fake running as a
// separate process. It needs no token (it is a test fixture on a loopback address) and
// is never counted in Calls.

// Ledger is the GET /_admin/ledger reply.
type Ledger struct {
	// Records is the ledger in creation order, in the §6.1 record shape.
	Records []WireRecord `json:"records"`
	// Charges is the number of ledger entries per settlement key (0 or 1 when correct).
	Charges map[string]int `json:"charges"`
	// Calls counts the §6.1 calls served.
	Calls CallCounts `json:"calls"`
	// PendingFaults is how many queued faults no POST has consumed yet.
	PendingFaults int `json:"pending_faults"`
}

// Faults is the POST /_admin/faults body. Every non-zero *_next queues that many
// faults, in the order of the fields below; down_for_ms takes the provider off the
// network right after the reply is sent and brings it back on the same port.
type Faults struct {
	// FailNext queues that many plain-text failures with Status (see Server.FailNext).
	FailNext int `json:"fail_next,omitempty"`
	// Status is the FailNext status, default 503.
	Status int `json:"status,omitempty"`
	// RateLimitNext queues that many 429s with Retry-After: RetryAfterSeconds.
	RateLimitNext     int `json:"rate_limit_next,omitempty"`
	RetryAfterSeconds int `json:"retry_after_seconds,omitempty"`
	// CommitThenTimeoutNext queues that many commits whose reply never comes.
	CommitThenTimeoutNext int `json:"commit_then_timeout_next,omitempty"`
	// CommitThen500Next queues that many commits answered with 500.
	CommitThen500Next int `json:"commit_then_500_next,omitempty"`
	// SlowNext queues that many requests delayed by SlowMS before normal handling.
	SlowNext int `json:"slow_next,omitempty"`
	SlowMS   int `json:"slow_ms,omitempty"`
	// RejectNext queues that many RejectStatus (default 400) replies with
	// {"error": RejectCode} (default "rejected").
	RejectNext   int    `json:"reject_next,omitempty"`
	RejectStatus int    `json:"reject_status,omitempty"`
	RejectCode   string `json:"reject_code,omitempty"`
	// DownForMS refuses connections for that many milliseconds, starting right after
	// this call has been answered.
	DownForMS int `json:"down_for_ms,omitempty"`
}

// RecordFormat is the POST /_admin/record-format body (see Server.SetOmitNulls).
type RecordFormat struct {
	// OmitNulls leaves null fields out of every record answered from now on.
	OmitNulls bool `json:"omit_nulls"`
}

// StatusChange is the POST /_admin/status body (see SetStatus).
type StatusChange struct {
	// SettlementKey selects the records to change.
	SettlementKey string `json:"settlement_key"`
	// Status is "pending", "settled" or "failed".
	Status string `json:"status"`
	// FailureReason is reported with a failed status, e.g. "card_declined".
	FailureReason string `json:"failure_reason,omitempty"`
}

func (s *Server) handleAdminLedger(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	entries := s.sortedLocked()
	l := Ledger{Records: make([]WireRecord, len(entries)), Calls: s.calls, PendingFaults: len(s.faults)}
	for i, e := range entries {
		l.Records[i] = e.wire()
	}
	s.mu.Unlock()
	l.Charges = s.chargeCounts()
	writeJSON(w, http.StatusOK, l)
}

// decodeAdmin reads an admin body strictly (unknown fields are typos in a test script)
// and drains it, so closing the connection afterwards cannot reset it.
func decodeAdmin(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	_, _ = io.Copy(io.Discard, r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return false
	}
	return true
}

func (s *Server) handleAdminFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	if !decodeAdmin(w, r, &f) {
		return
	}
	if f.FailNext < 0 || f.RateLimitNext < 0 || f.CommitThenTimeoutNext < 0 || f.CommitThen500Next < 0 ||
		f.SlowNext < 0 || f.RejectNext < 0 || f.DownForMS < 0 || f.SlowMS < 0 || f.RetryAfterSeconds < 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", "counts and durations must not be negative")
		return
	}
	s.FailNext(f.FailNext, f.Status)
	s.RateLimitNext(f.RateLimitNext, time.Duration(f.RetryAfterSeconds)*time.Second)
	s.CommitThenTimeoutNext(f.CommitThenTimeoutNext)
	s.CommitThen500Next(f.CommitThen500Next)
	s.SlowNext(f.SlowNext, time.Duration(f.SlowMS)*time.Millisecond)
	s.RejectNext(f.RejectNext, f.RejectStatus, f.RejectCode)

	s.mu.Lock()
	pending := len(s.faults)
	s.mu.Unlock()
	if f.DownForMS == 0 {
		writeJSON(w, http.StatusOK, map[string]int{"pending_faults": pending})
		return
	}
	// Stop accepting, answer, then go down: a client that has the reply is refused at
	// once (closing the listener after the reply let a quick dial in, or reset it from
	// the backlog). The reply has a Content-Length and is flushed, and the client is
	// told not to reuse the connection that is about to be dropped.
	s.stopAccepting()
	w.Header().Set("Connection", "close")
	writeJSON(w, http.StatusOK, map[string]int{"pending_faults": pending, "down_for_ms": f.DownForMS})
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
	_ = s.downFor(time.Duration(f.DownForMS) * time.Millisecond) // the reply is already sent
}

func (s *Server) handleAdminStatus(w http.ResponseWriter, r *http.Request) {
	var c StatusChange
	if !decodeAdmin(w, r, &c) {
		return
	}
	if err := s.SetStatus(c.SettlementKey, c.Status, c.FailureReason); err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errNoRecord) {
			status = http.StatusNotFound
		}
		writeError(w, status, "invalid_request", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "updated"})
}

func (s *Server) handleAdminImport(w http.ResponseWriter, r *http.Request) {
	var rec WireRecord
	if !decodeAdmin(w, r, &rec) {
		return
	}
	if err := s.Import(rec.toRecord()); err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errDuplicate) {
			status = http.StatusConflict
		}
		writeError(w, status, "invalid_request", err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"status": "imported"})
}

func (s *Server) handleAdminRecordFormat(w http.ResponseWriter, r *http.Request) {
	var f RecordFormat
	if !decodeAdmin(w, r, &f) {
		return
	}
	s.SetOmitNulls(f.OmitNulls)
	writeJSON(w, http.StatusOK, f)
}
