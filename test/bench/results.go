package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Results is everything one run measured; it is written to bench/results.json and
// printed as a table. Absolute numbers depend on the machine and on whatever else
// runs on it, so every headline is also given as a ratio to a baseline measured
// against the same control plane in the same run. bench/README.md explains the
// fields.
type Results struct {
	Schema          int       `json:"schema"`
	StartedAt       time.Time `json:"startedAt"`
	DurationSeconds float64   `json:"durationSeconds"`
	Machine         Machine   `json:"machine"`
	Settings        Settings  `json:"settings"`
	Ingestion       Ingestion `json:"ingestion"`
	Latency         Latency   `json:"latency"`
	Cost            Cost      `json:"cost"`
	Memory          Memory    `json:"memory"`
	Notes           []string  `json:"notes,omitempty"`
}

// Machine describes where the numbers were taken.
type Machine struct {
	CPUs              int    `json:"nproc"`
	CPUModel          string `json:"cpuModel"`
	MemoryBytes       int64  `json:"memoryBytes"`
	OS                string `json:"os"`
	GoVersion         string `json:"goVersion"`
	KubernetesVersion string `json:"kubernetesVersion"`
	EtcdVersion       string `json:"etcdVersion"`
	// LoadAverage is /proc/loadavg's 1/5/15-minute averages at the start and the end:
	// other work on a shared machine shows here.
	LoadAverageStart string `json:"loadAverageStart"`
	LoadAverageEnd   string `json:"loadAverageEnd"`
}

// Settings are the run's parameters (see the flags of test/bench/cmd).
type Settings struct {
	// Revision is the commit the manager was built from ("-dirty": with local changes).
	Revision string `json:"revision"`
	// ManagerArgs are extra flags the manager ran with (none: its defaults).
	ManagerArgs         []string  `json:"managerArgs,omitempty"`
	Senders             int       `json:"senders"`
	Rounds              int       `json:"rounds"`
	EventsPerRound      int       `json:"eventsPerRound"`
	LoadFractions       []float64 `json:"loadFractions"`
	LevelSeconds        float64   `json:"levelSeconds"`
	MaxEventsPerLevel   int       `json:"maxEventsPerLevel"`
	RetainedLevels      []int     `json:"retainedLevels"`
	DuplicatesPerEvent  int       `json:"duplicatesPerEvent"`
	ReceiverMaxInFlight int       `json:"receiverMaxInFlight"`
	BudgetSeconds       float64   `json:"budgetSeconds"`
}

// Ingestion compares the receiver with the API server's raw create rate (items 1, 2).
type Ingestion struct {
	// RawCreatesPerSecond is the ceiling: minimal WebhookEvents created directly by
	// Senders concurrent clients. A design whose ack is one create cannot beat it.
	RawCreatesPerSecond float64 `json:"rawCreatesPerSecond"`
	// AcceptedPerSecond is deliveries answered 200 "accepted" by the receiver with the
	// same number of concurrent senders (signed, verified, extracted, stored).
	AcceptedPerSecond float64 `json:"acceptedPerSecond"`
	// DuplicatesPerSecond is redeliveries of stored events answered 200 "duplicate".
	DuplicatesPerSecond float64 `json:"duplicatesPerSecond"`
	// AcceptedToRaw and DuplicateToAccepted are the headline ratios.
	AcceptedToRaw       float64 `json:"acceptedToRaw"`
	DuplicateToAccepted float64 `json:"duplicateToAccepted"`
	// Latency of one raw create, one accepted delivery, one duplicate delivery.
	RawCreateLatency Percentiles `json:"rawCreateLatency"`
	AcceptedLatency  Percentiles `json:"acceptedLatency"`
	DuplicateLatency Percentiles `json:"duplicateLatency"`
	// Writes the API server counted per accepted and per duplicate delivery (an
	// accepted delivery should cost exactly one create, a duplicate none).
	WritesPerAccepted  float64 `json:"writesPerAccepted"`
	WritesPerDuplicate float64 `json:"writesPerDuplicate"`
	Events             int     `json:"events"`
}

