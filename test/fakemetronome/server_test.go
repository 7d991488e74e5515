package fakemetronome_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
)

func post(t *testing.T, url, token, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode
}

// The fake answers as Metronome documents: the whole batch refused for one invalid
// event, a reused transaction_id ignored with a 200, and its books on /_admin/effects.
func TestIngestAsDocumented(t *testing.T) {
	s, err := fakemetronome.Start(fakemetronome.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now().UTC()
	ev := func(id string, at time.Time) string {
		return `{"transaction_id":"` + id + `","customer_id":"c","event_type":"t","timestamp":"` + at.Format(time.RFC3339) + `","properties":{"quantity":"1"}}`
	}
	ingest := s.URL() + "/v1/ingest"
	for name, tc := range map[string]struct {
		token, body string
		status      int
	}{
		"wrong token":    {"nope", "[" + ev("a", now) + "]", 401},
		"not an array":   {s.Token(), ev("a", now), 400},
		"empty batch":    {s.Token(), "[]", 400},
		"too old":        {s.Token(), "[" + ev("a", now.Add(-35*24*time.Hour)) + "]", 400},
		"too far ahead":  {s.Token(), "[" + ev("a", now.Add(25*time.Hour)) + "]", 400},
		"one bad of two": {s.Token(), "[" + ev("a", now) + "," + `{"transaction_id":"b","customer_id":"c","event_type":"t","timestamp":"26-01-01"}` + "]", 400},
	} {
		if got := post(t, ingest, tc.token, tc.body); got != tc.status {
			t.Fatalf("%s: %d, want %d", name, got, tc.status)
		}
	}
	if len(s.Events()) != 0 {
		t.Fatal("nothing refused is ingested")
	}
	if post(t, ingest, s.Token(), "["+ev("a", now)+"]") != 200 || post(t, ingest, s.Token(), "["+ev("a", now.Add(-time.Hour))+"]") != 200 {
		t.Fatal("an event and its duplicate are answered 200")
	}
	if e := s.Events(); len(e) != 1 || e[0].Timestamp != now.Format(time.RFC3339) || e[0].Duplicates != 1 {
		t.Fatalf("the first copy is kept: %+v", e)
	}
	resp, err := http.Get(s.URL() + "/_admin/effects")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var effects map[string]int
	if err := json.NewDecoder(resp.Body).Decode(&effects); err != nil || effects["a"] != 1 || len(effects) != 1 {
		t.Fatalf("effects %v %v", effects, err)
	}
}

// A search fault armed after answered searches lands on the next one after them, and
// only answered searches count for the transaction IDs they asked about.
func TestSearchFaultAfterAnswered(t *testing.T) {
	s, err := fakemetronome.Start(fakemetronome.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	search := s.URL() + "/v1/events/search"
	s.FailSearchAfter(1, http.StatusTooManyRequests, 1)
	var got []int
	for _, id := range []string{"a", "b", "b"} {
		got = append(got, post(t, search, s.Token(), `{"transactionIds":["`+id+`"]}`))
	}
	if got[0] != 200 || got[1] != 429 || got[2] != 200 {
		t.Fatalf("statuses %v, want [200 429 200]", got)
	}
	if s.SearchesFor("a") != 1 || s.SearchesFor("b") != 1 || s.Searches() != 3 {
		t.Fatalf("answered a=%d b=%d, served %d", s.SearchesFor("a"), s.SearchesFor("b"), s.Searches())
	}
}
