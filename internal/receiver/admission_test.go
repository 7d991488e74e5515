package receiver

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

// countingArchive counts receipt lookups; it stands in for PostgreSQL only, never for
// Kubernetes, which stays real here.
type countingArchive struct{ calls atomic.Int64 }

func (a *countingArchive) Event(context.Context, string, string, string) (*archive.EventReceipt, error) {
	a.calls.Add(1)
	return nil, nil
}

// apiCounts wraps a real client and counts what the receiver asks of the API server.
type apiCounts struct {
	writes, secretGets atomic.Int64
}

func (n *apiCounts) client() client.WithWatch {
	direct, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	write := func() { n.writes.Add(1) }
	return interceptor.NewClient(direct, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				n.secretGets.Add(1)
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			write()
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			write()
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			write()
			return c.Patch(ctx, obj, p, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			write()
			return c.Delete(ctx, obj, opts...)
		},
	})
}

// startReceiver runs a receiver of its own on a real TCP port, so its limits and
// counters are not shared with other specs, and returns its address.
func startReceiver(opts Options, writer client.Writer, live client.Reader) (*Receiver, string) {
	GinkgoHelper()
	opts.BindAddress = "127.0.0.1:0"
	r := New(opts, mgrCache, writer, live, recv.recorder)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Start(rctx) }()
	DeferCleanup(func() {
		stop()
		Eventually(done).WithTimeout(30 * time.Second).Should(Receive(Succeed()))
	})
	addr, err := r.Addr(ctx)
	Expect(err).NotTo(HaveOccurred())
	return r, addr.String()
}

// slowConn is an unauthenticated client on its own TCP connection: it sends complete
// headers announcing a body, then a few bytes of it, and then either stalls or
// dribbles one byte every 200ms. Everything the server sends back is collected until
// the connection closes.
type slowConn struct {
	conn   net.Conn
	closed chan struct{}
	mu     sync.Mutex
	got    bytes.Buffer
}

func openSlow(addr, path string, dribble bool) *slowConn {
	GinkgoHelper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	Expect(err).NotTo(HaveOccurred())
	s := &slowConn{conn: c, closed: make(chan struct{})}
	_, err = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: receiver\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{\"type\":", path)
	Expect(err).NotTo(HaveOccurred())
	go func() {
		defer close(s.closed)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			s.mu.Lock()
			s.got.Write(buf[:n])
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	if dribble {
		go func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-s.closed:
					return
				case <-t.C:
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
	}
	return s
}

// status is the HTTP status the server answered on the connection, 0 if none.
func (s *slowConn) status() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var code int
	if _, err := fmt.Sscanf(s.got.String(), "HTTP/1.1 %d", &code); err != nil {
		return 0
	}
	return code
}

func (s *slowConn) answer() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got.String()
}

