package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// operator is the manager binary running as its own OS process — controllers and
// receiver, exactly as deployed — so its memory is its own and not the benchmark's.
type operator struct {
	cmd         *exec.Cmd
	bin         string        // the manager binary (for go tool pprof)
	done        chan struct{} // closed when the process has exited
	waitErr     error         // its exit status, once done is closed
	ReceiverURL string
	MetricsURL  string
	PprofURL    string
	LogPath     string
}

// buildManager compiles ./cmd into dir.
func buildManager(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "manager")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd")
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd: %w\n%s", err, out)
	}
	return bin, nil
}

// freePort asks the kernel for a free loopback port. Another process could take it
// before the manager binds it; the manager then fails to start and says so.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startOperator writes a kubeconfig for a system:masters user of env and starts the
// manager with it, its endpoints on free loopback ports and its log in dir as
// <name>.log; extraEnv is added to the benchmark's environment.
func startOperator(ctx context.Context, env *envtest.Environment, bin, dir, name string, extraArgs, extraEnv []string) (*operator, error) {
	user, err := env.AddUser(envtest.User{Name: "settlement-operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("provision the manager's user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig for the manager: %w", err)
	}
	kcPath := filepath.Join(dir, name+".kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	var addrs [4]string
	for i := range addrs {
		if addrs[i], err = freePort(); err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
	}
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	// Plain-HTTP metrics on loopback (the benchmark scrapes them as a local process).
	// The benchmark's senders all dial from loopback but stand for many senders, so the
	// per-address limit (docs/design.md §15) is set where it never binds.
	args := append([]string{"--kubeconfig", kcPath, "--metrics-bind-address", addrs[0], "--metrics-secure=false",
		"--health-probe-bind-address", addrs[1], "--receiver-bind-address", addrs[2], "--pprof-bind-address", addrs[3],
		"--receiver-max-unauthenticated-per-address=1024"}, extraArgs...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The manager dies with the benchmark, even if the benchmark is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start the manager: %w", err)
	}
	op := &operator{cmd: cmd, bin: bin, done: make(chan struct{}), ReceiverURL: "http://" + addrs[2],
		MetricsURL: "http://" + addrs[0] + "/metrics", PprofURL: "http://" + addrs[3], LogPath: logPath}
	go func() {
		op.waitErr = cmd.Wait()
		_ = logFile.Close()
		close(op.done)
	}()

	// Ready when the probe endpoint answers (the manager has started its runnables).
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := op.exited(); err != nil {
			return nil, err
		}
		resp, err := http.Get("http://" + addrs[1] + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return op, nil
			}
		}
		if time.Now().After(deadline) {
			op.stop()
			return nil, fmt.Errorf("the manager was not ready after 60s; see %s", logPath)
		}
		select {
		case <-ctx.Done():
			op.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Pid is the manager's process ID.
func (o *operator) Pid() int { return o.cmd.Process.Pid }

// stop asks the manager to shut down (SIGTERM) and kills it after 30s.
func (o *operator) stop() {
	if o.exited() != nil {
		return
	}
	_ = o.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-o.done:
	case <-time.After(30 * time.Second):
		_ = o.cmd.Process.Kill()
		<-o.done
	}
}

// exited reports an early exit of the manager, so a phase fails fast with its log.
func (o *operator) exited() error {
	select {
	case <-o.done:
		err := o.waitErr
		if err == nil {
			err = errors.New("exit status 0")
		}
		return fmt.Errorf("the manager exited (%v); see %s", err, o.LogPath)
	default:
		return nil
	}
}

// revision names the commit the working tree is at, "-dirty" with local changes.
func revision(ctx context.Context) string {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = testenv.RepoRoot()
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	rev, err := git("rev-parse", "--short=12", "HEAD")
	if err != nil {
		return "unknown"
	}
	if st, err := git("status", "--porcelain", "--untracked-files=no"); err == nil && st != "" {
		rev += "-dirty"
	}
	return rev
}
