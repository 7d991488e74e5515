package bench

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/api/meta"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// archiveNamespace holds the sustained phase's tenant.
const archiveNamespace = "bench-archive"

// The archived kinds, in the order of arcDelivery.archived.
const (
	arcEvent = iota
	arcJob
	arcSettlement
)

var arcKinds = [3]string{"WebhookEvent", "JobCompletion", "BillingSettlement"}

// arcTables are the archive's tables, in the same order.
var arcTables = [3]string{"event_receipts", "job_completions", "settlements"}

// arcDelivery is one event's way through the whole pipeline, every instant taken by
// the benchmark's clock as its watch sees it.
type arcDelivery struct {
	scheduled, acked, settled, reconciled, processed time.Time
	// archived is when each of the event's three records left the cluster (the
	// watch saw its deletion: only the archiver deletes them in this phase).
	archived [3]time.Time
	failed   bool
}

// arcTracker follows deliveries by event ID (= job ID in the bench's payload).
type arcTracker struct {
	mu                                 sync.Mutex
	byID                               map[string]*arcDelivery
	acked, failed, settled, reconciled int
	archived                           [3]int
	processed                          int
	changed                            chan struct{}
	// jobByUID maps settlements' UIDs to their job IDs: a report confirms settlements
	// by UID (with the archive on, a pass's confirmations are in its report).
	jobByUID map[string]string
}

func newArcTracker() *arcTracker {
	return &arcTracker{byID: map[string]*arcDelivery{}, changed: make(chan struct{}, 1), jobByUID: map[string]string{}}
}

func (t *arcTracker) add(id string, scheduled time.Time) *arcDelivery {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := &arcDelivery{scheduled: scheduled}
	t.byID[id] = d
	return d
}

func (t *arcTracker) ack(d *arcDelivery, at time.Time) {
	t.mu.Lock()
	if at.IsZero() {
		d.failed = true
		t.failed++
	} else {
		d.acked = at
		t.acked++
	}
	t.mu.Unlock()
}

func (t *arcTracker) observe(id string, set func(d *arcDelivery, now time.Time)) {
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

func (t *arcTracker) onSettlement(obj any) {
	bs, ok := obj.(*hooksv1alpha1.BillingSettlement)
	if !ok {
		return
	}
	settled := bs.Status.State == hooksv1alpha1.SettlementSettled
	reconciled := settled && meta.IsStatusConditionTrue(bs.Status.Conditions, hooksv1alpha1.ConditionReconciled)
	if !settled {
		return
	}
	t.mu.Lock()
	t.jobByUID[string(bs.UID)] = bs.Spec.JobID
	t.mu.Unlock()
	t.observe(bs.Spec.JobID, func(d *arcDelivery, now time.Time) {
		if d.settled.IsZero() {
			d.settled = now
			t.settled++
		}
		if reconciled && d.reconciled.IsZero() {
			d.reconciled = now
			t.reconciled++
		}
	})
}

// onDelete records that one of an event's records left the cluster.
func (t *arcTracker) onDelete(kind int) func(obj any) {
	return func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		var id string
		switch o := obj.(type) {
		case *hooksv1alpha1.WebhookEvent:
			id = o.Spec.EventID
		case *hooksv1alpha1.JobCompletion:
			id = o.Spec.JobID
		case *hooksv1alpha1.BillingSettlement:
			id = o.Spec.JobID
		default:
			return
		}
		t.observe(id, func(d *arcDelivery, now time.Time) {
			if !d.archived[kind].IsZero() {
				return
			}
			d.archived[kind] = now
			t.archived[kind]++
			for _, a := range d.archived {
				if a.IsZero() {
					return
				}
			}
			d.processed = now
			t.processed++
		})
	}
}

// arcCounts is a snapshot of the tracker.
type arcCounts struct {
	acked, failed, settled, reconciled, processed int
	archived                                      [3]int
}

func (t *arcTracker) counts() arcCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	return arcCounts{acked: t.acked, failed: t.failed, settled: t.settled, reconciled: t.reconciled,
		processed: t.processed, archived: t.archived}
}

// waitProcessed waits until every acknowledged delivery in ds is processed (its three
// records archived), or until timeout; it returns how many are not.
func (t *arcTracker) waitProcessed(ctx context.Context, ds []*arcDelivery, timeout time.Duration, alive func() error) (int, error) {
	deadline := time.After(timeout)
	for {
		t.mu.Lock()
		pending := 0
		for _, d := range ds {
			if !d.failed && d.processed.IsZero() {
				pending++
			}
		}
		t.mu.Unlock()
		if pending == 0 {
			return 0, nil
		}
		if err := alive(); err != nil {
			return pending, err
		}
		select {
		case <-t.changed:
		case <-time.After(500 * time.Millisecond):
		case <-deadline:
			return pending, nil
		case <-ctx.Done():
			return pending, ctx.Err()
		}
	}
}

// onReport takes the settlements a report confirms as reconciled (docs/design.md §7):
// with the archive on they carry no Reconciled condition in the cluster.
func (t *arcTracker) onReport(obj any) {
	rr, ok := obj.(*hooksv1alpha1.ReconciliationReport)
	if !ok || rr.Status.Confirmed == nil {
		return
	}
	for _, g := range rr.Status.Confirmed.ByReason {
		for _, v := range g.Settlements {
			uid, _, _ := strings.Cut(v, "/")
			t.mu.Lock()
			job, known := t.jobByUID[uid]
			t.mu.Unlock()
			if !known {
				continue
			}
			t.observe(job, func(d *arcDelivery, now time.Time) {
				if d.reconciled.IsZero() {
					d.reconciled = now
					t.reconciled++
				}
			})
		}
	}
}

