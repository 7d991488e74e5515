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

	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// What a release of the chart needs beyond installing the same objects as the
// installer: a pinned version and a `helm lint --strict` that passes.

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
		// The same run refuses what helm install would refuse.
		Expect(helmLint(map[string]any{"replicas": "two"})).To(ContainElement(ContainSubstring("replicas")))
		Expect(helmLint(map[string]any{"metrics": map[string]any{"servicemonitor": map[string]any{"enabled": true}}})).
			To(ContainElement(ContainSubstring("servicemonitor")))
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
