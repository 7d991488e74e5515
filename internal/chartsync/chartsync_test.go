package chartsync_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/settlement-operator/settlement-operator/internal/chartsync"
)

// TestChartInSync fails when the chart's CRDs, manager ClusterRole, record-protection
// policy or alerting rules differ from config/ (run `make manifests`), or when the
// chart holds a CRD template whose CRD is gone.
func TestChartInSync(t *testing.T) {
	root := filepath.Join("..", "..")
	want, err := chartsync.Files(root)
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range want {
		got, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v (run `make manifests`)", p, err)
			continue
		}
		if !bytes.Equal(got, b) {
			t.Errorf("%s differs from its source in config/: run `make manifests`", p)
		}
	}
	have, _ := filepath.Glob(filepath.Join(root, chartsync.ChartDir, "templates", "crds", "*.yaml"))
	for _, p := range have {
		r, _ := filepath.Rel(root, p)
		if _, ok := want[r]; !ok {
			t.Errorf("%s has no CRD in config/crd/bases: run `make manifests`", r)
		}
	}
}

// TestFilesSeeChanges: a changed source shows in the generated files, so the test
// above can fail.
func TestFilesSeeChanges(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"config/crd/bases", "config/rbac", "config/admission", "config/prometheus"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("config/crd/bases/x.yaml", "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: xs.example.com\nspec:\n  group: example.com\n")
	write("config/rbac/role.yaml", "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: manager-role\nrules:\n- apiGroups: [\"\"]\n  resources: [pods]\n  verbs: [get]\n")
	write("config/admission/record_protection.yaml", "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata:\n  name: p\nspec:\n  failurePolicy: Fail\n---\nkind: ValidatingAdmissionPolicyBinding\n")
	write("config/prometheus/rules.yaml", "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: alerts\nspec:\n  groups:\n  - name: g\n    rules:\n    - alert: A\n      annotations: {summary: \"{{ $labels.namespace }}\"}\n")
	before, err := chartsync.Files(root)
	if err != nil {
		t.Fatal(err)
	}
	crd := before[filepath.Join(chartsync.ChartDir, "templates", "crds", "x.yaml")]
	if !bytes.Contains(crd, []byte("helm.sh/resource-policy: keep")) {
		t.Errorf("the CRD template lacks helm.sh/resource-policy: keep:\n%s", crd)
	}
	rules := before[filepath.Join(chartsync.ChartDir, "templates", "prometheusrule.yaml")]
	if !bytes.Contains(rules, []byte(`{{ "{{" }} $labels.namespace }}`)) {
		t.Errorf("Prometheus templates are not escaped for Helm:\n%s", rules)
	}
	write("config/rbac/role.yaml", "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: manager-role\nrules:\n- apiGroups: [\"\"]\n  resources: [pods]\n  verbs: [get, list]\n")
	after, err := chartsync.Files(root)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(chartsync.ChartDir, "templates", "manager-role.yaml")
	if bytes.Equal(before[p], after[p]) {
		t.Errorf("a changed config/rbac/role.yaml left %s unchanged", p)
	}
}