// watchArchive starts the benchmark's informers on the archive namespace.
func (b *run) watchArchive(ctx context.Context, t *arcTracker) (context.CancelFunc, error) {
	c, err := cache.New(b.restCfg, cache.Options{Scheme: testenv.Scheme(),
		DefaultNamespaces: map[string]cache.Config{archiveNamespace: {}},
		DefaultTransform:  cache.TransformStripManagedFields()})
	if err != nil {
		return nil, fmt.Errorf("benchmark cache: %w", err)
	}
	handlers := []struct {
		obj client.Object
		h   toolscache.ResourceEventHandlerFuncs
	}{
		{&hooksv1alpha1.WebhookEvent{}, toolscache.ResourceEventHandlerFuncs{DeleteFunc: t.onDelete(arcEvent)}},
		{&hooksv1alpha1.JobCompletion{}, toolscache.ResourceEventHandlerFuncs{DeleteFunc: t.onDelete(arcJob)}},
		{&hooksv1alpha1.BillingSettlement{}, toolscache.ResourceEventHandlerFuncs{AddFunc: t.onSettlement,
			UpdateFunc: func(_, n any) { t.onSettlement(n) }, DeleteFunc: t.onDelete(arcSettlement)}},
		{&hooksv1alpha1.ReconciliationReport{}, toolscache.ResourceEventHandlerFuncs{AddFunc: t.onReport,
			UpdateFunc: func(_, n any) { t.onReport(n) }}},
	}
	for _, h := range handlers {
		inf, err := c.GetInformer(ctx, h.obj)
		if err != nil {
			return nil, fmt.Errorf("informer for %T: %w", h.obj, err)
		}
		if _, err := inf.AddEventHandler(h.h); err != nil {
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

// pacer sends deliveries open loop at a rate that can be lowered while it runs.
type pacer struct {
	rate       atomic.Uint64 // math.Float64bits
	sent       atomic.Int64
	retried429 atomic.Int64
	retried503 atomic.Int64
	firstError atomic.Value
}

func newPacer(rate float64) *pacer {
	p := &pacer{}
	p.setRate(rate)
	return p
}

func (p *pacer) setRate(r float64) { p.rate.Store(math.Float64bits(r)) }
func (p *pacer) rateNow() float64  { return math.Float64frombits(p.rate.Load()) }

// run schedules n deliveries, one goroutine each at its scheduled time whatever the
// earlier ones are doing (as openLoop does), and returns when all are answered.
func (p *pacer) run(ctx context.Context, t *arcTracker, hc *http.Client, url, prefix string, n int) []*arcDelivery {
	ds := make([]*arcDelivery, 0, n)
	var wg sync.WaitGroup
	next := time.Now().Add(50 * time.Millisecond)
	for i := range n {
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return ds
			case <-time.After(d):
			}
		}
		id := fmt.Sprintf("%s-%06d", prefix, i)
		d := t.add(id, next)
		ds = append(ds, d)
		p.sent.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := deliverWithRetries(ctx, hc, url, id, payload(id, i))
			p.retried429.Add(int64(r.retried429))
			p.retried503.Add(int64(r.retried503))
			if r.firstError != "" {
				p.firstError.CompareAndSwap(nil, r.firstError)
			}
			t.ack(d, r.acked)
		}()
		next = next.Add(time.Duration(float64(time.Second) / p.rateNow()))
	}
	wg.Wait()
	return ds
}

