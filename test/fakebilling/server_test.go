package fakebilling

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

const token = "fake_token"

const validBody = `{"settlement_key":"p/job-1","type":"charge","reverses":null,"customer":"cus_1","usage":{"meter":"tokens","quantity":12.5,"unit":"tok"},"metadata":{}}`

func start(t *testing.T, opts Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// call sends one request with a fresh connection and returns status and body.
func call(t *testing.T, method, url string, header map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func submitHeaders(key string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + token, "Idempotency-Key": key, "Content-Type": "application/json"}
}

func TestSubmitValidatesTheContract(t *testing.T) {
	s := start(t, Options{Token: token})
	tests := []struct {
		name       string
		header     map[string]string
		body       string
		wantStatus int
		wantCode   string
	}{
		{name: "valid", header: submitHeaders("k1"), body: validBody, wantStatus: 201},
		{name: "no token", header: map[string]string{"Idempotency-Key": "k2", "Content-Type": "application/json"}, body: validBody, wantStatus: 401, wantCode: "unauthorized"},
		{name: "wrong token", header: map[string]string{"Authorization": "Bearer nope", "Idempotency-Key": "k2", "Content-Type": "application/json"}, body: validBody, wantStatus: 401, wantCode: "unauthorized"},
		{name: "no key", header: map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"}, body: validBody, wantStatus: 400, wantCode: "missing_idempotency_key"},
		{name: "not JSON", header: map[string]string{"Authorization": "Bearer " + token, "Idempotency-Key": "k2", "Content-Type": "text/plain"}, body: validBody, wantStatus: 415, wantCode: "unsupported_media_type"},
		{name: "quantity as a string", header: submitHeaders("k2"), body: strings.Replace(validBody, `12.5`, `"12.5"`, 1), wantStatus: 400, wantCode: "invalid_request"},
		{name: "negative quantity", header: submitHeaders("k2"), body: strings.Replace(validBody, `12.5`, `-1`, 1), wantStatus: 400, wantCode: "invalid_request"},
		{name: "reverses missing", header: submitHeaders("k2"), body: strings.Replace(validBody, `"reverses":null,`, ``, 1), wantStatus: 400, wantCode: "invalid_request"},
		{name: "metadata missing", header: submitHeaders("k2"), body: strings.Replace(validBody, `,"metadata":{}`, ``, 1), wantStatus: 400, wantCode: "invalid_request"},
		{name: "unknown field", header: submitHeaders("k2"), body: strings.Replace(validBody, `"customer"`, `"idempotency_key":"x","customer"`, 1), wantStatus: 400, wantCode: "invalid_request"},
		{name: "bad type", header: submitHeaders("k2"), body: strings.Replace(validBody, `"charge"`, `"Charge"`, 1), wantStatus: 400, wantCode: "invalid_request"},
		{name: "fractional minor amount", header: submitHeaders("k2"), body: strings.Replace(validBody, `"metadata"`, `"amount":{"minor":1.5,"currency":"USD"},"metadata"`, 1), wantStatus: 400, wantCode: "invalid_request"},
		{name: "trailing data", header: submitHeaders("k2"), body: validBody + `{}`, wantStatus: 400, wantCode: "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := call(t, http.MethodPost, s.URL()+"/settlements", tt.header, tt.body)
			if status != tt.wantStatus {
				t.Fatalf("status %d (%s), want %d", status, body, tt.wantStatus)
			}
			if tt.wantCode != "" {
				var e errorBody
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error != tt.wantCode {
					t.Errorf("body %s, want error %q", body, tt.wantCode)
				}
			}
		})
	}
	if n := len(s.Records()); n != 1 {
		t.Errorf("ledger has %d records, want 1 (only the valid request)", n)
	}
	if c := s.Calls(); c.Posts != len(tests) {
		t.Errorf("Posts = %d, want %d", c.Posts, len(tests))
	}
}

func TestAdminAPI(t *testing.T) {
	s := start(t, Options{Token: token})
	admin := s.URL() + "/_admin"

	// Faults queued over HTTP are served in order: 503, then 429 with Retry-After, then 400.
	status, body := call(t, http.MethodPost, admin+"/faults", nil,
		`{"fail_next":1,"status":503,"rate_limit_next":1,"retry_after_seconds":3,"reject_next":1,"reject_status":400,"reject_code":"invalid_currency"}`)
	if status != 200 || !strings.Contains(body, `"pending_faults":3`) {
		t.Fatalf("queue faults: %d %s", status, body)
	}
	for i, want := range []int{503, 429, 400, 201, 200} {
		if got, body := call(t, http.MethodPost, s.URL()+"/settlements", submitHeaders("k1"), validBody); got != want {
			t.Fatalf("POST %d: status %d (%s), want %d", i+1, got, body, want)
		}
	}
	if status, _ := call(t, http.MethodPost, admin+"/faults", nil, `{"fail_nxt":1}`); status != 400 {
		t.Errorf("a misspelt fault was accepted: %d", status)
	}

	// Status changes and imports show up in the ledger.
	if status, body := call(t, http.MethodPost, admin+"/status", nil, `{"settlement_key":"p/job-1","status":"failed","failure_reason":"card_declined"}`); status != 200 {
		t.Fatalf("set status: %d %s", status, body)
	}
	if status, _ := call(t, http.MethodPost, admin+"/status", nil, `{"settlement_key":"nope","status":"failed"}`); status != 404 {
		t.Errorf("status of an unknown key: %d, want 404", status)
	}
	imported := `{"id":"ext_1","status":"settled","settlement_key":"manual/1","idempotency_key":"stl_ext","type":"charge","reverses":null,"customer":"cus_9","amount":{"minor":500,"currency":"EUR"},"metadata":{},"created_at":"2026-01-02T03:04:05Z"}`
	if status, body := call(t, http.MethodPost, admin+"/import", nil, imported); status != 201 {
		t.Fatalf("import: %d %s", status, body)
	}
	if status, _ := call(t, http.MethodPost, admin+"/import", nil, imported); status != 409 {
		t.Errorf("importing the same key twice: %d, want 409", status)
	}

	status, body = call(t, http.MethodGet, admin+"/ledger", nil, "")
	if status != 200 {
		t.Fatalf("ledger: %d %s", status, body)
	}
	var l Ledger
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Records) != 2 || l.Records[0].ID != "ext_1" || l.Records[1].Status != "failed" || l.Records[1].FailureReason != "card_declined" {
		t.Errorf("records %+v: want the import first, then the failed charge", l.Records)
	}
	if l.Records[1].Usage == nil || l.Records[1].Usage.Quantity.String() != "12.5" {
		t.Errorf("usage %+v, want quantity 12.5", l.Records[1].Usage)
	}
	if l.Charges["p/job-1"] != 1 || l.Charges["manual/1"] != 1 {
		t.Errorf("charges %v, want one per key", l.Charges)
	}
	if l.Calls != (CallCounts{Posts: 5, Faults: 3}) || l.PendingFaults != 0 {
		t.Errorf("calls %+v pending %d, want 5 posts 3 faults, none pending", l.Calls, l.PendingFaults)
	}
	if !strings.Contains(body, `"quantity":12.5`) {
		t.Errorf("the ledger does not show quantity as a JSON number: %s", body)
	}
}

