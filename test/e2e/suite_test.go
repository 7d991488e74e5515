//go:build e2e

// Package e2e runs the operator as real OS processes — two manager replicas with
// leader election — against a local control plane, with the fake billing provider and
// job sink, and checks the exactly-once invariants after every scenario.
//
//	make test-e2e            (E2E_SOAK=5m for the full soak; CI runs a short one)
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fakejobsink"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

const (
	ns           = "e2e"
	leaderNS     = "e2e-system"
	billingToken = "e2e-billing-token"
	swhSecret    = fixtures.StandardWebhooksSecret
)

var (
	env        *envtest.Environment
	k8s        client.Client
	ctx        context.Context
	cancel     context.CancelFunc
	billing    *fakebilling.Server
	sink       *fakejobsink.Server
	workDir    string
	managerBin string
	kubeconfig string

	replicasMu sync.Mutex
	replicas   []*replica
	restarted  *exec.Cmd // a kube-apiserver re-executed by the restart scenario
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(2 * time.Minute)
	SetDefaultEventuallyPollingInterval(250 * time.Millisecond)
	RunSpecs(t, "End-to-end suite (real processes)")
}

var _ = BeforeSuite(func() {
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	workDir, err = os.MkdirTemp("", "settlement-e2e-")
	Expect(err).NotTo(HaveOccurred())

	By("building the manager binary")
	managerBin = filepath.Join(workDir, "manager")
	build := exec.Command("go", "build", "-o", managerBin, "./cmd")
	build.Dir = testenv.RepoRoot()
	build.Stdout, build.Stderr = GinkgoWriter, GinkgoWriter
	Expect(build.Run()).To(Succeed())

	By("starting the control plane")
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err := env.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	admin, err := env.AddUser(envtest.User{Name: "e2e-operator", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kc, err := admin.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	kubeconfig = filepath.Join(workDir, "kubeconfig")
	Expect(os.WriteFile(kubeconfig, kc, 0o600)).To(Succeed())

	By("starting the fake billing provider and job sink")
	billing, err = fakebilling.Start(fakebilling.Options{Token: billingToken})
	Expect(err).NotTo(HaveOccurred())
	sink, err = fakejobsink.Start(fakejobsink.Options{})
	Expect(err).NotTo(HaveOccurred())

	By("configuring a tenant")
	for _, n := range []string{ns, leaderNS} {
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})).To(Succeed())
	}
	for _, sec := range fixtures.Secrets(ns, billingToken, billing.URL()) {
		Expect(k8s.Create(ctx, sec)).To(Succeed())
	}
	bp := fixtures.BillingProvider(ns, billing.URL())
	bp.Spec.Retry = &hooksv1alpha1.RetryPolicy{MaxAttempts: 200, MaxElapsed: fixtures.Duration(10 * time.Minute),
		InitialBackoff: fixtures.Duration(200 * time.Millisecond), MaxBackoff: fixtures.Duration(2 * time.Second)}
	bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{Interval: fixtures.Duration(20 * time.Second),
		StuckAfter: fixtures.Duration(time.Minute), EventStaleAfter: fixtures.Duration(2 * time.Minute), KeepReports: 5}
	Expect(k8s.Create(ctx, bp)).To(Succeed())
	wp := fixtures.WebhookProvider(ns)
	wp.Spec.Routes[0].Operations[0].JobCompletion.Sink = &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP, URL: sink.URL(), AllowInsecureHTTP: true}
	Expect(k8s.Create(ctx, wp)).To(Succeed())

	By("starting two manager replicas with leader election")
	startReplica()
	startReplica()
	Eventually(leader).ShouldNot(BeNil())
})

var _ = AfterSuite(func() {
	replicasMu.Lock()
	for _, r := range replicas {
		r.kill()
	}
	replicasMu.Unlock()
	if restarted != nil && restarted.Process != nil {
		_ = restarted.Process.Kill()
		_, _ = restarted.Process.Wait()
	}
	if billing != nil {
		_ = billing.Close()
	}
	if sink != nil {
		_ = sink.Close()
	}
	if cancel != nil {
		cancel()
	}
	if env != nil {
		_ = testenv.SignalAPIServer(env, syscall.SIGCONT)
		Expect(env.Stop()).To(Succeed())
	}
	if workDir != "" {
		_ = os.RemoveAll(workDir)
	}
})