// archivePhase is item 6: the manager with the archive on, fed at a rate it sustains
// for ArchiveEvents events, sampled as it goes (docs/design.md §12; bench/README.md).
func (b *run) archivePhase(ctx context.Context, bin string) (err error) {
	cfg := b.cfg
	a := &ArchivePhase{Events: cfg.ArchiveEvents, ArchiveAfterSeconds: cfg.ArchiveAfter.Seconds(),
		ReconcileIntervalSeconds: cfg.ReconcileInterval.Seconds(), CalibrationEvents: cfg.CalibrationEvents,
		LoadFraction: cfg.ArchiveLoad}
	b.res.Archive = a
	phaseStart := time.Now()
	defer func() { a.DurationSeconds = round(time.Since(phaseStart).Seconds(), 1) }()

	b.logf("item 6: starting PostgreSQL (internal/archive/pgtest)")
	pg, err := pgtest.Start()
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.WriteFile(filepath.Join(b.dir, "postgres.log"), []byte(pg.Log()), 0o644)
		}
		pg.Close()
	}()
	if err := pg.CreateDatabase("archive"); err != nil {
		return err
	}
	a.PostgresVersion = postgresVersion(ctx, pg.URL("archive"))

	stopCP, err := b.startControlPlane(ctx)
	if err != nil {
		return err
	}
	defer stopCP()
	billing, err := fakebilling.Start(fakebilling.Options{Token: billingToken})
	if err != nil {
		return err
	}
	defer func() { _ = billing.Close() }()
	args := append([]string{fmt.Sprintf("--archive-after=%s", cfg.ArchiveAfter)}, cfg.ManagerArgs...)
	a.ManagerArgs = args
	b.logf("item 6: starting the manager with the archive on (%s, ARCHIVE_DATABASE_URL)", strings.Join(args, " "))
	// The URL goes through the environment, as docs/archive.md recommends.
	op, err := startOperator(ctx, b.env, bin, b.dir, "manager-archive", args, []string{"ARCHIVE_DATABASE_URL=" + pg.URL("archive")})
	if err != nil {
		return err
	}
	defer op.stop()
	if a.StartRSSBytes, _, err = rss(op.Pid()); err != nil {
		return err
	}
	interval := cfg.ReconcileInterval
	if err := tenant(ctx, b.k, archiveNamespace, billing.URL(), func(bp *hooksv1alpha1.BillingProvider) {
		bp.Spec.Reconciliation = &hooksv1alpha1.ReconciliationPolicy{Interval: fixtures.Duration(interval)}
	}); err != nil {
		return err
	}
	db, err := connectArchive(ctx, pg.URL("archive"), op)
	if err != nil {
		return err
	}
	defer db.Close(context.Background())

	t := newArcTracker()
	stopWatch, err := b.watchArchive(ctx, t)
	if err != nil {
		return err
	}
	defer stopWatch()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024}, Timeout: time.Minute}
	url := endpoint(op.ReceiverURL, archiveNamespace)
	// Longest a record should take to leave once its event is acknowledged: settle,
	// one reconciliation interval (plus a pass), --archive-after, then slack.
	pipelineDelay := cfg.ArchiveAfter + 2*interval + 30*time.Second
	diagnose := func(what string, pending int) error {
		c := t.counts()
		return fmt.Errorf("%s: %d events not archived after the wait (acked %d, settled %d, reconciled %d, archived events/jobs/settlements %d/%d/%d); see %s",
			what, pending, c.acked, c.settled, c.reconciled, c.archived[0], c.archived[1], c.archived[2], op.LogPath)
	}

	// Warm-up (not reported): connections, caches, the schema, a first pass.
	b.logf("item 6: warm-up, 40 events through the whole pipeline")
	warm := newPacer(20).run(ctx, t, hc, url, "arcwarm", 40)
	if n, err := t.waitProcessed(ctx, warm, pipelineDelay+2*time.Minute, op.exited); err != nil || n > 0 {
		if err != nil {
			return err
		}
		return diagnose("warm-up", n)
	}

	// Calibration (a burst for an upper bound, then an open-loop staircase) finds the
	// rate the pipeline sustains; the sustained phase runs at ArchiveLoad of it.
	rate := cfg.ArchiveRate
	if cfg.CalibrationEvents > 0 {
		cal, err := b.calibrate(ctx, t, hc, url, op, pipelineDelay)
		if err != nil {
			return err
		}
		a.Calibration = cal
		if rate <= 0 {
			rate = cfg.ArchiveLoad * cal.SustainablePerSecond
		}
	}
	if rate <= 0 {
		return fmt.Errorf("no delivery rate: set -archive-rate or -archive-calibration-events")
	}
	a.TargetPerSecond = round(rate, 1)

	// The sustained phase: N events at the target rate, sampled every N/samples sent.
	time.Sleep(2 * time.Second)
	samples := &sampler{b: b, op: op, t: t, db: db, start: time.Now(), roots: map[int]string{pg.Pid(): "postgres"}}
	if _, err := samples.take(ctx, "idle"); err != nil {
		return err
	}
	w0, err := b.probe.writes(ctx)
	if err != nil {
		return err
	}
	e0, err := b.probe.etcdStats(ctx)
	if err != nil {
		return err
	}
	m0, err := get(ctx, http.DefaultClient, op.MetricsURL)
	if err != nil {
		return err
	}
	pgRoot := map[int]string{pg.Pid(): "postgres"}
	cpu0, err := cpuSeconds(pgRoot)
	if err != nil {
		return err
	}
	samples.overhead = nil // from here on
	n := cfg.ArchiveEvents
	if cfg.ArchiveDuration > 0 {
		n = max(1, int(rate*cfg.ArchiveDuration.Seconds()))
		a.Events = n
	}
	b.logf("item 6: sustained, %d events at %.1f/s (reconciliation every %s, --archive-after=%s)", n, rate, interval, cfg.ArchiveAfter)
	p := newPacer(rate)
	samples.pacer = p
	done := make(chan []*arcDelivery, 1)
	sendStart := time.Now()
	a.LoadStartSeconds = round(sendStart.Sub(samples.start).Seconds(), 1)
	go func() { done <- p.run(ctx, t, hc, url, "arc", n) }()
	var profiles []func() (*Profile, error)
	if cfg.ProfileSeconds > 0 {
		profiles = append(profiles, op.startCPUProfile(ctx, "archive sustained", b.profileDir(), cfg.ProfileSeconds),
			b.startAPIServerProfile(ctx, "archive sustained", cfg.ProfileSeconds))
	}
	every := max(1, n/max(1, cfg.ArchiveSamples))
	nextSample := every
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var ds []*arcDelivery
	var lastCheck time.Time
	var hist []int
	for ds == nil {
		select {
		case ds = <-done:
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := op.exited(); err != nil {
			return err
		}
		sent := int(p.sent.Load())
		if nextSample <= n && (sent >= nextSample || ds != nil) {
			s, err := samples.take(ctx, "load")
			if err != nil {
				return err
			}
			cpu := "-"
			if k := len(samples.out); k >= 2 {
				prev := samples.out[k-2]
				if d := s.Processed - prev.Processed; d > 0 {
					used := cpuTotal(s.CPUSeconds) - cpuTotal(prev.CPUSeconds) - (s.CPUSampling - prev.CPUSampling)
					cpu = fmt.Sprintf("%.0f ms", used*1000/float64(d))
				}
			}
			b.logf("item 6: %d/%d sent, %d processed, backlog %d, live WE/JC/BS %d/%d/%d, etcd %s compacted (%s raw), RSS %s, live heap %s, PG %s, CPU/processed event %s",
				s.Sent, n, s.Processed, s.Backlog, s.LiveObjects["WebhookEvent"], s.LiveObjects["JobCompletion"],
				s.LiveObjects["BillingSettlement"], mib(s.EtcdCompactedBytes), mib(s.EtcdRawInUseBytes), mib(s.RSSBytes), mib(s.LiveHeapBytes),
				mib(s.PostgresBytes), cpu)
			for nextSample <= sent {
				nextSample += every
			}
			if ds != nil && nextSample <= n {
				nextSample = n + 1
			}
		}
		// A governor, not a measurement: when the backlog has grown at every check for
		// 45s and holds more than twice what the pipeline holds when it keeps up, the
		// machine no longer sustains the rate (a shared machine's load moves): lower
		// it by 10% and say so.
		if time.Since(lastCheck) >= 15*time.Second && ds == nil {
			c := t.counts()
			backlog := c.acked - c.processed
			hist = append(hist, backlog)
			steady := int(p.rateNow() * (cfg.ArchiveAfter + interval + 10*time.Second).Seconds())
			k := len(hist)
			if k >= 4 && hist[k-1] > hist[k-2] && hist[k-2] > hist[k-3] && hist[k-3] > hist[k-4] && backlog > 2*steady+200 {
				r := p.rateNow() * 0.9
				p.setRate(r)
				a.RateCuts++
				a.Notes = append(a.Notes, fmt.Sprintf("after %d events the backlog was %d (> 2 × %d, what the pipeline holds when it keeps up) and growing: rate lowered to %.1f/s",
					sent, backlog, steady, r))
				b.logf("item 6: backlog %d and growing, rate lowered to %.1f/s", backlog, r)
				hist = nil
			}
			lastCheck = time.Now()
		}
	}
	for _, p := range profiles {
		b.addProfile(p)
	}
	sendSeconds := time.Since(sendStart).Seconds()
	a.FinalTargetPerSecond = round(p.rateNow(), 1)
	a.OfferedPerSecond = round(float64(len(ds))/sendSeconds, 1)
	a.Retried429, a.Retried503 = int(p.retried429.Load()), int(p.retried503.Load())
	if e, ok := p.firstError.Load().(string); ok {
		a.Notes = append(a.Notes, "first delivery error: "+e)
	}

	b.logf("item 6: all sent; waiting for the pipeline to archive the rest")
	pending, err := t.waitProcessed(ctx, ds, pipelineDelay+5*time.Minute, op.exited)
	if err != nil {
		return err
	}
	if pending > 0 {
		a.Notes = append(a.Notes, diagnose("drain", pending).Error())
	}
	time.Sleep(2 * time.Second)
	if _, err := samples.take(ctx, "drained"); err != nil {
		return err
	}
	w1, err := b.probe.writes(ctx)
	if err != nil {
		return err
	}
	e1, err := b.probe.etcdStats(ctx)
	if err != nil {
		return err
	}
	m1, err := get(ctx, http.DefaultClient, op.MetricsURL)
	if err != nil {
		return err
	}
	cpu1, err := cpuSeconds(pgRoot)
	if err != nil {
		return err
	}
	// Less what the samples cost (a compaction and defragmentation of etcd, PostgreSQL's
	// sizes): the benchmark's measuring, not the pipeline's work.
	for name, v := range samples.overhead {
		cpu1[name] -= v
	}
	a.CPUMillisPerEvent = cpuPerEvent(cpu0, cpu1, n)
	a.Samples = samples.out
	a.summarize(ds, n)
	d := w1.since(w0)
	a.WritesPerEvent = round(d.total(true)/float64(n), 3)
	a.Writes = d.perEvent(n)
	a.EtcdPutsPerEvent = round((e1.Puts-e0.Puts)/float64(n), 3)
	a.EtcdReceivedBytesPerEvent = round((e1.ReceivedBytes-e0.ReceivedBytes)/float64(n), 0)
	before, after := parseSamples(m0, keepManagerCounters), parseSamples(m1, keepManagerCounters)
	a.Controllers = controllerCostsOf(diffSamples(before, after), n)
	a.ArchiveMetrics = archiveMetrics(diffSamples(before, after))
	if err := a.postgresDetail(ctx, db); err != nil {
		return err
	}
	a.goals()
	b.logf("item 6: done in %.0fs: RSS %+.0f B/event, etcd %+.0f B/event compacted, PG %.0f B/event, archived÷accepted %.3f",
		time.Since(phaseStart).Seconds(), a.Slopes.RSSBytes.LeastSquares, a.Slopes.EtcdCompactedBytes.LeastSquares,
		a.Postgres.BytesPerArchivedEvent, a.Rates.ArchivedToAccepted)
	return nil
}

