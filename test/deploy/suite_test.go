package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The deploy suite checks what a platform team installs: the one-file installer that
// `make build-installer` writes (kustomize build config/default), applied with
// `kubectl apply --server-side` as the README says, to a bare control plane (no CRDs
// preinstalled). Then it runs the manager binary as the Deployment's ServiceAccount
// (impersonated: envtest has no kubelet to mount a token), so any missing permission in
// the shipped RBAC fails a test instead of a production rollout.

var (
	env        *envtest.Environment
	cfg        *rest.Config
	k8s        client.Client
	ctx        context.Context
	cancel     context.CancelFunc
	workDir    string
	adminKC    string // admin kubeconfig, for kubectl
	kubectlBin string
	kustomize  string
	install    string                       // path of the rendered installer
	objects    []*unstructured.Unstructured // its objects, in file order
	managerBin string
)

func TestDeploy(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(60 * time.Second)
	SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	RunSpecs(t, "Deploy suite")
}

var _ = BeforeSuite(func() {
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	workDir, err = os.MkdirTemp("", "deploy-suite-")
	Expect(err).NotTo(HaveOccurred())

	kustomize, err = findKustomize()
	Expect(err).NotTo(HaveOccurred())
	install = filepath.Join(workDir, "install.yaml")
	rendered := run(kustomize, "build", filepath.Join(testenv.RepoRoot(), "config", "default"))
	Expect(os.WriteFile(install, []byte(rendered), 0o600)).To(Succeed())
	objects = decodeAll(rendered)

	// A bare control plane: the installer brings the CRDs, as it does in a cluster.
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	env.CRDDirectoryPaths, env.ErrorIfCRDPathMissing = nil, false
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())
	scheme := testenv.Scheme()
	Expect(apiextensionsv1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	adminKC = filepath.Join(workDir, "admin.kubeconfig")
	Expect(testenv.WriteKubeconfig(adminKC, cfg, "envtest-admin", "")).To(Succeed())
	kubectlBin = filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")

	managerBin, err = gexec.Build("github.com/settlement-operator/settlement-operator/cmd")
	Expect(err).NotTo(HaveOccurred(), "build the manager")
})

var _ = AfterSuite(func() {
	gexec.KillAndWait(30 * time.Second)
	gexec.CleanupBuildArtifacts()
	if cancel != nil {
		cancel()
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
	if workDir != "" {
		_ = os.RemoveAll(workDir)
	}
})

// findKustomize returns the kustomize the Makefile installs: $KUSTOMIZE (set by
// `make test`), else the newest bin/kustomize-* of the checkout.
func findKustomize() (string, error) {
	if k := os.Getenv("KUSTOMIZE"); k != "" {
		return k, nil
	}
	matches, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "bin", "kustomize-*"))
	if len(matches) > 0 {
		return matches[len(matches)-1], nil
	}
	return "", errors.New("kustomize not found: run the suite with `make test` (it installs bin/kustomize-<version>), or set KUSTOMIZE")
}

// run executes a command and returns its stdout; a non-zero exit fails the spec with
// the command's stderr.
func run(name string, args ...string) string {
	GinkgoHelper()
	out, errOut, err := runE(name, args...)
	Expect(err).NotTo(HaveOccurred(), "%s %s\n%s", filepath.Base(name), strings.Join(args, " "), errOut)
	return out
}

func runE(name string, args ...string) (string, string, error) {
	c, cancelRun := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelRun()
	cmd := exec.CommandContext(c, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// kubectl runs kubectl as the given kubeconfig's user.
func kubectl(kubeconfig string, args ...string) string {
	GinkgoHelper()
	return run(kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

func kubectlE(kubeconfig string, args ...string) (string, string, error) {
	return runE(kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

// decodeAll splits a multi-document YAML stream into objects.
func decodeAll(s string) []*unstructured.Unstructured {
	GinkgoHelper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// freeAddr returns a loopback address nobody listens on right now.
func freeAddr() string {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().String()
}

func objectKey(u *unstructured.Unstructured) string {
	return fmt.Sprintf("%s/%s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
}
