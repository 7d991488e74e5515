package deploy_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The Helm chart (charts/settlement-operator) is rendered with the Helm SDK, as `helm
// install` renders it, and checked against the installer: with default values it must
// install what config/default installs.

const chartKubeVersion = "v1.37.2" // the envtest control plane's

// renderChart renders the chart as `helm install <release> -n <namespace>` would,
// with the given values over values.yaml, and returns the objects it installs (hooks
// left out, as helm install leaves out `helm test`'s) in a stable order.
func renderChart(release, namespace string, values map[string]any) []*unstructured.Unstructured {
	GinkgoHelper()
	objs, _ := renderChartAndHooks(release, namespace, values)
	return objs
}

// renderChartAndHooks renders the chart and returns apart the objects it installs and
// its hooks (annotation helm.sh/hook), each in a stable order.
func renderChartAndHooks(release, namespace string, values map[string]any) (objs, hooks []*unstructured.Unstructured) {
	GinkgoHelper()
	files, err := renderChartE(release, namespace, values)
	Expect(err).NotTo(HaveOccurred())
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, o := range decodeAll(files[name]) {
			if _, hook := o.GetAnnotations()["helm.sh/hook"]; hook {
				hooks = append(hooks, o)
			} else {
				objs = append(objs, o)
			}
		}
	}
	return objs, hooks
}

// renderChartE renders the chart, checking the values against values.schema.json as
// helm install does, and returns the rendered files by name.
func renderChartE(release, namespace string, values map[string]any) (map[string]string, error) {
	GinkgoHelper()
	ch, err := loader.Load(filepath.Join(testenv.RepoRoot(), "charts", "settlement-operator"))
	Expect(err).NotTo(HaveOccurred())
	Expect(chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, chartKubeVersion)).To(BeTrue(),
		"the chart's kubeVersion admits the tested Kubernetes")
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: chartKubeVersion, Major: "1", Minor: "37"}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, vals)
}

// helmOwned are the labels the chart adds to mark its objects (Helm's conventions and
// the release), the only thing in which its objects may differ from the installer's
// besides app.kubernetes.io/managed-by (kustomize vs Helm).
func helmOwned(k string) bool {
	return strings.HasPrefix(k, "helm.sh/") || k == "app.kubernetes.io/instance" ||
		k == "app.kubernetes.io/version" || k == "app.kubernetes.io/managed-by"
}

// normalised returns a copy of o without what legitimately differs between a Helm
// release and the kustomize installer: Helm's labels (in metadata, in the Pod template
// and in every selector: the chart's selectors also carry the release, so two releases
// in one namespace never select each other's Pods), the CRDs'
// helm.sh/resource-policy: keep annotation, and the whitespace of CEL expressions.
func normalised(o *unstructured.Unstructured) map[string]any {
	GinkgoHelper()
	c := o.DeepCopy().Object
	var walk func(v any)
	walk = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			for k, child := range t {
				if k == "labels" || k == "matchLabels" || k == "selector" || k == "annotations" {
					if m, ok := child.(map[string]any); ok {
						for lk := range m {
							if helmOwned(lk) {
								delete(m, lk)
							}
						}
						if len(m) == 0 && k != "selector" && k != "matchLabels" {
							delete(t, k)
						}
					}
				}
				// kustomize re-encodes folded (>-) scalars and doubles the line break
				// before a more-indented line; CEL reads any whitespace alike.
				if str, ok := child.(string); ok && k == "expression" {
					t[k] = strings.Join(strings.Fields(str), " ")
				}
				walk(child)
			}
		case []any:
			for _, child := range t {
				walk(child)
			}
		}
	}
	walk(c)
	return c
}