// calibrate measures the rate the whole pipeline sustains, in two steps:
//
//  1. a burst of CalibrationEvents deliveries with Senders concurrent clients (as
//     fast as the receiver answers), drained by the pipeline: the rate between the
//     20th and 80th percentile of completions is an upper bound (in a burst the work
//     queues coalesce the triggers a steady stream reconciles one by one);
//  2. an open-loop staircase from half that bound: each step sends at one rate for
//     stepDuration and keeps up when the backlog (acknowledged, not yet archived)
//     grew by less than 3 seconds' worth of events over its second half, by which
//     time the pipeline holds what it holds at that rate. Steps go up by 25% while
//     they keep up and down by 30% until one does; the sustainable rate is the
//     highest step that kept up below the lowest that did not.
func (b *run) calibrate(ctx context.Context, t *arcTracker, hc *http.Client, url string, op *operator,
	pipelineDelay time.Duration) (*ArchiveCalibration, error) {
	n := b.cfg.CalibrationEvents
	b.logf("item 6: calibration, a burst of %d events with %d senders", n, b.cfg.Senders)
	ds := make([]*arcDelivery, n)
	start := time.Now()
	dur, err := parallel(b.cfg.Senders, n, nil, func(i int) error {
		id := fmt.Sprintf("arccal-%06d", i)
		d := t.add(id, time.Now())
		ds[i] = d
		r := deliverWithRetries(ctx, hc, url, id, payload(id, i))
		t.ack(d, r.acked)
		if r.acked.IsZero() {
			return fmt.Errorf("delivery %s: %s", id, r.firstError)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("calibration deliveries: %w", err)
	}
	timeout := pipelineDelay + time.Duration(float64(n)/2)*time.Second
	pending, err := t.waitProcessed(ctx, ds, timeout, op.exited)
	if err != nil {
		return nil, err
	}
	if pending > 0 {
		return nil, fmt.Errorf("calibration: %d of %d events not archived after %s; see %s", pending, n, timeout, op.LogPath)
	}
	t.mu.Lock()
	var settled, processed []time.Time
	for _, d := range ds {
		settled, processed = append(settled, d.settled), append(processed, d.processed)
	}
	t.mu.Unlock()
	c := &ArchiveCalibration{Events: n, AcceptedPerSecond: round(float64(n)/dur.Seconds(), 1),
		SettledPerSecond: round(middleRate(settled), 1), ProcessedPerSecond: round(middleRate(processed), 1),
		DrainSeconds: round(latest(processed).Sub(start).Seconds(), 1)}
	bound := min(c.SettledPerSecond, c.ProcessedPerSecond)
	b.logf("item 6: burst: accepted %.0f/s, then settled %.1f/s and archived %.1f/s (all archived after %.0fs)",
		c.AcceptedPerSecond, c.SettledPerSecond, c.ProcessedPerSecond, c.DrainSeconds)

	rate := max(1, bound/2)
	kept, failed := 0.0, 0.0
	var all []*arcDelivery
	for step := 0; step < 10; step++ {
		p := newPacer(rate)
		sn := max(1, int(rate*stepDuration.Seconds()))
		done := make(chan []*arcDelivery, 1)
		go func() { done <- p.run(ctx, t, hc, url, fmt.Sprintf("arcstep%d", step), sn) }()
		backlog := func() int { c := t.counts(); return c.acked - c.processed }
		var mid, end int
		select {
		case <-time.After(stepDuration / 2):
			mid = backlog()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		got := <-done
		end = backlog()
		all = append(all, got...)
		if err := op.exited(); err != nil {
			return nil, err
		}
		ok := float64(end-mid) < rate*3
		c.Steps = append(c.Steps, CalibrationStep{PerSecond: round(rate, 1), Events: sn, BacklogMiddle: mid, BacklogEnd: end, KeptUp: ok})
		b.logf("item 6: staircase %.1f/s: backlog %d → %d over the second half: kept up %v", rate, mid, end, ok)
		if ok {
			kept = rate
			if failed > 0 && rate*1.25 >= failed {
				break
			}
			rate *= 1.25
		} else {
			failed = rate
			if kept > 0 {
				break
			}
			rate *= 0.7
		}
	}
	if kept == 0 {
		return nil, fmt.Errorf("calibration: no rate down to %.1f/s kept up; see %s", rate/0.7, op.LogPath)
	}
	c.SustainablePerSecond = round(kept, 1)
	// Start the sustained phase from an empty pipeline.
	if pending, err := t.waitProcessed(ctx, all, pipelineDelay+5*time.Minute, op.exited); err != nil {
		return nil, err
	} else if pending > 0 {
		return nil, fmt.Errorf("calibration: %d staircase events not archived; see %s", pending, op.LogPath)
	}
	b.logf("item 6: sustainable %.1f/s", kept)
	return c, nil
}

// eventCacheWarmup is how long the manager's event recorder takes to reach its steady
// size: client-go's events broadcaster drops a cached Event 6 minutes after it was
// sent, checking every 6 minutes (k8s.io/client-go/tools/events, finishTime).
const eventCacheWarmup = 12 * time.Minute

// stepDuration is how long one staircase step sends.
const stepDuration = 60 * time.Second

// middleRate is how many of ts fall between their 20th and 80th percentile per second
// of that span.
func middleRate(ts []time.Time) float64 {
	s := append([]time.Time(nil), ts...)
	sort.Slice(s, func(i, j int) bool { return s[i].Before(s[j]) })
	lo, hi := len(s)/5, len(s)*4/5
	if hi <= lo {
		return 0
	}
	span := s[hi].Sub(s[lo]).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(hi-lo) / span
}

func latest(ts []time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// connectArchive connects to the archive's database once the manager has migrated
// its schema.
func connectArchive(ctx context.Context, url string, op *operator) (*pgx.Conn, error) {
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to the archive: %w", err)
	}
	err = waitFor(ctx, 60*time.Second, "the manager to migrate the archive's schema", func() (bool, error) {
		if err := op.exited(); err != nil {
			return false, err
		}
		var ok bool
		if err := db.QueryRow(ctx, `SELECT to_regclass('public.settlements') IS NOT NULL AND
			EXISTS (SELECT 1 FROM pg_tables WHERE tablename = 'schema_migrations')`).Scan(&ok); err != nil {
			return false, err
		}
		return ok, nil
	})
	if err != nil {
		db.Close(context.Background())
		return nil, err
	}
	return db, nil
}

func postgresVersion(ctx context.Context, url string) string {
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		return "unknown"
	}
	defer db.Close(context.Background())
	var v string
	if db.QueryRow(ctx, `SHOW server_version`).Scan(&v) != nil {
		return "unknown"
	}
	return v
}

// pgSizes is what the archive's tables hold.
type pgSizes struct {
	rows                  [3]int64
	total, table, index   [3]int64
	database              int64
	meanObject, meanRow   [3]float64
	objectTotal, rowTotal [3]int64
	opsTotal              int64
}

func readPGSizes(ctx context.Context, db *pgx.Conn, detail bool) (pgSizes, error) {
	var s pgSizes
	for i, tbl := range arcTables {
		if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+tbl+`), pg_total_relation_size($1::regclass),
			pg_table_size($1::regclass), pg_indexes_size($1::regclass)`, tbl).
			Scan(&s.rows[i], &s.total[i], &s.table[i], &s.index[i]); err != nil {
			return s, fmt.Errorf("size of %s: %w", tbl, err)
		}
		if detail && s.rows[i] > 0 {
			// Receipts written since migration 0002 store no object (NULL).
			if err := db.QueryRow(ctx, `SELECT coalesce(sum(pg_column_size(object)), 0), sum(pg_column_size(t.*)) FROM `+tbl+` t`).
				Scan(&s.objectTotal[i], &s.rowTotal[i]); err != nil {
				return s, fmt.Errorf("column sizes of %s: %w", tbl, err)
			}
			s.meanObject[i] = float64(s.objectTotal[i]) / float64(s.rows[i])
			s.meanRow[i] = float64(s.rowTotal[i]) / float64(s.rows[i])
		}
	}
	if detail {
		// Since migration 0002 no column repeats the object: settlements' and job
		// completions' conditions columns are gone, and a receipt's operations are its
		// record. Only receipts of 0001's form repeat them (their object holds them too).
		if err := db.QueryRow(ctx, `SELECT coalesce(sum(pg_column_size(operations)) FILTER (WHERE object IS NOT NULL), 0) FROM event_receipts`).Scan(&s.opsTotal); err != nil {
			return s, err
		}
	}
	err := db.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&s.database)
	return s, err
}

