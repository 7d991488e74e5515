package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
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
})
