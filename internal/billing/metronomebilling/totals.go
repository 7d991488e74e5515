package metronomebilling

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// uuidPattern is the shape of a Metronome ID (customers, billable metrics). A customer
// of this shape is taken as a Metronome customer ID, any other as an ingest alias.
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// exactDecimal is a usage value the pass compares exactly: a plain decimal literal. A
// value in exponent form (what a float's printing gives for large or tiny numbers) is
// not taken: whether it is the exact total cannot be told.
var exactDecimal = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

// Bounds of the usage and customer reads.
const (
	// maxUsagePages bounds the pages one total reads (one customer and one metric
	// answer in one row with window_size NONE; more pages mean something is wrong).
	maxUsagePages = 20
	// aliasCacheSize bounds the ingest aliases a client remembers.
	aliasCacheSize = 1024
	// aliasTTL is how long a resolved alias is reused: an alias can be moved to another
	// customer in Metronome, rarely.
	aliasTTL = time.Hour
)

// usageRequest is the body of POST /v1/usage.
type usageRequest struct {
	StartingOn      string         `json:"starting_on"`
	EndingBefore    string         `json:"ending_before"`
	WindowSize      string         `json:"window_size"`
	CustomerIDs     []string       `json:"customer_ids"`
	BillableMetrics []usageMetricQ `json:"billable_metrics"`
}

type usageMetricQ struct {
	ID string `json:"id"`
}

// usageAnswer is POST /v1/usage's answer; a value is a JSON number or null (no usage).
type usageAnswer struct {
	Data []struct {
		CustomerID       string      `json:"customer_id"`
		BillableMetricID string      `json:"billable_metric_id"`
		StartTimestamp   string      `json:"start_timestamp"`
		EndTimestamp     string      `json:"end_timestamp"`
		Value            json.Number `json:"value"`
	} `json:"data"`
	NextPage *string `json:"next_page"`
}