// sampler takes the phase's samples.
type sampler struct {
	b              *run
	op             *operator
	t              *arcTracker
	db             *pgx.Conn
	pacer          *pacer
	start          time.Time
	roots          map[int]string     // processes of the run that are not its children (cpuSeconds)
	overhead       map[string]float64 // CPU the samples themselves cost, by process, since the sustained phase began
	sampling       float64            // and in all, the pipeline's processes, since the first sample
	out            []ArchiveSample
	prevCompacted  int64
	prevHistorySum int64
}

// liveHeap forces a collection in the manager and reads its heap allocated right
// after (what is live, without the garbage the collector's headroom lets pile up
// between collections, which go_memstats_heap_inuse_bytes includes); the heap
// profile that comes with it is kept in the profile directory as
// manager-heap-NN.txt (`go tool pprof -base manager-heap-01.txt manager-heap-NN.txt`).
func (s *sampler) liveHeap(ctx context.Context, n int) (int64, error) {
	body, err := get(ctx, http.DefaultClient, s.op.PprofURL+"/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return 0, fmt.Errorf("read the manager's heap profile: %w", err)
	}
	_ = os.WriteFile(filepath.Join(s.b.profileDir(), fmt.Sprintf("manager-heap-%02d.txt", n)), body, 0o644)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("the manager's heap profile carries no HeapAlloc")
}

