package receiver

import (
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/settlement-operator/settlement-operator/test/sender"
)

var _ = Describe("before authentication: one client's slow bodies never refuse another's deliveries", func() {
	It("accepts a signed delivery from 127.0.0.1 while 127.0.0.2 holds 36 slow bodies at the same provider", func() {
		ns := newNamespace()
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})

		const (
			bodyTimeout = 6 * time.Second
			n           = 36 // more than the provider's 16 and the namespace's 32 default slots
		)
		// Default limits; a body deadline (and so a request deadline) long enough that
		// the flood is still held when the signed delivery arrives on a loaded machine.
		_, addr := startReceiver(Options{BodyReadTimeout: bodyTimeout, RequestTimeout: bodyTimeout}, k8s, k8s)
		path := EndpointPath(ns, "inference")

		var conns []*slowConn
		start := time.Now()
		for i := range n {
			conns = append(conns, openSlowFrom("127.0.0.2", addr, path, i%2 == 0))
		}
		DeferCleanup(func() {
			for _, c := range conns {
				_ = c.conn.Close()
			}
		})
		answered := func() int {
			k := 0
			for _, c := range conns {
				if c.status() != 0 {
					k++
				}
			}
			return k
		}
		// The receiver has taken in the flood: whatever it holds, it refused the rest.
		Eventually(answered).WithTimeout(bodyTimeout / 2).Should(BeNumerically(">", 0))

		resp, err := sender.Send(ctx, nil, sender.Delivery{URL: "http://" + addr + path, Signature: swh,
			Secret: []byte(swhSecret), ID: "msg_from_the_real_sender", Body: []byte(completedV2)})
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(http.StatusOK), resp.Body)
		Expect(time.Since(start)).To(BeNumerically("<", bodyTimeout), "the flood was still held")

		// The slow client got the per-address refusal for its extra connections, and the
		// ones admitted are cut at the body deadline.
		counts := map[int]int{}
		for _, c := range conns {
			Eventually(c.closed).WithTimeout(bodyTimeout+10*time.Second).Should(BeClosed(), c.answer())
			counts[c.status()]++
		}
		Expect(counts).To(Equal(map[int]int{
			http.StatusRequestTimeout:  DefaultMaxUnauthenticatedPerAddress,
			http.StatusTooManyRequests: n - DefaultMaxUnauthenticatedPerAddress,
		}))
		for _, c := range conns {
			if c.status() == http.StatusTooManyRequests {
				Expect(c.answer()).To(ContainSubstring(`"error":"` + OutcomeBusyAddress + `"`))
				Expect(c.answer()).To(ContainSubstring("Retry-After: 1"))
			}
		}
		Expect(time.Since(start)).To(BeNumerically(">=", bodyTimeout), "the admitted ones were held until the deadline")
		Expect(listEvents(ns)).To(HaveLen(1))
	})

	It("answers within the shortest sender timeout (5s) even when the API server does not answer", func() {
		ns := newNamespace()
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})
		// Default deadlines: the budget is the defaults' promise.
		_, addr := startReceiver(Options{}, k8s, k8s)
		deliver := deliverer(addr, ns)
		// The signing Secret is cached, so the frozen API server is met at the create.
		Expect(deliver("msg_budget_warm").Status).To(Equal(http.StatusOK))
		Expect(signalAPIServer(syscall.SIGSTOP)).To(Succeed())
		stopped := true
		defer func() {
			if stopped {
				_ = signalAPIServer(syscall.SIGCONT)
			}
		}()
		start := time.Now()
		resp := deliver("msg_budget")
		took := time.Since(start)
		Expect(signalAPIServer(syscall.SIGCONT)).To(Succeed())
		stopped = false
		Expect(resp.Status).To(Equal(http.StatusServiceUnavailable), resp.Body)
		Expect(took).To(BeNumerically("<", 5*time.Second), "EventBridge would have given up and retried already")
	})

	It("cuts a client that trickles its headers at 2s, holding nothing", func() {
		_, addr := startReceiver(Options{}, k8s, k8s)
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
		c, err := d.Dial("tcp", addr)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		start := time.Now()
		_, err = c.Write([]byte("POST /webhooks/a/b HTTP/1.1\r\nHost: receiver\r\nContent-Type: app"))
		Expect(err).NotTo(HaveOccurred())
		Expect(c.SetReadDeadline(time.Now().Add(10 * time.Second))).To(Succeed())
		_, err = io.Copy(io.Discard, c)
		Expect(err).NotTo(HaveOccurred(), "the server closed the connection (not our read deadline)")
		Expect(time.Since(start)).To(And(BeNumerically(">=", 1500*time.Millisecond), BeNumerically("<", 3500*time.Millisecond)))
	})
})
