package bench

import (
	"testing"
	"time"
)

func TestPercentilesNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	got := percentiles(ds)
	want := Percentiles{Count: 100, P50: 50, P90: 90, P99: 99, Max: 100}
	if got != want {
		t.Fatalf("percentiles(1..100ms) = %+v, want %+v", got, want)
	}
	if got := percentiles([]time.Duration{7 * time.Millisecond}); got.P50 != 7 || got.P99 != 7 {
		t.Fatalf("one observation: %+v", got)
	}
	if got := percentiles(nil); got.Count != 0 {
		t.Fatalf("no observation: %+v", got)
	}
}

func TestParseSamples(t *testing.T) {
	text := []byte(`# HELP apiserver_request_total x
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",group="hooks.settlement.dev",resource="webhookevents",subresource="",verb="POST"} 400
apiserver_request_total{code="200",group="hooks.settlement.dev",resource="webhookevents",subresource="status",verb="PATCH"} 12
apiserver_request_total{code="200",group="",resource="pods",subresource="",verb="LIST"} 3
etcd_mvcc_db_total_size_in_use_in_bytes 1.2345e+06
other_metric{a="b"} 1
`)
	s := parseSamples(text, func(n string) bool { return n != "other_metric" })
	if len(s) != 4 {
		t.Fatalf("parsed %d samples, want 4: %+v", len(s), s)
	}
	writes := sum(s, "apiserver_request_total", func(l map[string]string) bool { return writeVerbs[l["verb"]] })
	if writes != 412 {
		t.Fatalf("writes = %v, want 412", writes)
	}
	if v := sum(s, "etcd_mvcc_db_total_size_in_use_in_bytes", nil); v != 1234500 {
		t.Fatalf("gauge = %v", v)
	}
	if s[1].labels["subresource"] != "status" {
		t.Fatalf("labels = %v", s[1].labels)
	}
}

func TestParsePprofTop(t *testing.T) {
	out := []byte(`File: manager
Type: cpu
Duration: 30s, Total samples = 21.50s (71.67%)
Showing nodes accounting for 6.20s, 28.84% of 21.50s total
Dropped 1200 nodes (cum <= 0.11s)
Showing top 10 nodes out of 600
      flat  flat%   sum%        cum   cum%
     2.10s  9.77%  9.77%      2.10s  9.77%  runtime.memmove
     1.00s  4.65% 14.42%      5.30s 24.65%  encoding/json.(*decodeState).object
`)
	got, total, err := parsePprofTop(out)
	if err != nil {
		t.Fatal(err)
	}
	if total != 21.5 || len(got) != 2 {
		t.Fatalf("total %v, %d rows", total, len(got))
	}
	want := ProfileEntry{Function: "encoding/json.(*decodeState).object", FlatSecond: 1, FlatPct: 4.65, CumSecond: 5.3, CumPct: 24.65}
	if got[1] != want {
		t.Fatalf("row 2: %+v, want %+v", got[1], want)
	}
	if _, _, err := parsePprofTop([]byte("nothing")); err == nil {
		t.Fatal("no rows: want an error")
	}
}