// take reads, in this order: the tracker, the manager's RSS and heap, etcd's size as
// the writes left it (raw), etcd after a compaction to the current revision and a
// defragmentation (compacted), the live objects per kind, PostgreSQL's tables and the
// reconciliation pass's state.
func (s *sampler) take(ctx context.Context, label string) (ArchiveSample, error) {
	c := s.t.counts()
	sm := ArchiveSample{Label: label, Seconds: round(time.Since(s.start).Seconds(), 1), Acked: c.acked,
		Settled: c.settled, Reconciled: c.reconciled, Processed: c.processed, Backlog: c.acked - c.processed,
		Archived: map[string]int{}, LiveObjects: map[string]int64{}, LiveBytes: map[string]int64{}, PostgresRows: map[string]int64{}}
	if s.pacer != nil {
		sm.Sent = int(s.pacer.sent.Load())
		sm.TargetPerSecond = round(s.pacer.rateNow(), 1)
	}
	for i, k := range arcKinds {
		sm.Archived[k] = c.archived[i]
	}
	var err error
	if sm.CPUSeconds, err = cpuSeconds(s.roots); err != nil {
		return sm, err
	}
	sm.CPUSampling = s.sampling
	defer func() {
		// What taking this sample cost each process, kept apart from the pipeline's CPU.
		if after, err := cpuSeconds(s.roots); err == nil {
			if s.overhead == nil {
				s.overhead = map[string]float64{}
			}
			for name, v := range after {
				s.overhead[name] += v - sm.CPUSeconds[name]
				if name != "bench" {
					s.sampling += v - sm.CPUSeconds[name]
				}
			}
		}
	}()
	if sm.RSSBytes, sm.PeakRSSBytes, err = rss(s.op.Pid()); err != nil {
		return sm, err
	}
	if body, err := get(ctx, http.DefaultClient, s.op.MetricsURL); err == nil {
		ms := parseSamples(body, func(n string) bool {
			return strings.HasPrefix(n, "go_memstats_") || n == "go_goroutines"
		})
		sm.HeapInuseBytes = int64(sum(ms, "go_memstats_heap_inuse_bytes", nil))
		sm.StackInuseBytes = int64(sum(ms, "go_memstats_stack_inuse_bytes", nil))
		sm.HeapIdleBytes = int64(sum(ms, "go_memstats_heap_idle_bytes", nil) - sum(ms, "go_memstats_heap_released_bytes", nil))
		sm.Goroutines = int(sum(ms, "go_goroutines", nil))
	}
	if sm.LiveHeapBytes, err = s.liveHeap(ctx, len(s.out)); err != nil {
		return sm, err
	}
	before, after, compact, defrag, err := s.b.probe.compactDefrag(ctx)
	if err != nil {
		return sm, fmt.Errorf("compact etcd: %w", err)
	}
	sm.EtcdRawInUseBytes, sm.EtcdRawSizeBytes = before.DBSizeInUse, before.DBSize
	sm.EtcdCompactedBytes, sm.EtcdRevision = after.DBSizeInUse, before.Revision
	sm.EtcdCompactSeconds, sm.EtcdDefragSeconds = round(compact.Seconds(), 3), round(defrag.Seconds(), 3)
	if s.prevCompacted > 0 {
		sm.EtcdHistoryBytes = before.DBSizeInUse - s.prevCompacted
	}
	s.prevHistorySum += sm.EtcdHistoryBytes
	sm.EtcdHistorySumBytes = s.prevHistorySum
	s.prevCompacted = after.DBSizeInUse
	var crBytes int64
	for _, k := range storedKinds {
		prefix := k.prefix + archiveNamespace + "/"
		n, err := s.b.probe.count(ctx, prefix)
		if err != nil {
			return sm, err
		}
		sm.LiveObjects[k.kind] = n
		if n == 0 {
			continue
		}
		maxKeys := 0
		if k.kind == "Event" {
			maxKeys = 1000 // Events live for an hour: estimate from a sample
		}
		st, err := s.b.probe.storedUpTo(ctx, prefix, maxKeys)
		if err != nil {
			return sm, err
		}
		bytes := st.KeyBytes + st.ValueBytes
		if st.Keys > 0 && int64(st.Keys) < n {
			bytes = int64(float64(bytes) / float64(st.Keys) * float64(n))
		}
		sm.LiveBytes[k.kind] = bytes
		if k.kind != "Event" {
			crBytes += bytes
		}
	}
	sm.LiveRecordBytes = crBytes
	if n, err := s.b.probe.count(ctx, "/registry/hooks.settlement.dev/reconciliationreports/"+archiveNamespace+"/"); err == nil {
		sm.LiveObjects["ReconciliationReport"] = n
	}
	ps, err := readPGSizes(ctx, s.db, false)
	if err != nil {
		return sm, err
	}
	for i, k := range arcKinds {
		sm.PostgresRows[k] = ps.rows[i]
		sm.PostgresBytes += ps.total[i]
	}
	sm.PostgresDatabaseBytes = ps.database
	s.reconciliation(ctx, &sm)
	s.out = append(s.out, sm)
	return sm, nil
}

// reconciliation reads how far the billing provider's passes have got.
func (s *sampler) reconciliation(ctx context.Context, sm *ArchiveSample) {
	var bp hooksv1alpha1.BillingProvider
	if err := s.b.k.Get(ctx, client.ObjectKey{Namespace: archiveNamespace, Name: fixtures.BillingProviderName}, &bp); err != nil {
		return
	}
	now := time.Now()
	if t := bp.Status.ProviderListedUntil; t != nil {
		sm.ListedUntilLagSeconds = round(now.Sub(t.Time).Seconds(), 1)
	}
	if bp.Status.LastReport == "" {
		return
	}
	var rr hooksv1alpha1.ReconciliationReport
	if err := s.b.k.Get(ctx, client.ObjectKey{Namespace: archiveNamespace, Name: bp.Status.LastReport}, &rr); err != nil {
		return
	}
	pass := &PassSample{Report: rr.Name, Phase: string(rr.Status.Phase), Truncated: rr.Status.Truncated,
		Discrepancies: int(rr.Status.Discrepancies), NeedsReview: int(rr.Status.NeedsReview), Examined: map[string]int32{},
		ByType: map[string]int32{}}
	for k, v := range rr.Status.Examined {
		pass.Examined[k] = v
	}
	for _, c := range rr.Status.ByType {
		pass.ByType[string(c.Type)] = c.Count
	}
	seen := map[hooksv1alpha1.DiscrepancyType]bool{}
	for _, it := range rr.Status.Items {
		if !seen[it.Type] {
			seen[it.Type] = true
			pass.Examples = append(pass.Examples, fmt.Sprintf("%s %s (%s): %s", it.Type, it.Object, it.Action, it.Message))
		}
	}
	if rr.Status.CompletedAt != nil {
		pass.Seconds = round(rr.Status.CompletedAt.Sub(rr.CreationTimestamp.Time).Seconds(), 1)
	}
	sm.LastPass = pass
}

