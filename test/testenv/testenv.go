// Package testenv starts a real control plane (etcd + kube-apiserver from envtest)
// with this project's CRDs installed, for the integration suites.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

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

// APIServerPID finds the process of env's kube-apiserver, so a suite can freeze
// (SIGSTOP), resume (SIGCONT) or restart it to test outages. It is the kube-apiserver
// that holds the listening socket of env's secure port: a command line naming the
// port is not proof, because an API server of another suite that is still shutting
// down may have been started with the same port (its listener closed first, and the
// port was handed out again).
func APIServerPID(env *envtest.Environment) (int, error) {
	if env == nil || env.ControlPlane.APIServer == nil || env.ControlPlane.APIServer.SecureServing.Port == "" {
		return 0, fmt.Errorf("the environment has no running API server")
	}
	port := env.ControlPlane.APIServer.SecureServing.Port
	sockets, err := listeningSockets(port)
	if err != nil {
		return 0, err
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.HasSuffix(args[0], "kube-apiserver") || !slices.Contains(args, "--secure-port="+port) {
			continue
		}
		dir := filepath.Dir(p)
		fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && sockets[link] {
				return strconv.Atoi(filepath.Base(dir))
			}
		}
	}
	return 0, fmt.Errorf("no kube-apiserver process listens on port %s", port)
}

// listeningSockets returns the sockets ("socket:[inode]", as /proc/PID/fd links name
// them) listening on TCP port port, IPv4 or IPv6.
func listeningSockets(port string) (map[string]bool, error) {
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", port, err)
	}
	suffix := fmt.Sprintf(":%04X", n)
	found := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) > 9 && strings.HasSuffix(f[1], suffix) && f[3] == "0A" {
				found["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("nothing listens on port %s", port)
	}
	return found, nil
}

// SignalAPIServer sends sig to env's kube-apiserver. SIGSTOP freezes it (requests
// hang, then time out: the hardest outage for a client); SIGCONT resumes it with its
// state, certificates and port intact. It returns once every thread of the process
// is stopped (SIGSTOP) or running again (SIGCONT): a stop is carried out by each
// thread when it is next scheduled, which on a loaded machine is not at once, and a
// test that sends its request in between would see it answered.
func SignalAPIServer(env *envtest.Environment, sig syscall.Signal) error {
	pid, err := APIServerPID(env)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	if sig != syscall.SIGSTOP && sig != syscall.SIGCONT {
		return nil
	}
	want := sig == syscall.SIGSTOP
	deadline := time.Now().Add(30 * time.Second)
	for {
		stopped, err := allThreadsStopped(pid)
		if err != nil || stopped == want {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver (pid %d) did not %s within 30s", pid, map[bool]string{true: "stop", false: "resume"}[want])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// allThreadsStopped reports whether every thread of pid is in the stopped state (T),
// or, when false, that at least one is not.
func allThreadsStopped(pid int) (bool, error) {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false, fmt.Errorf("kube-apiserver (pid %d) has no threads to read: %v", pid, err)
	}
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue // a thread that just exited
		}
		// "tid (comm) S ...": the state follows the last parenthesis (comm may hold any).
		// T is stopped, t stopped by a tracer; a thread that exited (Z, X) holds nothing.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			continue
		}
		if len(f) == 0 || (f[0] != "T" && f[0] != "t") {
			return false, nil
		}
	}
	return true, nil
}
