// Package bench measures the operator's capacity against one local control plane
// (envtest's etcd and kube-apiserver), in one run, and reports every headline both as
// an absolute number and as a ratio to a baseline taken in the same run — a shared
// two-core machine moves absolute numbers, not the ratios:
//
//  1. the API server's raw create rate of a minimal custom resource (the ceiling of a
//     design whose ack is one create) against the receiver's accepted events/s;
//  2. duplicate deliveries/s (answered from the cache, no write) against accepted/s;
//  3. request→Settled latency (p50/p99) under open-loop load at fractions of that
//     ceiling, with the manager binary running as its own process and the fake
//     billing provider in this one;
//  4. API-server writes and etcd bytes per event;
//  5. the manager's resident memory with 1k, 10k and 50k retained events;
//  7. another tenant's request→Settled p99 with and without a tenant whose billing
//     provider accepts connections and never answers, as a ratio (outbound
//     isolation, a control plane and a manager of its own);
//  6. with the archive on (a PostgreSQL of its own, a control plane of its own): a
//     sustained load of 50,000 events through the whole pipeline at a rate it keeps
//     up with, and what stays behind per event in etcd, the manager's memory and
//     PostgreSQL.
//
// `make bench` runs it (test/bench/cmd) and writes bench/results.json. Nothing here
// asserts a time: it measures and reports.
package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// Config is one run's parameters; zero values take the defaults in parentheses.
type Config struct {
	// ManagerBinary is the manager to run; built from ./cmd into WorkDir when empty.
	ManagerBinary string
	// ManagerArgs are extra flags for the manager (e.g. --max-concurrent-reconciles=8).
	ManagerArgs []string
	// WorkDir holds the kubeconfig, the binary and the manager's log (a temporary
	// directory, removed after a successful run).
	WorkDir string
	// Senders is the number of concurrent clients of items 1-2 (16).
	Senders int
	// Rounds × PerRound events are created raw, delivered and redelivered (3 × 400).
	Rounds, PerRound int
	// LoadFractions are the open-loop levels as fractions of the raw create rate
	// (0.25, 0.5, 0.9).
	LoadFractions []float64
	// LevelDuration is how long each level sends (1s), at most MaxEventsPerLevel
	// events (2500); SettleTimeout bounds the wait for a level to settle (150s).
	LevelDuration     time.Duration
	MaxEventsPerLevel int
	SettleTimeout     time.Duration
	// UnderCapacityLevel adds a level at half the pipeline throughput measured by the
	// others, to show the latency of an operator that keeps up (true).
	UnderCapacityLevel *bool
	// Retained are the cumulative numbers of retained events at which the manager's
	// RSS is read (1000, 10000, 50000).
	Retained []int
	// DuplicatesPerEvent is how many times each event of a round is redelivered (5):
	// duplicates are answered so fast that one redelivery each is too short to time.
	DuplicatesPerEvent int
	// ReceiverMaxInFlight is the in-process receiver's bound in items 1-2 (64, the
	// manager's default).
	ReceiverMaxInFlight int
	// Budget is the run's wall-time target (5m45s): memory levels that would overrun
	// it are extrapolated instead of measured.
	Budget time.Duration
	// ArchiveEvents is how many events item 6, the sustained phase with the archive
	// on, pushes through the whole pipeline (50000); negative skips it.
	ArchiveEvents int
	// ArchiveDuration, when set, replaces ArchiveEvents by as many events as the
	// sustained phase sends in that time at its rate (known only after calibration):
	// a run of a given length at the rate the pipeline sustains.
	ArchiveDuration time.Duration
	// ArchiveOnly skips items 1-5.
	ArchiveOnly bool
	// ArchiveAfter is the manager's --archive-after in item 6 (5s).
	ArchiveAfter time.Duration
	// ReconcileInterval is the BillingProvider's spec.reconciliation.interval in item 6
	// (5s): only settlements a pass confirmed are archived.
	ReconcileInterval time.Duration
	// CalibrationEvents are sent as one burst before item 6's sustained load to measure
	// what the pipeline sustains, followed by an open-loop staircase (600); ArchiveLoad
	// is the fraction of the sustainable rate the sustained load runs at (0.9).
	// ArchiveRate > 0 sets the rate instead.
	CalibrationEvents int
	ArchiveLoad       float64
	ArchiveRate       float64
	// ArchiveSamples is how many samples item 6 takes under load (10).
	ArchiveSamples int
	// IsolationEvents is how many charges item 7 (outbound isolation) measures alone
	// and again beside a tarpit, at IsolationRate per second (100 at 10/s); negative
	// skips it. TarpitCharges are sent to the tarpit's tenant first (64: more than
	// the manager's 16 settlement workers). IsolationOnly runs item 7 alone.
	IsolationEvents int
	IsolationRate   float64
	TarpitCharges   int
	IsolationOnly   bool
	// ProfileDir receives the manager's CPU profiles (the work directory).
	ProfileDir string
	// ProfileSeconds is how long the manager's CPU is profiled from the start of
	// item 3's levels and from the start of item 6's sustained load (30s; negative: no
	// profile).
	ProfileSeconds time.Duration
	// Progress receives one line per step (os.Stderr).
	Progress io.Writer
}

