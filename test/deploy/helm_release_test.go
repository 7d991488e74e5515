package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// What a release of the chart needs beyond installing the same objects as the
// installer: a pinned version, a `helm lint --strict` that passes and a ServiceMonitor
// in the Prometheus Operator's current form.

func chartDir() string { return filepath.Join(testenv.RepoRoot(), "charts", "settlement-operator") }

func chartAppVersion() string {
	GinkgoHelper()
	ch, err := loader.Load(chartDir())
	Expect(err).NotTo(HaveOccurred())
	return ch.Metadata.AppVersion
}

// everyToggle are values turning every optional part of the chart on.
var everyToggle = map[string]any{
	"networkPolicy": map[string]any{"enabled": true},
	"archive":       map[string]any{"enabled": true, "tls": map[string]any{"enabled": true}},
	"metrics": map[string]any{"certSecret": "metrics-tls", "serviceMonitor": map[string]any{"enabled": true},
		"prometheusRule": map[string]any{"enabled": true}},
	"controllers": map[string]any{"watchNamespaces": "tenant-a,tenant-b"},
}

// helmLint runs what `helm lint --strict` runs (the Helm SDK's lint package, the same
// rules: Chart.yaml, values against values.schema.json, every template rendered and
// checked as Kubernetes objects) and returns the messages that fail --strict: warnings
// and errors.
func helmLint(values map[string]any) []string {
	GinkgoHelper()
	kv := &chartutil.KubeVersion{Version: chartKubeVersion, Major: "1", Minor: "37"}
	l := lint.AllWithKubeVersionAndSchemaValidation(chartDir(), values, "settlement-operator-system", kv, false)
	var failing []string
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			failing = append(failing, m.Error())
		}
	}
	return failing
}

func byKind(objs []*unstructured.Unstructured) map[string][]*unstructured.Unstructured {
	out := map[string][]*unstructured.Unstructured{}
	for _, o := range objs {
		out[o.GetKind()] = append(out[o.GetKind()], o)
	}
	return out
}

// serviceMonitorEndpoint returns the one endpoint of the one ServiceMonitor in objs.
func serviceMonitorEndpoint(objs []*unstructured.Unstructured) map[string]any {
	GinkgoHelper()
	sms := byKind(objs)["ServiceMonitor"]
	Expect(sms).To(HaveLen(1))
	endpoints, _, err := unstructured.NestedSlice(sms[0].Object, "spec", "endpoints")
	Expect(err).NotTo(HaveOccurred())
	Expect(endpoints).To(HaveLen(1))
	return endpoints[0].(map[string]any)
}

// expectScraperIdentity checks that the ServiceMonitor in objs authenticates with the
// token Secret in objs of a ServiceAccount in objs bound (only) to the metrics-reader
// ClusterRole: what Prometheus sends is a token the manager accepts for /metrics.
func expectScraperIdentity(objs []*unstructured.Unstructured, metricsReader string) {
	GinkgoHelper()
	ep := serviceMonitorEndpoint(objs)
	Expect(ep).NotTo(HaveKey("bearerTokenFile"), "deprecated in the Prometheus Operator")
	Expect(ep).NotTo(HaveKey("bearerTokenSecret"), "deprecated in the Prometheus Operator")
	Expect(ep).To(HaveKey("authorization"))
	Expect(ep["authorization"]).To(SatisfyAll(HaveKeyWithValue("type", "Bearer"), HaveKeyWithValue("credentials",
		SatisfyAll(HaveLen(2), HaveKeyWithValue("name", HaveSuffix("-metrics-scraper-token")), HaveKeyWithValue("key", "token")))))
	Expect(ep).To(HaveKeyWithValue("scheme", "https"))
	Expect(ep).To(HaveKeyWithValue("tlsConfig", HaveKeyWithValue("insecureSkipVerify", true)),
		"the manager's certificate is self-signed by default")
	secretName, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "name")
	kinds := byKind(objs)
	sm := kinds["ServiceMonitor"][0]

	var secret *corev1.Secret
	for _, o := range kinds["Secret"] {
		if o.GetName() == secretName {
			s := decode[corev1.Secret](o)
			secret = &s
		}
	}
	Expect(secret).NotTo(BeNil(), "the ServiceMonitor's Secret %s is installed with it", secretName)
	Expect(secret.Namespace).To(Equal(sm.GetNamespace()), "the Prometheus Operator reads it from the ServiceMonitor's namespace")
	Expect(secret.Type).To(Equal(corev1.SecretTypeServiceAccountToken), "Kubernetes fills it with key token")
	saName := secret.Annotations[corev1.ServiceAccountNameKey]
	sas := kinds["ServiceAccount"]
	Expect(sas).To(ContainElement(SatisfyAll(HaveField("Object", HaveKeyWithValue("automountServiceAccountToken", false)),
		WithTransform(func(o *unstructured.Unstructured) string { return o.GetNamespace() + "/" + o.GetName() },
			Equal(secret.Namespace+"/"+saName)))), "the token's ServiceAccount is installed with it, and runs no Pod")
	var bound []string
	for _, o := range kinds["ClusterRoleBinding"] {
		b := decode[rbacv1.ClusterRoleBinding](o)
		for _, s := range b.Subjects {
			if s.Kind == "ServiceAccount" && s.Namespace == secret.Namespace && s.Name == saName {
				bound = append(bound, b.RoleRef.Kind+"/"+b.RoleRef.Name)
			}
		}
	}
	Expect(bound).To(ConsistOf("ClusterRole/"+metricsReader), "the scraper may get /metrics and nothing else")
}