// Latency is request-to-Settled under open-loop load (item 3).
type Latency struct {
	// CeilingPerSecond is Ingestion.RawCreatesPerSecond; levels are fractions of it.
	CeilingPerSecond float64     `json:"ceilingPerSecond"`
	Levels           []LoadLevel `json:"levels"`
	// PipelineSettledPerSecond is the highest rate at which the operator turned
	// accepted events into Settled settlements at any level (the controllers'
	// throughput), and its ratio to the ceiling.
	PipelineSettledPerSecond float64 `json:"pipelineSettledPerSecond"`
	PipelineToCeiling        float64 `json:"pipelineToCeiling"`
	// WriteBoundPerSecond is the ceiling divided by Cost.WritesPerEvent: the event
	// rate if every write of the pipeline cost what a raw create does.
	// PipelineToWriteBound says how close the operator gets to it.
	WriteBoundPerSecond  float64 `json:"writeBoundPerSecond"`
	PipelineToWriteBound float64 `json:"pipelineToWriteBound"`
}

// LoadLevel is one open-loop level: deliveries are scheduled at a fixed rate whatever
// the answers (a 429 or 503 is retried after its Retry-After, as a provider does),
// and every latency is measured from the scheduled time, so a slow answer cannot
// hide the queueing it causes.
type LoadLevel struct {
	Name              string  `json:"name"`
	FractionOfCeiling float64 `json:"fractionOfCeiling"`
	TargetPerSecond   float64 `json:"targetPerSecond"`
	// OfferedPerSecond is the rate the first attempts actually went out at.
	OfferedPerSecond float64 `json:"offeredPerSecond"`
	Events           int     `json:"events"`
	SendSeconds      float64 `json:"sendSeconds"`
	// Retried429 / Retried503 count answers that made the sender wait and retry.
	Retried429 int `json:"retried429"`
	Retried503 int `json:"retried503"`
	// Failed deliveries never got a 2xx (should be 0).
	Failed int `json:"failed"`
	// Ack is schedule→200; Settled is schedule→the benchmark's watch seeing the
	// BillingSettlement Settled; Complete is schedule→the WebhookEvent Complete.
	// Overloaded is true when a queue built up during the level: the median settle
	// latency of its second half exceeds the first half's by more than a quarter of
	// the level's duration (or events were left unsettled). Its latencies are then
	// mostly queueing and grow with the level's duration.
	Overloaded bool        `json:"overloaded"`
	Ack        Percentiles `json:"ack"`
	Settled    Percentiles `json:"settled"`
	Complete   Percentiles `json:"complete"`
	// SettledP50ToRawCreate and SettledP99ToRawCreate: settle latency in units of one
	// raw create's median round trip measured in the same run.
	SettledP50ToRawCreate float64 `json:"settledP50ToRawCreate"`
	SettledP99ToRawCreate float64 `json:"settledP99ToRawCreate"`
	// Unsettled events had not settled when the level's wait ended; their latency is
	// not in Settled (it is at least the wait).
	Unsettled int `json:"unsettled"`
	// SettledPerSecond is events / (last settled − first scheduled): the pipeline's
	// throughput at this level. DrainSeconds is last settled − last scheduled.
	SettledPerSecond float64 `json:"settledPerSecond"`
	DrainSeconds     float64 `json:"drainSeconds"`
}

// Cost is what one event costs the control plane (item 4), over every event the
// latency phase sent (warm-up included), after the pipeline went quiet.
type Cost struct {
	Events int `json:"events"`
	// WritesPerEvent counts successful API-server writes (create, update, patch,
	// delete) per event, from apiserver_request_total; RefusedWritesPerEvent counts
	// write attempts refused (conflicts, validation).
	WritesPerEvent        float64      `json:"writesPerEvent"`
	RefusedWritesPerEvent float64      `json:"refusedWritesPerEvent"`
	Writes                []WriteShare `json:"writes"`
	// StoredBytesPerEvent is the live size in etcd of one event's WebhookEvent +
	// JobCompletion + BillingSettlement (keys and JSON values, exactly as stored).
	StoredBytesPerEvent float64               `json:"storedBytesPerEvent"`
	Stored              map[string]StoredKind `json:"stored"`
	// KubernetesEventBytesPerEvent is the Events (kubectl get events) recorded per
	// event; they live until the API server's --event-ttl (1h by default).
	KubernetesEventBytesPerEvent float64 `json:"kubernetesEventBytesPerEvent"`
	// EtcdPutsPerEvent counts key writes in etcd; EtcdHistoryBytesPerEvent is the
	// growth of etcd's in-use backend size per event with compaction disabled: every
	// revision written, i.e. what an event costs until the next compaction.
	// EtcdReceivedBytesPerEvent is what the API server sent etcd per event.
	EtcdPutsPerEvent          float64 `json:"etcdPutsPerEvent"`
	EtcdHistoryBytesPerEvent  float64 `json:"etcdHistoryBytesPerEvent"`
	EtcdReceivedBytesPerEvent float64 `json:"etcdReceivedBytesPerEvent"`
	// Controllers is, per controller of the manager, what one event cost it over the
	// whole latency phase (controller_runtime_reconcile_total and _time_seconds).
	Controllers map[string]ControllerCost `json:"controllers,omitempty"`
}

