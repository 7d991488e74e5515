package bench

import (
	"fmt"
	"io"
)

// Throughput sets the figures of one run beside the targets for the pipeline a
// production install runs (docs/capacity.md): each is a ratio or a count measured in
// this run, reported and never asserted. A figure whose phase did not run is absent.
type Throughput struct {
	// ArchiveOnToOff is the sustained rate with the archive on (events fully processed
	// per second: received, settled, confirmed, archived and deleted) ÷ the archive-off
	// pipeline (best settled/s of item 2), both measured in this run.
	ArchiveOnToOff float64 `json:"archiveOnToOff,omitempty"`
	// WritesPerEventArchiveOn is every API-server write from receipt to the last record
	// deleted after archival, per event; WritesPerEventArchiveOff the same without the
	// archive (all levels, and at half the pipeline's rate alone).
	WritesPerEventArchiveOn          float64 `json:"writesPerEventArchiveOn,omitempty"`
	WritesPerEventArchiveOff         float64 `json:"writesPerEventArchiveOff,omitempty"`
	WritesPerEventArchiveOffUnderCap float64 `json:"writesPerEventArchiveOffUnderCapacity,omitempty"`
	// CPUMillisPerEventArchiveOn/Off is the pipeline's CPU per event (every process
	// but the bench's own), and CPUBoundArchiveOn/Off the rate that CPU allows on
	// this machine's cores: what bounds a CPU-bound pipeline, whatever the workers.
	CPUMillisPerEventArchiveOn  float64 `json:"cpuMillisPerEventArchiveOn,omitempty"`
	CPUMillisPerEventArchiveOff float64 `json:"cpuMillisPerEventArchiveOff,omitempty"`
	CPUBoundArchiveOn           float64 `json:"cpuBoundArchiveOn,omitempty"`
	CPUBoundArchiveOff          float64 `json:"cpuBoundArchiveOff,omitempty"`
	cpuOn, cpuOff               map[string]float64
	Goals                       []Goal `json:"goals"`
}

// throughput fills Results.Throughput from what the phases measured.
func (b *run) throughput() {
	r := b.res
	t := &Throughput{}
	add := func(name, goal string, value, limit float64, atMost bool, unit string) {
		met := value <= limit
		if !atMost {
			met = value >= limit
		}
		t.Goals = append(t.Goals, Goal{Name: name, Goal: goal, Value: value, Unit: unit, Met: met})
	}
	off := r.Latency.PipelineSettledPerSecond > 0
	if off {
		c := &r.Cost
		t.WritesPerEventArchiveOff = c.WritesPerEvent
		if ms := cpuTotal(c.CPUMillisPerEvent); ms > 0 {
			t.CPUMillisPerEventArchiveOff, t.CPUBoundArchiveOff = ms, round(float64(r.Machine.CPUs)*1000/ms, 1)
			t.cpuOff = c.CPUMillisPerEvent
		}
		add("archive off: writes per event (all levels)", "≤ 6 (direction ≤ 5)", c.WritesPerEvent, 6, true, "writes/event")
		if u := c.UnderCapacity; u != nil {
			t.WritesPerEventArchiveOffUnderCap = u.WritesPerEvent
			add("archive off: writes per event at half the pipeline's rate", "≤ 6 (direction ≤ 5)", u.WritesPerEvent, 6, true, "writes/event")
		}
		add("archive off: stored bytes per event (etcd, live)", "≤ 4 KiB (4,096 B)", c.StoredBytesPerEvent, 4096, true, "B/event")
		add("archive off: pipeline ÷ write bound", "≥ 0.8", r.Latency.PipelineToWriteBound, 0.8, false, "ratio")
		for _, lv := range r.Latency.Levels {
			if lv.Name == "50% of pipeline" {
				add("archive off: request→Settled p99 at half the pipeline's rate", "≤ 500 ms", lv.Settled.P99, 500, true, "ms")
			}
		}
		add("receiver accepted ÷ raw create of a minimal event", "≥ 0.95", r.Ingestion.AcceptedToRaw, 0.95, false, "ratio")
		add("billing provider POSTs per settlement", "= 1", c.ProviderPostsPerSettlement, 1, true, "POST/settlement")
	}
	if a := r.Archive; a != nil {
		t.WritesPerEventArchiveOn = a.WritesPerEvent
		if ms := cpuTotal(a.CPUMillisPerEvent); ms > 0 {
			t.CPUMillisPerEventArchiveOn, t.CPUBoundArchiveOn = ms, round(float64(r.Machine.CPUs)*1000/ms, 1)
			t.cpuOn = a.CPUMillisPerEvent
		}
		add("archive on: sustained events/s (fully processed)", "≥ 80/s on 2 cores (direction)", a.Rates.ProcessedPerSecond, 80, false, "events/s")
		if off {
			t.ArchiveOnToOff = ratio(a.Rates.ProcessedPerSecond, r.Latency.PipelineSettledPerSecond)
			add("archive on ÷ archive off (processed/s ÷ pipeline settled/s)", "≥ 0.8", t.ArchiveOnToOff, 0.8, false, "ratio")
		}
		add("archive rows per event (3 tables, pg_total_relation_size)", "≤ 2 KB (2,048 B)", a.Postgres.BytesPerArchivedEvent, 2048, true, "B/event")
	}
	if len(t.Goals) > 0 {
		r.Throughput = t
	}
}

// printThroughput writes the throughput goals as a table.
func printThroughput(w io.Writer, t *Throughput) {
	if t == nil {
		return
	}
	fmt.Fprintf(w, "\nTHROUGHPUT (this run; reported, not asserted)\tgoal\tmeasured\tmet\n")
	if t.WritesPerEventArchiveOn > 0 {
		fmt.Fprintf(w, "  writes per event, receipt to last record deleted: archive on %s, archive off %s (at half the pipeline %s)\t\t\t\n",
			f2(t.WritesPerEventArchiveOn), f2(t.WritesPerEventArchiveOff), f2(t.WritesPerEventArchiveOffUnderCap))
	}
	if t.cpuOn != nil || t.cpuOff != nil {
		fmt.Fprintf(w, "  CPU per event: archive on %s → at most %s events/s on these cores\t\t\t\n", cpuLine(t.cpuOn), f2(t.CPUBoundArchiveOn))
		fmt.Fprintf(w, "  CPU per event: archive off %s → at most %s events/s on these cores\t\t\t\n", cpuLine(t.cpuOff), f2(t.CPUBoundArchiveOff))
	}
	for _, g := range t.Goals {
		fmt.Fprintf(w, "  %s\t%s\t%s %s\t%v\n", g.Name, g.Goal, f2(g.Value), g.Unit, g.Met)
	}
}
