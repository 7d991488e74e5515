package fakemetronome

import (
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// UsageRequest is one usage request as the fake saw it.
type UsageRequest struct {
	StartingOn, EndingBefore string
	WindowSize               string
	CustomerIDs              []string
	BillableMetricIDs        []string
	// NextPage is the next_page query parameter ("" on a first page).
	NextPage string
}

// FailUsage makes the fake answer the next n usage requests with status (429 with
// Retry-After, or any error status with a {"message"} body).
func (s *Server) FailUsage(status, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.usageFail = append(s.usageFail, slices.Repeat([]int{status}, n)...)
}

// FailCustomers makes the fake answer the next n customer lists with status.
func (s *Server) FailCustomers(status, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.custFail = append(s.custFail, slices.Repeat([]int{status}, n)...)
}

// AnswerUsageValue makes the next usage answer carry raw (a JSON literal) as the value
// of every row, whatever the events add up to: a value Metronome may send that the
// client must not take as an exact total.
func (s *Server) AnswerUsageValue(raw string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.usageRaw = append(s.usageRaw, raw)
}

// UsageRequests are the usage requests the fake received, in order.
func (s *Server) UsageRequests() []UsageRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]UsageRequest(nil), s.usageReqs...)
}

// CustomerRequests counts the customer lists served.
func (s *Server) CustomerRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.custReqs
}

// failLocked answers the next injected failure of queue, if any.
func (s *Server) failLocked(w http.ResponseWriter, queue *[]int) bool {
	if len(*queue) == 0 {
		return false
	}
	status := (*queue)[0]
	*queue = (*queue)[1:]
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", fmt.Sprint(int(s.opts.RetryAfter.Round(time.Second)/time.Second)))
	}
	writeJSONLocked(w, status, map[string]string{"message": http.StatusText(status)})
	return true
}

type usageRow struct {
	CustomerID         string          `json:"customer_id"`
	BillableMetricID   string          `json:"billable_metric_id"`
	BillableMetricName string          `json:"billable_metric_name"`
	StartTimestamp     string          `json:"start_timestamp"`
	EndTimestamp       string          `json:"end_timestamp"`
	Value              json.RawMessage `json:"value"`
}

