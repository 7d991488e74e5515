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

// holdingClient is a real client whose WebhookEvent creates wait, for the event IDs
// hold was called with, until their release (or the request's end): a verified
// delivery then holds its tenant's and the replica's slots as long as a test needs.
type holdingClient struct {
	client.WithWatch
	mu      sync.Mutex
	gates   map[string]chan struct{}
	entered chan string
}

func newHoldingClient() *holdingClient {
	GinkgoHelper()
	direct, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	h := &holdingClient{gates: map[string]chan struct{}{}, entered: make(chan string, 256)}
	h.WithWatch = interceptor.NewClient(direct, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if ev, ok := obj.(*hooksv1alpha1.WebhookEvent); ok {
				h.mu.Lock()
				gate := h.gates[ev.Spec.EventID]
				h.mu.Unlock()
				if gate != nil {
					h.entered <- ev.Spec.EventID
					select {
					case <-gate:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	return h
}

// hold makes the create of eventID wait until the returned release is called.
func (h *holdingClient) hold(eventID string) (release func()) {
	gate := make(chan struct{})
	h.mu.Lock()
	h.gates[eventID] = gate
	h.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// sendAsync sends a signed delivery in the background; its answer arrives on the channel.
func sendAsync(d sender.Delivery) <-chan sender.Response {
	out := make(chan sender.Response, 1)
	go func() {
		defer GinkgoRecover()
		resp, err := sender.Send(ctx, nil, d)
		Expect(err).NotTo(HaveOccurred())
		out <- resp
	}()
	return out
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

// deliverer returns a sender of completedV2 under an event ID, signed with the suite's
// Standard Webhooks secret, to provider inference of ns at the receiver at addr.
func deliverer(addr, ns string) func(id string) sender.Response {
	return func(id string) sender.Response {
		GinkgoHelper()
		resp, err := sender.Send(ctx, nil, sender.Delivery{URL: "http://" + addr + EndpointPath(ns, "inference"),
			Signature: swh, Secret: []byte(swhSecret), ID: id, Body: []byte(completedV2)})
		Expect(err).NotTo(HaveOccurred())
		return resp
	}
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
	return openSlowFrom("127.0.0.1", addr, path, dribble)
}

// openSlowFrom is openSlow from the source address src: on Linux all of 127.0.0.0/8 is
// loopback, so one test machine is several clients.
func openSlowFrom(src, addr, path string, dribble bool) *slowConn {
	GinkgoHelper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
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
	It("keeps serving every provider, the flooded one included, while 80 slow connections from 16 addresses flood one provider and an unknown one", func() {
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
			perAddress  = DefaultMaxUnauthenticatedPerAddress
			addresses   = 16
			n           = addresses * (perAddress + 1) // 80: more than --receiver-max-in-flight (64)
		)
		// Default limits: the test shows the defaults protect every sender. The body
		// deadline is long enough that the flood is still held when the signed
		// deliveries arrive on a loaded machine.
		_, addr := startReceiver(Options{BodyReadTimeout: bodyTimeout, RequestTimeout: bodyTimeout}, k8s, k8s)
		base := "http://" + addr

		var conns []*slowConn
		start := time.Now()
		for i := range n {
			src := fmt.Sprintf("127.0.0.%d", 10+i%addresses)
			conns = append(conns, openSlowFrom(src, addr, EndpointPath(ns1, "flooded"), i%2 == 0))
			conns = append(conns, openSlowFrom(src, addr, EndpointPath(ns1, "nobody"), i%2 == 1))
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
		// The receiver has taken in the flood: everything but what each address may
		// hold was answered (404 at once, 429 after the admission wait).
		Eventually(answered).WithTimeout(bodyTimeout / 2).Should(Equal(2*n - addresses*perAddress))

		signed := func(ns, provider, id string) sender.Response {
			GinkgoHelper()
			resp, err := sender.Send(ctx, nil, sender.Delivery{URL: base + EndpointPath(ns, provider), Signature: swh,
				Secret: []byte(swhSecret), ID: id, Body: []byte(completedV2)})
			Expect(err).NotTo(HaveOccurred())
			return resp
		}
		// Another provider of the same tenant, another tenant, and the flooded provider
		// itself are served: an unauthenticated body holds no shared slot.
		for _, d := range [][3]string{{ns1, "quiet", "msg_quiet"}, {ns2, "other", "msg_other"}, {ns1, "flooded", "msg_flooded"}} {
			resp := signed(d[0], d[1], d[2])
			Expect(resp.Status).To(Equal(http.StatusOK), resp.Body)
		}
		Expect(time.Since(start)).To(BeNumerically("<", bodyTimeout), "all of this happened while the flood was held")

		// Every slow connection is cut off: each address's admitted ones by the body
		// read deadline (408 and close), its extra one without reading its body (429
		// naming the address limit, after the admission wait), the unknown provider's
		// at once (404), each closing the connection.
		counts := map[int]int{}
		for _, c := range conns {
			Eventually(c.closed).WithTimeout(bodyTimeout+10*time.Second).Should(BeClosed(), c.answer())
			counts[c.status()]++
		}
		Expect(counts).To(Equal(map[int]int{
			http.StatusRequestTimeout:  addresses * perAddress,
			http.StatusTooManyRequests: addresses,
			http.StatusNotFound:        n,
		}))
		for _, c := range conns {
			switch c.status() {
			case http.StatusRequestTimeout:
				Expect(c.answer()).To(ContainSubstring(`"error":"` + OutcomeBodyTimeout + `"`))
			case http.StatusTooManyRequests:
				Expect(c.answer()).To(ContainSubstring(`"error":"` + OutcomeBusyAddress + `"`))
			}
		}
		Expect(time.Since(start)).To(BeNumerically(">=", bodyTimeout), "the admitted ones were held until the deadline")
		// Nothing of the flood was stored.
		Expect(listEvents(ns1)).To(HaveLen(2))
	})

	It("answers 429 naming the provider and then the namespace limit when a tenant's verified deliveries fill them", func() {
		ns := newNamespace()
		var names []string
		for i := range 3 {
			p := inferenceProvider(ns)
			p.Name, p.Spec.Signature.SecretRef.Name = fmt.Sprintf("p%d", i), fmt.Sprintf("p%d-secret", i)
			install(p, map[string]string{"current": swhSecret})
			names = append(names, p.Name)
		}
		holding := newHoldingClient()
		_, addr := startReceiver(Options{MaxInFlightPerProvider: 2, MaxInFlightPerNamespace: 3,
			RequestTimeout: 20 * time.Second, BodyReadTimeout: 5 * time.Second}, holding, holding)
		delivery := func(provider, id string) sender.Delivery {
			return sender.Delivery{URL: "http://" + addr + EndpointPath(ns, provider), Signature: swh,
				Secret: []byte(swhSecret), ID: id, Body: []byte(completedV2)}
		}
		// Three verified deliveries wait in their create: two of p0, one of p1.
		var held []<-chan sender.Response
		var releases []func()
		for _, d := range [][2]string{{names[0], "msg_p0_a"}, {names[0], "msg_p0_b"}, {names[1], "msg_p1_a"}} {
			releases = append(releases, holding.hold(d[1]))
			held = append(held, sendAsync(delivery(d[0], d[1])))
			Eventually(holding.entered).WithTimeout(10 * time.Second).Should(Receive(Equal(d[1])))
		}
		DeferCleanup(func() {
			for _, release := range releases {
				release()
			}
		})

		busy := <-sendAsync(delivery(names[0], "msg_p0_c"))
		Expect(busy.Status).To(Equal(http.StatusTooManyRequests), busy.Body)
		Expect(decode(busy.Body)).To(HaveKeyWithValue("error", OutcomeBusyProvider))
		Expect(busy.RetryAfter).To(Equal("1"))
		busy = <-sendAsync(delivery(names[2], "msg_p2"))
		Expect(busy.Status).To(Equal(http.StatusTooManyRequests), busy.Body)
		Expect(decode(busy.Body)).To(HaveKeyWithValue("error", OutcomeBusyNamespace))
		Expect(busy.RetryAfter).To(Equal("1"))

		// Released, the held ones are stored and answered.
		for i, release := range releases {
			release()
			resp := <-held[i]
			Expect(resp.Status).To(Equal(http.StatusOK), resp.Body)
		}
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
		_, addr := startReceiver(Options{Archive: arch, MaxInFlightPerProvider: 64, MaxInFlightPerNamespace: 64,
			MaxUnauthenticatedPerAddress: 64}, c, c)
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
