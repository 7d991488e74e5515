package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultTimeout bounds one provider call when HTTPConfig.Timeout is zero: long enough
// for a slow payment backend, short enough that a hung connection becomes an Ambiguous
// outcome (and a Lookup) instead of a stuck reconcile.
const DefaultTimeout = 10 * time.Second

// HTTPConfig configures the generic HTTP provider (BillingProvider.spec.type: HTTP).
// Its String method hides the token, so a config printed by mistake leaks nothing.
type HTTPConfig struct {
	// Endpoint is the provider's base URL, e.g. https://billing.example.com/v1; the
	// §6.1 paths are appended to it. It must not carry credentials (use Token).
	Endpoint string
	// Token is the bearer credential from the provider's Secret; "" sends none.
	Token string
	// Timeout bounds each request including reading the reply; DefaultTimeout when 0.
	Timeout time.Duration
	// HTTPClient overrides the HTTP client (TLS settings, proxies). When nil, a client
	// that never follows redirects is used, so the bearer token is only ever sent to
	// Endpoint.
	HTTPClient *http.Client
}

// String describes the config without the token.
func (c HTTPConfig) String() string {
	return fmt.Sprintf("billing.HTTPConfig{Endpoint: %q, Token: %s, Timeout: %s}", c.Endpoint, redacted(c.Token), c.Timeout)
}

// GoString keeps %#v from printing the token.
func (c HTTPConfig) GoString() string { return c.String() }

func redacted(token string) string {
	if token == "" {
		return `""`
	}
	return "[redacted]"
}

// NewHTTP returns the §6.1 adapter. It validates the configuration up front so a bad
// BillingProvider surfaces as a clear error when it is loaded, not as a failed charge.
func NewHTTP(cfg HTTPConfig) (Client, error) {
	endpoint, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("billing provider endpoint: %w", err)
	}
	if strings.ContainsAny(cfg.Token, "\r\n\x00") {
		// Never echo the token: say what is wrong with it, not what it is.
		return nil, errors.New("billing provider token contains a line break or NUL; check the Secret")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("billing provider timeout %s is negative", cfg.Timeout)
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = NoRedirectClient()
	}
	return &httpClient{endpoint: endpoint, token: cfg.Token, timeout: timeout, hc: hc}, nil
}

