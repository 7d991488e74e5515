package bench

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// latencyNamespace holds the latency phase's tenant; the memory phase adds its
// retained events there too, under the same provider.
const latencyNamespace = "bench-latency"

// delivery is one event's timeline, every instant taken by the benchmark's clock.
type delivery struct {
	scheduled time.Time // when the open loop meant to send it
	sent      time.Time // when the first attempt actually went out
	acked     time.Time // the 200
	settled   time.Time // the watch saw its BillingSettlement Settled
	complete  time.Time // the watch saw its WebhookEvent Complete
	failed    bool
}

// tracker follows deliveries through the benchmark's own informers on
// BillingSettlements and WebhookEvents: "Settled observed" is when the watch
// delivers the status change, with the benchmark's clock (status.settledAt has a
// one-second resolution and the manager's clock).
type tracker struct {
	mu   sync.Mutex
	byID map[string]*delivery
	// changed is signalled on every observation, so waits do not poll blindly.
	changed chan struct{}
}

func newTracker() *tracker {
	return &tracker{byID: map[string]*delivery{}, changed: make(chan struct{}, 1)}
}

func (t *tracker) add(id string, scheduled time.Time) *delivery {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := &delivery{scheduled: scheduled}
	t.byID[id] = d
	return d
}

func (t *tracker) observe(id string, set func(d *delivery, now time.Time)) {
	now := time.Now()
	t.mu.Lock()
	if d, ok := t.byID[id]; ok {
		set(d, now)
	}
	t.mu.Unlock()
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

func (t *tracker) onSettlement(obj any) {
	bs, ok := obj.(*hooksv1alpha1.BillingSettlement)
	if !ok || bs.Status.State != hooksv1alpha1.SettlementSettled {
		return
	}
	t.observe(bs.Spec.JobID, func(d *delivery, now time.Time) {
		if d.settled.IsZero() {
			d.settled = now
		}
	})
}

func (t *tracker) onEvent(obj any) {
	ev, ok := obj.(*hooksv1alpha1.WebhookEvent)
	if !ok || ev.Status.Phase != hooksv1alpha1.EventComplete {
		return
	}
	t.observe(ev.Spec.EventID, func(d *delivery, now time.Time) {
		if d.complete.IsZero() {
			d.complete = now
		}
	})
}

// waitAll waits until every delivery in ds that was acknowledged is settled and
// complete, or until timeout; it returns how many are not.
func (t *tracker) waitAll(ctx context.Context, ds []*delivery, timeout time.Duration) int {
	deadline := time.After(timeout)
	for {
		t.mu.Lock()
		pending := 0
		for _, d := range ds {
			if !d.failed && (d.settled.IsZero() || d.complete.IsZero()) {
				pending++
			}
		}
		t.mu.Unlock()
		if pending == 0 {
			return 0
		}
		select {
		case <-t.changed:
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			return pending
		case <-ctx.Done():
			return pending
		}
	}
}

// watch starts the benchmark's informers on namespaces (the latency namespace when
// none); cancel stops them.
func (b *run) watch(ctx context.Context, t *tracker, namespaces ...string) (context.CancelFunc, error) {
	if len(namespaces) == 0 {
		namespaces = []string{latencyNamespace}
	}
	watched := map[string]cache.Config{}
	for _, ns := range namespaces {
		watched[ns] = cache.Config{}
	}
	c, err := cache.New(b.restCfg, cache.Options{Scheme: testenv.Scheme(), DefaultNamespaces: watched})
	if err != nil {
		return nil, fmt.Errorf("benchmark cache: %w", err)
	}
	for obj, on := range map[client.Object]func(any){
		&hooksv1alpha1.BillingSettlement{}: t.onSettlement,
		&hooksv1alpha1.WebhookEvent{}:      t.onEvent,
	} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("informer for %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: on, UpdateFunc: func(_, n any) { on(n) },
		}); err != nil {
			return nil, err
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { _ = c.Start(cctx) }()
	if !c.WaitForCacheSync(ctx) {
		cancel()
		return nil, fmt.Errorf("benchmark cache did not sync")
	}
	return cancel, nil
}

// levelRun is one open-loop level's raw observations.
type levelRun struct {
	deliveries []*delivery
	retried429 atomic.Int64
	retried503 atomic.Int64
	firstError atomic.Value
}

// openLoop schedules n deliveries at `rate` per second from now, each in its own
// goroutine, whatever the earlier ones are doing: an open loop, so a slow receiver
// builds a queue instead of slowing the sender (no coordinated omission). A 429 or
// 503 is retried after its Retry-After, as a webhook provider would.
func (b *run) openLoop(ctx context.Context, t *tracker, hc *http.Client, url, prefix string, rate float64, n int) *levelRun {
	lr := &levelRun{deliveries: make([]*delivery, n)}
	var wg sync.WaitGroup
	start := time.Now().Add(50 * time.Millisecond)
	interval := time.Duration(float64(time.Second) / rate)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		id := fmt.Sprintf("%s-%05d", prefix, i)
		d := t.add(id, at)
		lr.deliveries[i] = d
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.send(ctx, t, lr, hc, url, id, i, d)
		}()
	}
	wg.Wait()
	return lr
}