// ControllerCost is one controller's work per event. Its workers (Workers, the
// manager's --max-concurrent-reconciles) bound its throughput at
// MaxEventsPerSecond = Workers / WorkerSecondsPerEvent; reconcile times include
// waiting for the API server and the CPU, so on a saturated machine the bound is
// the machine's, not the code's.
type ControllerCost struct {
	Workers            int                `json:"workers"`
	ReconcilesPerEvent map[string]float64 `json:"reconcilesPerEvent"`
	MeanReconcileMs    float64            `json:"meanReconcileMs"`
	WorkerMsPerEvent   float64            `json:"workerMsPerEvent"`
	MaxEventsPerSecond float64            `json:"maxEventsPerSecond"`
}

// WriteShare is one kind of write and how often an event causes it.
type WriteShare struct {
	Write    string  `json:"write"`
	Total    int64   `json:"total"`
	PerEvent float64 `json:"perEvent"`
}

// StoredKind is the etcd footprint of one kind in the latency namespace.
type StoredKind struct {
	Objects        int     `json:"objects"`
	MeanValueBytes float64 `json:"meanValueBytes"`
	MeanKeyBytes   float64 `json:"meanKeyBytes"`
	MaxValueBytes  int64   `json:"maxValueBytes"`
	Encoding       string  `json:"encoding"`
	// MeanManagedFieldsBytes is how much of a JSON value is metadata.managedFields.
	MeanManagedFieldsBytes float64 `json:"meanManagedFieldsBytes,omitempty"`
}

// Memory is the manager process's resident memory against retained events (item 5).
type Memory struct {
	// StartRSSBytes is VmRSS right after the manager became ready, caches empty.
	StartRSSBytes int64 `json:"startRSSBytes"`
	// BaselineRSSBytes is VmRSS before the retained events, with the latency phase's
	// objects (BaselineEvents events and their children) already in its caches.
	BaselineRSSBytes int64         `json:"baselineRSSBytes"`
	BaselineEvents   int           `json:"baselineEvents"`
	Levels           []MemoryLevel `json:"levels"`
	// BytesPerRetainedEvent is the slope of the least-squares line of RSS over
	// retained events through the measured levels.
	BytesPerRetainedEvent float64 `json:"bytesPerRetainedEvent"`
	// RetainedEventBytes is the etcd value size of one retained event as created
	// here (no facts), to scale the slope to larger objects.
	RetainedEventBytes float64 `json:"retainedEventBytes"`
	// MetricsScrape is one scrape of the manager's /metrics at the last level: the
	// objects collector lists every cached object, which costs time and memory.
	MetricsScrape *Scrape `json:"metricsScrape,omitempty"`
}

// MemoryLevel is RSS with N retained events.
type MemoryLevel struct {
	RetainedEvents int   `json:"retainedEvents"`
	RSSBytes       int64 `json:"rssBytes"`
	PeakRSSBytes   int64 `json:"peakRSSBytes"`
	// GrowthPerEvent is (RSS − previous level's RSS) / (events added): how the
	// growth behaves as the cache fills.
	GrowthPerEvent float64 `json:"growthPerEventBytes"`
	// CreatePerSecond is how fast the benchmark created this level's events and
	// SettleSeconds how long the manager then took to reconcile all of them.
	CreatePerSecond float64 `json:"createPerSecond"`
	SettleSeconds   float64 `json:"settleSeconds"`
	// Extrapolated levels were not measured (they would not fit the time budget):
	// RSS is the least-squares line through the measured levels.
	Extrapolated bool `json:"extrapolated,omitempty"`
}

