// Package prometheus_test checks the shipped monitoring (config/prometheus): every alert
// and dashboard expression parses as PromQL and names only metrics the operator
// registers, and every alert links a section of docs/runbook.md.
package prometheus_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/receiver"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// registered is every metric name the operator exposes, histogram series included,
// collected from the collectors' descriptions (not a hand-kept list).
func registered(t *testing.T) map[string]bool {
	t.Helper()
	collectors := append(append(metrics.Collectors(), receiver.MetricCollectors()...), metrics.NewObjectsCollector(nil))
	reg := prometheus.NewPedanticRegistry()
	names := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			t.Fatalf("register: %v", err)
		}
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				names[m[1]+suffix] = true
			}
		}
	}
	if !names["settlement_oldest_unsettled_seconds"] || !names["settlement_receiver_requests_total"] {
		t.Fatalf("the registry misses the operator's metrics: %v", names)
	}
	return names
}

// promql parses as a Prometheus server does by default (no experimental syntax).
var promql = parser.NewParser(parser.Options{})

// checkExpr parses expr and fails for a metric name the operator does not register.
func checkExpr(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	parsed, err := promql.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", where, expr, err)
		return
	}
	selectors := parser.ExtractSelectors(parsed)
	if len(selectors) == 0 {
		t.Errorf("%s: %q selects no metric", where, expr)
	}
	for _, matchers := range selectors {
		var name string
		for _, m := range matchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		if !names[name] {
			t.Errorf("%s: %q uses %q, which the operator does not register", where, expr, name)
		}
	}
}

// prometheusRule is the part of monitoring.coreos.com/v1 PrometheusRule the rules use;
// it is read strictly, so a misspelt field fails the test instead of being dropped.
type prometheusRule struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// runbookAnchors are the GitHub anchors of docs/runbook.md's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	drop := regexp.MustCompile("[^a-z0-9 _-]")
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, "#") {
			h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
			anchors[strings.ReplaceAll(drop.ReplaceAllString(h, ""), " ", "-")] = true
		}
	}
	return anchors
}

func TestAlertRules(t *testing.T) {
	names, anchors := registered(t), runbookAnchors(t)
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "prometheus", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule prometheusRule
	if err := yaml.UnmarshalStrict(raw, &rule); err != nil {
		t.Fatal(err)
	}
	if rule.APIVersion != "monitoring.coreos.com/v1" || rule.Kind != "PrometheusRule" {
		t.Fatalf("kind %q", rule.Kind)
	}
	alerts := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without an alert name", g.Name)
				continue
			}
			alerts[r.Alert] = true
			checkExpr(t, r.Alert, r.Expr, names)
			if r.Labels["severity"] == "" {
				t.Errorf("%s: no severity label", r.Alert)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			url := r.Annotations["runbook_url"]
			anchor := url[strings.LastIndex(url, "#")+1:]
			if !strings.Contains(url, "docs/runbook.md#") || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q does not point at a heading of docs/runbook.md", r.Alert, url)
			}
		}
	}
	// What on-call must be paged for: dead letters, stuck settlements,
	// receiver 503/400/429 and signature failures, reconciliation findings, the archive.
	for _, a := range []string{"SettlementDeadLettered", "SettlementStuckUnsettled", "SettlementReceiverUnavailable",
		"SettlementReceiverBadRequests", "SettlementReceiverSignatureRejected", "SettlementReceiverThrottling",
		"SettlementReconciliationFindings", "SettlementArchiveDown", "SettlementArchiveConflict", "SettlementArchiveBehind"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
}

// grafanaVariables stand in for the dashboard's variables so its queries parse as
// Prometheus receives them after Grafana's substitution.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$namespace", "ns")

func TestGrafanaDashboard(t *testing.T) {
	names := registered(t)
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "prometheus", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			expr := grafanaVariables.Replace(target.Expr)
			checkExpr(t, "panel "+p.Title, expr, names)
			if parsed, err := promql.ParseExpr(expr); err == nil {
				for _, ms := range parser.ExtractSelectors(parsed) {
					for _, m := range ms {
						if m.Name == "__name__" {
							used[strings.TrimSuffix(m.Value, "_bucket")] = true
						}
					}
				}
			}
		}
	}
	var missing []string
	for _, m := range []string{"settlement_receiver_requests_total", "settlement_provider_calls_total",
		"settlement_billing_call_duration_seconds", "settlement_oldest_unsettled_seconds", "settlement_dead_letters_total",
		"settlement_reconciliation_discrepancies_total", "settlement_archive_up"} {
		if !used[m] {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the dashboard shows nothing of %v", missing)
	}
}