func (c *Config) defaults() {
	set := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	set(&c.Senders, 16)
	set(&c.Rounds, 3)
	set(&c.PerRound, 400)
	set(&c.MaxEventsPerLevel, 2500)
	set(&c.ReceiverMaxInFlight, 64)
	set(&c.DuplicatesPerEvent, 5)
	if c.Budget == 0 {
		c.Budget = 5*time.Minute + 45*time.Second
	}
	if len(c.LoadFractions) == 0 {
		c.LoadFractions = []float64{0.25, 0.5, 0.9}
	}
	if c.ProfileSeconds == 0 {
		c.ProfileSeconds = 30 * time.Second
	}
	if c.LevelDuration == 0 {
		c.LevelDuration = time.Second
	}
	if c.SettleTimeout == 0 {
		c.SettleTimeout = 150 * time.Second
	}
	if c.UnderCapacityLevel == nil {
		t := true
		c.UnderCapacityLevel = &t
	}
	if len(c.Retained) == 0 {
		c.Retained = []int{1000, 10000, 50000}
	}
	set(&c.ArchiveEvents, 50000)
	set(&c.CalibrationEvents, 600)
	set(&c.ArchiveSamples, 10)
	set(&c.IsolationEvents, 100)
	set(&c.TarpitCharges, 64)
	if c.IsolationRate == 0 {
		c.IsolationRate = 10
	}
	if c.ArchiveAfter == 0 {
		c.ArchiveAfter = 5 * time.Second
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = 5 * time.Second
	}
	if c.ArchiveLoad == 0 {
		c.ArchiveLoad = 0.9
	}
	if c.Progress == nil {
		c.Progress = os.Stderr
	}
}

// run is one benchmark run's shared state.
type run struct {
	cfg          Config
	cpu0         map[string]float64 // CPU of the run's processes when the latency phase began
	res          *Results
	env          *envtest.Environment
	restCfg      *rest.Config
	k            client.Client
	probe        *probe
	dir          string
	rawCreateP50 float64
	start        time.Time
}

