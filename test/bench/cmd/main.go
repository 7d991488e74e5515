// Command bench measures the operator against one local control plane and writes
// bench/results.json; `make bench` runs it. See test/bench and bench/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/settlement-operator/settlement-operator/test/bench"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

func main() {
	var (
		cfg       bench.Config
		out       string
		fractions string
		retained  string
		underCap  bool
		mgrArgs   string
	)
	flag.StringVar(&out, "out", filepath.Join(testenv.RepoRoot(), "bench", "results.json"), "Where to write the results.")
	flag.StringVar(&cfg.ManagerBinary, "manager", "", "Manager binary to run (default: go build ./cmd).")
	flag.StringVar(&cfg.WorkDir, "work-dir", "", "Keep the kubeconfigs and the managers' logs here (default: a temporary directory, removed after a successful run).")
	flag.StringVar(&mgrArgs, "manager-args", "", "Extra manager flags, space-separated (e.g. --max-concurrent-reconciles=8).")
	flag.IntVar(&cfg.Senders, "senders", 16, "Concurrent senders for the raw/accepted/duplicate comparison.")
	flag.IntVar(&cfg.Rounds, "rounds", 3, "Rounds of the raw/accepted/duplicate comparison.")
	flag.IntVar(&cfg.PerRound, "per-round", 400, "Events per round and kind.")
	flag.IntVar(&cfg.DuplicatesPerEvent, "duplicates-per-event", 5, "Redeliveries of each event in the duplicate measurement.")
	flag.StringVar(&fractions, "load", "0.25,0.5,0.9", "Open-loop levels, as fractions of the raw create rate.")
	flag.DurationVar(&cfg.LevelDuration, "level-duration", time.Second, "How long each open-loop level sends.")
	flag.IntVar(&cfg.MaxEventsPerLevel, "max-events-per-level", 2500, "Cap on the events of one level.")
	flag.DurationVar(&cfg.SettleTimeout, "settle-timeout", 150*time.Second, "Longest wait for a level's events to settle.")
	flag.BoolVar(&underCap, "under-capacity-level", true, "Add a level at half the measured pipeline throughput.")
	flag.StringVar(&retained, "retained", "1000,10000,50000", "Retained-event counts at which the manager's RSS is read.")
	flag.DurationVar(&cfg.Budget, "budget", 5*time.Minute+45*time.Second,
		"Wall-time target: retained-event levels that would overrun it are extrapolated, not measured.")
	flag.IntVar(&cfg.ArchiveEvents, "archive-events", 50000,
		"Events the sustained phase with the archive on (item 6) pushes through the whole pipeline; 0 skips it. Smaller values make quick runs.")
	flag.DurationVar(&cfg.ArchiveDuration, "archive-duration", 0,
		"Instead of -archive-events: send for this long at item 6's rate (e.g. 30m for the flatness run).")
	flag.BoolVar(&cfg.ArchiveOnly, "archive-only", false, "Run item 6 only (skip items 1-5).")
	flag.DurationVar(&cfg.ArchiveAfter, "archive-after", 5*time.Second, "The manager's --archive-after in item 6.")
	flag.DurationVar(&cfg.ReconcileInterval, "archive-reconcile-interval", 5*time.Second,
		"The BillingProvider's spec.reconciliation.interval in item 6 (only settlements a pass confirmed are archived).")
	flag.IntVar(&cfg.CalibrationEvents, "archive-calibration-events", 600,
		"Burst sent before item 6's open-loop staircase to measure the rate the pipeline sustains; negative skips both (then set -archive-rate).")
	flag.Float64Var(&cfg.ArchiveLoad, "archive-load", 0.9, "Item 6 runs at this fraction of the sustainable rate the staircase found.")
	flag.Float64Var(&cfg.ArchiveRate, "archive-rate", 0, "Item 6's delivery rate per second instead of the calibrated one.")
	flag.IntVar(&cfg.ArchiveSamples, "archive-samples", 10, "Samples item 6 takes under load (plus one before and one after).")
	flag.IntVar(&cfg.IsolationEvents, "isolation-events", 100,
		"Charges item 7 (outbound isolation) measures alone and again beside a provider that never answers; 0 skips it.")
	flag.Float64Var(&cfg.IsolationRate, "isolation-rate", 10, "Item 7's delivery rate per second.")
	flag.IntVar(&cfg.TarpitCharges, "isolation-tarpit-charges", 64, "Charges item 7 sends to the provider that never answers.")
	flag.BoolVar(&cfg.IsolationOnly, "isolation-only", false, "Run item 7 only (a control plane and a manager of its own, about 3 minutes).")
	flag.DurationVar(&cfg.ProfileSeconds, "profile", 30*time.Second,
		"Profile the manager's CPU this long from the start of item 3's levels and of item 6's sustained load; 0 or negative: no profile.")
	flag.Parse()
	if cfg.ProfileSeconds <= 0 {
		cfg.ProfileSeconds = -1
	}
	cfg.ProfileDir = filepath.Dir(out)
	if cfg.ArchiveEvents == 0 {
		cfg.ArchiveEvents = -1
	}
	if cfg.IsolationEvents == 0 {
		cfg.IsolationEvents = -1
	}
	cfg.UnderCapacityLevel = &underCap
	cfg.ManagerArgs = strings.Fields(mgrArgs)
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel)))

	var err error
	if cfg.LoadFractions, err = parseList(fractions, strconv.ParseFloat); err != nil {
		fail(fmt.Errorf("-load: %w", err))
	}
	if cfg.Retained, err = parseList(retained, func(s string, _ int) (int, error) { return strconv.Atoi(s) }); err != nil {
		fail(fmt.Errorf("-retained: %w", err))
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		fail(err)
	}
	res.PrintTable(os.Stdout)
	if err := res.WriteJSON(out); err != nil {
		fail(err)
	}
	fmt.Printf("\nwrote %s\n", out)
}

func parseList[T any](s string, parse func(string, int) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
