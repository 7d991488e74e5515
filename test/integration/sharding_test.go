package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/receiver"
	"github.com/settlement-operator/settlement-operator/internal/sharding"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

var _ = Describe("--watch-namespaces", func() {
	It("parses a list into the cache's namespaces, empty meaning all", func() {
		Expect(sharding.WatchedNamespaces("")).To(BeNil())
		Expect(sharding.WatchedNamespaces(" a, b ,,")).To(HaveLen(2))
		Expect(sharding.WatchedNamespaces("a,b")).To(HaveKey("b"))
	})

	It("serves only its own namespaces: another tenant's webhooks are refused as misrouted, never acknowledged", func() {
		mine, theirs := newTenant(), newTenant()
		m, err := ctrl.NewManager(cfg, ctrl.Options{
			Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
			Controller: config.Controller{SkipNameValidation: ptr.To(true)},
			Cache:      cache.Options{DefaultNamespaces: sharding.WatchedNamespaces(mine)},
		})
		Expect(err).NotTo(HaveOccurred())
		recv := receiver.New(receiver.Options{BindAddress: "127.0.0.1:0", SecretTTL: time.Second,
			Namespaces: map[string]bool{mine: true}}, m.GetCache(),
			m.GetClient(), m.GetAPIReader(), m.GetEventRecorder("receiver"))
		Expect(receiver.WarmCache(ctx, m.GetCache())).To(Succeed())
		Expect(m.Add(recv)).To(Succeed())
		mctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			Expect(m.Start(mctx)).To(Succeed())
		}()
		DeferCleanup(func() { stop(); Eventually(done).Should(BeClosed()) })
		addr, err := recv.Addr(ctx)
		Expect(err).NotTo(HaveOccurred())
		deliver := func(ns, id string) sender.Response {
			r, err := sender.Send(ctx, nil, sender.Delivery{
				URL: "http://" + addr.String() + identity.EndpointPath(ns, "inference"), ID: id,
				Body:      []byte(jobEvent(fmt.Sprintf("job-%s", id), 1, 1)),
				Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks}, Secret: []byte(swhSecret),
			})
			Expect(err).NotTo(HaveOccurred())
			return r
		}
		Eventually(func() int { return deliver(mine, "msg-shard-mine").Status }).Should(Equal(http.StatusOK))
		// Misrouted: retried by the sender (never a 4xx that could make it give up), and named.
		r := deliver(theirs, "msg-shard-theirs")
		Expect(r.Status).To(Equal(http.StatusServiceUnavailable))
		Expect(string(r.Body)).To(ContainSubstring("not served by this deployment"))
	})

	It("refuses a second deployment whose namespaces overlap the first's, and one serving all namespaces beside it", func() {
		a, b, c, home := newTenant(), newTenant(), newTenant(), newTenant()
		claim := func(id string, namespaces ...string) *sharding.Claim {
			return &sharding.Claim{Client: k8s, Reader: k8s, Identity: id, Namespaces: namespaces, Home: home,
				Duration: 3 * time.Second}
		}
		first := claim(home+"/first", a, b)
		Expect(first.Acquire(ctx)).To(Succeed())
		Expect(first.Acquire(ctx)).To(Succeed(), "its own claims are renewed, not refused")

		err := claim(home+"/second", b, c).Acquire(ctx)
		Expect(err).To(MatchError(sharding.ErrOverlap))
		Expect(err.Error()).To(ContainSubstring(b + " (held by " + home + "/first)"))
		Expect(err.Error()).NotTo(ContainSubstring(a + " (held"))
		var lease coordinationv1.Lease
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: c, Name: sharding.LeaseName}, &lease))).
			To(BeTrue(), "the refused deployment claims nothing")

		Expect(claim(home+"/all").Acquire(ctx)).To(MatchError(sharding.ErrOverlap), "all namespaces overlap with everything")
		Expect(claim(home+"/third", c).Acquire(ctx)).To(Succeed(), "disjoint namespaces do not overlap")
		Expect(claim(home+"/fifth", "not-created-yet").Acquire(ctx)).To(Succeed(), "a namespace that does not exist is claimed once it does")
		Expect(claim(home+"/fourth", home).Acquire(ctx)).To(Succeed())

		// The first stops without renewing: its claims lapse, and the second may start.
		Eventually(func() error { return claim(home+"/second", b).Acquire(ctx) }).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: b, Name: sharding.LeaseName}, &lease)).To(Succeed())
		Expect(*lease.Spec.HolderIdentity).To(Equal(home + "/second"))

		// A deployment serving all namespaces refuses every other, and is refused by them.
		Eventually(func() error { return claim(home+"/fourth", home).Acquire(ctx) }).Should(Succeed()) // still live
		Expect(claim(home + "/all").Acquire(ctx)).To(MatchError(ContainSubstring(home + " (held by " + home + "/fourth)")))
	})

	It("stops a running manager whose claim another deployment took", func() {
		ns, home := newTenant(), newTenant()
		m, err := ctrl.NewManager(cfg, ctrl.Options{
			Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
			Controller: config.Controller{SkipNameValidation: ptr.To(true)},
			Cache:      cache.Options{DefaultNamespaces: sharding.WatchedNamespaces(ns)},
		})
		Expect(err).NotTo(HaveOccurred())
		mine := &sharding.Claim{Client: m.GetClient(), Reader: m.GetAPIReader(), Identity: home + "/mine",
			Namespaces: []string{ns}, Home: home, Duration: 3 * time.Second}
		Expect(mine.Acquire(ctx)).To(Succeed())
		Expect(m.Add(mine)).To(Succeed())
		// Another deployment's claim replaces it, as if ours had lapsed.
		var lease coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: sharding.LeaseName}, &lease)).To(Succeed())
		lease.Spec.HolderIdentity = ptr.To(home + "/other")
		Expect(k8s.Update(ctx, &lease)).To(Succeed())
		done := make(chan error, 1)
		go func() { done <- m.Start(ctx) }()
		var stopped error
		Eventually(done).WithTimeout(20 * time.Second).Should(Receive(&stopped))
		Expect(stopped).To(MatchError(sharding.ErrOverlap))
	})

	It("starts while a namespace it serves is being deleted (creates there are refused)", func() {
		ns, home := newTenant(), newTenant()
		// Without a namespace controller (envtest) a deleted namespace stays Terminating,
		// as one does in a cluster while settlements still hold their finalizers.
		Expect(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Eventually(func() bool {
			var n corev1.Namespace
			Expect(k8s.Get(ctx, client.ObjectKey{Name: ns}, &n)).To(Succeed())
			return !n.DeletionTimestamp.IsZero()
		}).Should(BeTrue())
		restarted := &sharding.Claim{Client: k8s, Reader: k8s, Identity: home + "/restarted", Namespaces: []string{ns}, Home: home}
		Expect(restarted.Acquire(ctx)).To(Succeed(), "a Terminating namespace refuses the claim's create: nothing to claim there, and no reason to stop every other tenant")
	})

	It("stops a running manager whose namespace, created after it started, an all-namespaces deployment serves", func() {
		ns, home := fmt.Sprintf("claimed-later-%d", time.Now().UnixNano()), newTenant()
		m, err := ctrl.NewManager(cfg, ctrl.Options{
			Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
			Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		})
		Expect(err).NotTo(HaveOccurred())
		later := &sharding.Claim{Client: m.GetClient(), Reader: m.GetAPIReader(), Identity: home + "/later",
			Namespaces: []string{ns}, Home: home, Duration: 3 * time.Second}
		Expect(later.Acquire(ctx)).To(Succeed(), "its namespace does not exist yet")
		all := &sharding.Claim{Client: k8s, Reader: k8s, Identity: home + "/all", Home: home, Duration: time.Minute}
		// Once the short claims of the specs before this one have lapsed.
		Eventually(func() error { return all.Acquire(ctx) }).WithTimeout(30*time.Second).Should(Succeed(), "nothing is claimed yet")
		DeferCleanup(func() { // its live claim would overlap every other spec's
			Expect(k8s.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: sharding.LeaseName}})).To(Succeed())
		})
		Expect(m.Add(later)).To(Succeed())
		done := make(chan error, 1)
		go func() { done <- m.Start(ctx) }()
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		var stopped error
		Eventually(done).WithTimeout(20*time.Second).Should(Receive(&stopped), "two deployments would serve "+ns)
		Expect(stopped).To(MatchError(sharding.ErrOverlap))
	})

	It("releases its claims on a clean shutdown: the namespace may be served by another at once", func() {
		ns, home := newTenant(), newTenant()
		m, err := ctrl.NewManager(cfg, ctrl.Options{
			Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
			Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		})
		Expect(err).NotTo(HaveOccurred())
		mine := &sharding.Claim{Client: m.GetClient(), Reader: m.GetAPIReader(), Identity: home + "/leaving",
			Namespaces: []string{ns}, Home: home, Duration: time.Minute}
		Expect(mine.Acquire(ctx)).To(Succeed())
		Expect(m.Add(mine)).To(Succeed())
		mctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Start(mctx) }()
		next := &sharding.Claim{Client: k8s, Reader: k8s, Identity: home + "/next", Namespaces: []string{ns}, Home: home}
		Consistently(func() error { return next.Acquire(ctx) }).WithTimeout(2 * time.Second).Should(MatchError(sharding.ErrOverlap))
		stop()
		Eventually(done).Should(Receive(BeNil()))
		Expect(next.Acquire(ctx)).To(Succeed())
	})
})
