// Package testenv starts a real control plane (etcd + kube-apiserver from envtest)
// with this project's CRDs installed, for the integration suites.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// RepoRoot is the repository's top directory, found from this file's location so that
// suites work from any package directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Scheme holds the core kinds and this project's kinds.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(hooksv1alpha1.AddToScheme(s))
	return s
}

// New returns an Environment that loads the CRDs from config/crd/bases (a missing
// directory is an error, never a silently empty API). KUBEBUILDER_ASSETS must point at
// the control-plane binaries; `make test` sets it from hack/setup-envtest.sh.
func New() (*envtest.Environment, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, " +
			"or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	return &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                Scheme(),
	}, nil
}

// APIServerPID finds the process of env's kube-apiserver by its secure port, so a
// suite can freeze (SIGSTOP), resume (SIGCONT) or restart it to test outages.
func APIServerPID(env *envtest.Environment) (int, error) {
	if env == nil || env.ControlPlane.APIServer == nil || env.ControlPlane.APIServer.SecureServing.Port == "" {
		return 0, fmt.Errorf("the environment has no running API server")
	}
	port := env.ControlPlane.APIServer.SecureServing.Port
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.HasSuffix(args[0], "kube-apiserver") {
			continue
		}
		for _, a := range args {
			if a == "--secure-port="+port {
				return strconv.Atoi(strings.Split(p, "/")[2])
			}
		}
	}
	return 0, fmt.Errorf("no kube-apiserver process serves port %s", port)
}

// SignalAPIServer sends sig to env's kube-apiserver. SIGSTOP freezes it (requests
// hang, then time out: the hardest outage for a client); SIGCONT resumes it with its
// state, certificates and port intact.
func SignalAPIServer(env *envtest.Environment, sig syscall.Signal) error {
	pid, err := APIServerPID(env)
	if err != nil {
		return err
	}
	return syscall.Kill(pid, sig)
}