func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	var body struct {
		StartingOn      string   `json:"starting_on"`
		EndingBefore    string   `json:"ending_before"`
		WindowSize      string   `json:"window_size"`
		CustomerIDs     []string `json:"customer_ids"`
		BillableMetrics []struct {
			ID string `json:"id"`
		} `json:"billable_metrics"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"message": "body must be a JSON object"})
		return
	}
	page := 0
	if p := r.URL.Query().Get("next_page"); p != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(p, "page-"))
		if err != nil || !strings.HasPrefix(p, "page-") || n <= 0 || n >= s.opts.UsagePages {
			writeJSON(w, http.StatusBadRequest, map[string]string{"message": "next_page is not a cursor this API gave"})
			return
		}
		page = n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	req := UsageRequest{StartingOn: body.StartingOn, EndingBefore: body.EndingBefore, WindowSize: body.WindowSize,
		CustomerIDs: append([]string(nil), body.CustomerIDs...), NextPage: r.URL.Query().Get("next_page")}
	for _, m := range body.BillableMetrics {
		req.BillableMetricIDs = append(req.BillableMetricIDs, m.ID)
	}
	s.usageReqs = append(s.usageReqs, req)
	if s.failLocked(w, &s.usageFail) {
		return
	}
	start, err1 := time.Parse(time.RFC3339Nano, body.StartingOn)
	end, err2 := time.Parse(time.RFC3339Nano, body.EndingBefore)
	switch {
	case err1 != nil || err2 != nil || !rfc3339Year4.MatchString(body.StartingOn) || !rfc3339Year4.MatchString(body.EndingBefore):
		writeJSONLocked(w, http.StatusBadRequest, map[string]string{"message": "starting_on and ending_before must be RFC 3339 timestamps"})
		return
	case !end.After(start):
		writeJSONLocked(w, http.StatusBadRequest, map[string]string{"message": "ending_before must be after starting_on"})
		return
	case body.WindowSize != "NONE":
		// The fake serves one aggregate for the whole window, all the adapter asks for.
		writeJSONLocked(w, http.StatusBadRequest, map[string]string{"message": "window_size must be NONE in this fake"})
		return
	}
	for _, id := range req.BillableMetricIDs {
		if _, ok := s.opts.Metrics[id]; !ok {
			writeJSONLocked(w, http.StatusNotFound, map[string]string{"message": "billable metric " + id + " not found"})
			return
		}
	}
	rows := []usageRow{}
	if page == s.opts.UsagePages-1 { // earlier pages are empty
		var raw string
		if len(s.usageRaw) > 0 {
			raw, s.usageRaw = s.usageRaw[0], s.usageRaw[1:]
		}
		for _, cid := range body.CustomerIDs {
			for _, mid := range req.BillableMetricIDs {
				value := json.RawMessage(s.totalLocked(cid, s.opts.Metrics[mid], start, end))
				if raw != "" {
					value = json.RawMessage(raw)
				}
				rows = append(rows, usageRow{CustomerID: cid, BillableMetricID: mid, BillableMetricName: s.opts.Metrics[mid].EventType,
					StartTimestamp: body.StartingOn, EndTimestamp: body.EndingBefore, Value: value})
			}
		}
	}
	answer := map[string]any{"data": rows, "next_page": nil}
	if page < s.opts.UsagePages-1 {
		answer["next_page"] = fmt.Sprintf("page-%d", page+1)
	}
	writeJSONLocked(w, http.StatusOK, answer)
}

// totalLocked is the sum of m's property over the events of customerID (under its ID
// or an ingest alias) dated in [start, end), as a JSON number; null when none.
func (s *Server) totalLocked(customerID string, m Metric, start, end time.Time) string {
	names := []string{customerID}
	for _, c := range s.opts.Customers {
		if c.ID == customerID {
			names = append(names, c.IngestAliases...)
		}
	}
	prop := m.Property
	if prop == "" {
		prop = "quantity"
	}
	sum, places, found := new(big.Rat), 0, false
	for _, id := range s.order {
		e := s.events[id]
		t, err := time.Parse(time.RFC3339Nano, e.Timestamp)
		if err != nil || e.EventType != m.EventType || !slices.Contains(names, e.CustomerID) || t.Before(start) || !t.Before(end) {
			continue
		}
		v := e.Properties[prop]
		q, ok := new(big.Rat).SetString(v)
		if !ok {
			continue // Metronome ignores a property it cannot aggregate
		}
		sum.Add(sum, q)
		if i := strings.IndexByte(v, '.'); i >= 0 && len(v)-i-1 > places {
			places = len(v) - i - 1
		}
		found = true
	}
	if !found {
		return "null"
	}
	return sum.FloatString(places)
}

type customerRow struct {
	ID            string   `json:"id"`
	ExternalID    string   `json:"external_id"`
	Name          string   `json:"name"`
	IngestAliases []string `json:"ingest_aliases"`
}

func (s *Server) customers(w http.ResponseWriter, r *http.Request) {
	alias := r.URL.Query().Get("ingest_alias")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.custReqs++
	if s.failLocked(w, &s.custFail) {
		return
	}
	rows := []customerRow{}
	for _, c := range s.opts.Customers {
		if alias != "" && !slices.Contains(c.IngestAliases, alias) {
			continue
		}
		external := c.ID
		if len(c.IngestAliases) > 0 {
			external = c.IngestAliases[0]
		}
		rows = append(rows, customerRow{ID: c.ID, ExternalID: external, Name: "customer " + c.ID,
			IngestAliases: append([]string{}, c.IngestAliases...)})
	}
	writeJSONLocked(w, http.StatusOK, map[string]any{"data": rows, "next_page": nil})
}