// replica is one manager OS process.
type replica struct {
	name        string
	cmd         *exec.Cmd
	receiverURL string
	metricsURL  string
	probeURL    string
	logPath     string
	// readyAfter is how long the process took from exec to its first readyz 200.
	readyAfter time.Duration
	done       chan struct{}
}

func freePort() string {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().String()
}

var replicaCount int

// startReplica starts a manager process with the suite's flags followed by extra
// (a flag given again in extra wins), waits until its readyz answers 200 (a minute at
// most), and only then adds it to the live replicas senders post to. Several may be
// started at once.
func startReplica(extra ...string) *replica {
	GinkgoHelper()
	replicasMu.Lock()
	replicaCount++
	n := replicaCount
	replicasMu.Unlock()
	recvAddr, metricsAddr, probeAddr := freePort(), freePort(), freePort()
	r := &replica{name: fmt.Sprintf("manager-%d", n), receiverURL: "http://" + recvAddr,
		metricsURL: "http://" + metricsAddr + "/metrics", probeURL: "http://" + probeAddr + "/readyz", done: make(chan struct{})}
	args := append([]string{"--kubeconfig", kubeconfig, "--leader-elect", "--leader-election-namespace", leaderNS,
		// Plain-HTTP metrics on loopback: the suite reads them (leader gauge, archive
		// metrics) as a local process; test/deploy covers the authenticated default.
		"--receiver-bind-address", recvAddr, "--metrics-bind-address", metricsAddr, "--metrics-secure=false",
		"--health-probe-bind-address", probeAddr,
		"--max-concurrent-reconciles", "4"}, extra...)
	r.cmd = exec.Command(managerBin, args...)
	r.logPath = filepath.Join(workDir, r.name+".log")
	logFile, err := os.Create(r.logPath)
	Expect(err).NotTo(HaveOccurred())
	r.cmd.Stdout, r.cmd.Stderr = logFile, logFile
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	started := time.Now()
	Expect(r.cmd.Start()).To(Succeed())
	go func() {
		_ = r.cmd.Wait()
		_ = logFile.Close()
		close(r.done)
	}()
	ready := false
	defer func() {
		if !ready {
			r.kill() // never leave a process behind a failed start
		}
	}()
	Eventually(func() error {
		resp, err := http.Get(r.probeURL)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	}).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).Should(Succeed(), "replica %s ready (log: %s)", r.name, r.logPath)
	r.readyAfter = time.Since(started)
	ready = true
	replicasMu.Lock()
	replicas = append(replicas, r)
	replicasMu.Unlock()
	return r
}

// stop ends the replica as Kubernetes does: SIGTERM (it releases its lease and
// answers in-flight deliveries), then SIGKILL after the Deployment's 30s grace period.
func (r *replica) stop() {
	if r.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		r.kill()
	}
}

// kill ends the replica with SIGKILL: no graceful shutdown, no lease release.
func (r *replica) kill() {
	if r.cmd.Process != nil {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-r.done
}

func (r *replica) alive() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// isLeader reads the replica's leader-election gauge from its metrics endpoint.
func (r *replica) isLeader() bool {
	resp, err := http.Get(r.metricsURL)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "leader_election_master_status") && strings.HasSuffix(line, " 1") {
			return true
		}
	}
	return false
}

func leader() *replica {
	replicasMu.Lock()
	defer replicasMu.Unlock()
	for _, r := range replicas {
		if r.alive() && r.isLeader() {
			return r
		}
	}
	return nil
}

func liveReplicas() []*replica {
	replicasMu.Lock()
	defer replicasMu.Unlock()
	var out []*replica
	for _, r := range replicas {
		if r.alive() {
			out = append(out, r)
		}
	}
	return out
}