func (b *run) logf(format string, args ...any) {
	fmt.Fprintf(b.cfg.Progress, "bench %5.1fs: %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

// Run starts a control plane, runs every phase against it and returns the results.
// The control plane, the manager process and the fake billing provider are stopped
// before it returns.
func Run(ctx context.Context, cfg Config) (res *Results, err error) {
	cfg.defaults()
	b := &run{cfg: cfg, start: time.Now(), res: &Results{Schema: 1, StartedAt: time.Now(), Machine: machine(),
		Settings: Settings{Senders: cfg.Senders, Rounds: cfg.Rounds, EventsPerRound: cfg.PerRound,
			LoadFractions: cfg.LoadFractions, LevelSeconds: cfg.LevelDuration.Seconds(),
			MaxEventsPerLevel: cfg.MaxEventsPerLevel, RetainedLevels: cfg.Retained,
			DuplicatesPerEvent: cfg.DuplicatesPerEvent, ReceiverMaxInFlight: cfg.ReceiverMaxInFlight,
			BudgetSeconds: cfg.Budget.Seconds()}}}
	b.dir = cfg.WorkDir
	if b.dir == "" {
		if b.dir, err = os.MkdirTemp("", "settlement-bench-"); err != nil {
			return nil, err
		}
		defer func() {
			if err == nil {
				_ = os.RemoveAll(b.dir)
			} else {
				err = fmt.Errorf("%w (manager log and kubeconfig kept in %s)", err, b.dir)
			}
		}()
	}

	bin := cfg.ManagerBinary
	if bin == "" {
		b.logf("building the manager (go build ./cmd)")
		if bin, err = buildManager(ctx, b.dir); err != nil {
			return nil, err
		}
	}

	b.res.Settings.Revision, b.res.Settings.ManagerArgs = revision(ctx), cfg.ManagerArgs

	if cfg.IsolationOnly {
		cfg.ArchiveOnly, cfg.ArchiveEvents = true, -1
	}
	if !cfg.ArchiveOnly {
		if err := b.archiveOff(ctx, bin); err != nil {
			return nil, err
		}
	}
	if cfg.IsolationEvents > 0 && (cfg.IsolationOnly || !cfg.ArchiveOnly) {
		if err := b.isolation(ctx, bin); err != nil {
			return nil, fmt.Errorf("isolation: %w", err)
		}
	}
	if cfg.ArchiveEvents > 0 {
		if err := b.archivePhase(ctx, bin); err != nil {
			return nil, fmt.Errorf("archive: %w", err)
		}
	}
	b.throughput()
	b.res.Machine.LoadAverageEnd = loadAverage()
	b.res.DurationSeconds = round(time.Since(b.start).Seconds(), 1)
	return b.res, nil
}

// startControlPlane starts a control plane of its own (etcd + kube-apiserver) and
// points the run's clients and probe at it; stop stops it.
func (b *run) startControlPlane(ctx context.Context) (stop func(), err error) {
	b.logf("starting the control plane (etcd + kube-apiserver, periodic compaction off)")
	if b.env, err = testenv.New(); err != nil {
		return nil, err
	}
	// History is kept for the whole run, so etcd's growth over a window is every
	// revision the window wrote (the capacity model adds compaction back).
	b.env.ControlPlane.GetAPIServer().Configure().Set("etcd-compaction-interval", "0")
	admin, err := b.env.Start()
	if err != nil {
		return nil, fmt.Errorf("start the control plane: %w", err)
	}
	env := b.env
	stop = func() { _ = env.Stop() }
	b.restCfg = unlimited(admin)
	if b.k, err = client.New(b.restCfg, client.Options{Scheme: testenv.Scheme()}); err != nil {
		stop()
		return nil, err
	}
	if b.probe, err = newProbe(b.restCfg, b.env.ControlPlane.Etcd.URL); err != nil {
		stop()
		return nil, err
	}
	if dc, err := discovery.NewDiscoveryClientForConfig(b.restCfg); err == nil {
		if v, err := dc.ServerVersion(); err == nil {
			b.res.Machine.KubernetesVersion = v.GitVersion
		}
	}
	b.res.Machine.EtcdVersion = b.probe.etcdVersion(ctx)
	return stop, nil
}

// archiveOff runs items 1-5 with the manager's default flags (no archive) on one
// control plane, stopped at the end.
func (b *run) archiveOff(ctx context.Context, bin string) error {
	cfg := b.cfg
	stopCP, err := b.startControlPlane(ctx)
	if err != nil {
		return err
	}
	defer stopCP()

	b.logf("items 1-2: raw creates vs receiver (accepted, duplicate), %d senders", cfg.Senders)
	if err := b.ingest(ctx); err != nil {
		return fmt.Errorf("ingestion: %w", err)
	}
	in := b.res.Ingestion
	b.logf("raw %.0f/s, accepted %.0f/s (%.2f), duplicate %.0f/s (%.2f of accepted)", in.RawCreatesPerSecond,
		in.AcceptedPerSecond, in.AcceptedToRaw, in.DuplicatesPerSecond, in.DuplicateToAccepted)

	billing, err := fakebilling.Start(fakebilling.Options{Token: billingToken})
	if err != nil {
		return err
	}
	defer func() { _ = billing.Close() }()
	b.logf("starting the manager process")
	op, err := startOperator(ctx, b.env, bin, b.dir, "manager", cfg.ManagerArgs, nil)
	if err != nil {
		return err
	}
	defer op.stop()
	if b.res.Memory.StartRSSBytes, _, err = rss(op.Pid()); err != nil {
		return err
	}
	if err := b.latency(ctx, op, billing); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	if err := b.memory(ctx, op); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	return nil
}

// latency runs item 3 and, over the same events, item 4.
func (b *run) latency(ctx context.Context, op *operator, billing *fakebilling.Server) error {
	if err := tenant(ctx, b.k, latencyNamespace, billing.URL()); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, "the WebhookProvider to be Ready", func() (bool, error) {
		if err := op.exited(); err != nil {
			return false, err
		}
		var p hooksv1alpha1.WebhookProvider
		if err := b.k.Get(ctx, client.ObjectKey{Namespace: latencyNamespace, Name: providerName}, &p); err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == hooksv1alpha1.ConditionReady && c.Status == "True" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	t := newTracker()
	stopWatch, err := b.watch(ctx, t)
	if err != nil {
		return err
	}
	defer stopWatch()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024}, Timeout: time.Minute}
	url := endpoint(op.ReceiverURL, latencyNamespace)

	w0, err := b.probe.writes(ctx)
	if err != nil {
		return err
	}
	e0, err := b.probe.etcdStats(ctx)
	if err != nil {
		return err
	}
	calls0 := billing.Calls()
	if b.cpu0, err = cpuSeconds(nil); err != nil {
		return err
	}
	events := 0
	// Warm-up (not reported): connections, caches, the billing client.
	warm := b.openLoop(ctx, t, hc, url, "warm", 20, 40)
	events += len(warm.deliveries)
	if n := t.waitAll(ctx, warm.deliveries, time.Minute); n > 0 {
		return fmt.Errorf("%d warm-up events did not settle within a minute; see %s", n, op.LogPath)
	}

	ceiling := b.res.Ingestion.RawCreatesPerSecond
	b.res.Latency.CeilingPerSecond = ceiling
	var lastLevelEvents int
	level := func(name, prefix string, fraction, rate float64, duration time.Duration) error {
		n := max(1, min(b.cfg.MaxEventsPerLevel, int(rate*duration.Seconds())))
		lastLevelEvents = n
		b.logf("item 3, level %s: %d events at %.0f/s, open loop", name, n, rate)
		lr := b.openLoop(ctx, t, hc, url, prefix, rate, n)
		events += n
		unsettled := t.waitAll(ctx, lr.deliveries, b.cfg.SettleTimeout)
		lv := LoadLevel{Name: name, FractionOfCeiling: round(fraction, 3), TargetPerSecond: round(rate, 1)}
		b.summarize(t, &lv, lr)
		if e, ok := lr.firstError.Load().(string); ok {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("level %s: first delivery error: %s", name, e))
		}
		if unsettled > 0 {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("level %s: %d events were not settled and complete after %s",
				name, unsettled, b.cfg.SettleTimeout))
		}
		b.res.Latency.Levels = append(b.res.Latency.Levels, lv)
		b.logf("level %s: settled p50 %.0f ms, p99 %.0f ms, %.1f settled/s, %d unsettled, 429/503 %d/%d",
			name, lv.Settled.P50, lv.Settled.P99, lv.SettledPerSecond, lv.Unsettled, lv.Retried429, lv.Retried503)
		if err := op.exited(); err != nil {
			return err
		}
		return nil
	}
	var profiles []func() (*Profile, error)
	if b.cfg.ProfileSeconds > 0 {
		profiles = append(profiles, op.startCPUProfile(ctx, "pipeline", b.profileDir(), b.cfg.ProfileSeconds),
			b.startAPIServerProfile(ctx, "pipeline", b.cfg.ProfileSeconds))
	}
	for _, f := range b.cfg.LoadFractions {
		if err := level(fmt.Sprintf("%.0f%% of ceiling", f*100), fmt.Sprintf("p%03.0f", f*100), f, f*ceiling, b.cfg.LevelDuration); err != nil {
			return err
		}
	}
	for _, p := range profiles {
		b.addProfile(p)
	}
	best := 0.0
	for _, lv := range b.res.Latency.Levels {
		best = max(best, lv.SettledPerSecond)
	}
	var under *LevelWrites
	if *b.cfg.UnderCapacityLevel && best > 0 {
		// Its writes are counted on their own, between quiet moments before and after.
		before, err := b.quietWrites(ctx)
		if err != nil {
			return err
		}
		// Longer than the others: few events per second, and its p99 needs a sample.
		if err := level("50% of pipeline", "u050", best/2/ceiling, best/2, max(b.cfg.LevelDuration, 10*time.Second)); err != nil {
			return err
		}
		after, err := b.quietWrites(ctx)
		if err != nil {
			return err
		}
		under = levelWrites(before, after, lastLevelEvents)
	}
	b.res.Latency.PipelineSettledPerSecond = best
	b.res.Latency.PipelineToCeiling = ratio(best, ceiling)

	b.logf("item 4: waiting for the pipeline to go quiet, then counting writes and bytes")
	if err := b.cost(ctx, op, w0, e0, events); err != nil {
		return err
	}
	b.res.Cost.UnderCapacity = under
	// One settlement per event: what each cost the billing provider.
	calls := billing.Calls()
	c := &b.res.Cost
	c.ProviderPostsPerSettlement = round(float64(calls.Posts-calls0.Posts)/float64(events), 3)
	c.ProviderLookupsPerSettlement = round(float64(calls.Gets-calls0.Gets)/float64(events), 3)
	c.ProviderListsDuringPhase = calls.Lists - calls0.Lists
	if w := b.res.Cost.WritesPerEvent; w > 0 {
		b.res.Latency.WriteBoundPerSecond = round(ceiling/w, 1)
		b.res.Latency.PipelineToWriteBound = ratio(best, ceiling/w)
	}
	return nil
}

// profileDir is where CPU profiles are written: Config.ProfileDir, else the work
// directory.
func (b *run) profileDir() string {
	if b.cfg.ProfileDir != "" {
		return b.cfg.ProfileDir
	}
	return b.dir
}

// addProfile waits for a CPU profile and adds it to the results; a failure is a
// note, not the end of the run.
func (b *run) addProfile(wait func() (*Profile, error)) {
	p, err := wait()
	if err != nil {
		b.res.Notes = append(b.res.Notes, err.Error())
		return
	}
	b.res.Profiles = append(b.res.Profiles, *p)
	if len(p.Flat) > 0 {
		b.logf("CPU profile of the %s, %s: %.1f CPU-s in %.0f s; top: %s %.1f%%", p.Process, p.Phase, p.SampledCPUSeconds, p.Seconds,
			p.Flat[0].Function, p.Flat[0].FlatPct)
	}
}

// waitFor polls cond every 100ms until it is true, returns an error, or timeout
// passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
