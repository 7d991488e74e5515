//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

var _ = Describe("the failure matrix on real processes (docs/design.md §9)", Ordered, func() {
	It("turns 50 concurrent duplicates across both replicas into one event and one charge", func() {
		r := newRun()
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				Expect(r.deliver("msg_dup", "dup-1", 1, jobEvent("dup-1", 1, 5), time.Minute)).To(Equal(http.StatusOK))
			}()
		}
		wg.Wait()
		r.checkInvariants("duplicates")
		var evs hooksv1alpha1.WebhookEventList
		Expect(k8s.List(ctx, &evs, client.InNamespace(ns), client.MatchingLabels{hooksv1alpha1.LabelProvider: "inference"})).To(Succeed())
		n := 0
		for _, e := range evs.Items {
			if e.Spec.EventID == "msg_dup" {
				n++
			}
		}
		Expect(n).To(Equal(1))
	})

	It("keeps jobs applied while billing fails and charges once when it recovers", func() {
		r := newRun()
		billing.FailNext(8, http.StatusServiceUnavailable)
		r.burst("billfail", 5, 5, nil)
		r.checkInvariants("billing fails")
	})

	It("learns lost responses by key: no second charge", func() {
		r := newRun()
		billing.CommitThenTimeoutNext(3)
		r.burst("lost", 3, 3, nil)
		r.checkInvariants("response lost")
	})

	It("never moves a job backward when v2 arrives before v1", func() {
		r := newRun()
		Expect(r.deliver("msg_ooo_v2", "ooo-1", 2, jobEvent("ooo-1", 2, 2), time.Minute)).To(Equal(http.StatusOK))
		Expect(r.deliver("msg_ooo_v1", "ooo-1", 1, jobEvent("ooo-1", 1, 1), time.Minute)).To(Equal(http.StatusOK))
		r.checkInvariants("out of order")
	})

	It("answers a reused event ID with another payload 409 and lets it do nothing", func() {
		r := newRun()
		Expect(r.deliver("msg_reuse", "reuse-1", 1, jobEvent("reuse-1", 1, 1), time.Minute)).To(Equal(http.StatusOK))
		Expect(r.deliver("msg_reuse", "reuse-x", 1, jobEvent("reuse-x", 1, 9), time.Minute)).To(Equal(http.StatusConflict))
		r.checkInvariants("conflicting reuse")
		Expect(billing.Charges(identity.JobSettlementKey(ns, "inference", "reuse-x"))).To(Equal(0))
	})

	It("acknowledges nothing while the API server is frozen, and everything after", func() {
		r := newRun()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			r.burst("frozen", 12, 4, nil)
		}()
		time.Sleep(300 * time.Millisecond)
		Expect(testenv.SignalAPIServer(env, syscall.SIGSTOP)).To(Succeed())
		time.Sleep(5 * time.Second)
		Expect(testenv.SignalAPIServer(env, syscall.SIGCONT)).To(Succeed())
		wg.Wait()
		for _, s := range sortedStatuses(r.statuses) {
			Expect(s).To(BeElementOf(http.StatusOK, http.StatusServiceUnavailable, http.StatusTooManyRequests),
				"senders see only 2xx, 503 or 429: %v", r.statuses)
		}
		r.checkInvariants("API server frozen")
	})

	It("dead-letters when the provider is down past maxElapsed; a replay settles with the same key", func() {
		short := fixtures.BillingProvider(ns, billing.URL())
		short.Name = "billing-short"
		short.Spec.Retry.MaxElapsed = fixtures.Duration(3 * time.Second)
		Expect(k8s.Create(ctx, short)).To(Succeed())
		wp := &hooksv1alpha1.WebhookProvider{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, wp)).To(Succeed())
		shortWP := &hooksv1alpha1.WebhookProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "short"}, Spec: *wp.Spec.DeepCopy()}
		shortWP.Spec.Routes[0].Operations[1].Settlement.BillingProviderRef = "billing-short"
		Expect(k8s.Create(ctx, shortWP)).To(Succeed())

		r := newRun()
		r.provider = "short"
		Expect(billing.SetDown(true)).To(Succeed())
		// The replicas' caches learn of the new provider within moments (404 until then).
		Eventually(func() int { return r.deliver("msg_dl", "dl-1", 1, jobEvent("dl-1", 1, 3), time.Minute) }).
			Should(Equal(http.StatusOK))
		name := identity.SettlementNameFor("short", identity.JobSettlementKey(ns, "short", "dl-1"))
		bs := &hooksv1alpha1.BillingSettlement{}
		Eventually(func() hooksv1alpha1.SettlementState {
			Expect(client.IgnoreNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, bs))).To(Succeed())
			return bs.Status.State
		}).Should(Equal(hooksv1alpha1.SettlementFailed))
		Expect(billing.SetDown(false)).To(Succeed())
		patch := client.MergeFrom(bs.DeepCopy())
		bs.Annotations = map[string]string{hooksv1alpha1.AnnotationReplay: "after-outage"}
		Expect(k8s.Patch(ctx, bs, patch)).To(Succeed())
		r.checkInvariants("dead-letter and replay")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), bs)).To(Succeed())
		Expect(bs.Status.Replay.Count).To(Equal(int32(1)))
	})
})

