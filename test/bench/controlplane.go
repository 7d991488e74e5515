package bench

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// writeVerbs are the API-server request verbs (as apiserver_request_total labels
// them) that write to etcd when they succeed.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true, "DELETE": true, "DELETECOLLECTION": true}

// probe reads the control plane's own accounting: the API server's request counters
// (what was written, by resource and verb) and etcd's metrics and keys (what is
// stored, and how much history the writes left until the next compaction).
type probe struct {
	api  *http.Client
	host string
	etcd *url.URL
	hc   *http.Client
}

func newProbe(cfg *rest.Config, etcd *url.URL) (*probe, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("http client for the API server: %w", err)
	}
	return &probe{api: hc, host: strings.TrimSuffix(cfg.Host, "/"), etcd: etcd, hc: &http.Client{Timeout: 60 * time.Second}}, nil
}

func get(ctx context.Context, hc *http.Client, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", u, resp.StatusCode, bytes.TrimSpace(b[:min(len(b), 200)]))
	}
	return b, nil
}

// writeKey names one kind of write: resource[/subresource] VERB code-class.
type writeKey struct {
	Resource, Subresource, Verb string
	OK                          bool
}

func (k writeKey) String() string {
	r := k.Resource
	if k.Subresource != "" {
		r += "/" + k.Subresource
	}
	s := r + " " + k.Verb
	if !k.OK {
		s += " (refused)"
	}
	return s
}

// writeCounts is a snapshot of apiserver_request_total's write verbs, and of its GETs
// of single objects (reads past an informer's cache), kept apart: total and perEvent
// count writes only, gets the reads.
type writeCounts map[writeKey]float64

// writes scrapes the API server's request counters. Leases are left out: the API
// server renews its own identity lease on a timer, and neither the operator (run
// without leader election here) nor the benchmark writes one.
func (p *probe) writes(ctx context.Context) (writeCounts, error) {
	b, err := get(ctx, p.api, p.host+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape the API server's metrics: %w", err)
	}
	out := writeCounts{}
	for _, s := range parseSamples(b, func(n string) bool { return n == "apiserver_request_total" }) {
		if !writeVerbs[s.labels["verb"]] && s.labels["verb"] != "GET" || s.labels["resource"] == "leases" {
			continue
		}
		k := writeKey{Resource: s.labels["resource"], Subresource: s.labels["subresource"], Verb: s.labels["verb"],
			OK: strings.HasPrefix(s.labels["code"], "2")}
		out[k] += s.value
	}
	return out, nil
}