// maxAttempts bounds the retries of one delivery (a provider gives up eventually too).
const maxAttempts = 30

func (b *run) send(ctx context.Context, t *tracker, lr *levelRun, hc *http.Client, url, id string, n int, d *delivery) {
	t.mu.Lock()
	d.sent = time.Now()
	t.mu.Unlock()
	r := deliverWithRetries(ctx, hc, url, id, payload(id, n))
	lr.retried429.Add(int64(r.retried429))
	lr.retried503.Add(int64(r.retried503))
	if r.firstError != "" {
		lr.firstError.CompareAndSwap(nil, r.firstError)
	}
	t.mu.Lock()
	if r.acked.IsZero() {
		d.failed = true
	} else {
		d.acked = r.acked
	}
	t.mu.Unlock()
}

// retried is what one delivery took: when it was acknowledged (zero: never), and the
// answers that made the sender wait.
type retried struct {
	acked                  time.Time
	retried429, retried503 int
	firstError             string
}

// deliverWithRetries posts one delivery until it is answered 200, as a provider does:
// a 429 or 503 (or no answer) is retried after its Retry-After, anything else gives
// up, and so does the maxAttempts-th failure.
func deliverWithRetries(ctx context.Context, hc *http.Client, url, id string, body []byte) retried {
	var r retried
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		resp, err := deliver(ctx, hc, url, id, body)
		wait := time.Second
		switch {
		case err != nil: // no answer: the provider retries, like a 503
			if r.firstError == "" {
				r.firstError = err.Error()
			}
			r.retried503++
		case resp.Status == http.StatusOK:
			r.acked = time.Now()
			return r
		case resp.Status == http.StatusTooManyRequests:
			r.retried429++
			wait = retryAfter(resp)
		case resp.Status == http.StatusServiceUnavailable:
			r.retried503++
			wait = retryAfter(resp)
		default:
			if r.firstError == "" {
				r.firstError = fmt.Sprintf("delivery %s: %d %s", id, resp.Status, resp.Body)
			}
			return r
		}
		if attempt == maxAttempts {
			break
		}
		select {
		case <-ctx.Done():
			return r
		case <-time.After(wait):
		}
	}
	return r
}

// summarize turns a level's timelines into its row.
func (b *run) summarize(t *tracker, lv *LoadLevel, lr *levelRun) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ack, settled, complete, firstHalf, secondHalf []time.Duration
	var firstSched, lastSched, firstSent, lastSent, lastSettled time.Time
	for i, d := range lr.deliveries {
		if i == 0 {
			firstSched, firstSent = d.scheduled, d.sent
		}
		lastSched, lastSent = d.scheduled, d.sent
		if d.failed {
			lv.Failed++
			continue
		}
		ack = append(ack, d.acked.Sub(d.scheduled))
		if d.settled.IsZero() {
			lv.Unsettled++
		} else {
			settled = append(settled, d.settled.Sub(d.scheduled))
			if i < len(lr.deliveries)/2 {
				firstHalf = append(firstHalf, d.settled.Sub(d.scheduled))
			} else {
				secondHalf = append(secondHalf, d.settled.Sub(d.scheduled))
			}
			if d.settled.After(lastSettled) {
				lastSettled = d.settled
			}
		}
		if !d.complete.IsZero() {
			complete = append(complete, d.complete.Sub(d.scheduled))
		}
	}
	lv.Events = len(lr.deliveries)
	lv.SendSeconds = round(lastSched.Sub(firstSched).Seconds(), 3)
	if s := lastSent.Sub(firstSent).Seconds(); s > 0 {
		lv.OfferedPerSecond = round(float64(lv.Events-1)/s, 1)
	}
	lv.Ack, lv.Settled, lv.Complete = percentiles(ack), percentiles(settled), percentiles(complete)
	lv.Retried429, lv.Retried503 = int(lr.retried429.Load()), int(lr.retried503.Load())
	if !lastSettled.IsZero() {
		lv.SettledPerSecond = round(float64(len(settled))/lastSettled.Sub(firstSched).Seconds(), 1)
		lv.DrainSeconds = round(lastSettled.Sub(lastSched).Seconds(), 2)
	}
	// A queue builds when latency grows while the level runs: the second half's
	// median exceeds the first half's by more than a quarter of the level's length.
	growth := percentiles(secondHalf).P50 - percentiles(firstHalf).P50
	lv.Overloaded = growth > 250*lv.SendSeconds || lv.Unsettled > 0
	lv.SettledP50ToRawCreate = ratio(lv.Settled.P50, b.rawCreateP50)
	lv.SettledP99ToRawCreate = ratio(lv.Settled.P99, b.rawCreateP50)
}