// keepManagerCounters selects the manager's metrics the phase reads.
func keepManagerCounters(n string) bool {
	return strings.HasPrefix(n, "controller_runtime_reconcile_") || n == "controller_runtime_max_concurrent_reconciles" ||
		strings.HasPrefix(n, "settlement_archive") || n == "settlement_reconciliation_discrepancies_total"
}

// diffSamples is after − before per series (gauges — max_concurrent_reconciles,
// archive_enabled/up — are taken from after).
func diffSamples(before, after []sample) []sample {
	key := func(s sample) string {
		ks := make([]string, 0, len(s.labels))
		for k, v := range s.labels {
			ks = append(ks, k+"="+v)
		}
		sort.Strings(ks)
		return s.name + "{" + strings.Join(ks, ",") + "}"
	}
	prev := map[string]float64{}
	for _, s := range before {
		prev[key(s)] = s.value
	}
	out := make([]sample, 0, len(after))
	for _, s := range after {
		if s.name != "controller_runtime_max_concurrent_reconciles" && !strings.HasSuffix(s.name, "_enabled") &&
			!strings.HasSuffix(s.name, "_up") {
			s.value -= prev[key(s)]
		}
		out = append(out, s)
	}
	return out
}

// archiveMetrics turns the manager's archive and discrepancy counters into
// name{labels} → value.
func archiveMetrics(ss []sample) map[string]float64 {
	out := map[string]float64{}
	for _, s := range ss {
		if !strings.HasPrefix(s.name, "settlement_archive") && s.name != "settlement_reconciliation_discrepancies_total" || s.value == 0 {
			continue
		}
		ks := make([]string, 0, len(s.labels))
		for k, v := range s.labels {
			ks = append(ks, k+"="+v)
		}
		sort.Strings(ks)
		out[s.name+"{"+strings.Join(ks, ",")+"}"] = s.value
	}
	return out
}

// summarize fills in slopes, rates and latencies from the samples and timelines.
func (a *ArchivePhase) summarize(ds []*arcDelivery, n int) {
	var load []ArchiveSample
	for _, s := range a.Samples {
		if s.Label == "load" {
			load = append(load, s)
		}
	}
	var ack, settled, reconciled, processed []time.Duration
	for _, d := range ds {
		if d.failed {
			a.Failed++
			continue
		}
		ack = append(ack, d.acked.Sub(d.scheduled))
		if !d.settled.IsZero() {
			settled = append(settled, d.settled.Sub(d.scheduled))
		}
		if !d.reconciled.IsZero() {
			reconciled = append(reconciled, d.reconciled.Sub(d.scheduled))
		}
		if !d.processed.IsZero() {
			processed = append(processed, d.processed.Sub(d.scheduled))
		} else {
			a.Unprocessed++
		}
	}
	a.Latency = ArchiveLatency{Ack: percentiles(ack), Settled: percentiles(settled), Reconciled: percentiles(reconciled),
		Archived: percentiles(processed)}
	// The manager's event recorder (client-go tools/events) keeps every Event it sent
	// for 6-12 minutes: its memory grows with the rate for the first eventCacheWarmup
	// of load, then holds. Slopes are fitted after that when enough samples are left.
	var steady []ArchiveSample
	for _, s := range load {
		if s.Seconds-a.LoadStartSeconds >= eventCacheWarmup.Seconds() {
			steady = append(steady, s)
		}
	}
	if len(steady) >= 3 {
		a.FitFromSeconds = steady[0].Seconds
		load = steady
	} else if len(load) > 0 {
		a.FitFromSeconds = load[0].Seconds
		a.Notes = append(a.Notes, fmt.Sprintf("fewer than 3 samples came %s or more into the load: slopes are fitted from the first sample under load and include the warm-up of the manager's Event cache (6-12 min of Events)",
			eventCacheWarmup))
	}
	a.FitSamples = len(load)
	if len(load) < 2 {
		a.Notes = append(a.Notes, "fewer than two samples under load: no slopes (raise -archive-events or -archive-samples)")
		return
	}
	first, last := load[0], load[len(load)-1]
	x := func(s ArchiveSample) float64 { return float64(s.Processed) }
	slope := func(y func(ArchiveSample) float64) Slope {
		xs, ys := make([]float64, len(load)), make([]float64, len(load))
		for i, s := range load {
			xs[i], ys[i] = x(s), y(s)
		}
		out := Slope{Start: y(first), Middle: y(load[len(load)/2]), End: y(last)}
		if ls, _, ok := leastSquares(xs, ys); ok {
			out.LeastSquares = round(ls, 1)
		}
		if dx := x(last) - x(first); dx > 0 {
			out.EndMinusStart = round((y(last)-y(first))/dx, 1)
		}
		return out
	}
	obj := func(k string) func(ArchiveSample) float64 {
		return func(s ArchiveSample) float64 { return float64(s.LiveObjects[k]) }
	}
	a.Slopes = ArchiveSlopes{
		RSSBytes:             slope(func(s ArchiveSample) float64 { return float64(s.RSSBytes) }),
		HeapInuseBytes:       slope(func(s ArchiveSample) float64 { return float64(s.HeapInuseBytes) }),
		LiveHeapBytes:        slope(func(s ArchiveSample) float64 { return float64(s.LiveHeapBytes) }),
		StackInuseBytes:      slope(func(s ArchiveSample) float64 { return float64(s.StackInuseBytes) }),
		HeapIdleBytes:        slope(func(s ArchiveSample) float64 { return float64(s.HeapIdleBytes) }),
		Goroutines:           slope(func(s ArchiveSample) float64 { return float64(s.Goroutines) }),
		EtcdCompactedBytes:   slope(func(s ArchiveSample) float64 { return float64(s.EtcdCompactedBytes) }),
		EtcdRawInUseBytes:    slope(func(s ArchiveSample) float64 { return float64(s.EtcdRawInUseBytes) }),
		EtcdRecordBytes:      slope(func(s ArchiveSample) float64 { return float64(s.LiveRecordBytes) }),
		EtcdEventBytes:       slope(func(s ArchiveSample) float64 { return float64(s.LiveBytes["Event"]) }),
		EtcdCompactedNoEvent: slope(func(s ArchiveSample) float64 { return float64(s.EtcdCompactedBytes - s.LiveBytes["Event"]) }),
		EtcdHistoryBytes:     slope(func(s ArchiveSample) float64 { return float64(s.EtcdHistorySumBytes) }),
		PostgresBytes:        slope(func(s ArchiveSample) float64 { return float64(s.PostgresBytes) }),
		PostgresDatabase:     slope(func(s ArchiveSample) float64 { return float64(s.PostgresDatabaseBytes) }),
		LiveObjects: map[string]Slope{"WebhookEvent": slope(obj("WebhookEvent")), "JobCompletion": slope(obj("JobCompletion")),
			"BillingSettlement": slope(obj("BillingSettlement")), "Event": slope(obj("Event")),
			"ReconciliationReport": slope(obj("ReconciliationReport"))},
	}
	// Rates over the same window: the first to the last sample under load.
	dt := last.Seconds - first.Seconds
	if dt <= 0 {
		return
	}
	r := &a.Rates
	r.WindowSeconds = round(dt, 1)
	r.AcceptedPerSecond = round(float64(last.Acked-first.Acked)/dt, 2)
	r.SettledPerSecond = round(float64(last.Settled-first.Settled)/dt, 2)
	r.ProcessedPerSecond = round(float64(last.Processed-first.Processed)/dt, 2)
	r.ArchivedPerSecond = map[string]float64{}
	for _, k := range arcKinds {
		v := float64(last.Archived[k]-first.Archived[k]) / dt
		r.ArchivedPerSecond[k] = round(v, 2)
	}
	r.ArchivedToAccepted = ratio(r.ProcessedPerSecond, r.AcceptedPerSecond)
	r.BacklogStart, r.BacklogEnd = first.Backlog, last.Backlog
	r.ArchivedRecordsPerSecond = round(float64(sumArchived(last)-sumArchived(first))/dt, 2)
}

