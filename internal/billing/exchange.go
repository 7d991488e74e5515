package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// MaxResponseBytes bounds how much of a provider reply is read, so a misbehaving
// endpoint cannot make the manager buffer an unbounded body. Legitimate replies are a
// few hundred bytes; a List page of 100 records is well under it.
const MaxResponseBytes = 1 << 20

// Response is a provider reply read in full (up to MaxResponseBytes), so the connection
// is released before the caller starts interpreting it.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Header is the reply's header, e.g. for Retry-After.
	Header http.Header
	// Body is the reply body, at most MaxResponseBytes long.
	Body []byte
	// Truncated says the body was longer than MaxResponseBytes; a truncated success
	// reply cannot be trusted and must be treated as unreadable.
	Truncated bool
}

// Do sends req with hc and reads the reply. It is exported so that every adapter that
// performs a foreign call (the billing provider, the job sink) classifies network
// failures by the same rule:
//
//   - the connection was never established (refused, DNS failure, dial timeout, the
//     deadline passed while waiting for a connection): the provider provably did not
//     receive the request -> Transient;
//   - a connection existed and the exchange failed (timeout, reset, EOF): the request
//     may have been processed -> Ambiguous when mutating, else Transient (a read has
//     nothing to be ambiguous about).
//
// The returned error is always an *Error. Non-2xx replies are not errors here: callers
// handle the statuses their contract defines and pass the rest to StatusError.
func Do(hc *http.Client, req *http.Request, mutating bool) (Response, error) {
	resp, err := send(req, mutating, hc.Do)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()

	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		// The reply started (status line received) and was then lost: whatever it said,
		// the provider had the full request.
		return Response{}, transportError(err, false, mutating)
	}
	out := Response{Status: resp.StatusCode, Header: resp.Header, Body: body}
	if len(body) > MaxResponseBytes {
		out.Body, out.Truncated = body[:MaxResponseBytes], true
	}
	return out, nil
}

// send makes one exchange and classifies its failure as Do describes.
func send(req *http.Request, mutating bool, do func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	// The proof that a request was not received is that no attempt finished writing it:
	// WroteRequest fires once per attempt, with an error when the write failed, and a
	// server cannot act on a request it did not read whole. One exchange may be several
	// attempts: net/http sends a request that carries an Idempotency-Key again by
	// itself, on a new connection, when a reused one closes without a reply — so a
	// refused dial at the end proves nothing about the first attempt, which the
	// provider may have read and committed (the envtest of a provider re-pointed while
	// money may be at the first found exactly that). GetConn fires only for transports
	// that support httptrace (net/http's); for others we fall back to recognising dial
	// errors. An attempt counts as unwritten only once its write has failed: HTTP/2
	// writes on a goroutine of its own and reports the write after flushing it, so a
	// request can be on the wire, and RoundTrip return on a deadline, before the report
	// (a helper review reproduced it); each connection obtained (GotConn, on the
	// caller's goroutine before any byte) must be matched by a failed write.
	var askedConn, wrote atomic.Bool
	var conns, failed atomic.Int32
	trace := &httptrace.ClientTrace{
		GetConn: func(string) { askedConn.Store(true) },
		GotConn: func(httptrace.GotConnInfo) { conns.Add(1) },
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				wrote.Store(true)
			} else {
				failed.Add(1)
			}
		},
	}
	if err := req.Context().Err(); err != nil {
		// Already cancelled or past its deadline: nothing will be sent.
		return nil, transportError(err, true, mutating)
	}
	resp, err := do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if err != nil {
		notSent := askedConn.Load() && !wrote.Load() && conns.Load() <= failed.Load() || !askedConn.Load() && isDialError(err)
		return nil, transportError(err, notSent, mutating)
	}
	return resp, nil
}

// ClassifyingTransport is an http.RoundTripper that classifies a failed exchange by
// Do's rule and returns the *Error, for adapters whose client library makes the call
// (stripe-go): any method but GET counts as mutating.
type ClassifyingTransport struct {
	// Base makes the exchange (http.DefaultTransport when nil).
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *ClassifyingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return send(req, req.Method != http.MethodGet, base.RoundTrip)
}

// transportError classifies a failure where no complete reply arrived; notSent is the
// proof that the request never reached the provider.
func transportError(err error, notSent, mutating bool) *Error {
	var ue *url.Error
	if errors.As(err, &ue) {
		// url.Error repeats the method and URL; our callers add their own context.
		err = ue.Err
	}
	e := &Error{Code: networkCode(err), Err: err}
	switch {
	case notSent:
		e.Class = Transient
		e.Message = "the request never reached the provider"
	case mutating:
		e.Class = Ambiguous
		e.Message = "no reply after the request was sent; the provider may have committed it"
	default:
		e.Class = Transient
		e.Message = "no reply from the provider"
	}
	return e
}

// isDialError recognises failures to establish a connection, which prove the request
// was never sent.
func isDialError(err error) bool {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return true
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// networkCode names a network failure for Error.Code.
func networkCode(err error) string {
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.As(err, &dnsErr):
		return "dns_failure"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection_reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection_closed"
	default:
		return "network_error"
	}
}