var _ = Describe("the Helm chart (charts/settlement-operator)", Ordered, func() {
	It("installs with default values the objects config/default installs", func() {
		chart := renderChart("settlement-operator", operatorNamespace, nil)
		// Helm's convention is `helm install --create-namespace`: the chart does not
		// manage its own namespace (README, "With Helm").
		var kustomized []*unstructured.Unstructured
		for _, o := range objects {
			if o.GetKind() != "Namespace" {
				kustomized = append(kustomized, o)
			}
		}
		keys := func(objs []*unstructured.Unstructured) []string {
			var out []string
			for _, o := range objs {
				out = append(out, objectKey(o))
			}
			return out
		}
		Expect(keys(chart)).To(ConsistOf(keys(kustomized)))

		byKey := map[string]*unstructured.Unstructured{}
		for _, o := range chart {
			byKey[objectKey(o)] = o
		}
		for _, want := range kustomized {
			got := byKey[objectKey(want)]
			Expect(cmp.Diff(normalised(want), normalised(got))).To(BeEmpty(), "%s differs from config/default (-kustomize +chart)", objectKey(want))
			// What the normalisation removed is only Helm's own.
			if got.GetKind() == "CustomResourceDefinition" {
				Expect(got.GetAnnotations()).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"),
					"helm uninstall must never delete a CRD, and with it every settlement")
			}
			Expect(got.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/name", "settlement-operator"))
		}

		// The add-ons, turned on by values, are config/network-policy and config/prometheus.
		addons := renderChart("settlement-operator", operatorNamespace, map[string]any{
			"networkPolicy": map[string]any{"enabled": true},
			"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true},
				"prometheusRule": map[string]any{"enabled": true}},
		})
		byKey = map[string]*unstructured.Unstructured{}
		for _, o := range addons {
			byKey[objectKey(o)] = o
		}
		for _, dir := range []string{"network-policy", "prometheus"} {
			for _, want := range decodeAll(run(kustomize, "build", filepath.Join(testenv.RepoRoot(), "config", dir))) {
				got := byKey[objectKey(want)]
				Expect(got).NotTo(BeNil(), "the chart has no %s (config/%s)", objectKey(want), dir)
				Expect(cmp.Diff(normalised(want), normalised(got))).To(BeEmpty(),
					"%s differs from config/%s (-kustomize +chart)", objectKey(want), dir)
			}
		}
	})

	It("refuses bad values with an error that names them, before anything is installed", func() {
		for _, bad := range []struct {
			values map[string]any
			says   string
		}{
			{map[string]any{"replicas": "two"}, "replicas"},
			{map[string]any{"replicas": 0}, "replicas"},
			{map[string]any{"receiver": map[string]any{"admissionWait": "1 second"}}, "admissionWait"},
			{map[string]any{"receiver": map[string]any{"maxInFlight": -1}}, "maxInFlight"},
			{map[string]any{"receiver": map[string]any{"trustedProxies": "10.0.0.0/8"}}, "trustedProxies"},
			{map[string]any{"archive": map[string]any{"maxConns": 0}}, "maxConns"},
			{map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, "pullPolicy"},
			{map[string]any{"archive": map[string]any{"enabled": true, "secretName": ""}}, "archive.secretName is required"},
			// One name per item: the policy splits the annotation at commas.
			{map[string]any{"recordProtection": map[string]any{"compensators": map[string]any{"users": []any{"a@example.com,b@example.com"}}}}, "compensators"},
			{map[string]any{"recordProtection": map[string]any{"compensators": map[string]any{"group": []any{"finance"}}}}, "group"},
			{map[string]any{"replicas": 2, "leaderElection": map[string]any{"enabled": false}}, "replicas: 2 needs leaderElection.enabled: true"},
			// A misspelt key is refused, not silently ignored (the ServiceMonitor would
			// not be installed, nobody would notice until an alert did not fire).
			{map[string]any{"metrics": map[string]any{"servicemonitor": map[string]any{"enabled": true}}}, "'servicemonitor' not allowed"},
			{map[string]any{"replica": 3}, "'replica' not allowed"},
			{map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"token": map[string]any{"key": ""}}}}, "/metrics/serviceMonitor/token/key"},
			{map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"token": map[string]any{"existingSecret": "Prometheus Token"}}}}, "existingSecret"},
			{map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"interval": "30 seconds"}}}, "interval"},
			{map[string]any{"image": map[string]any{"tag": "v1.2.3 "}}, "/image/tag"},
			{map[string]any{"controllers": map[string]any{"watchNamespaces": "tenant-a, tenant-b"}}, "watchNamespaces"},
			{map[string]any{"podAnnotations": map[string]any{"prometheus.io/scrape": true}}, "podAnnotations"},
			{map[string]any{"archive": map[string]any{"secretName": "Settlement Archive"}}, "/archive/secretName"},
		} {
			_, err := renderChartE("settlement-operator", operatorNamespace, bad.values)
			Expect(err).To(MatchError(ContainSubstring(bad.says)), "%v", bad.values)
		}
		// The NOTES are rendered with the rest; they name the roles to bind.
		files, err := renderChartE("settlement-operator", operatorNamespace, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(files).To(HaveKeyWithValue("settlement-operator/templates/NOTES.txt",
			ContainSubstring("settlement-operator-metrics-reader")))
	})

	It("applies server-side to the API server with every toggle on, and runs the manager as the chart's ServiceAccount", func() {
		const release, ns = "acme", "billing-helm"
		rendered, hooks := renderChartAndHooks(release, ns, map[string]any{
			"image":          map[string]any{"repository": "registry.example.com/settlement-operator", "tag": "v1.2.3"},
			"replicas":       3,
			"resources":      map[string]any{"requests": map[string]any{"cpu": "50m", "memory": "64Mi"}},
			"leaderElection": map[string]any{"id": "acme-settlement-operator"},
			"receiver": map[string]any{"port": 9090, "maxInFlight": 10, "maxInFlightPerNamespace": 5,
				"maxInFlightPerProvider": 3, "admissionWait": "2s", "bodyReadTimeout": "5s", "requestTimeout": "6s",
				"maxUnauthenticatedPerAddress": 6, "trustedProxies": []any{"10.0.0.0/8", "fd00::/8"},
				"maxBodyBytes": 65536, "apiTimeout": "7s"},
			"controllers":   map[string]any{"maxConcurrentReconciles": 2, "settlementWorkers": 24, "settlementWorkersPerProvider": 6, "reconciliationMaxLookups": 50, "eventStatusDelay": "2s", "transitionEvents": true, "watchNamespaces": "tenant-a,tenant-b"},
			"networkPolicy": map[string]any{"enabled": true},
			"archive": map[string]any{"enabled": true, "secretName": "acme-archive", "after": "2h",
				"maxConns": 4, "statementTimeout": "3s", "tls": map[string]any{"enabled": true}},
			"metrics": map[string]any{"certSecret": "acme-metrics-tls",
				"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}},
				"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}},
			"recordProtection": map[string]any{"compensators": map[string]any{
				"users": []any{"alice@example.com", "system:serviceaccount:finance:refunds"}, "groups": []any{"acme-finance"}}},
		})

		// The Prometheus Operator's kinds have no CRD in this control plane: checked
		// here, applied elsewhere (config/prometheus) only where it runs.
		var apply, monitoring []*unstructured.Unstructured
		for _, o := range rendered {
			if o.GroupVersionKind().Group == "monitoring.coreos.com" {
				monitoring = append(monitoring, o)
			} else {
				apply = append(apply, o)
			}
		}
		Expect(monitoring).To(HaveLen(2))
		for _, o := range monitoring {
			Expect(o.GetNamespace()).To(Equal(ns))
			Expect(o.GetLabels()).To(HaveKeyWithValue("release", "prometheus"))
		}
		// Its scraper identity is applied with the rest (below).
		expectScraperIdentity(rendered, release+"-settlement-operator-metrics-reader")

		var dep appsv1.Deployment
		for _, o := range apply {
			if o.GetKind() == "Deployment" {
				dep = decode[appsv1.Deployment](o)
			}
		}
		c := dep.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal("registry.example.com/settlement-operator:v1.2.3"))
		Expect(*dep.Spec.Replicas).To(Equal(int32(3)))
		Expect(c.Args).To(ContainElements("--leader-elect", "--leader-election-id=acme-settlement-operator",
			"--receiver-bind-address=:9090", "--receiver-max-in-flight=10",
			"--receiver-max-in-flight-per-namespace=5", "--receiver-max-in-flight-per-provider=3",
			"--receiver-admission-wait=2s", "--receiver-body-read-timeout=5s", "--receiver-request-timeout=6s",
			"--receiver-max-unauthenticated-per-address=6", "--receiver-trusted-proxies=10.0.0.0/8,fd00::/8", "--receiver-max-body-bytes=65536",
			"--receiver-api-timeout=7s", "--max-concurrent-reconciles=2", "--settlement-workers=24", "--settlement-workers-per-provider=6", "--reconciliation-max-lookups=50", "--event-status-delay=2s", "--transition-events",
			"--watch-namespaces=tenant-a,tenant-b", "--archive-after=2h", "--archive-max-conns=4",
			"--archive-statement-timeout=3s", "--metrics-cert-dir=/etc/settlement-operator/metrics-tls"))
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--metrics-secure")), "metrics stay authenticated")
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--archive-database-url")), "the URL carries a password: never a flag")
		Expect(c.Env).To(ContainElement(SatisfyAll(HaveField("Name", "ARCHIVE_DATABASE_URL"),
			HaveField("ValueFrom.SecretKeyRef.Name", "acme-archive"), HaveField("ValueFrom.SecretKeyRef.Key", "url"))))
		Expect(c.Env).To(ContainElement(SatisfyAll(HaveField("Name", "PGSSLMODE"), HaveField("Value", "verify-full"))))
		Expect(c.Resources.Requests.Cpu().String()).To(Equal("50m"))

		// Apply as the README's `helm install` would create them, server-side, twice.
		dir := filepath.Join(workDir, "helm")
		Expect(os.MkdirAll(dir, 0o700)).To(Succeed())
		var manifest strings.Builder
		for _, o := range apply {
			b, err := o.MarshalJSON()
			Expect(err).NotTo(HaveOccurred())
			manifest.Write(b)
			manifest.WriteString("\n")
		}
		path := filepath.Join(dir, "release.json")
		Expect(os.WriteFile(path, []byte(manifest.String()), 0o600)).To(Succeed())
		kubectl(adminKC, "create", "namespace", ns)
		// The restricted Pod Security Standard, as the README asks of the release
		// namespace: `helm test`'s Pod must be admitted there.
		kubectl(adminKC, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
		DeferCleanup(func() {
			// The chart's record-protection binding knows only this release's manager:
			// it goes with the release, so the installer's specs see their own alone.
			kubectl(adminKC, "delete", "--ignore-not-found", "validatingadmissionpolicybinding", release+"-settlement-operator-record-protection")
		})
		Expect(kubectl(adminKC, "apply", "--server-side", "--field-manager=helm", "-f", path)).To(ContainSubstring("serverside-applied"))
		kubectl(adminKC, "apply", "--server-side", "--field-manager=helm", "-f", path)
		Expect(recordProtectionParam(apply)).To(Equal(ns + "/" + dep.Spec.Template.Spec.ServiceAccountName))
		// The ServiceMonitor's token is of a ServiceAccount that may get /metrics (what
		// the manager's metrics filter asks the API server) and nothing else.
		scraper := "--as=system:serviceaccount:" + ns + ":" + release + "-settlement-operator-metrics-scraper"
		Expect(kubectl(adminKC, "auth", "can-i", "get", "/metrics", scraper)).To(Equal("yes\n"))
		for _, what := range [][]string{{"get", "secrets", "-n", ns}, {"list", "webhookevents.hooks.settlement.dev", "-A"}, {"get", "/debug/pprof/"}} {
			out, _, err := kubectlE(adminKC, append([]string{"auth", "can-i", scraper}, what...)...)
			Expect(err).To(HaveOccurred(), "the scraper may %v", what)
			Expect(out).To(Equal("no\n"))
		}
		// The compensators of the values are on the binding's parameter, where the policy
		// reads them.
		var sa corev1.ServiceAccount
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: dep.Spec.Template.Spec.ServiceAccountName}, &sa)).To(Succeed())
		Expect(sa.Annotations).To(SatisfyAll(
			HaveKeyWithValue("hooks.settlement.dev/compensator-users", "alice@example.com, system:serviceaccount:finance:refunds"),
			HaveKeyWithValue("hooks.settlement.dev/compensator-groups", "acme-finance")))
		// The chart's policy knows only its own manager: the installer's (allowed by the
		// installer's binding, when installed) is a stranger to it. As a member of the
		// listed group it may create a Refund, never a Charge.
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "installer-manager-creates"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit-settlements"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: operatorNamespace,
				Name: "settlement-operator-controller-manager"}},
		})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "edit-settlements"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{hooksv1alpha1.GroupVersion.Group},
				Resources: []string{"billingsettlements"}, Verbs: []string{"create", "get"}}},
		})).To(Succeed())
		samples := filepath.Join(testenv.RepoRoot(), "config", "samples")
		chartManager := "system:serviceaccount:" + ns + ":" + dep.Spec.Template.Spec.ServiceAccountName
		// The API server takes up a new binding from an informer: wait until a dry run
		// (admission included, nothing stored) is refused.
		Eventually(func() error {
			_, _, err := kubectlE(adminKC, "--as="+managerUser, "create", "--dry-run=server", "-n", ns,
				"-f", filepath.Join(samples, "hooks_v1alpha1_billingsettlement.yaml"))
			return err
		}).Should(HaveOccurred(), "the chart's binding is in force")
		refused(adminKC, "Charge settlements are created only by the settlement-operator ("+chartManager+")",
			"--as="+managerUser, "--as-group=acme-finance", "create", "-n", ns,
			"-f", filepath.Join(samples, "hooks_v1alpha1_billingsettlement.yaml"))
		refused(adminKC, "annotations of ServiceAccount "+ns+"/"+dep.Spec.Template.Spec.ServiceAccountName, "--as="+managerUser, "create", "-n", ns,
			"-f", filepath.Join(samples, "hooks_v1alpha1_billingsettlement_refund.yaml"))
		Eventually(func() error { // once the policy's informer has the ServiceAccount
			_, stderr, err := kubectlE(adminKC, "--as="+managerUser, "--as-group=acme-finance", "create", "-n", ns,
				"-f", filepath.Join(samples, "hooks_v1alpha1_billingsettlement_refund.yaml"))
			if err != nil {
				return fmt.Errorf("%w: %s", err, stderr)
			}
			return nil
		}).Should(Succeed(), "a member of the chart's compensator group creates a Refund")

		// The chart's RBAC is enough for the manager: it starts as the ServiceAccount and
		// takes the Lease in the release namespace.
		user := "system:serviceaccount:" + ns + ":" + dep.Spec.Template.Spec.ServiceAccountName
		kc := filepath.Join(workDir, "helm-manager.kubeconfig")
		Expect(testenv.WriteKubeconfig(kc, cfg, "as-helm-manager", user)).To(Succeed())
		dep.Namespace = ns
		// Without the archive: this control plane has no PostgreSQL (the archive's flags
		// are checked above, and by internal/archive's own tests).
		var args []string
		for _, a := range c.Args {
			if !strings.HasPrefix(a, "--archive-") && !strings.HasPrefix(a, "--metrics-cert-dir") {
				args = append(args, a)
			}
		}
		dep.Spec.Template.Spec.Containers[0].Args = args
		r := startReplica(&dep, kc)
		DeferCleanup(func() { r.session.Kill() })
		Eventually(func(g Gomega) {
			var lease coordinationv1.Lease
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "acme-settlement-operator"}, &lease)).To(Succeed())
			g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Not(BeEmpty())))
		}).Should(Succeed())
		Expect(r.session.ExitCode()).To(Equal(-1), "the manager keeps running")

		expectHelmTestPasses(hooks, ns, "tenant-a", r)
	})
})