// since is the difference to an earlier snapshot, without zero entries.
func (w writeCounts) since(before writeCounts) writeCounts {
	out := writeCounts{}
	for k, v := range w {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// total counts successful writes (ok) or refused attempts (!ok).
func (w writeCounts) total(ok bool) float64 {
	t := 0.0
	for k, v := range w {
		if k.OK == ok && k.Verb != "GET" {
			t += v
		}
	}
	return t
}

// count is the number of successful writes of one resource/subresource/verb.
func (w writeCounts) count(resource, subresource, verb string) float64 {
	return w[writeKey{Resource: resource, Subresource: subresource, Verb: verb, OK: true}]
}

// perEvent lists the writes per event by kind, largest first.
func (w writeCounts) perEvent(events int) []WriteShare {
	var out []WriteShare
	for k, v := range w {
		if k.Verb == "GET" {
			continue
		}
		out = append(out, WriteShare{Write: k.String(), Total: int64(v), PerEvent: round(v/float64(events), 3)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Total != out[j].Total {
			return out[i].Total > out[j].Total
		}
		return out[i].Write < out[j].Write
	})
	return out
}

// gets is the GETs of single objects of our group's kinds, per event by resource: the
// reads that skip the informer cache (the settlement controller's live reads of
// another settlement of the same operation, of compensations and of credentials;
// the receiver's of a duplicate). Secrets are counted too.
func (w writeCounts) gets(events int) map[string]float64 {
	out := map[string]float64{}
	for k, v := range w {
		if k.Verb == "GET" && k.OK && v > 0 {
			out[k.String()] = round(v/float64(events), 3)
		}
	}
	return out
}

// etcdStats are etcd's own counters of what it stores.
type etcdStats struct {
	// DBInUse is the size of the backend's pages in use: live keys plus every
	// revision not compacted yet (the benchmark disables the API server's periodic
	// compaction, so the growth over a window is the history that window wrote).
	DBInUse float64
	// DBSize is the backend file's size (what the quota is checked against).
	DBSize float64
	// Puts counts key writes.
	Puts float64
	// ReceivedBytes counts the bytes etcd received from its gRPC clients (the API
	// server): dominated by the values written.
	ReceivedBytes float64
}

func (p *probe) etcdStats(ctx context.Context) (etcdStats, error) {
	b, err := get(ctx, p.hc, p.etcd.String()+"/metrics")
	if err != nil {
		return etcdStats{}, fmt.Errorf("scrape etcd's metrics: %w", err)
	}
	s := parseSamples(b, func(n string) bool { return strings.HasPrefix(n, "etcd_") })
	return etcdStats{
		DBInUse:       sum(s, "etcd_mvcc_db_total_size_in_use_in_bytes", nil),
		DBSize:        sum(s, "etcd_mvcc_db_total_size_in_bytes", nil),
		Puts:          sum(s, "etcd_mvcc_put_total", nil),
		ReceivedBytes: sum(s, "etcd_network_client_grpc_received_bytes_total", nil),
	}, nil
}

// etcdVersion is etcd's server version.
func (p *probe) etcdVersion(ctx context.Context) string {
	b, err := get(ctx, p.hc, p.etcd.String()+"/version")
	if err != nil {
		return "unknown"
	}
	var v struct {
		Server string `json:"etcdserver"`
	}
	if json.Unmarshal(b, &v) != nil {
		return "unknown"
	}
	return v.Server
}

// storedSize is what etcd holds under one key prefix: the number of keys and the
// bytes of their keys and values, exactly as stored (JSON for custom resources,
// protobuf for built-in kinds such as Events).
type storedSize struct {
	Keys        int
	KeyBytes    int64
	ValueBytes  int64
	LargestItem int64
	// ManagedFieldsBytes is the part of JSON values taken by metadata.managedFields
	// (server-side apply bookkeeping every write maintains).
	ManagedFieldsBytes int64
}

// stored reads every key under prefix through etcd's gRPC gateway (plain JSON over
// HTTP, enabled by default), which needs no client library and reports the values
// byte for byte.
func (p *probe) stored(ctx context.Context, prefix string) (storedSize, error) {
	return p.storedUpTo(ctx, prefix, 0)
}

// storedUpTo is stored for at most maxKeys keys (0: all), to estimate the mean size
// of a kind with many objects without reading every one.
func (p *probe) storedUpTo(ctx context.Context, prefix string, maxKeys int) (storedSize, error) {
	var out storedSize
	key := []byte(prefix)
	end := append([]byte(prefix[:len(prefix)-1]), prefix[len(prefix)-1]+1)
	for {
		body, _ := json.Marshal(map[string]any{
			"key": base64.StdEncoding.EncodeToString(key), "range_end": base64.StdEncoding.EncodeToString(end),
			"limit": 2000,
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.etcd.String()+"/v3/kv/range", bytes.NewReader(body))
		if err != nil {
			return out, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.hc.Do(req)
		if err != nil {
			return out, fmt.Errorf("range %s in etcd: %w", prefix, err)
		}
		var r struct {
			KVs []struct {
				Key   []byte `json:"key"`
				Value []byte `json:"value"`
			} `json:"kvs"`
			More bool `json:"more"`
		}
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil {
			return out, fmt.Errorf("decode range %s: %w", prefix, err)
		}
		for _, kv := range r.KVs {
			out.Keys++
			out.KeyBytes += int64(len(kv.Key))
			out.ValueBytes += int64(len(kv.Value))
			out.LargestItem = max(out.LargestItem, int64(len(kv.Value)))
			var obj struct {
				Metadata struct {
					ManagedFields json.RawMessage `json:"managedFields"`
				} `json:"metadata"`
			}
			if len(kv.Value) > 0 && kv.Value[0] == '{' && json.Unmarshal(kv.Value, &obj) == nil {
				out.ManagedFieldsBytes += int64(len(obj.Metadata.ManagedFields))
			}
		}
		if !r.More || len(r.KVs) == 0 || (maxKeys > 0 && out.Keys >= maxKeys) {
			return out, nil
		}
		key = append(append([]byte(nil), r.KVs[len(r.KVs)-1].Key...), 0)
	}
}

// post sends a JSON body to one of etcd's gRPC-gateway endpoints and decodes the answer.
func (p *probe) post(ctx context.Context, path string, body, into any) error {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.etcd.String()+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.hc.Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %d %s", path, resp.StatusCode, bytes.TrimSpace(raw[:min(len(raw), 200)]))
	}
	if into == nil {
		return nil
	}
	return json.Unmarshal(raw, into)
}

// etcdStatus is etcd's own view of its backend (Maintenance.Status).
type etcdStatus struct {
	Revision int64
	// DBSize is the backend file's size; DBSizeInUse the pages holding data (live
	// keys and every revision not compacted yet). Compaction frees pages without
	// shrinking the file; defragmentation shrinks it to what is in use.
	DBSize, DBSizeInUse, Quota int64
}

// status reads etcd's Maintenance.Status (int64 fields are strings in the gateway's JSON).
func (p *probe) status(ctx context.Context) (etcdStatus, error) {
	var r struct {
		Header struct {
			Revision int64 `json:"revision,string"`
		} `json:"header"`
		DBSize      int64 `json:"dbSize,string"`
		DBSizeInUse int64 `json:"dbSizeInUse,string"`
		Quota       int64 `json:"dbSizeQuota,string"`
	}
	if err := p.post(ctx, "/v3/maintenance/status", struct{}{}, &r); err != nil {
		return etcdStatus{}, err
	}
	return etcdStatus{Revision: r.Header.Revision, DBSize: r.DBSize, DBSizeInUse: r.DBSizeInUse, Quota: r.Quota}, nil
}

// compactDefrag compacts etcd's history up to its current revision (waiting until the
// compaction is applied to the backend), then defragments it, as an operator's
// maintenance would: afterwards the backend holds the live keys only. It returns the
// status before and after and how long each step blocked.
func (p *probe) compactDefrag(ctx context.Context) (before, after etcdStatus, compact, defrag time.Duration, err error) {
	if before, err = p.status(ctx); err != nil {
		return
	}
	start := time.Now()
	if err = p.post(ctx, "/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(before.Revision, 10), "physical": true}, nil); err != nil &&
		!strings.Contains(err.Error(), "already been compacted") {
		return
	}
	compact = time.Since(start)
	start = time.Now()
	if err = p.post(ctx, "/v3/maintenance/defragment", struct{}{}, nil); err != nil {
		return
	}
	defrag = time.Since(start)
	after, err = p.status(ctx)
	return
}

// count is the number of keys under prefix, counted by etcd without reading values.
func (p *probe) count(ctx context.Context, prefix string) (int64, error) {
	key := []byte(prefix)
	end := append([]byte(prefix[:len(prefix)-1]), prefix[len(prefix)-1]+1)
	var r struct {
		Count int64 `json:"count,string"`
	}
	err := p.post(ctx, "/v3/kv/range", map[string]any{"key": base64.StdEncoding.EncodeToString(key),
		"range_end": base64.StdEncoding.EncodeToString(end), "count_only": true}, &r)
	return r.Count, err
}