func TestDownForComesBackOnTheSamePort(t *testing.T) {
	s := start(t, Options{})
	status, body := call(t, http.MethodPost, s.URL()+"/_admin/faults", nil, `{"down_for_ms":300}`)
	if status != 200 {
		t.Fatalf("down_for_ms: %d %s", status, body)
	}
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while down: %v, want connection refused", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			_ = conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still down after 5s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status, _ := call(t, http.MethodGet, s.URL()+"/_admin/ledger", nil, ""); status != 200 {
		t.Errorf("after coming back: %d", status)
	}
}

func TestCloseReleasesHeldConnections(t *testing.T) {
	s, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.CommitThenTimeoutNext(1)
	errc := make(chan error, 1)
	go func() {
		// No client timeout: only the server closing can end this request.
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/settlements", strings.NewReader(validBody))
		req.Header.Set("Idempotency-Key", "held")
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err == nil {
			resp.Body.Close()
			err = errors.New("got a reply")
		}
		errc <- err
	}()
	// The charge is committed just before the connection is hijacked and held.
	for s.Charges("p/job-1") == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let the handler hand the connection to hold()
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %s with a held connection", d)
	}
	select {
	case err := <-errc:
		if err == nil || err.Error() == "got a reply" {
			t.Errorf("held request: %v, want a connection error", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the held request did not end when the server closed")
	}
	if err := s.SetDown(true); err == nil {
		t.Error("SetDown on a closed server succeeded")
	}
}

func TestImportAndRecordsOrder(t *testing.T) {
	s := start(t, Options{PendingPolls: 1})
	now := time.Now().UTC()
	for i, r := range []billing.Record{
		{IdempotencyKey: "b", SettlementKey: "sb", CreatedAt: now.Add(-time.Minute)},
		{IdempotencyKey: "a", SettlementKey: "sa", CreatedAt: now.Add(-time.Hour), Status: billing.StatusFailed},
		{IdempotencyKey: "c", SettlementKey: "sc", Usage: &billing.Usage{Meter: "m", Quantity: "007"}},
	} {
		if err := s.Import(r); err != nil {
			t.Fatalf("import %d: %v", i, err)
		}
	}
	if err := s.Import(billing.Record{IdempotencyKey: "a", SettlementKey: "other"}); err == nil {
		t.Error("a duplicate key was imported")
	}
	if err := s.Import(billing.Record{SettlementKey: "x"}); err == nil {
		t.Error("a record without a key was imported")
	}
	recs := s.Records()
	var keys []string
	for _, r := range recs {
		keys = append(keys, r.IdempotencyKey)
	}
	if strings.Join(keys, ",") != "a,b,c" {
		t.Fatalf("order %v, want a,b,c (by creation time)", keys)
	}
	if recs[0].Status != billing.StatusFailed || recs[1].Status != billing.StatusSettled || recs[1].Type != billing.TypeCharge || recs[1].ID == "" {
		t.Errorf("defaults not filled: %+v", recs[:2])
	}
	if recs[2].Usage.Quantity != "7" {
		t.Errorf("quantity %q, want 7", recs[2].Usage.Quantity)
	}
	if err := s.SetStatus("sz", billing.StatusSettled, ""); err == nil {
		t.Error("SetStatus of an unknown key succeeded")
	}
	if err := s.SetStatus("sa", "done", ""); err == nil {
		t.Error("SetStatus accepted an unknown status")
	}
}

// TestRecordsWithAndWithoutNulls: by default a record carries every contract field,
// null when it has none; a provider set to omit nulls leaves exactly those out, in its
// POST, GET and List replies alike, and the admin API switches between the two.
func TestRecordsWithAndWithoutNulls(t *testing.T) {
	s := start(t, Options{Token: token})
	if status, body := call(t, http.MethodPost, s.URL()+"/settlements", submitHeaders("k1"), validBody); status != http.StatusCreated {
		t.Fatalf("submit: %d %s", status, body)
	}
	auth := map[string]string{"Authorization": "Bearer " + token}
	fields := func(body string) map[string]json.RawMessage {
		t.Helper()
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("record %s: %v", body, err)
		}
		return m
	}
	replies := func() map[string]map[string]json.RawMessage {
		t.Helper()
		_, post := call(t, http.MethodPost, s.URL()+"/settlements", submitHeaders("k1"), validBody)
		_, get := call(t, http.MethodGet, s.URL()+"/settlements/k1", auth, "")
		_, list := call(t, http.MethodGet, s.URL()+"/settlements", auth, "")
		var page struct{ Items []json.RawMessage }
		if err := json.Unmarshal([]byte(list), &page); err != nil || len(page.Items) != 1 {
			t.Fatalf("list %s: %v", list, err)
		}
		return map[string]map[string]json.RawMessage{"POST": fields(post), "GET": fields(get), "List": fields(string(page.Items[0]))}
	}
	for reply, rec := range replies() {
		if string(rec["reverses"]) != "null" || string(rec["amount"]) != "null" {
			t.Errorf("%s record sends nulls: reverses %s, amount %s; want both null", reply, rec["reverses"], rec["amount"])
		}
	}
	if status, body := call(t, http.MethodPost, s.URL()+"/_admin/record-format", nil, `{"omit_nulls":true}`); status != http.StatusOK {
		t.Fatalf("admin record-format: %d %s", status, body)
	}
	for reply, rec := range replies() {
		for _, f := range []string{"reverses", "amount"} {
			if v, ok := rec[f]; ok {
				t.Errorf("%s record omitting nulls has %s: %s", reply, f, v)
			}
		}
		for _, f := range []string{"id", "status", "customer", "usage", "metadata"} {
			if _, ok := rec[f]; !ok {
				t.Errorf("%s record omitting nulls lost %s", reply, f)
			}
		}
	}
	s.SetOmitNulls(false)
	if rec := replies()["GET"]; string(rec["reverses"]) != "null" {
		t.Errorf("after SetOmitNulls(false) reverses = %s, want null", rec["reverses"])
	}
}
