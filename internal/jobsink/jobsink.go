// Package jobsink applies job completions to a job service over the generic HTTP
// contract (docs/design.md §6.2).
//
// The job service guards its own transition with the completion version, so a
// completion can be sent any number of times: a repeat is "already applied", an older
// version is refused as stale and a job it does not know yet is a wait, not a failure.
// This client turns those replies into three outcomes and classifies everything else
// with the billing adapter's error classes, so the JobCompletion controller retries,
// stops or waits by the same rules as the BillingSettlement controller.
package jobsink

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// Completion is one versioned completion of a job, as the JobCompletion records it.
type Completion struct {
	// JobID identifies the job at the sink; it is path-escaped in the URL.
	JobID string
	// Version orders completions of one job; the sink applies only increasing versions.
	Version int64
	// State is the job's result, e.g. "Succeeded".
	State string
	// CompletedAt is when the job finished, if the event said so.
	CompletedAt *time.Time
	// Usage is what the job consumed, if the event said so.
	Usage *billing.Usage
}

// Outcome is what the sink did with a completion that it answered.
type Outcome int

const (
	// Applied: the sink now holds this version (newly, or it already had it).
	Applied Outcome = iota + 1
	// Superseded: the sink holds a newer version; this one must never move the job back.
	Superseded
	// Deferred: the sink does not know the job yet (404); try again later, up to a deadline.
	Deferred
)

// String names the outcome for status and events.
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "Applied"
	case Superseded:
		return "Superseded"
	case Deferred:
		return "Deferred"
	default:
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
}

// Result is the sink's answer. CurrentVersion is the version the sink holds: the
// applied version for Applied, the newer one for Superseded, 0 for Deferred.
type Result struct {
	Outcome        Outcome
	CurrentVersion int64
}

// Client posts completions to one job sink. It is safe for concurrent use.
type Client struct {
	base    string
	token   string
	timeout time.Duration
	hc      *http.Client
}

// New returns a client for the sink at url (completions go to {url}/jobs/{id}/completion).
// token is the optional bearer credential; timeout bounds each call
// (billing.DefaultTimeout when 0); hc overrides the HTTP client (by default one that
// never follows redirects, so the token only goes to url). A malformed url surfaces as
// a Terminal error from Apply.
func New(url, token string, timeout time.Duration, hc *http.Client) *Client {
	if timeout <= 0 {
		timeout = billing.DefaultTimeout
	}
	if hc == nil {
		hc = billing.NoRedirectClient()
	}
	return &Client{base: strings.TrimRight(url, "/"), token: token, timeout: timeout, hc: hc}
}

// String describes the client without its token, for %v and %+v.
func (c *Client) String() string {
	tok := `""`
	if c.token != "" {
		tok = "[redacted]"
	}
	return fmt.Sprintf("jobsink.Client(%s, token: %s, timeout: %s)", c.base, tok, c.timeout)
}

// GoString keeps %#v from printing the token.
func (c *Client) GoString() string { return c.String() }

// wireCompletion is the §6.2 body. completed_at and usage are null when unknown, so
// the sink always sees every field of the contract.
type wireCompletion struct {
	CompletionVersion int64      `json:"completion_version"`
	State             string     `json:"state"`
	CompletedAt       *string    `json:"completed_at"`
	Usage             *wireUsage `json:"usage"`
}

type wireUsage struct {
	Meter    string      `json:"meter"`
	Quantity json.Number `json:"quantity"`
	Unit     string      `json:"unit"`
}

// wireReply is what the sink may say on 200 and 409.
type wireReply struct {
	Error          string `json:"error"`
	CurrentVersion *int64 `json:"current_version"`
}

func invalid(format string, args ...any) *billing.Error {
	return &billing.Error{Class: billing.Terminal, Code: "invalid_request", Message: fmt.Sprintf(format, args...)}
}

// Apply posts comp under idempotencyKey and reports the sink's outcome. Errors carry a
// *billing.Error: Transient (retry), Terminal (stop) or Ambiguous (the sink may have
// applied it; retrying with the same key is safe because the sink is version-guarded).
func (c *Client) Apply(ctx context.Context, idempotencyKey string, comp Completion) (Result, error) {
	res, err := c.apply(ctx, idempotencyKey, comp)
	if err != nil {
		return Result{}, fmt.Errorf("apply completion v%d of job %s: %w", comp.Version, comp.JobID, err)
	}
	return res, nil
}

func (c *Client) apply(ctx context.Context, key string, comp Completion) (Result, error) {
	switch {
	case comp.JobID == "":
		return Result{}, invalid("job ID is empty")
	case key == "" || strings.ContainsAny(key, "\r\n\x00"):
		return Result{}, invalid("idempotency key is empty or has control characters")
	case comp.State == "":
		return Result{}, invalid("state is empty")
	}
	w := wireCompletion{CompletionVersion: comp.Version, State: comp.State}
	if comp.CompletedAt != nil {
		s := comp.CompletedAt.UTC().Format(time.RFC3339Nano)
		w.CompletedAt = &s
	}
	if comp.Usage != nil {
		q, err := billing.QuantityNumber(comp.Usage.Quantity)
		if err != nil {
			return Result{}, invalid("usage: %v", err)
		}
		w.Usage = &wireUsage{Meter: comp.Usage.Meter, Quantity: q, Unit: comp.Usage.Unit}
	}
	body, err := json.Marshal(w)
	if err != nil {
		return Result{}, &billing.Error{Class: billing.Terminal, Code: "invalid_request", Message: "cannot encode the completion", Err: err}
	}

	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	target := c.base + "/jobs/" + url.PathEscape(comp.JobID) + "/completion"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return Result{}, &billing.Error{Class: billing.Terminal, Code: "invalid_config", Message: "cannot build the request (check the sink URL)", Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "settlement-operator")
	req.Header.Set("Idempotency-Key", key)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}

	resp, err := billing.Do(c.hc, req, true)
	if err != nil {
		return Result{}, err
	}
	var reply wireReply
	_ = json.Unmarshal(resp.Body, &reply) // the status decides; the body only adds the version
	switch {
	case resp.Status >= 200 && resp.Status <= 299:
		cur := comp.Version
		if reply.CurrentVersion != nil {
			cur = *reply.CurrentVersion
		}
		return Result{Outcome: Applied, CurrentVersion: cur}, nil
	case resp.Status == http.StatusConflict && reply.Error == "stale_version":
		res := Result{Outcome: Superseded}
		if reply.CurrentVersion != nil {
			res.CurrentVersion = *reply.CurrentVersion
		}
		return res, nil
	case resp.Status == http.StatusNotFound:
		return Result{Outcome: Deferred}, nil
	default:
		return Result{}, billing.StatusError(resp, true, c.token)
	}
}