var _ = Describe("replica failure and API server restarts", Ordered, func() {
	It("survives kill -9 of the leader mid-burst: the other replica takes over, no double charge", func() {
		r := newRun()
		old := leader()
		Expect(old).NotTo(BeNil())
		var killed atomic.Bool
		killAt := 15 + rand.IntN(20)
		r.burst("leaderkill", 60, 6, func(i int) {
			if i >= killAt && killed.CompareAndSwap(false, true) {
				By(fmt.Sprintf("kill -9 the leader %s after %d deliveries", old.name, i))
				old.kill()
				startReplica()
			}
		})
		Eventually(func() *replica {
			l := leader()
			if l == old {
				return nil
			}
			return l
		}).ShouldNot(BeNil(), "a new leader")
		r.checkInvariants("leader killed")
	})

	It("keeps every 2xx event through an API server restart during a burst", func() {
		r := newRun()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			r.burst("apirestart", 40, 4, nil)
		}()
		time.Sleep(time.Second)
		By("restarting kube-apiserver")
		restartAPIServer()
		wg.Wait()
		for _, s := range sortedStatuses(r.statuses) {
			Expect(s).To(BeElementOf(http.StatusOK, http.StatusServiceUnavailable, http.StatusTooManyRequests),
				"senders see only 2xx, 503 or 429: %v", r.statuses)
		}
		r.checkInvariants("API server restarted")
	})
})

// restartAPIServer stops the control plane's kube-apiserver and starts it again with
// the same arguments, certificates and etcd: a real restart, not a pause.
func restartAPIServer() {
	GinkgoHelper()
	pid, err := testenv.APIServerPID(env)
	Expect(err).NotTo(HaveOccurred())
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	Expect(err).NotTo(HaveOccurred())
	environ, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	// A graceful stop first; kube-apiserver drains long-running requests (watches)
	// for a while, so after 15s it is killed — a crash is a restart too.
	Expect(syscall.Kill(pid, syscall.SIGTERM)).To(Succeed())
	gone := func() bool {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err != nil || strings.Contains(string(stat), ") Z ")
	}
	deadline := time.Now().Add(15 * time.Second)
	for !gone() && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if !gone() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	Eventually(gone).WithTimeout(30 * time.Second).Should(BeTrue())
	if restarted != nil && restarted.Process != nil {
		_, _ = restarted.Process.Wait()
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = strings.Split(strings.TrimRight(string(environ), "\x00"), "\x00")
	cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
	Expect(cmd.Start()).To(Succeed())
	restarted = cmd
	Eventually(func() error {
		return k8s.List(ctx, &hooksv1alpha1.WebhookProviderList{}, client.InNamespace(ns))
	}).WithTimeout(time.Minute).Should(Succeed())
}

var _ = Describe("soak", Ordered, func() {
	It("holds the invariants under random provider faults and duplicate, out-of-order deliveries", func() {
		length := 45 * time.Second
		if v := os.Getenv("E2E_SOAK"); v != "" {
			d, err := time.ParseDuration(v)
			Expect(err).NotTo(HaveOccurred())
			length = d
		}
		By(fmt.Sprintf("soaking for %s", length))
		r := newRun()
		end := time.Now().Add(length)
		var wg sync.WaitGroup
		var sent atomic.Int64
		for s := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				rng := rand.New(rand.NewPCG(uint64(s), uint64(time.Now().UnixNano())))
				for time.Now().Before(end) {
					n := int(sent.Add(1))
					job := fmt.Sprintf("soak-%d", rng.IntN(max(n/2, 1)))
					version := 1 + rng.IntN(3)
					// The event ID names the fact (job, version): a resend of the same fact
					// is a duplicate, a lower version after a higher one is out of order.
					id := fmt.Sprintf("msg_%s_v%d", job, version)
					status := r.deliver(id, job, version, jobEvent(job, version, 10), time.Minute)
					Expect(status).To(Equal(http.StatusOK))
					time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			rng := rand.New(rand.NewPCG(99, uint64(time.Now().UnixNano())))
			for time.Now().Before(end) {
				switch rng.IntN(6) {
				case 0:
					billing.FailNext(1+rng.IntN(4), http.StatusBadGateway)
				case 1:
					billing.RateLimitNext(1+rng.IntN(3), time.Second)
				case 2:
					billing.CommitThenTimeoutNext(1)
				case 3:
					billing.SlowNext(2, 500*time.Millisecond)
				case 4:
					Expect(billing.SetDown(true)).To(Succeed())
					time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
					Expect(billing.SetDown(false)).To(Succeed())
				}
				time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
			}
		}()
		wg.Wait()
		Expect(billing.SetDown(false)).To(Succeed())
		r.checkInvariants(fmt.Sprintf("soak %s (%d deliveries)", length, sent.Load()))
	})
})