// NoRedirectClient is the default HTTP client of the provider adapters: a redirect
// from a payment API is a misconfiguration, and following it would resend the request
// (and its credential) somewhere we were not told to send it.
func NoRedirectClient() *http.Client {
	return &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// parseEndpoint checks an endpoint is an absolute http(s) URL without credentials,
// query or fragment, and returns it without a trailing slash.
func parseEndpoint(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("not a valid URL")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("scheme %q is not http or https", u.Scheme)
	case u.Host == "":
		return "", errors.New("no host")
	case u.User != nil:
		// Do not echo the URL: it holds the credentials.
		return "", errors.New("credentials in the URL are not allowed; put the token in the Secret")
	case u.RawQuery != "" || u.Fragment != "":
		return "", errors.New("query and fragment are not allowed")
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// httpClient implements Client for the generic HTTP provider (§6.1).
type httpClient struct {
	endpoint string
	token    string
	timeout  time.Duration
	hc       *http.Client
}

// String describes the client without its token, for %v and %+v.
func (c *httpClient) String() string {
	return fmt.Sprintf("billing.HTTP(%s, token: %s, timeout: %s)", c.endpoint, redacted(c.token), c.timeout)
}

// GoString keeps %#v from printing the token.
func (c *httpClient) GoString() string { return c.String() }

// wireUsage, wireAmount, wireRequest and wireRecord are the §6.1 JSON shapes. Field
// order in wireRequest follows the contract, which keeps request bodies readable in
// provider logs.
type wireUsage struct {
	Meter    string      `json:"meter"`
	Quantity json.Number `json:"quantity"`
	Unit     string      `json:"unit"`
}

// wireAmount's minor is ISO 4217 minor units, as billing.Amount's: this adapter sends
// and reads it unchanged (a backend counting in other units converts on its side).
type wireAmount struct {
	Minor    int64  `json:"minor"`
	Currency string `json:"currency"`
}

type wireRequest struct {
	SettlementKey string            `json:"settlement_key"`
	Type          string            `json:"type"`
	Reverses      *string           `json:"reverses"`
	Customer      string            `json:"customer"`
	Usage         *wireUsage        `json:"usage,omitempty"`
	Amount        *wireAmount       `json:"amount,omitempty"`
	Metadata      map[string]string `json:"metadata"`
}

// wireRecord reads a record the JSON way: a field the provider left out and a field
// it sent as null are both null, the zero value (nil, "").
type wireRecord struct {
	Reverses       *string           `json:"reverses"`
	ID             string            `json:"id"`
	Status         string            `json:"status"`
	FailureReason  string            `json:"failure_reason"`
	SettlementKey  string            `json:"settlement_key"`
	IdempotencyKey string            `json:"idempotency_key"`
	Customer       string            `json:"customer"`
	Type           string            `json:"type"`
	Usage          *wireUsage        `json:"usage"`
	Amount         *wireRecordAmount `json:"amount"`
	CreatedAt      string            `json:"created_at"`
}

// wireRecordAmount is a record's amount; minor is nil when null or left out.
type wireRecordAmount struct {
	Minor    *int64 `json:"minor"`
	Currency string `json:"currency"`
}

type wireList struct {
	Items      []json.RawMessage `json:"items"`
	NextCursor string            `json:"next_cursor"`
}

// invalidRequest reports input the provider would reject on every attempt; it is found
// before anything is sent, so the class is Terminal and the outcome certain.
func invalidRequest(format string, args ...any) *Error {
	return &Error{Class: Terminal, Code: "invalid_request", Local: true, Message: fmt.Sprintf(format, args...)}
}

// validKey reports whether a key can travel in a header and a URL path unchanged.
func validKey(k string) bool {
	if k == "" || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= 0x20 || c >= 0x7f {
			return false
		}
	}
	return true
}

// encodeRequest builds the §6.1 body, rejecting input that cannot be sent faithfully.
func encodeRequest(r Request) ([]byte, error) {
	switch {
	case r.SettlementKey == "":
		return nil, invalidRequest("settlement key is empty")
	case !validKey(r.IdempotencyKey):
		return nil, invalidRequest("idempotency key is empty, too long or has spaces or control characters")
	case r.Type != TypeCharge && r.Type != TypeRefund && r.Type != TypeVoid:
		return nil, invalidRequest("type %q is not charge, refund or void", r.Type)
	}
	w := wireRequest{
		SettlementKey: r.SettlementKey,
		Type:          r.Type,
		Customer:      r.Customer,
		Metadata:      r.Metadata,
	}
	if w.Metadata == nil {
		w.Metadata = map[string]string{}
	}
	if r.Reverses != "" {
		w.Reverses = &r.Reverses
	}
	if r.Usage != nil {
		q, err := QuantityNumber(r.Usage.Quantity)
		if err != nil {
			return nil, invalidRequest("usage: %v", err)
		}
		w.Usage = &wireUsage{Meter: r.Usage.Meter, Quantity: q, Unit: r.Usage.Unit}
	}
	if r.Amount != nil {
		if r.Amount.Currency == "" {
			return nil, invalidRequest("amount has no currency")
		}
		w.Amount = &wireAmount{Minor: r.Amount.Minor, Currency: r.Amount.Currency}
	}
	body, err := json.Marshal(w)
	if err != nil {
		return nil, &Error{Class: Terminal, Code: "invalid_request", Local: true, Message: "cannot encode the request", Err: err}
	}
	return body, nil
}

// decodeRecord parses one provider record. A record without an ID or with a status
// outside §6.1 is unusable: the caller could not act on it. Every other field may be
// null or left out, which mean the same; whether a null proves enough is Match's to
// say, from what we sent (docs/design.md §6.1).
func decodeRecord(raw []byte) (Record, error) {
	var w wireRecord
	if err := json.Unmarshal(raw, &w); err != nil {
		return Record{}, fmt.Errorf("decode record: %w", err)
	}
	if w.ID == "" {
		return Record{}, errors.New("record has no id")
	}
	switch w.Status {
	case StatusPending, StatusSettled, StatusFailed:
	default:
		return Record{}, errors.New("record has a status that is not pending, settled or failed")
	}
	rec := Record{
		ID:             w.ID,
		Status:         w.Status,
		FailureReason:  w.FailureReason,
		SettlementKey:  w.SettlementKey,
		IdempotencyKey: w.IdempotencyKey,
		Customer:       w.Customer,
		Type:           w.Type,
	}
	if w.Reverses != nil {
		rec.Reverses = *w.Reverses
	}
	// A usage object whose members are all null is null, as an omitted one is.
	if u := w.Usage; u != nil && (u.Meter != "" || u.Quantity.String() != "" || u.Unit != "") {
		rec.Usage = &Usage{Meter: u.Meter, Quantity: u.Quantity.String(), Unit: u.Unit}
	}
	// An amount without minor units says nothing about money: no amount — but one that
	// names anything else (a currency) is a provider's amount it did not state in full,
	// never ours to fill in from the request: it is missing.
	switch a := w.Amount; {
	case a != nil && a.Minor != nil:
		rec.Amount = &Amount{Minor: *a.Minor, Currency: a.Currency}
	case a != nil && a.Currency != "":
		rec.Omitted = append(rec.Omitted, "amount")
	}
	// created_at is informational; a provider's odd date format must not turn a valid
	// answer into an unreadable one.
	if t, err := time.Parse(time.RFC3339Nano, w.CreatedAt); err == nil {
		rec.CreatedAt = t
	}
	return rec, nil
}

// unreadable classifies a success reply we cannot use. For a POST the provider
// answered 2xx, so it probably committed, but we do not have the record: Ambiguous,
// resolved by Lookup. For a read nothing happened: Transient.
func unreadable(resp Response, mutating bool, err error) *Error {
	e := &Error{Class: Transient, Code: "unreadable_response", Status: resp.Status, Err: err,
		Message: "the provider's reply could not be read"}
	if resp.Truncated {
		e.Message = fmt.Sprintf("the provider's reply exceeded %d bytes", MaxResponseBytes)
	}
	if mutating {
		e.Class = Ambiguous
		e.Message += "; it may have committed the request"
	}
	return e
}

// newRequest builds a request with the headers every §6.1 call carries.
func (c *httpClient) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var rd io.Reader // a typed nil *bytes.Reader would count as a body
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.endpoint+path, rd)
	if err != nil {
		return nil, &Error{Class: Terminal, Code: "invalid_request", Local: true, Message: "cannot build the request", Err: err}
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "settlement-operator")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// Submit posts the settlement (§6.1 POST /settlements) and classifies the outcome.
func (c *httpClient) Submit(ctx context.Context, r Request) (Record, error) {
	rec, err := c.submit(ctx, r)
	if err != nil {
		return Record{}, fmt.Errorf("submit settlement %s: %w", r.SettlementKey, err)
	}
	return rec, nil
}

