package bench

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/receiver"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// ingestNamespace holds the ingestion phase's events; they are deleted afterwards so
// the operator never dispatches them.
const ingestNamespace = "bench-ingest"

// ingest measures items 1 and 2 with the receiver alone (no controllers, so nothing
// else writes while it is measured): in each round, perRound raw creates of a minimal
// WebhookEvent, perRound deliveries accepted by the receiver, and the same deliveries
// again as duplicates, each with `senders` concurrent clients. Interleaving the
// three in rounds spreads any drift of a shared machine over all of them.
func (b *run) ingest(ctx context.Context) error {
	s := b.cfg
	if err := tenant(ctx, b.k, ingestNamespace, ""); err != nil {
		return err
	}
	mctx, stop := context.WithCancel(ctx)
	mgr, err := ctrl.NewManager(b.restCfg, ctrl.Options{Scheme: testenv.Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		stop()
		return fmt.Errorf("receiver manager: %w", err)
	}
	// The bench's senders all dial from one loopback address but stand for many
	// senders: the per-address limit (docs/design.md §15) is sized so it never binds here.
	recv := receiver.New(receiver.Options{BindAddress: "127.0.0.1:0", MaxInFlight: s.ReceiverMaxInFlight,
		MaxUnauthenticatedPerAddress: max(s.Senders, receiver.DefaultMaxUnauthenticatedPerAddress)},
		mgr.GetCache(), mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("bench-receiver"))
	if err := receiver.WarmCache(mctx, mgr.GetCache()); err != nil {
		stop()
		return err
	}
	if err := mgr.Add(recv); err != nil {
		stop()
		return err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		stop()
		<-done
	}()
	addr, err := recv.Addr(ctx)
	if err != nil {
		return err
	}
	key := client.ObjectKey{Namespace: ingestNamespace, Name: providerName}
	if err := waitFor(ctx, 30*time.Second, "the receiver's cache to see the provider", func() (bool, error) {
		return mgr.GetCache().Get(ctx, key, &hooksv1alpha1.WebhookProvider{}) == nil, nil
	}); err != nil {
		return err
	}

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: s.Senders}, Timeout: time.Minute}
	url := endpoint("http://"+addr.String(), ingestNamespace)
	post := func(id string, n int, want string) error {
		resp, err := deliver(ctx, hc, url, id, payload(id, n))
		if err != nil {
			return err
		}
		if resp.Status != http.StatusOK || !strings.Contains(resp.Body, `"`+want+`"`) {
			return fmt.Errorf("delivery %s: %d %s", id, resp.Status, resp.Body)
		}
		return nil
	}
	// One warm-up round (connections, caches, the provider's compiled routes) that is
	// not measured.
	if _, err := parallel(s.Senders, 2*s.Senders, nil, func(i int) error {
		return post(fmt.Sprintf("warm-%d", i), i, "accepted")
	}); err != nil {
		return err
	}

	// The object the receiver stores for a delivery, as a template for raw creates of
	// the same size and shape: the receiver's own cost is accepted vs these.
	var template hooksv1alpha1.WebhookEvent
	if err := b.k.Get(ctx, client.ObjectKey{Namespace: ingestNamespace,
		Name: identity.EventName(ingestNamespace, providerName, "warm-0")}, &template); err != nil {
		return fmt.Errorf("read a stored delivery: %w", err)
	}
	fullEvent := func(id string) *hooksv1alpha1.WebhookEvent {
		ev := &hooksv1alpha1.WebhookEvent{ObjectMeta: metav1.ObjectMeta{Namespace: ingestNamespace,
			Name: identity.EventName(ingestNamespace, providerName, id), Labels: template.Labels,
			Annotations: template.Annotations}, Spec: *template.Spec.DeepCopy()}
		ev.Spec.EventID = id
		ev.Spec.ReceivedAt = metav1.Now()
		return ev
	}
	var raw, rawFull, accepted, dup time.Duration
	var rawLat, rawFullLat, accLat, dupLat []time.Duration
	var accWrites, dupWrites writeCounts = writeCounts{}, writeCounts{}
	total := 0
	var profiles []string
	for round := range s.Rounds {
		base := round * s.PerRound
		d, err := parallel(s.Senders, s.PerRound, &rawLat, func(i int) error {
			id := fmt.Sprintf("raw-%d", base+i)
			return b.k.Create(ctx, minimalEvent(ingestNamespace, identity.EventName(ingestNamespace, providerName, id), id))
		})
		if err != nil {
			return fmt.Errorf("raw creates: %w", err)
		}
		raw += d
		if d, err = parallel(s.Senders, s.PerRound, &rawFullLat, func(i int) error {
			return b.k.Create(ctx, fullEvent(fmt.Sprintf("full-%d", base+i)))
		}); err != nil {
			return fmt.Errorf("raw creates of stored deliveries: %w", err)
		}
		rawFull += d
		w0, err := b.probe.writes(ctx)
		if err != nil {
			return err
		}
		stopProfile := b.profileSelf(fmt.Sprintf("receiver-cpu-round-%d.pprof", round+1), &profiles)
		d, err = parallel(s.Senders, s.PerRound, &accLat, func(i int) error {
			return post(fmt.Sprintf("evt-%d", base+i), base+i, receiver.OutcomeAccepted)
		})
		stopProfile()
		if err != nil {
			return fmt.Errorf("accepted deliveries: %w", err)
		}
		accepted += d
		w1, err := b.probe.writes(ctx)
		if err != nil {
			return err
		}
		// The receiver answers a duplicate from its informer cache; give the cache a
		// moment to see the events just created, as it would have in production
		// where a redelivery comes seconds to hours later.
		time.Sleep(500 * time.Millisecond)
		w2, err := b.probe.writes(ctx)
		if err != nil {
			return err
		}
		if d, err = parallel(s.Senders, s.PerRound*s.DuplicatesPerEvent, &dupLat, func(i int) error {
			i %= s.PerRound
			return post(fmt.Sprintf("evt-%d", base+i), base+i, receiver.OutcomeDuplicate)
		}); err != nil {
			return fmt.Errorf("duplicate deliveries: %w", err)
		}
		dup += d
		w3, err := b.probe.writes(ctx)
		if err != nil {
			return err
		}
		addCounts(accWrites, w1.since(w0))
		addCounts(dupWrites, w3.since(w2))
		total += s.PerRound
		b.logf("ingestion round %d/%d: raw %.0f/s, raw stored-delivery %.0f/s, accepted %.0f/s, duplicate %.0f/s (cumulative)", round+1, s.Rounds,
			float64(total)/raw.Seconds(), float64(total)/rawFull.Seconds(), float64(total)/accepted.Seconds(), float64(total*s.DuplicatesPerEvent)/dup.Seconds())
	}
	rate := func(n int, d time.Duration) float64 { return round(float64(n)/d.Seconds(), 1) }
	in := &b.res.Ingestion
	in.Events = total
	in.RawCreatesPerSecond, in.AcceptedPerSecond = rate(total, raw), rate(total, accepted)
	in.DuplicatesPerSecond = rate(total*s.DuplicatesPerEvent, dup)
	in.AcceptedToRaw = ratio(in.AcceptedPerSecond, in.RawCreatesPerSecond)
	in.RawStoredDeliveryPerSecond = rate(total, rawFull)
	in.AcceptedToRawStoredDelivery = ratio(in.AcceptedPerSecond, in.RawStoredDeliveryPerSecond)
	in.RawStoredDeliveryLatency = percentiles(rawFullLat)
	in.DuplicateToAccepted = ratio(in.DuplicatesPerSecond, in.AcceptedPerSecond)
	in.RawCreateLatency, in.AcceptedLatency, in.DuplicateLatency = percentiles(rawLat), percentiles(accLat), percentiles(dupLat)
	in.WritesPerAccepted = round(accWrites.total(true)/float64(total), 3)
	in.WritesPerDuplicate = round(dupWrites.total(true)/float64(total*s.DuplicatesPerEvent), 3)
	b.rawCreateP50 = in.RawCreateLatency.P50
	if len(profiles) > 0 {
		b.summarizeSelfProfile(ctx, profiles, accepted)
	}

	// The operator must not dispatch these events: delete them (envtest runs no
	// namespace controller, so deleting the namespace would leave them).
	for _, o := range []client.Object{&hooksv1alpha1.WebhookEvent{}, &hooksv1alpha1.WebhookProvider{}} {
		if err := b.k.DeleteAllOf(ctx, o, client.InNamespace(ingestNamespace)); err != nil {
			return fmt.Errorf("clean up %s: %w", ingestNamespace, err)
		}
	}
	return nil
}

func addCounts(into, w writeCounts) {
	for k, v := range w {
		into[k] += v
	}
}

// parallel runs n tasks on `workers` goroutines and returns the wall time; each
// task's own duration is appended to lat when lat is not nil.
func parallel(workers, n int, lat *[]time.Duration, task func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	local := make([][]time.Duration, workers)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t := time.Now()
				err := task(i)
				local[w] = append(local[w], time.Since(t))
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if lat != nil {
		for _, l := range local {
			*lat = append(*lat, l...)
		}
	}
	if len(errs) > 0 {
		return d, fmt.Errorf("%d of %d failed, first: %w", len(errs), n, errs[0])
	}
	return d, nil
}

// unlimited is cfg without client-side rate limiting: the benchmark measures the
// API server, not client-go's token bucket (envtest's admin config allows 1000 QPS).
func unlimited(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = -1, 0
	return c
}
