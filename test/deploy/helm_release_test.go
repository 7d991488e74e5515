package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
// installer: a pinned version, a `helm lint --strict` that passes, a ServiceMonitor in
// the Prometheus Operator's current form, and a `helm test` hook.

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
		// The longest prefix the schema admits still gives valid names (Services: 63
		// characters); lint's own release name, test-release, is 12 characters.
		Expect(helmLint(map[string]any{"fullnameOverride": strings.Repeat("a", 40),
			"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}})).To(BeEmpty())
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

	It("has a helm test hook: the manager's image checks that the receiver answers a signed delivery and refuses another key", func() {
		_, hooks := renderChartAndHooks("acme", "billing", nil)
		kinds := byKind(hooks)
		Expect(kinds).To(HaveLen(3))
		Expect(kinds["Secret"]).To(HaveLen(1))
		Expect(kinds["WebhookProvider"]).To(HaveLen(1))
		Expect(kinds["Pod"]).To(HaveLen(1))
		for _, o := range hooks {
			Expect(o.GetAnnotations()).To(HaveKeyWithValue("helm.sh/hook", "test"), objectKey(o))
			Expect(o.GetAnnotations()).To(HaveKeyWithValue("helm.sh/hook-delete-policy", "before-hook-creation,hook-succeeded"), objectKey(o))
			Expect(o.GetNamespace()).To(Equal("billing"), objectKey(o))
		}
		// The WebhookProvider routes nothing: the check can store no record.
		Expect(kinds["WebhookProvider"][0].Object).NotTo(HaveKeyWithValue("spec", HaveKey("routes")))
		Expect(kinds["WebhookProvider"][0].Object).NotTo(HaveKeyWithValue("spec", HaveKey("storeUnroutedEvents")))
		pod := decode[corev1.Pod](kinds["Pod"][0])
		Expect(pod.Spec.Containers).To(HaveLen(1))
		c := pod.Spec.Containers[0]
		Expect(c.Image).To(Equal("settlement-operator:"+chartAppVersion()), "the manager's image: nothing else to pull")
		Expect(c.Command).To(Equal([]string{"/manager"}))
		Expect(c.Args).To(Equal([]string{"check-receiver",
			"--url=http://acme-settlement-operator-webhook-receiver.billing.svc:80/webhooks/billing/acme-settlement-operator-helm-test",
			"--secret-file=/etc/settlement-operator/helm-test/key", "--timeout=2m"}))
		Expect(pod.Spec.AutomountServiceAccountToken).To(HaveValue(BeFalse()))
		Expect(pod.Spec.RestartPolicy).To(Equal(corev1.RestartPolicyNever))

		// A release serving other namespaces tests in the first it serves.
		_, hooks = renderChartAndHooks("acme", "billing", map[string]any{"controllers": map[string]any{"watchNamespaces": "tenant-a,tenant-b"}})
		var where []string
		for _, o := range hooks {
			where = append(where, objectKey(o))
		}
		Expect(where).To(ConsistOf("Secret/billing/acme-settlement-operator-helm-test",
			"Secret/tenant-a/acme-settlement-operator-helm-test",
			"WebhookProvider/tenant-a/acme-settlement-operator-helm-test", "Pod/billing/acme-settlement-operator-helm-test"))
		keys := map[string]bool{}
		for _, o := range byKind(hooks)["Secret"] {
			k, _, _ := unstructured.NestedString(o.Object, "stringData", "key")
			Expect(k).To(MatchRegexp(`^whsec_[A-Za-z0-9+/]{40,}={0,2}$`))
			keys[k] = true
		}
		Expect(keys).To(HaveLen(1), "the Pod signs with the provider's key")
		pod = decode[corev1.Pod](byKind(hooks)["Pod"][0])
		Expect(pod.Spec.Containers[0].Args).To(ContainElement(HaveSuffix("/webhooks/tenant-a/acme-settlement-operator-helm-test")))

		// One that lists its own namespace tests there.
		_, hooks = renderChartAndHooks("acme", "billing", map[string]any{"controllers": map[string]any{"watchNamespaces": "tenant-a,billing"}})
		for _, o := range hooks {
			Expect(o.GetNamespace()).To(Equal("billing"), objectKey(o))
		}
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

// expectHelmTestPasses applies the chart's test hooks to the API server as `helm test`
// creates them (the Pod is admitted by the restricted Pod Security Standard of the
// release namespace, but no kubelet runs it here), then runs the Pod's command, the
// manager binary with the Pod's arguments and its mounted key, against the replica r,
// as the Pod would through the receiver Service. It must pass, store nothing, and fail
// with another key.
func expectHelmTestPasses(hooks []*unstructured.Unstructured, releaseNS, testNS string, r *replica) {
	GinkgoHelper()
	kubectl(adminKC, "create", "namespace", testNS)
	// The Pod Security admission is in force: a Pod without the restricted settings is refused.
	refused(adminKC, `violates PodSecurity "restricted:latest"`, "run", "-n", releaseNS, "unrestricted",
		"--image=settlement-operator:v0.1.0", "--restart=Never")
	var manifest strings.Builder
	for _, o := range hooks {
		b, err := o.MarshalJSON()
		Expect(err).NotTo(HaveOccurred())
		manifest.Write(b)
		manifest.WriteString("\n")
	}
	path := filepath.Join(workDir, "helm-test-hooks.json")
	Expect(os.WriteFile(path, []byte(manifest.String()), 0o600)).To(Succeed())
	out, stderr, err := kubectlE(adminKC, "create", "-f", path)
	Expect(err).NotTo(HaveOccurred(), "%s%s", out, stderr)
	Expect(out).To(ContainSubstring("pod/"), "the test Pod is admitted")

	var pod corev1.Pod
	var key string
	for _, o := range hooks {
		switch o.GetKind() {
		case "Pod":
			pod = decode[corev1.Pod](o)
		case "Secret":
			key, _, _ = unstructured.NestedString(o.Object, "stringData", "key")
		}
	}
	Expect(pod.Spec.Volumes).To(HaveLen(1))
	Expect(pod.Spec.Volumes[0].Secret.SecretName).To(Equal(pod.Name))
	mount := pod.Spec.Containers[0].VolumeMounts[0].MountPath
	dir := filepath.Join(workDir, "helm-test-pod")
	Expect(os.MkdirAll(dir, 0o700)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(dir, "key"), []byte(key), 0o600)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(dir, "other-key"), []byte("whsec_"+"b3RoZXIga2V5IG9mIDMyIGJ5dGVzIGZvciB0aGUgdGVzdA=="), 0o600)).To(Succeed())

	// The Pod's arguments, with the Service's address as the replica's and the mount as dir.
	podArgs := func(keyFile string) []string {
		var args []string
		for _, a := range pod.Spec.Containers[0].Args {
			a = regexp.MustCompile(`^--url=http://[^/]+/`).ReplaceAllString(a, "--url=http://"+r.receiver+"/")
			a = strings.Replace(a, mount+"/key", filepath.Join(dir, keyFile), 1)
			args = append(args, a)
		}
		return args
	}
	Expect(pod.Spec.Containers[0].Command).To(Equal([]string{"/manager"}))
	check := exec.Command(managerBin, podArgs("key")...)
	outB, err := check.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "helm test's check failed:\n%s", outB)
	Expect(string(outB)).To(SatisfyAll(ContainSubstring(`200 {`), ContainSubstring(`"status":"ignored"`), ContainSubstring("another key: 401")))
	fmt.Fprintf(GinkgoWriter, "helm test's check:\n%s", outB)
	Expect(kubectl(adminKC, "get", "webhookevents", "-n", testNS, "-o", "name")).To(BeEmpty(), "the check stores nothing")

	// Signed with a key that is not the provider's, the check fails and says so.
	check = exec.Command(managerBin, append(podArgs("other-key"), "--timeout=5s")...)
	outB, err = check.CombinedOutput()
	Expect(err).To(HaveOccurred())
	Expect(string(outB)).To(ContainSubstring("FAIL: a delivery signed with the test provider's key was answered 401"))
}
