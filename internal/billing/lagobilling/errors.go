package lagobilling

import (
	"encoding/json"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// wireError is Lago's error body: {"status":422,"error":"Unprocessable Entity",
// "code":"validation_errors","error_details":{"transaction_id":["value_already_exist"]}}.
type wireError struct {
	Status       int                        `json:"status"`
	Error        string                     `json:"error"`
	Code         string                     `json:"code"`
	ErrorDetails map[string]json.RawMessage `json:"error_details"`
}

func lagoError(body []byte) wireError {
	var e wireError
	_ = json.Unmarshal(body, &e) // anything else reads as an empty error
	return e
}

// details lists a validation error's fields and codes, e.g. ["code: value_is_mandatory"];
// only what reads as a field and a code is kept, never free text.
func (e wireError) details() []string {
	var out []string
	for field, raw := range e.ErrorDetails {
		if !codeRE.MatchString(field) {
			continue
		}
		var codes []string
		if json.Unmarshal(raw, &codes) != nil {
			continue
		}
		for _, c := range codes {
			if codeRE.MatchString(c) {
				out = append(out, field+": "+c)
			}
		}
	}
	sort.Strings(out)
	if len(out) > 5 {
		out = append(out[:5], "...")
	}
	return out
}

// has reports whether the error lists code for field.
func (e wireError) has(field, code string) bool {
	var codes []string
	if json.Unmarshal(e.ErrorDetails[field], &codes) != nil {
		return false
	}
	for _, c := range codes {
		if c == code {
			return true
		}
	}
	return false
}

var codeRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// alreadyExists is Lago's answer to a reused transaction_id in its default pipeline:
// 422 validation_errors with transaction_id value_already_exist. The event was ignored.
func alreadyExists(resp billing.Response) bool {
	if resp.Status != http.StatusUnprocessableEntity {
		return false
	}
	return lagoError(resp.Body).has("transaction_id", "value_already_exist")
}

// classify turns a Lago reply the caller does not handle itself into the operator's
// three classes, once (docs/design.md §13):
//
//   - 401 (the API key is wrong or revoked) and 403 (the organization may not use
//     this, e.g. a premium feature) → Transient: our configuration, not the
//     settlement's; fixing it resumes every settlement;
//   - 429 → Transient, waiting for X-RateLimit-Reset (seconds) or Retry-After;
//   - 400, 404 and 422 (other than a reused transaction_id) → Terminal: Lago refuses
//     the event as sent and will again;
//   - 5xx → Ambiguous for the POST (Lago may have stored the event before failing),
//     Transient for a read;
//   - another 2xx to the POST (202, a proxy's 204) → Ambiguous: Lago, or something
//     before it, took the event and answered without a readable record, so it may be
//     stored; it is asked about by key;
//   - anything else (a redirect: never followed with the key) → Terminal.
func (c *Client) classify(resp billing.Response, mutating bool) *billing.Error {
	le := lagoError(resp.Body)
	e := &billing.Error{Status: resp.Status, Code: le.Code}
	if !codeRE.MatchString(e.Code) {
		e.Code = strconv.Itoa(resp.Status)
	}
	switch s := resp.Status; {
	case s == http.StatusUnauthorized:
		e.Class = billing.Transient
		e.Message = "Lago refused the API key (check the Secret holds the organization's current API key)"
	case s == http.StatusForbidden:
		e.Class = billing.Transient
		e.Message = "Lago forbids this to the organization or key (" + e.Code + "): check the organization's plan and the key's permissions"
	case s == http.StatusTooManyRequests:
		e.Class = billing.Transient
		e.RetryAfter = rateLimitReset(resp.Header, time.Now())
		e.Message = "rate limited by Lago"
	case s == http.StatusNotFound:
		e.Class = billing.Terminal
		e.Message = "Lago has no such resource (" + e.Code + "): check the subscription's external_id and the billable metric exist"
	case s == http.StatusUnprocessableEntity || s == http.StatusBadRequest:
		e.Class = billing.Terminal
		e.Message = "Lago refused the event"
		if d := le.details(); len(d) > 0 {
			e.Message += " (" + strings.Join(d, ", ") + ")"
		}
	case s >= 500 && s < 600:
		e.RetryAfter = billing.RetryAfter(resp.Header, time.Now())
		if mutating {
			e.Class = billing.Ambiguous
			e.Message = "Lago failed; it may have stored the event"
		} else {
			e.Class = billing.Transient
			e.Message = "Lago failed"
		}
	case s >= 400 && s < 500:
		e.Class = billing.Terminal
		e.Message = "Lago rejected the request"
	case s >= 200 && s < 300 && mutating:
		e.Class = billing.Ambiguous
		e.Message = "Lago answered HTTP " + strconv.Itoa(s) + " without the event: it may have stored it (asking by key)"
	default:
		e.Class = billing.Terminal
		e.Message = "unexpected HTTP status " + strconv.Itoa(s) + " (check spec.endpoint is Lago's API host)"
	}
	return e
}

// rateLimitReset is how long Lago asks to wait: X-RateLimit-Reset (seconds until the
// window resets), else Retry-After.
func rateLimitReset(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("X-RateLimit-Reset")); v != "" {
		if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs > 0 {
			return time.Duration(min(secs, 3600)) * time.Second
		}
	}
	return billing.RetryAfter(h, now)
}
