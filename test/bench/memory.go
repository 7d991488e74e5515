package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// memory runs item 5: the manager's VmRSS with growing numbers of retained events.
// Retained events are created directly, as a receiver would store them, but with
// no facts: they are reconciled once (phase Ignored, one status patch, a retention
// deadline) and fan out to nothing, as a completed event waiting for retention
// does not either. Nothing is forced: the manager's informers see them, its
// controller settles them, and RSS is read after that, as the kernel reports it.
//
// A level whose projected duration (from the previous level's pace) would overrun
// the run's time budget is not measured but extrapolated, and marked so.
func (b *run) memory(ctx context.Context, op *operator) error {
	m := &b.res.Memory
	m.BaselineEvents = b.res.Cost.Events
	time.Sleep(2 * time.Second)
	var err error
	if m.BaselineRSSBytes, _, err = rss(op.Pid()); err != nil {
		return err
	}
	b.logf("item 5: manager RSS %s before retained events", mib(m.BaselineRSSBytes))
	created := 0
	name := func(i int) (string, string) {
		id := fmt.Sprintf("ret-%06d", i)
		return identity.EventName(latencyNamespace, providerName, id), id
	}
	var secondsPerEvent float64 // pace of the previous level, create + settle
	prevRSS, prevN := m.BaselineRSSBytes, 0
	for _, target := range b.cfg.Retained {
		n := target - created
		if n <= 0 {
			continue
		}
		if secondsPerEvent > 0 {
			projected := time.Duration(1.2 * secondsPerEvent * float64(n) * float64(time.Second))
			if left := b.cfg.Budget - time.Since(b.start); projected > left {
				b.logf("item 5: %d retained events would take ~%s, %s of the budget is left: extrapolating",
					target, projected.Round(time.Second), left.Round(time.Second))
				m.Levels = append(m.Levels, MemoryLevel{RetainedEvents: target, Extrapolated: true})
				b.res.Notes = append(b.res.Notes, fmt.Sprintf(
					"memory at %d retained events is EXTRAPOLATED (least-squares line through the measured levels): measuring it "+
						"would have taken ~%s with %s of the %s budget left (-budget to allow more)",
					target, projected.Round(time.Second), left.Round(time.Second), b.cfg.Budget))
				continue
			}
		}
		w0, err := b.probe.writes(ctx)
		if err != nil {
			return err
		}
		base := created
		d, err := parallel(b.cfg.Senders, n, nil, func(i int) error {
			nm, id := name(base + i)
			return b.k.Create(ctx, minimalEvent(latencyNamespace, nm, id))
		})
		if err != nil {
			return fmt.Errorf("create retained events: %w", err)
		}
		created = target
		settleStart := time.Now()
		// Settled when the controller has written each new event's status once.
		err = waitFor(ctx, 10*time.Minute, "the manager to reconcile the retained events", func() (bool, error) {
			if err := op.exited(); err != nil {
				return false, err
			}
			w, err := b.probe.writes(ctx)
			if err != nil {
				return false, err
			}
			time.Sleep(400 * time.Millisecond)
			return w.since(w0).count("webhookevents", "status", "PATCH") >= float64(n), nil
		})
		if err != nil {
			return err
		}
		settle := time.Since(settleStart)
		secondsPerEvent = (d + settle).Seconds() / float64(n)
		lv := MemoryLevel{RetainedEvents: target, CreatePerSecond: round(float64(n)/d.Seconds(), 1),
			SettleSeconds: round(settle.Seconds(), 1)}
		// Read RSS a few times as the manager goes idle; keep the last reading.
		for range 3 {
			time.Sleep(time.Second)
			if lv.RSSBytes, lv.PeakRSSBytes, err = rss(op.Pid()); err != nil {
				return err
			}
		}
		lv.GrowthPerEvent = round(float64(lv.RSSBytes-prevRSS)/float64(target-prevN), 0)
		prevRSS, prevN = lv.RSSBytes, target
		m.Levels = append(m.Levels, lv)
		b.logf("item 5: %d retained events: RSS %s (peak %s), created at %.0f/s, reconciled %.1fs later",
			target, mib(lv.RSSBytes), mib(lv.PeakRSSBytes), lv.CreatePerSecond, lv.SettleSeconds)
	}
	b.fitMemory()
	if created > 0 {
		nm, _ := name(0)
		if s, err := b.probe.stored(ctx, storedKinds[0].prefix+latencyNamespace+"/"+nm); err == nil && s.Keys == 1 {
			m.RetainedEventBytes = float64(s.ValueBytes + s.KeyBytes)
		}
	}

	// One scrape of the manager's metrics, as Prometheus would every 15-60s: its
	// objects collector lists every cached object.
	before, _, _ := rss(op.Pid())
	start := time.Now()
	resp, err := http.Get(op.MetricsURL)
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		after, _, _ := rss(op.Pid())
		m.MetricsScrape = &Scrape{Seconds: round(time.Since(start).Seconds(), 3), Bytes: len(body),
			RSSBeforeBytes: before, RSSAfterBytes: after}
	}
	return nil
}

// fitMemory fits RSS = a + b·events through the measured levels (least squares;
// with one measured level, through the baseline too) and fills in the
// extrapolated ones.
func (b *run) fitMemory() {
	m := &b.res.Memory
	var xs, ys []float64
	for _, lv := range m.Levels {
		if !lv.Extrapolated {
			xs, ys = append(xs, float64(lv.RetainedEvents)), append(ys, float64(lv.RSSBytes))
		}
	}
	if len(xs) == 1 {
		xs, ys = append(xs, 0), append(ys, float64(m.BaselineRSSBytes))
	}
	if len(xs) < 2 {
		return
	}
	slope, icept, ok := leastSquares(xs, ys)
	if !ok {
		return
	}
	m.BytesPerRetainedEvent = round(slope, 0)
	for i := range m.Levels {
		if m.Levels[i].Extrapolated {
			m.Levels[i].RSSBytes = int64(icept + slope*float64(m.Levels[i].RetainedEvents))
			m.Levels[i].GrowthPerEvent = round(slope, 0)
		}
	}
}