func (c *httpClient) submit(ctx context.Context, r Request) (Record, error) {
	body, err := encodeRequest(r)
	if err != nil {
		return Record{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := c.newRequest(ctx, http.MethodPost, "/settlements", body)
	if err != nil {
		return Record{}, err
	}
	req.Header.Set("Idempotency-Key", r.IdempotencyKey)

	resp, err := Do(c.hc, req, true)
	if err != nil {
		return Record{}, err
	}
	if resp.Status < 200 || resp.Status > 299 {
		return Record{}, StatusError(resp, true, c.token)
	}
	if resp.Truncated {
		return Record{}, unreadable(resp, true, nil)
	}
	rec, err := decodeRecord(resp.Body)
	if err != nil {
		return Record{}, unreadable(resp, true, err)
	}
	if (rec.IdempotencyKey != "" && rec.IdempotencyKey != r.IdempotencyKey) ||
		(rec.SettlementKey != "" && rec.SettlementKey != r.SettlementKey) {
		// Trusting a record for another operation could close the wrong settlement.
		return Record{}, &Error{Class: Ambiguous, Code: "mismatched_response", Status: resp.Status,
			Message: "the provider answered with a record for a different key"}
	}
	fillFromRequest(&rec, r)
	return rec, nil
}

// fillFromRequest completes a minimal §6.1 POST reply ({"id","status",
// "failure_reason"}) with what we sent. A 2xx to our POST is the provider's word that
// it compared our parameters with what it holds under the key (a different request
// is a 422), so the reply is proof; fields it did return are still compared by Match.
// A lookup's record is never filled: a GET compares nothing.
func fillFromRequest(rec *Record, r Request) {
	if rec.Reverses == "" {
		rec.Reverses = r.Reverses
	}
	if rec.SettlementKey == "" {
		rec.SettlementKey = r.SettlementKey
	}
	if rec.IdempotencyKey == "" {
		rec.IdempotencyKey = r.IdempotencyKey
	}
	if rec.Customer == "" {
		rec.Customer = r.Customer
	}
	if rec.Type == "" {
		rec.Type = r.Type
	}
	if rec.Usage == nil && r.Usage != nil {
		u := *r.Usage
		rec.Usage = &u
	}
	if rec.Amount == nil && r.Amount != nil {
		a := *r.Amount
		rec.Amount = &a
	}
}

// Lookup asks the provider for the record under idempotencyKey (§6.1 GET). Any 404 is
// taken as "no such record": the contract gives 404 no other meaning, and the only
// consequence of believing it is a resubmission under the same key.
func (c *httpClient) Lookup(ctx context.Context, idempotencyKey string) (Record, bool, error) {
	rec, found, err := c.lookup(ctx, idempotencyKey)
	if err != nil {
		return Record{}, false, fmt.Errorf("look up settlement by key %s: %w", idempotencyKey, err)
	}
	return rec, found, nil
}

func (c *httpClient) lookup(ctx context.Context, key string) (Record, bool, error) {
	if !validKey(key) {
		return Record{}, false, invalidRequest("idempotency key is empty, too long or has spaces or control characters")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := c.newRequest(ctx, http.MethodGet, "/settlements/"+url.PathEscape(key), nil)
	if err != nil {
		return Record{}, false, err
	}
	resp, err := Do(c.hc, req, false)
	if err != nil {
		return Record{}, false, err
	}
	if resp.Status == http.StatusNotFound {
		return Record{}, false, nil
	}
	if resp.Status < 200 || resp.Status > 299 {
		return Record{}, false, StatusError(resp, false, c.token)
	}
	if resp.Truncated {
		return Record{}, false, unreadable(resp, false, nil)
	}
	rec, err := decodeRecord(resp.Body)
	if err != nil {
		return Record{}, false, unreadable(resp, false, err)
	}
	// A record that does not name its key is returned as it is: Match finds the key
	// missing, as it would any field we sent.
	if rec.IdempotencyKey != "" && rec.IdempotencyKey != key {
		return Record{}, false, &Error{Class: Transient, Code: "mismatched_response", Status: resp.Status,
			Message: "the provider answered with a record for a different key"}
	}
	return rec, true, nil
}

// List returns one page of the provider's records created at or after since (§6.1
// GET /settlements). since is sent in whole seconds, rounded down: reconciliation would
// rather see a record twice than miss one.
func (c *httpClient) List(ctx context.Context, since time.Time, cursor string) ([]Record, string, error) {
	items, next, err := c.list(ctx, since, cursor)
	if err != nil {
		return nil, "", fmt.Errorf("list settlements since %s: %w", since.UTC().Format(time.RFC3339), err)
	}
	return items, next, nil
}

func (c *httpClient) list(ctx context.Context, since time.Time, cursor string) ([]Record, string, error) {
	q := url.Values{}
	if !since.IsZero() {
		q.Set("since", since.UTC().Truncate(time.Second).Format(time.RFC3339))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	path := "/settlements"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := c.newRequest(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, "", err
	}
	resp, err := Do(c.hc, req, false)
	if err != nil {
		return nil, "", err
	}
	if resp.Status < 200 || resp.Status > 299 {
		return nil, "", StatusError(resp, false, c.token)
	}
	if resp.Truncated {
		return nil, "", unreadable(resp, false, nil)
	}
	var page wireList
	if err := json.Unmarshal(resp.Body, &page); err != nil {
		return nil, "", unreadable(resp, false, err)
	}
	items := make([]Record, 0, len(page.Items))
	for i, raw := range page.Items {
		rec, err := decodeRecord(raw)
		if err != nil {
			return nil, "", unreadable(resp, false, fmt.Errorf("item %d: %w", i, err))
		}
		items = append(items, rec)
	}
	if cursor != "" && page.NextCursor == cursor {
		// A cursor that does not advance would make the caller page forever.
		return nil, "", &Error{Class: Terminal, Code: "cursor_not_advancing", Status: resp.Status,
			Message: "the provider returned the same cursor it was given"}
	}
	return items, page.NextCursor, nil
}