var _ = Describe("the Helm chart's release", func() {
	It("is pinned: appVersion, the default image tag, config/manager's tag and the Makefile's IMG name one release, never latest", func() {
		ch, err := loader.Load(chartDir())
		Expect(err).NotTo(HaveOccurred())
		app := ch.Metadata.AppVersion
		Expect(app).NotTo(ContainSubstring("latest"))
		Expect(app).To(MatchRegexp(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`), "a release tag")
		Expect(app).To(Equal("v"+ch.Metadata.Version), "the chart and the manager are released together")
		want := "settlement-operator:" + app

		objs, hooks := renderChartAndHooks("settlement-operator", operatorNamespace, nil)
		var images []string
		for _, o := range append(objs, hooks...) {
			if o.GetKind() == "Deployment" {
				d := decode[appsv1.Deployment](o)
				images = append(images, d.Spec.Template.Spec.Containers[0].Image)
			}
			if o.GetKind() == "Pod" {
				p := decode[corev1.Pod](o)
				images = append(images, p.Spec.Containers[0].Image)
			}
		}
		Expect(images).To(SatisfyAll(ContainElement(want), HaveEach(want)), "the manager (and the test Pod) run the release's image")
		Expect(deployment().Spec.Template.Spec.Containers[0].Image).To(Equal(want), "the installer (config/manager) too")

		// `make docker-build`, `make deploy` and `make build-installer` tag and name the
		// same image, unless IMG is given.
		cmd := exec.Command("make", "-s", "--no-print-directory", "-C", testenv.RepoRoot(),
			"--eval", "print-img: ; @echo $(IMG)", "print-img")
		cmd.Env = slicesWithout(os.Environ(), "IMG=", "VERSION=")
		out, err := cmd.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(strings.TrimSpace(string(out))).To(Equal(want))

		// Nothing the chart or the installer renders names :latest.
		files, err := renderChartE("settlement-operator", operatorNamespace, everyToggle)
		Expect(err).NotTo(HaveOccurred())
		for name, text := range files {
			Expect(text).NotTo(MatchRegexp(`image: \S*:latest`), name)
		}
		installer, err := os.ReadFile(install)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(installer)).NotTo(MatchRegexp(`image: \S*:latest`))
	})

	It("passes helm lint --strict with default values and with every toggle on, and lint fails bad values", func() {
		Expect(helmLint(nil)).To(BeEmpty())
		Expect(helmLint(everyToggle)).To(BeEmpty())
		Expect(helmLint(map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true,
			"token": map[string]any{"existingSecret": "prometheus-token"}}}})).To(BeEmpty())
		// The same run refuses what helm install would refuse.
		Expect(helmLint(map[string]any{"replicas": "two"})).To(ContainElement(ContainSubstring("replicas")))
		Expect(helmLint(map[string]any{"metrics": map[string]any{"servicemonitor": map[string]any{"enabled": true}}})).
			To(ContainElement(ContainSubstring("servicemonitor")))
	})

	It("scrapes with the authorization of a token Secret of a ServiceAccount that may only get /metrics", func() {
		objs := renderChart("acme", "billing", map[string]any{
			"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}})
		expectScraperIdentity(objs, "acme-settlement-operator-metrics-reader")
		// The ClusterRole it is bound to is the chart's.
		Expect(byKind(objs)["ClusterRole"]).To(ContainElement(WithTransform(
			(*unstructured.Unstructured).GetName, Equal("acme-settlement-operator-metrics-reader"))))

		// A token from elsewhere (a secret store): the chart creates no identity of its own.
		objs = renderChart("acme", "billing", map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{
			"enabled": true, "token": map[string]any{"existingSecret": "vault-prometheus-token", "key": "jwt"}}}})
		Expect(serviceMonitorEndpoint(objs)).To(HaveKeyWithValue("authorization", map[string]any{"type": "Bearer",
			"credentials": map[string]any{"name": "vault-prometheus-token", "key": "jwt"}}))
		for _, o := range objs {
			Expect(o.GetName()).NotTo(ContainSubstring("metrics-scraper"), objectKey(o))
		}

		// With its own certificate, the scrape verifies it: the CA from a Secret, the
		// metrics Service's DNS name unless told otherwise.
		objs = renderChart("acme", "billing", map[string]any{"metrics": map[string]any{"certSecret": "acme-metrics-tls",
			"serviceMonitor": map[string]any{"enabled": true, "insecureSkipVerify": false,
				"caSecret": map[string]any{"name": "acme-metrics-ca"}}}})
		Expect(serviceMonitorEndpoint(objs)).To(HaveKeyWithValue("tlsConfig", map[string]any{
			"insecureSkipVerify": false,
			"ca":                 map[string]any{"secret": map[string]any{"name": "acme-metrics-ca", "key": "ca.crt"}},
			"serverName":         "acme-settlement-operator-controller-manager-metrics-service.billing.svc"}))
	})
})

// slicesWithout returns env without the variables of the given prefixes.
func slicesWithout(env []string, prefixes ...string) []string {
	var out []string
next:
	for _, kv := range env {
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}