// Scrape is one timed scrape of the manager's metrics endpoint.
type Scrape struct {
	Seconds        float64 `json:"seconds"`
	Bytes          int     `json:"bytes"`
	RSSBeforeBytes int64   `json:"rssBeforeBytes"`
	RSSAfterBytes  int64   `json:"rssAfterBytes"`
}

// WriteJSON writes the results, creating the directory.
func (r *Results) WriteJSON(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func mib(b int64) string  { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

// PrintTable writes the human-readable summary.
func (r *Results) PrintTable(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	m := r.Machine
	fmt.Fprintf(w, "settlement-operator benchmark — %s, %.0fs\n", r.StartedAt.UTC().Format(time.RFC3339), r.DurationSeconds)
	fmt.Fprintf(w, "machine: %d CPU (%s), %s RAM, %s, %s, Kubernetes %s, etcd %s\n", m.CPUs, m.CPUModel, mib(m.MemoryBytes),
		m.OS, m.GoVersion, m.KubernetesVersion, m.EtcdVersion)
	fmt.Fprintf(w, "load average: start %s, end %s\n", m.LoadAverageStart, m.LoadAverageEnd)
	fmt.Fprintf(w, "manager: revision %s, flags %v\n\n", r.Settings.Revision, r.Settings.ManagerArgs)

	in := r.Ingestion
	fmt.Fprintf(w, "1-2. INGESTION (%d senders, %d events each)\trate/s\tratio\tp50 ms\tp99 ms\twrites/delivery\n", r.Settings.Senders, in.Events)
	fmt.Fprintf(w, "  raw create of a minimal WebhookEvent (ceiling)\t%s\t1.000\t%s\t%s\t-\n", f1(in.RawCreatesPerSecond),
		f2(in.RawCreateLatency.P50), f2(in.RawCreateLatency.P99))
	fmt.Fprintf(w, "  receiver: accepted\t%s\t%.3f of raw\t%s\t%s\t%s\n", f1(in.AcceptedPerSecond), in.AcceptedToRaw,
		f2(in.AcceptedLatency.P50), f2(in.AcceptedLatency.P99), f2(in.WritesPerAccepted))
	fmt.Fprintf(w, "  receiver: duplicate\t%s\t%.3f of accepted\t%s\t%s\t%s\n\n", f1(in.DuplicatesPerSecond), in.DuplicateToAccepted,
		f2(in.DuplicateLatency.P50), f2(in.DuplicateLatency.P99), f2(in.WritesPerDuplicate))

	l := r.Latency
	fmt.Fprintf(w, "3. REQUEST→SETTLED, open loop (ceiling %s/s)\ttarget/s\toffered/s\tevents\tack p50/p99 ms\tsettled p50/p99 ms\t×raw create p50/p99\tcomplete p99 ms\tsettled/s\tunsettled\t429/503\n", f1(l.CeilingPerSecond))
	for _, lv := range l.Levels {
		if lv.Overloaded {
			lv.Name += " (overloaded)"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%d\t%s / %s\t%s / %s\t%s / %s\t%s\t%s\t%d\t%d/%d\n", lv.Name, f1(lv.TargetPerSecond),
			f1(lv.OfferedPerSecond), lv.Events, f1(lv.Ack.P50), f1(lv.Ack.P99), f1(lv.Settled.P50), f1(lv.Settled.P99),
			f1(lv.SettledP50ToRawCreate), f1(lv.SettledP99ToRawCreate), f1(lv.Complete.P99), f1(lv.SettledPerSecond),
			lv.Unsettled, lv.Retried429, lv.Retried503)
	}
	fmt.Fprintf(w, "  pipeline throughput (best settled/s)\t%s\t%.3f of ceiling\n", f1(l.PipelineSettledPerSecond), l.PipelineToCeiling)
	fmt.Fprintf(w, "  write bound (ceiling ÷ %.2f writes/event)\t%s\tpipeline = %.2f of it\n\n", r.Cost.WritesPerEvent,
		f1(l.WriteBoundPerSecond), l.PipelineToWriteBound)

	c := r.Cost
	fmt.Fprintf(w, "4. COST PER EVENT (%d events)\tper event\n", c.Events)
	fmt.Fprintf(w, "  API-server writes (successful)\t%s\n", f2(c.WritesPerEvent))
	fmt.Fprintf(w, "  API-server write attempts refused\t%s\n", f2(c.RefusedWritesPerEvent))
	for _, s := range c.Writes {
		if s.PerEvent >= 0.05 {
			fmt.Fprintf(w, "    %s\t%s\n", s.Write, f2(s.PerEvent))
		}
	}
	fmt.Fprintf(w, "  stored bytes, live (WebhookEvent+JobCompletion+BillingSettlement)\t%.0f\n", c.StoredBytesPerEvent)
	for _, k := range []string{"WebhookEvent", "JobCompletion", "BillingSettlement", "Event"} {
		if s, ok := c.Stored[k]; ok {
			mf := ""
			if s.MeanManagedFieldsBytes > 0 {
				mf = fmt.Sprintf(", of which managedFields %.0f", s.MeanManagedFieldsBytes)
			}
			fmt.Fprintf(w, "    %s (%s; max value %d%s)\t%.0f\n", k, s.Encoding, s.MaxValueBytes, mf, s.MeanValueBytes+s.MeanKeyBytes)
		}
	}
	fmt.Fprintf(w, "  Kubernetes Events stored (until --event-ttl)\t%.0f\n", c.KubernetesEventBytesPerEvent)
	fmt.Fprintf(w, "  etcd puts\t%s\n", f2(c.EtcdPutsPerEvent))
	fmt.Fprintf(w, "  etcd history bytes until compaction (in-use growth)\t%.0f\n", c.EtcdHistoryBytesPerEvent)
	fmt.Fprintf(w, "  bytes sent to etcd\t%.0f\n", c.EtcdReceivedBytesPerEvent)
	for _, ctl := range sortedKeys(c.Controllers) {
		cc := c.Controllers[ctl]
		total := 0.0
		var parts []string
		for _, res := range sortedKeys(cc.ReconcilesPerEvent) {
			total += cc.ReconcilesPerEvent[res]
			parts = append(parts, fmt.Sprintf("%s %.2f", res, cc.ReconcilesPerEvent[res]))
		}
		if total < 0.05 {
			continue
		}
		fmt.Fprintf(w, "  %s controller: reconciles (%s)\t%.2f × %.1f ms = %.1f worker-ms; %d workers → ≤ %.0f events/s\n",
			ctl, strings.Join(parts, ", "), total, cc.MeanReconcileMs, cc.WorkerMsPerEvent, cc.Workers, cc.MaxEventsPerSecond)
	}
	fmt.Fprintln(w)

	mem := r.Memory
	fmt.Fprintf(w, "5. MANAGER MEMORY (separate process, VmRSS)\tRSS\tpeak RSS\tgrowth/event\tcreate/s\tsettle s\n")
	fmt.Fprintf(w, "  started, caches empty\t%s\t\t\t\t\n", mib(mem.StartRSSBytes))
	fmt.Fprintf(w, "  baseline (%d latency-phase events cached)\t%s\t\t\t\t\n", mem.BaselineEvents, mib(mem.BaselineRSSBytes))
	for _, lv := range mem.Levels {
		name := fmt.Sprintf("%d retained events", lv.RetainedEvents)
		if lv.Extrapolated {
			fmt.Fprintf(w, "  %s (EXTRAPOLATED, not measured)\t%s\t\t\t\n", name, mib(lv.RSSBytes))
			continue
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%.0f B\t%s\t%s\n", name, mib(lv.RSSBytes), mib(lv.PeakRSSBytes), lv.GrowthPerEvent,
			f1(lv.CreatePerSecond), f1(lv.SettleSeconds))
	}
	fmt.Fprintf(w, "  growth per retained event (least-squares slope)\t%.0f B\t(one retained event is %.0f B in etcd)\n", mem.BytesPerRetainedEvent, mem.RetainedEventBytes)
	if s := mem.MetricsScrape; s != nil {
		fmt.Fprintf(w, "  one /metrics scrape at the last level\t%.2f s\tRSS %s → %s\n", s.Seconds, mib(s.RSSBeforeBytes), mib(s.RSSAfterBytes))
	}
	_ = w.Flush()
	if len(r.Notes) > 0 {
		fmt.Fprintf(out, "\nnotes:\n  - %s\n", strings.Join(r.Notes, "\n  - "))
	}
}