var _ = Describe("admission: no one can starve the receiver", func() {
	It("keeps serving other providers and tenants while 64+ slow connections flood one provider and an unknown one", func() {
		ns1, ns2 := newNamespace(), newNamespace()
		flooded := inferenceProvider(ns1)
		flooded.Name, flooded.Spec.Signature.SecretRef.Name = "flooded", "flooded-secret"
		quiet := inferenceProvider(ns1)
		quiet.Name, quiet.Spec.Signature.SecretRef.Name = "quiet", "quiet-secret"
		other := inferenceProvider(ns2)
		other.Name = "other"
		for _, p := range []*hooksv1alpha1.WebhookProvider{flooded, quiet, other} {
			install(p, map[string]string{"current": swhSecret})
		}

		const (
			bodyTimeout = 8 * time.Second
			perProvider = 16 // the documented default of --receiver-max-in-flight-per-provider
			n           = 80 // more than --receiver-max-in-flight (64)
		)
		// Default limits: the test shows the defaults protect other tenants.
		r, addr := startReceiver(Options{BodyReadTimeout: bodyTimeout}, k8s, k8s)
		base := "http://" + addr

		var conns []*slowConn
		start := time.Now()
		for i := range n {
			conns = append(conns, openSlow(addr, EndpointPath(ns1, "flooded"), i%2 == 0))
			conns = append(conns, openSlow(addr, EndpointPath(ns1, "nobody"), i%2 == 1))
		}
		answered := func() int {
			k := 0
			for _, c := range conns {
				if c.status() != 0 {
					k++
				}
			}
			return k
		}
		// The receiver has taken in the flood (whatever it holds, it answered some).
		Eventually(answered).WithTimeout(bodyTimeout / 2).Should(BeNumerically(">=", n))

		signed := func(ns, provider, id string) sender.Response {
			GinkgoHelper()
			resp, err := sender.Send(ctx, nil, sender.Delivery{URL: base + EndpointPath(ns, provider), Signature: swh,
				Secret: []byte(swhSecret), ID: id, Body: []byte(completedV2)})
			Expect(err).NotTo(HaveOccurred())
			return resp
		}
		// Another provider of the same tenant, and another tenant, are served...
		q := signed(ns1, "quiet", "msg_quiet")
		Expect(q.Status).To(Equal(http.StatusOK), q.Body)
		o := signed(ns2, "other", "msg_other")
		Expect(o.Status).To(Equal(http.StatusOK), o.Body)

		// ...while the flood holds exactly the flooded provider's slots (everything else
		// was answered, past the admission wait), and the flooded provider itself is told
		// it is at its limit.
		Eventually(answered).WithTimeout(bodyTimeout / 2).Should(Equal(2*n - perProvider))
		busy := signed(ns1, "flooded", "msg_flooded")
		Expect(busy.Status).To(Equal(http.StatusTooManyRequests), busy.Body)
		Expect(busy.RetryAfter).To(Equal("1"))
		Expect(decode(busy.Body)).To(HaveKeyWithValue("error", OutcomeBusyProvider), busy.Body)
		Expect(time.Since(start)).To(BeNumerically("<", bodyTimeout), "all of this happened while the flood was held")

		// Every slow connection is cut off: the admitted ones by the body read deadline
		// (408 and close), the rest without reading their bodies (429 for the flooded
		// provider past its limit after the admission wait, 404 at once for the unknown
		// one, each closing the connection).
		counts := map[int]int{}
		for _, c := range conns {
			Eventually(c.closed).WithTimeout(bodyTimeout+10*time.Second).Should(BeClosed(), c.answer())
			counts[c.status()]++
		}
		Expect(r.opts.MaxInFlightPerProvider).To(Equal(perProvider))
		Expect(counts).To(Equal(map[int]int{
			http.StatusRequestTimeout:  perProvider,
			http.StatusTooManyRequests: n - perProvider,
			http.StatusNotFound:        n,
		}))
		for _, c := range conns {
			if c.status() == http.StatusRequestTimeout {
				Expect(c.answer()).To(ContainSubstring(`"error":"` + OutcomeBodyTimeout + `"`))
			}
		}
		Expect(time.Since(start)).To(BeNumerically(">=", bodyTimeout), "the admitted ones were held until the deadline")
		for _, c := range conns {
			_ = c.conn.Close()
		}
		// Nothing of the flood was stored.
		Expect(listEvents(ns1)).To(HaveLen(1))
	})

	It("answers 429 naming the namespace limit when a tenant's providers together reach it", func() {
		ns := newNamespace()
		var names []string
		for i := range 3 {
			p := inferenceProvider(ns)
			p.Name, p.Spec.Signature.SecretRef.Name = fmt.Sprintf("p%d", i), fmt.Sprintf("p%d-secret", i)
			install(p, map[string]string{"current": swhSecret})
			names = append(names, p.Name)
		}
		_, addr := startReceiver(Options{MaxInFlightPerProvider: 2, MaxInFlightPerNamespace: 3, BodyReadTimeout: 3 * time.Second}, k8s, k8s)
		var conns []*slowConn
		for _, name := range names[:2] {
			for range 2 {
				conns = append(conns, openSlow(addr, EndpointPath(ns, name), false))
			}
		}
		DeferCleanup(func() {
			for _, c := range conns {
				_ = c.conn.Close()
			}
		})
		var resp sender.Response
		Eventually(func() int {
			var err error
			resp, err = sender.Send(ctx, nil, sender.Delivery{URL: "http://" + addr + EndpointPath(ns, names[2]), Signature: swh,
				Secret: []byte(swhSecret), ID: "msg_ns", Body: []byte(completedV2)})
			Expect(err).NotTo(HaveOccurred())
			return resp.Status
		}).WithTimeout(5 * time.Second).Should(Equal(http.StatusTooManyRequests))
		Expect(decode(resp.Body)).To(HaveKeyWithValue("error", OutcomeBusyNamespace))
		Expect(resp.RetryAfter).NotTo(BeEmpty())
	})

	It("makes no API write and no archive call for a bad signature, and reads the signing Secret at most once per refresh interval", func() {
		ns := newNamespace()
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})
		missing := inferenceProvider(ns)
		missing.Name, missing.Spec.Signature.SecretRef.Name = "nosecret", "no-such-secret"
		Expect(k8s.Create(ctx, missing)).To(Succeed())
		Eventually(func() error {
			return mgrCache.Get(ctx, client.ObjectKeyFromObject(missing), &hooksv1alpha1.WebhookProvider{})
		}).Should(Succeed())

		var counts apiCounts
		c := counts.client()
		arch := &countingArchive{}
		// Limits high enough for 50 at once: this spec is about what a forged delivery costs.
		_, addr := startReceiver(Options{Archive: arch, MaxInFlightPerProvider: 64, MaxInFlightPerNamespace: 64}, c, c)
		forged := func(provider, id string) sender.Response {
			resp, err := sender.Send(ctx, nil, sender.Delivery{URL: "http://" + addr + EndpointPath(ns, provider), Signature: swh,
				Secret: []byte("whsec_" + "Zm9yZ2VkLWtleS1mb3ItdGhlLXRlc3Q="), ID: id, Body: []byte(completedV2)})
			Expect(err).NotTo(HaveOccurred())
			return resp
		}

		// 100 forged deliveries, 50 at a time, on a cold Secret cache.
		for round := range 2 {
			var wg sync.WaitGroup
			errs := make(chan error, 50)
			for i := range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer GinkgoRecover()
					if r := forged("inference", fmt.Sprintf("msg_forged_%d_%d", round, i)); r.Status != http.StatusUnauthorized {
						errs <- fmt.Errorf("status %d: %s", r.Status, r.Body)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				Expect(err).NotTo(HaveOccurred())
			}
		}
		Expect(counts.writes.Load()).To(BeZero(), "a forged delivery writes nothing")
		Expect(arch.calls.Load()).To(BeZero(), "a forged delivery asks nothing of the archive")
		// One load, and at most one refresh after a mismatch within the 5s interval.
		Expect(counts.secretGets.Load()).To(BeNumerically("<=", 2), "forged deliveries must not multiply Secret reads")

		// A provider whose Secret is missing: 503 every time, one read per interval.
		before := counts.secretGets.Load()
		for i := range 30 {
			r := forged("nosecret", fmt.Sprintf("msg_nosecret_%d", i))
			Expect(r.Status).To(Equal(http.StatusServiceUnavailable), r.Body)
		}
		Expect(counts.secretGets.Load()-before).To(BeNumerically("<=", 1), "a missing Secret is not re-read on every delivery")
		Expect(counts.writes.Load()).To(BeZero())

		// The counters do count: a signed delivery writes and asks the archive.
		resp, err := sender.Send(ctx, nil, sender.Delivery{URL: "http://" + addr + EndpointPath(ns, "inference"), Signature: swh,
			Secret: []byte(swhSecret), ID: "msg_signed", Body: []byte(completedV2)})
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(http.StatusOK), resp.Body)
		Expect(counts.writes.Load()).To(BeNumerically(">=", 1))
		Expect(arch.calls.Load()).To(BeNumerically(">=", 1))
	})
})