func sumArchived(s ArchiveSample) int {
	t := 0
	for _, v := range s.Archived {
		t += v
	}
	return t
}

// postgresDetail reads the archive's tables once everything is archived.
func (a *ArchivePhase) postgresDetail(ctx context.Context, db *pgx.Conn) error {
	s, err := readPGSizes(ctx, db, true)
	if err != nil {
		return err
	}
	pg := &a.Postgres
	pg.Tables = map[string]PostgresTable{}
	var total int64
	for i, k := range arcKinds {
		t := PostgresTable{Table: arcTables[i], Rows: s.rows[i], TotalBytes: s.total[i], TableBytes: s.table[i],
			IndexBytes: s.index[i], MeanObjectBytes: round(s.meanObject[i], 0), MeanRowBytes: round(s.meanRow[i], 0)}
		if s.rows[i] > 0 {
			t.BytesPerRow = round(float64(s.total[i])/float64(s.rows[i]), 0)
		}
		pg.Tables[k] = t
		total += s.total[i]
	}
	pg.TotalBytes, pg.DatabaseBytes = total, s.database
	pg.ArchivedEvents = s.rows[arcEvent]
	if s.rows[arcEvent] > 0 {
		pg.BytesPerArchivedEvent = round(float64(total)/float64(s.rows[arcEvent]), 0)
		pg.ObjectBytesPerEvent = round(float64(s.objectTotal[0]+s.objectTotal[1]+s.objectTotal[2])/float64(s.rows[arcEvent]), 0)
		pg.DuplicatedJSONBytesPerEvent = round(float64(s.opsTotal)/float64(s.rows[arcEvent]), 0)
	}
	// How the object column is stored: TOAST compresses a row's large values (pglz)
	// once the row passes ~2 KB, which these rows mostly do.
	if s.rows[arcEvent] > 0 {
		var text, compressed, rows int64
		for _, tbl := range arcTables {
			var t, c, n int64
			if err := db.QueryRow(ctx, `SELECT coalesce(sum(octet_length(object::text)), 0),
				count(*) FILTER (WHERE pg_column_compression(object) IS NOT NULL), count(object) FROM `+tbl).Scan(&t, &c, &n); err != nil {
				return fmt.Errorf("object column of %s: %w", tbl, err)
			}
			text, compressed, rows = text+t, compressed+c, rows+n
		}
		pg.ObjectTextBytesPerEvent = round(float64(text)/float64(s.rows[arcEvent]), 0)
		pg.CompressedObjectShare = ratio(float64(compressed), float64(rows))
	}
	if len(a.Samples) > 0 {
		idle := a.Samples[0]
		if d := s.rows[arcEvent] - idle.PostgresRows["WebhookEvent"]; d > 0 {
			pg.DatabaseGrowthPerEvent = round(float64(s.database-idle.PostgresDatabaseBytes)/float64(d), 0)
		}
	}
	return nil
}

// goals compares the measurements with the archive's targets: reported, never asserted.
func (a *ArchivePhase) goals() {
	add := func(name, goal string, value, limit float64, atMost bool, unit string) {
		met := value <= limit
		if !atMost {
			met = value >= limit
		}
		a.Goals = append(a.Goals, Goal{Name: name, Goal: goal, Value: value, Unit: unit, Met: met})
	}
	add("manager RSS slope (least squares)", "≤ 200 B per processed event", a.Slopes.RSSBytes.LeastSquares, 200, true, "B/event")
	add("etcd size slope, compacted+defragmented (least squares)", "≤ 500 B per processed event", a.Slopes.EtcdCompactedBytes.LeastSquares, 500, true, "B/event")
	add("etcd size slope without Kubernetes Events (they expire after --event-ttl)", "≤ 500 B per processed event",
		a.Slopes.EtcdCompactedNoEvent.LeastSquares, 500, true, "B/event")
	add("archival rate ÷ pipeline rate (events fully archived/s ÷ accepted/s)", "≥ 1", a.Rates.ArchivedToAccepted, 1, false, "ratio")
	add("PostgreSQL bytes per archived event (3 tables, pg_total_relation_size)", "≤ 3 KB (3,072 B)", a.Postgres.BytesPerArchivedEvent, 3072, true, "B/event")
}