// UsageTotal is Metronome's total of usage meter's billable metric for customer over
// [start, end), whole minutes — the batched usage (POST /v1/usage, window_size NONE)
// — compared by reconciliation with the quantities the operator sent, since Metronome
// lists no events by time (docs/design.md §13).
//
// The usage API is keyed by billable metric ID and Metronome customer ID. A customer
// that is not a UUID is an ingest alias, resolved through the customers list filtered
// by ingest_alias (cached); an alias naming no customer, or several, is never guessed.
//
// Errors: Unanswerable with Unreadable for a meter without billableMetricID (nothing
// to compare, by the user's choice); Unanswerable for a meter whose event type another
// usage meter shares (its metric totals both), an alias that does not resolve to one
// customer, a usage request Metronome refuses (4xx: the metric is unknown to this
// account, …) and a value that is not an exact decimal; Transient for 401/403, 429 and
// 5xx (the window is compared again by a later pass); Local for a window not in whole
// minutes (refused before sending).
func (c *Client) UsageTotal(ctx context.Context, meter, customer string, start, end time.Time) (string, error) {
	m, ok := c.meters[meter]
	if !ok {
		return "", &billing.Error{Class: billing.Terminal, Unanswerable: true, Code: "unknown_meter",
			Message: fmt.Sprintf("no Metronome event type is configured for usage meter %q (spec.metronome.meters) any more", meter)}
	}
	if m.BillableMetricID == "" {
		return "", &billing.Error{Class: billing.Terminal, Unanswerable: true, Unreadable: true, Code: "billable_metric_missing",
			Message: fmt.Sprintf("spec.metronome.meters has no billableMetricID for usage meter %q: set it to the ID of the Metronome billable metric "+
				"that sums event type %q, so that its usage totals can be compared", meter, m.EventType)}
	}
	if shared := c.sharingEventType(meter, m.EventType); len(shared) > 0 {
		return "", &billing.Error{Class: billing.Terminal, Unanswerable: true, Code: "event_type_shared",
			Message: fmt.Sprintf("usage meters %q and %s are all reported as event type %q: billable metric %s totals them together, "+
				"which cannot be compared with one usage meter's settlements", meter, strings.Join(shared, ", "), m.EventType, m.BillableMetricID)}
	}
	if start.Truncate(time.Minute) != start || end.Truncate(time.Minute) != end || !end.After(start) {
		return "", terminal("window_not_whole_minutes", "a usage total covers whole minutes, start before end")
	}
	if customer == "" {
		return "", terminal("customer_missing", "a Metronome usage total needs a customer")
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	customerID := customer
	if !uuidPattern.MatchString(customer) {
		id, err := c.resolveAlias(ctx, customer)
		if err != nil {
			return "", err
		}
		customerID = id
	}
	body, err := json.Marshal(usageRequest{StartingOn: wireTime(start), EndingBefore: wireTime(end), WindowSize: "NONE",
		CustomerIDs: []string{customerID}, BillableMetrics: []usageMetricQ{{ID: m.BillableMetricID}}})
	if err != nil {
		return "", terminal("unencodable", "the usage request could not be encoded: "+err.Error())
	}
	var values []string
	cursor, seen := "", map[string]bool{}
	for page := 0; ; page++ {
		if page == maxUsagePages {
			return "", &billing.Error{Class: billing.Transient, Code: "too_many_pages",
				Message: fmt.Sprintf("Metronome's usage of billable metric %s for one customer ran past %d pages", m.BillableMetricID, maxUsagePages)}
		}
		path := UsagePath
		if cursor != "" {
			path += "?next_page=" + url.QueryEscape(cursor)
		}
		resp, err := c.post(ctx, path, body, false)
		if err != nil {
			return "", err
		}
		if resp.Status != http.StatusOK {
			return "", c.usageRefused(resp, fmt.Sprintf("the usage of billable metric %s", m.BillableMetricID))
		}
		var a usageAnswer
		if resp.Truncated || json.Unmarshal(resp.Body, &a) != nil || a.Data == nil {
			return "", &billing.Error{Class: billing.Transient, Code: "unreadable_reply", Status: resp.Status,
				Message: "Metronome's usage answer could not be read"}
		}
		for _, d := range a.Data {
			if !strings.EqualFold(d.CustomerID, customerID) || !strings.EqualFold(d.BillableMetricID, m.BillableMetricID) {
				continue // not asked for: never counted
			}
			v := d.Value.String()
			switch {
			case v == "":
				continue // null: no usage
			case !exactDecimal.MatchString(v):
				return "", &billing.Error{Class: billing.Terminal, Unanswerable: true, Code: "total_not_exact",
					Message: fmt.Sprintf("Metronome's usage of billable metric %s is %s, not a decimal that can be compared exactly", m.BillableMetricID, billing.Sanitize(v, c.cfg.Token))}
			}
			values = append(values, v)
		}
		if a.NextPage == nil || *a.NextPage == "" {
			break
		}
		if seen[*a.NextPage] {
			return "", &billing.Error{Class: billing.Transient, Code: "cursor_repeated",
				Message: "Metronome's usage answer repeated a page cursor"}
		}
		seen[*a.NextPage], cursor = true, *a.NextPage
	}
	return sumDecimals(values), nil
}

// sharingEventType lists, sorted, the other usage meters reported as eventType.
func (c *Client) sharingEventType(meter, eventType string) []string {
	var out []string
	for name, m := range c.meters {
		if name != meter && m.EventType == eventType {
			out = append(out, fmt.Sprintf("%q", name))
		}
	}
	sort.Strings(out)
	return out
}

// sumDecimals adds exact decimal literals; one value is returned as Metronome wrote it,
// none is 0.
func sumDecimals(values []string) string {
	switch len(values) {
	case 0:
		return "0"
	case 1:
		return values[0]
	}
	sum, places := new(big.Rat), 0
	for _, v := range values {
		q, _ := new(big.Rat).SetString(v) // exactDecimal: always parses
		sum.Add(sum, q)
		if i := strings.IndexByte(v, '.'); i >= 0 && len(v)-i-1 > places {
			places = len(v) - i - 1
		}
	}
	return sum.FloatString(places)
}

// usageRefused classifies a non-200 answer to a read the totals make: the adapter's
// classification (401/403, 429 and 5xx Transient), and any other refusal Unanswerable —
// the request is the meter's (an unknown billable metric, …), never one customer's.
func (c *Client) usageRefused(resp billing.Response, what string) error {
	e := c.classify(resp, false)
	if e.Class != billing.Terminal {
		return e
	}
	return &billing.Error{Class: billing.Terminal, Unanswerable: true, Code: "usage_refused", Status: e.Status,
		Message: fmt.Sprintf("Metronome refused %s: %s", what, e.Message)}
}

// customersAnswer is GET /v1/customers' answer.
type customersAnswer struct {
	Data []struct {
		ID            string   `json:"id"`
		IngestAliases []string `json:"ingest_aliases"`
	} `json:"data"`
	NextPage *string `json:"next_page"`
}

// resolveAlias is the Metronome customer ID an ingest alias names: exactly one customer
// listing it among its ingest aliases, or a Terminal error saying what is wrong — this
// customer's, not the meter's: the pass reports it and compares the meter's other customers.
// Resolved aliases are cached (bounded, aliasTTL); a failure is not.
func (c *Client) resolveAlias(ctx context.Context, alias string) (string, error) {
	now := c.cfg.Now()
	if id, ok := c.aliases.get(alias, now); ok {
		return id, nil
	}
	resp, err := c.call(ctx, http.MethodGet, CustomersPath+"?ingest_alias="+url.QueryEscape(alias), nil, false)
	if err != nil {
		return "", err
	}
	if resp.Status != http.StatusOK {
		return "", c.usageRefused(resp, "the customer list filtered by ingest alias "+billing.Sanitize(alias, c.cfg.Token))
	}
	var a customersAnswer
	if resp.Truncated || json.Unmarshal(resp.Body, &a) != nil || a.Data == nil {
		return "", &billing.Error{Class: billing.Transient, Code: "unreadable_reply", Status: resp.Status,
			Message: "Metronome's customer list could not be read"}
	}
	ids := map[string]bool{}
	for _, cu := range a.Data {
		for _, al := range cu.IngestAliases {
			if al == alias && cu.ID != "" {
				ids[cu.ID] = true // only a customer that lists the alias: a filter ignored is no answer
			}
		}
	}
	switch {
	case len(ids) > 1:
		return "", &billing.Error{Class: billing.Terminal, Code: "alias_ambiguous",
			Message: fmt.Sprintf("more than one Metronome customer answers to ingest alias %q: the customer its usage is billed to cannot be told",
				billing.Sanitize(alias, c.cfg.Token))}
	case a.NextPage != nil && *a.NextPage != "":
		// Another page may hold another customer with the alias: one is not proven.
		return "", &billing.Error{Class: billing.Terminal, Code: "alias_ambiguous",
			Message: fmt.Sprintf("Metronome's customer list for ingest alias %q runs past one page: whether one customer alone has it cannot be told",
				billing.Sanitize(alias, c.cfg.Token))}
	case len(ids) == 0:
		return "", &billing.Error{Class: billing.Terminal, Code: "alias_unknown",
			Message: fmt.Sprintf("no Metronome customer has ingest alias %q: its usage events are not billed to anyone; add the alias to the customer in Metronome",
				billing.Sanitize(alias, c.cfg.Token))}
	}
	var id string
	for k := range ids {
		id = k
	}
	c.aliases.put(alias, id, now)
	return id, nil
}

// aliasCache remembers resolved ingest aliases, at most aliasCacheSize of them for
// aliasTTL each: a pass reads many windows of the same customers.
type aliasCache struct {
	mu      sync.Mutex
	entries map[string]aliasEntry
}

type aliasEntry struct {
	id string
	at time.Time
}

func (a *aliasCache) get(alias string, now time.Time) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.entries[alias]
	if !ok || now.Sub(e.at) >= aliasTTL || now.Before(e.at) {
		return "", false
	}
	return e.id, true
}

func (a *aliasCache) put(alias, id string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.entries == nil {
		a.entries = map[string]aliasEntry{}
	}
	if _, ok := a.entries[alias]; !ok && len(a.entries) >= aliasCacheSize {
		// Full: drop the expired, then the oldest, so the bound holds.
		oldest := ""
		for k, e := range a.entries {
			if now.Sub(e.at) >= aliasTTL {
				delete(a.entries, k)
				continue
			}
			if oldest == "" || e.at.Before(a.entries[oldest].at) {
				oldest = k
			}
		}
		if len(a.entries) >= aliasCacheSize && oldest != "" {
			delete(a.entries, oldest)
		}
	}
	a.entries[alias] = aliasEntry{id: id, at: now}
}
