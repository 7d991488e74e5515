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
	Goals                            []Goal  `json:"goals"`
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
	for _, g := range t.Goals {
		fmt.Fprintf(w, "  %s\t%s\t%s %s\t%v\n", g.Name, g.Goal, f2(g.Value), g.Unit, g.Met)
	}
}
