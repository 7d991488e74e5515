package receiver

import (
	"net/http"
	"net/http/httptest"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

// The request deadline covers every step (docs/design.md §4, "Time budget"): a sender
// with a 5 s timeout (EventBridge) must get an answer within it, even when the API
// server hangs during the first delivery's signing-Secret read.
var _ = Describe("the request deadline", func() {
	It("answers 503 within the request timeout while the signing Secret's read hangs", func() {
		ns := newNamespace()
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})
		// A receiver of its own, whose Secret cache is empty: its first delivery reads
		// the Secret. Each API call may take 30 s; the whole request 1 s.
		r := New(Options{RequestTimeout: time.Second, APITimeout: 30 * time.Second, RetryAfter: 3 * time.Second},
			mgrCache, k8s, k8s, nil)
		srv := httptest.NewServer(r.Handler())
		defer srv.Close()

		Expect(signalAPIServer(syscall.SIGSTOP)).To(Succeed())
		stopped := true
		defer func() {
			if stopped {
				_ = signalAPIServer(syscall.SIGCONT)
			}
		}()
		start := time.Now()
		resp, err := sender.Send(ctx, nil, sender.Delivery{URL: srv.URL + EndpointPath(ns, "inference"),
			Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks}, Secret: []byte(swhSecret),
			ID: "msg_budget", Body: []byte(completedV2)})
		elapsed := time.Since(start)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(http.StatusServiceUnavailable), resp.Body)
		// The bound is the request timeout (1 s); 4 s leaves room for a loaded machine
		// and is still far below the 30 s the Secret's read may take.
		Expect(elapsed).To(BeNumerically("<", 4*time.Second), "answered after %s", elapsed)

		Expect(signalAPIServer(syscall.SIGCONT)).To(Succeed())
		stopped = false
		// The shared read was not cut short by the delivery that gave up on it: once the
		// API server answers, the next delivery is accepted.
		Eventually(func() int {
			resp, err := sender.Send(ctx, nil, sender.Delivery{URL: srv.URL + EndpointPath(ns, "inference"),
				Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks}, Secret: []byte(swhSecret),
				ID: "msg_budget", Body: []byte(completedV2)})
			Expect(err).NotTo(HaveOccurred())
			return resp.Status
		}).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(Equal(http.StatusOK))
	})
})