// StatusError classifies a reply whose status the caller's contract does not handle
// itself (docs/design.md §5, §6.1):
//
//   - 409 idempotency_key_in_use: a request with the same key is still being processed
//     -> Transient;
//   - 422 idempotency_key_reused: the key is bound to other parameters -> Terminal with
//     KeyReused;
//   - 408 and 429 -> Transient (refused before processing), honouring Retry-After;
//   - other 4xx -> Terminal;
//   - 5xx -> Ambiguous when mutating (the provider may have committed before failing),
//     Transient for reads, honouring Retry-After;
//   - anything else (1xx, 3xx: we never follow redirects with a credential attached)
//     -> Terminal, because it is a configuration problem a retry will not fix.
//
// redact is removed from any provider-supplied text, so a provider echoing our
// credential back cannot leak it into status or logs.
func StatusError(resp Response, mutating bool, redact string) *Error {
	code, msg := providerError(resp.Body)
	status := resp.Status
	e := &Error{Status: status, Code: code}
	if e.Code == "" {
		e.Code = strconv.Itoa(status)
	}
	switch {
	case status == http.StatusConflict && code == "idempotency_key_in_use":
		e.Class, e.InFlight = Transient, true
		e.Message = "a request with the same idempotency key is still in progress"
	case status == http.StatusUnprocessableEntity && code == "idempotency_key_reused":
		e.Class, e.KeyReused = Terminal, true
		e.Message = "the idempotency key was already used with different parameters"
	case status == http.StatusTooManyRequests:
		e.Class = Transient
		e.RetryAfter = RetryAfter(resp.Header, time.Now())
		e.Message = "rate limited by the provider"
	case status == http.StatusRequestTimeout:
		e.Class = Transient
		e.Message = "the provider timed out reading the request and did not process it"
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		// Our credentials are wrong or were rotated: our configuration problem, not
		// the settlement's. Retried (and dead-lettered only when the budget runs out),
		// so fixing the token resumes everything without a mass replay.
		e.Class = Transient
		e.Message = "the peer refused our credentials (check the token Secret it is configured with)"
	case status >= 400 && status < 500:
		e.Class = Terminal
		e.Message = "the provider rejected the request"
		if msg != "" {
			e.Message += ": " + Sanitize(msg, redact)
		}
	case status >= 500 && status < 600:
		e.RetryAfter = RetryAfter(resp.Header, time.Now())
		if mutating {
			e.Class = Ambiguous
			e.Message = "the provider failed; it may have committed the request"
		} else {
			e.Class = Transient
			e.Message = "the provider failed"
		}
	default:
		e.Class = Terminal
		e.Message = fmt.Sprintf("unexpected HTTP status %d (check the endpoint)", status)
	}
	return e
}

// providerCodeRE bounds what is accepted as a machine-readable error code, so that a
// provider's free text never lands in Code.
var providerCodeRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// providerError extracts the error code and message from a JSON error body, in the
// §6.1 form {"error":"code","message":"..."} or the nested {"error":{"code","message"}}
// form many providers use. Anything else yields empty strings.
func providerError(body []byte) (code, message string) {
	var flat struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &flat) != nil || len(flat.Error) == 0 {
		return "", ""
	}
	message = flat.Message
	var s string
	if json.Unmarshal(flat.Error, &s) == nil {
		code = s
	} else {
		var nested struct {
			Code    string `json:"code"`
			Type    string `json:"type"`
			Message string `json:"message"`
		}
		if json.Unmarshal(flat.Error, &nested) == nil {
			code = nested.Code
			if code == "" {
				code = nested.Type
			}
			if message == "" {
				message = nested.Message
			}
		}
	}
	if !providerCodeRE.MatchString(code) {
		code = ""
	}
	return code, message
}

// maxMessage bounds provider text copied into an Error: enough for "currency XYZ is
// not supported", too little for a body dump.
const maxMessage = 120

// Sanitize makes provider text safe for status and logs: printable ASCII only, bounded,
// and with the credential (redact) removed. Every adapter copies provider text through it.
func Sanitize(s, redact string) string {
	if redact != "" {
		s = strings.ReplaceAll(s, redact, "[redacted]")
	}
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return ' '
		}
		return r
	}, s)
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxMessage {
		s = s[:maxMessage] + "..."
	}
	return s
}

// RetryAfter parses a Retry-After header (delay-seconds or HTTP-date) relative to now.
// It returns 0 when the header is absent, malformed or in the past, so callers can use
// max(backoff, RetryAfter) without special cases.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		// Cap before multiplying so an absurd value cannot overflow into a negative wait.
		const maxSecs = int64(365 * 24 * time.Hour / time.Second)
		return time.Duration(min(secs, maxSecs)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// decimalRE is the shape the API allows for a quantity (non-negative decimal); leading
// zeros are allowed there but not in JSON, so QuantityNumber strips them.
var decimalRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// QuantityNumber turns a decimal string into the JSON number sent on the wire, without
// ever passing through float64: "12.5" stays 12.5, "1523" stays 1523. Leading zeros
// ("007") are dropped because JSON forbids them; the result is the same for the same
// input, so every attempt sends identical parameters.
func QuantityNumber(q string) (json.Number, error) {
	if !decimalRE.MatchString(q) {
		return "", fmt.Errorf("quantity %q is not a non-negative decimal", q)
	}
	intPart, frac, hasFrac := strings.Cut(q, ".")
	intPart = strings.TrimLeft(intPart, "0")
	if intPart == "" {
		intPart = "0"
	}
	if hasFrac {
		return json.Number(intPart + "." + frac), nil
	}
	return json.Number(intPart), nil
}
