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
	// Archive is item 6, the sustained phase with the archive on (absent when skipped).
	Archive *ArchivePhase `json:"archive,omitempty"`
	// Isolation is item 7, outbound isolation (absent when skipped).
	Isolation *Isolation `json:"isolation,omitempty"`
	// Throughput sets the run's figures beside the pipeline's targets (throughput.go).
	Throughput *Throughput `json:"throughput,omitempty"`
	// Profiles are CPU profiles of the manager and the API server while the pipeline
	// was busy.
	Profiles []Profile `json:"profiles,omitempty"`
	Notes    []string  `json:"notes,omitempty"`
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
	// RawStoredDeliveryPerSecond is raw creates of what the receiver stores for a
	// delivery (a copy of one, same labels and spec): the create's own cost at that
	// size, so AcceptedToRawStoredDelivery is what the receiver adds to it
	// (signature, extraction, deduplication, encoding).
	RawStoredDeliveryPerSecond  float64     `json:"rawStoredDeliveryPerSecond"`
	AcceptedToRawStoredDelivery float64     `json:"acceptedToRawStoredDelivery"`
	RawStoredDeliveryLatency    Percentiles `json:"rawStoredDeliveryLatency"`
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
	// CPUMillisPerEvent is the CPU time each process used over the same events, in ms
	// (see ArchiveResult.CPUMillisPerEvent).
	CPUMillisPerEvent map[string]float64 `json:"cpuMillisPerEvent,omitempty"`
	// LiveGetsPerEvent counts GETs of single objects per event by resource (reads
	// past the informer cache, by the operator and the benchmark alike): what the
	// settlement controller's freshness check and other live reads cost.
	LiveGetsPerEvent map[string]float64 `json:"liveGetsPerEvent,omitempty"`
	// UnderCapacity is the same count for the events of the level at half the
	// pipeline's rate alone (the load an operator should run at): the overloaded
	// levels write more, e.g. an event's status twice when its charge takes longer
	// than --event-status-delay.
	UnderCapacity *LevelWrites `json:"underCapacity,omitempty"`
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
	// ProviderPostsPerSettlement and ProviderLookupsPerSettlement are the billing
	// provider's POSTs (submissions) and GETs by key (lookups) per settlement, as the
	// fake provider counted them (1 and 0 on the happy path: a lookup only where money
	// may have moved); ProviderListsDuringPhase are the reconciliation passes' list calls.
	ProviderPostsPerSettlement   float64 `json:"providerPostsPerSettlement"`
	ProviderLookupsPerSettlement float64 `json:"providerLookupsPerSettlement"`
	ProviderListsDuringPhase     int     `json:"providerListsDuringPhase"`
}

// LevelWrites is one level's API-server writes per event.
type LevelWrites struct {
	Events                int          `json:"events"`
	WritesPerEvent        float64      `json:"writesPerEvent"`
	RefusedWritesPerEvent float64      `json:"refusedWritesPerEvent"`
	Writes                []WriteShare `json:"writes"`
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

// ArchivePhase is item 6: the manager with the archive on (--archive-after, a
// PostgreSQL of its own) under a sustained load of Events events, each pushed through
// the whole pipeline — signed delivery, event, job, settlement Settled, confirmed by a
// reconciliation pass, archived and deleted — on a control plane of its own.
type ArchivePhase struct {
	Events                   int      `json:"events"`
	ArchiveAfterSeconds      float64  `json:"archiveAfterSeconds"`
	ReconcileIntervalSeconds float64  `json:"reconcileIntervalSeconds"`
	ManagerArgs              []string `json:"managerArgs"`
	PostgresVersion          string   `json:"postgresVersion"`
	DurationSeconds          float64  `json:"durationSeconds"`
	StartRSSBytes            int64    `json:"startRSSBytes"`
	// CalibrationEvents were sent as one burst first; LoadFraction of the rate the
	// pipeline drained them at is the sustained phase's target.
	CalibrationEvents int                 `json:"calibrationEvents"`
	LoadFraction      float64             `json:"loadFraction"`
	Calibration       *ArchiveCalibration `json:"calibration,omitempty"`
	// TargetPerSecond is the rate the sustained phase started at, FinalTargetPerSecond
	// the one it ended at (lowered by RateCuts of 10% when the backlog kept growing);
	// OfferedPerSecond is events ÷ the time it took to send them.
	TargetPerSecond      float64 `json:"targetPerSecond"`
	FinalTargetPerSecond float64 `json:"finalTargetPerSecond"`
	RateCuts             int     `json:"rateCuts"`
	OfferedPerSecond     float64 `json:"offeredPerSecond"`
	Retried429           int     `json:"retried429"`
	Retried503           int     `json:"retried503"`
	Failed               int     `json:"failed"`
	// Unprocessed events were not fully archived when the drain wait ended.
	Unprocessed int `json:"unprocessed"`
	// Samples: "idle" before the sustained load, "load" every Events/samples sent
	// events, "drained" once everything is archived. LoadStartSeconds is when the
	// sustained load began, on the samples' clock.
	Samples          []ArchiveSample `json:"samples"`
	LoadStartSeconds float64         `json:"loadStartSeconds"`
	// Slopes are per processed (fully archived) event, over the FitSamples "load"
	// samples from FitFromSeconds: those taken 12 minutes or more into the load (the
	// manager's Event cache has reached its size by then), or every "load" sample when
	// fewer than 3 are that late (then a note says so). Rates are over the same window.
	FitFromSeconds float64       `json:"fitFromSeconds"`
	FitSamples     int           `json:"fitSamples"`
	Slopes         ArchiveSlopes `json:"slopes"`
	Rates          ArchiveRates  `json:"rates"`
	// Latency of the sustained events from their scheduled time.
	Latency  ArchiveLatency  `json:"latency"`
	Postgres ArchivePostgres `json:"postgres"`
	// WritesPerEvent and Writes are the API server's successful writes between the idle
	// and the drained sample ÷ Events; likewise etcd's puts and received bytes.
	WritesPerEvent            float64      `json:"writesPerEvent"`
	Writes                    []WriteShare `json:"writes"`
	EtcdPutsPerEvent          float64      `json:"etcdPutsPerEvent"`
	EtcdReceivedBytesPerEvent float64      `json:"etcdReceivedBytesPerEvent"`
	// CPUMillisPerEvent is the CPU time each process of the run used between the idle
	// and the drained sample ÷ Events, in ms: kube-apiserver, etcd, manager, postgres
	// and the bench itself (senders, watches, the fake billing provider).
	CPUMillisPerEvent map[string]float64 `json:"cpuMillisPerEvent,omitempty"`
	// Controllers is each controller's work per sustained event (idle → drained).
	Controllers map[string]ControllerCost `json:"controllers,omitempty"`
	// ArchiveMetrics are the manager's settlement_archive* counters over the same span.
	ArchiveMetrics map[string]float64 `json:"archiveMetrics,omitempty"`
	Goals          []Goal             `json:"goals"`
	Notes          []string           `json:"notes,omitempty"`
}

// ArchiveCalibration is the burst that measures what the pipeline sustains.
type ArchiveCalibration struct {
	Events            int     `json:"events"`
	AcceptedPerSecond float64 `json:"acceptedPerSecond"`
	// SettledPerSecond and ProcessedPerSecond: completions between the 20th and the
	// 80th percentile per second, for Settled and for fully archived.
	SettledPerSecond   float64 `json:"settledPerSecond"`
	ProcessedPerSecond float64 `json:"processedPerSecond"`
	DrainSeconds       float64 `json:"drainSeconds"`
	// Steps is the open-loop staircase; SustainablePerSecond the highest step that
	// kept up below the lowest that did not.
	Steps                []CalibrationStep `json:"steps"`
	SustainablePerSecond float64           `json:"sustainablePerSecond"`
}

// CalibrationStep is one open-loop step: the backlog (acknowledged, not yet
// archived) halfway through and at the end; it kept up when it grew by less than
// 3 seconds' worth of events.
type CalibrationStep struct {
	PerSecond     float64 `json:"perSecond"`
	Events        int     `json:"events"`
	BacklogMiddle int     `json:"backlogMiddle"`
	BacklogEnd    int     `json:"backlogEnd"`
	KeptUp        bool    `json:"keptUp"`
}

// ArchiveSample is one reading during the sustained phase.
type ArchiveSample struct {
	Label           string  `json:"label"`
	Seconds         float64 `json:"seconds"`
	TargetPerSecond float64 `json:"targetPerSecond,omitempty"`
	// Sent, Acked, Settled, Reconciled count the sustained phase's deliveries (Sent) and
	// every delivery of the phase (the others); Processed events have all three
	// records archived; Backlog = Acked − Processed.
	Sent       int            `json:"sent"`
	Acked      int            `json:"acked"`
	Settled    int            `json:"settled"`
	Reconciled int            `json:"reconciled"`
	Processed  int            `json:"processed"`
	Backlog    int            `json:"backlog"`
	Archived   map[string]int `json:"archived"`
	// CPUSeconds is each process's CPU time since it started (cpuSeconds): two
	// samples' difference ÷ the events processed between them shows whether an event
	// costs more as the archive grows.
	CPUSeconds map[string]float64 `json:"cpuSeconds,omitempty"`
	// CPUSampling is the CPU the pipeline's processes spent on the samples before this
	// one (a compaction and defragmentation of etcd, PostgreSQL's sizes): subtracted.
	CPUSampling float64 `json:"cpuSamplingSeconds,omitempty"`
	// LiveObjects per kind in the phase's namespace, counted in etcd; LiveBytes their
	// keys and values (Events estimated from up to 1000 of them); LiveRecordBytes the
	// three archived kinds together.
	LiveObjects     map[string]int64 `json:"liveObjects"`
	LiveBytes       map[string]int64 `json:"liveBytes"`
	LiveRecordBytes int64            `json:"liveRecordBytes"`
	// EtcdRawInUseBytes / EtcdRawSizeBytes: etcd as the writes left it (every revision
	// since the previous sample's compaction); EtcdCompactedBytes: in use after a
	// compaction to the current revision and a defragmentation (live keys only).
	// EtcdHistoryBytes = raw in use − the previous sample's compacted size: what the
	// writes since then cost until a compaction; EtcdHistorySumBytes adds them up.
	EtcdRevision        int64   `json:"etcdRevision"`
	EtcdRawInUseBytes   int64   `json:"etcdRawInUseBytes"`
	EtcdRawSizeBytes    int64   `json:"etcdRawSizeBytes"`
	EtcdCompactedBytes  int64   `json:"etcdCompactedBytes"`
	EtcdHistoryBytes    int64   `json:"etcdHistoryBytes"`
	EtcdHistorySumBytes int64   `json:"etcdHistorySumBytes"`
	EtcdCompactSeconds  float64 `json:"etcdCompactSeconds"`
	EtcdDefragSeconds   float64 `json:"etcdDefragSeconds"`
	// RSSBytes/PeakRSSBytes: the manager's VmRSS/VmHWM; HeapInuseBytes its Go heap
	// in use (go_memstats_heap_inuse_bytes), which the GC's headroom does not blur.
	RSSBytes       int64 `json:"rssBytes"`
	PeakRSSBytes   int64 `json:"peakRSSBytes"`
	HeapInuseBytes int64 `json:"heapInuseBytes"`
	// LiveHeapBytes is the heap allocated right after a forced collection: what the
	// manager holds, without the garbage heap in use carries between collections.
	LiveHeapBytes int64 `json:"liveHeapBytes,omitempty"`
	// StackInuseBytes, HeapIdleBytes (idle spans not yet returned to the OS) and
	// Goroutines say where RSS goes that the heap does not hold.
	StackInuseBytes int64 `json:"stackInuseBytes,omitempty"`
	HeapIdleBytes   int64 `json:"heapIdleNotReleasedBytes,omitempty"`
	Goroutines      int   `json:"goroutines,omitempty"`
	// PostgresRows per kind; PostgresBytes the three tables' pg_total_relation_size
	// (heap, TOAST, indexes); PostgresDatabaseBytes pg_database_size.
	PostgresRows          map[string]int64 `json:"postgresRows"`
	PostgresBytes         int64            `json:"postgresBytes"`
	PostgresDatabaseBytes int64            `json:"postgresDatabaseBytes"`
	// ListedUntilLagSeconds: now − the BillingProvider's status.providerListedUntil
	// (how far behind the pass's complete walk of the provider's list is); LastPass
	// the latest report.
	ListedUntilLagSeconds float64     `json:"listedUntilLagSeconds,omitempty"`
	LastPass              *PassSample `json:"lastPass,omitempty"`
}

// PassSample is the latest ReconciliationReport at a sample.
type PassSample struct {
	Report        string           `json:"report"`
	Phase         string           `json:"phase"`
	Seconds       float64          `json:"seconds"`
	Truncated     bool             `json:"truncated"`
	Discrepancies int              `json:"discrepancies"`
	NeedsReview   int              `json:"needsReview"`
	ByType        map[string]int32 `json:"byType,omitempty"`
	// Examples is the first finding of each type the report lists.
	Examples []string         `json:"examples,omitempty"`
	Examined map[string]int32 `json:"examined"`
}

// Slope is one quantity at the first, middle and last sample under load and its
// change per processed event: LeastSquares through every sample under load, and
// EndMinusStart = (last − first) ÷ (events processed in between).
type Slope struct {
	Start         float64 `json:"start"`
	Middle        float64 `json:"middle"`
	End           float64 `json:"end"`
	LeastSquares  float64 `json:"leastSquaresPerEvent"`
	EndMinusStart float64 `json:"endMinusStartPerEvent"`
}

// ArchiveSlopes are the growth per processed event.
type ArchiveSlopes struct {
	RSSBytes        Slope `json:"rssBytes"`
	HeapInuseBytes  Slope `json:"heapInuseBytes"`
	LiveHeapBytes   Slope `json:"liveHeapBytes"`
	StackInuseBytes Slope `json:"stackInuseBytes"`
	HeapIdleBytes   Slope `json:"heapIdleNotReleasedBytes"`
	Goroutines      Slope `json:"goroutines"`
	// EtcdCompactedBytes is etcd's size after compaction and defragmentation;
	// EtcdCompactedNoEvent the same without the Kubernetes Events (which expire after
	// the API server's --event-ttl, 1 h); EtcdRecordBytes the live WebhookEvents,
	// JobCompletions and BillingSettlements; EtcdEventBytes the Events.
	EtcdCompactedBytes   Slope `json:"etcdCompactedBytes"`
	EtcdCompactedNoEvent Slope `json:"etcdCompactedWithoutEventsBytes"`
	EtcdRecordBytes      Slope `json:"etcdRecordBytes"`
	EtcdEventBytes       Slope `json:"etcdEventBytes"`
	// EtcdRawInUseBytes is the raw reading (history since the previous sample's
	// compaction included), EtcdHistoryBytes the history written, summed: what an event
	// costs etcd until the next compaction.
	EtcdRawInUseBytes Slope            `json:"etcdRawInUseBytes"`
	EtcdHistoryBytes  Slope            `json:"etcdHistoryBytes"`
	PostgresBytes     Slope            `json:"postgresBytes"`
	PostgresDatabase  Slope            `json:"postgresDatabaseBytes"`
	LiveObjects       map[string]Slope `json:"liveObjects"`
}

// ArchiveRates are over the window from the first to the last sample under load.
type ArchiveRates struct {
	WindowSeconds      float64 `json:"windowSeconds"`
	AcceptedPerSecond  float64 `json:"acceptedPerSecond"`
	SettledPerSecond   float64 `json:"settledPerSecond"`
	ProcessedPerSecond float64 `json:"processedPerSecond"`
	// ArchivedPerSecond per kind; ArchivedRecordsPerSecond all three together.
	ArchivedPerSecond        map[string]float64 `json:"archivedPerSecond"`
	ArchivedRecordsPerSecond float64            `json:"archivedRecordsPerSecond"`
	// ArchivedToAccepted = ProcessedPerSecond ÷ AcceptedPerSecond: 1 when archival
	// keeps up; BacklogStart/End say whether the backlog grew over the window.
	ArchivedToAccepted float64 `json:"archivedToAccepted"`
	BacklogStart       int     `json:"backlogStart"`
	BacklogEnd         int     `json:"backlogEnd"`
}

// ArchiveLatency is scheduled → each stage, for the sustained events.
type ArchiveLatency struct {
	Ack        Percentiles `json:"ack"`
	Settled    Percentiles `json:"settled"`
	Reconciled Percentiles `json:"reconciled"`
	// Archived: scheduled → the last of the three records deleted from the cluster.
	Archived Percentiles `json:"archived"`
}

// ArchivePostgres is the archive's size once everything is archived.
type ArchivePostgres struct {
	Tables         map[string]PostgresTable `json:"tables"`
	TotalBytes     int64                    `json:"totalBytes"`
	DatabaseBytes  int64                    `json:"databaseBytes"`
	ArchivedEvents int64                    `json:"archivedEvents"`
	// BytesPerArchivedEvent = TotalBytes ÷ ArchivedEvents (every event of the phase,
	// warm-up and calibration included); DatabaseGrowthPerEvent = pg_database_size's
	// growth from the idle sample ÷ the events archived since.
	BytesPerArchivedEvent  float64 `json:"bytesPerArchivedEvent"`
	DatabaseGrowthPerEvent float64 `json:"databaseGrowthPerEvent"`
	// ObjectBytesPerEvent is the rows' object column (a job completion's or a
	// settlement's record as JSONB, stored compressed when its row is large; receipts
	// store none since migration 0002); DuplicatedJSONBytesPerEvent the columns that
	// repeat what an object column holds (since 0002 only receipts of 0001's form).
	ObjectBytesPerEvent         float64 `json:"objectBytesPerEvent"`
	DuplicatedJSONBytesPerEvent float64 `json:"duplicatedJSONBytesPerEvent"`
	// ObjectTextBytesPerEvent is the same objects as JSON text; CompressedObjectShare
	// the share of stored objects PostgreSQL keeps compressed (TOAST, pglz).
	ObjectTextBytesPerEvent float64 `json:"objectTextBytesPerEvent"`
	CompressedObjectShare   float64 `json:"compressedObjectShare"`
}

// PostgresTable is one archive table.
type PostgresTable struct {
	Table      string `json:"table"`
	Rows       int64  `json:"rows"`
	TotalBytes int64  `json:"totalBytes"`
	// TableBytes: heap, TOAST and maps (pg_table_size); IndexBytes: pg_indexes_size.
	TableBytes      int64   `json:"tableBytes"`
	IndexBytes      int64   `json:"indexBytes"`
	BytesPerRow     float64 `json:"bytesPerRow"`
	MeanRowBytes    float64 `json:"meanRowBytes"`
	MeanObjectBytes float64 `json:"meanObjectBytes"`
}

// Goal is one of the archive's targets and the measured value: reported, not asserted.
type Goal struct {
	Name  string  `json:"name"`
	Goal  string  `json:"goal"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	Met   bool    `json:"met"`
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

	if r.Ingestion.Events > 0 {
		r.printArchiveOff(w)
	}
	if r.Isolation != nil {
		r.Isolation.print(w)
	}
	if r.Archive != nil {
		r.Archive.print(w)
	}
	printThroughput(w, r.Throughput)
	for _, p := range r.Profiles {
		fmt.Fprintf(w, "CPU PROFILE of the %s, %s (%.0f s sampled, %.1f CPU-s; %s)\tflat s\tflat %%\tcum s\tcum %%\n",
			p.Process, p.Phase, p.Seconds, p.SampledCPUSeconds, p.File)
		for _, e := range p.Flat {
			fmt.Fprintf(w, "  %s\t%.2f\t%.1f\t%.2f\t%.1f\n", e.Function, e.FlatSecond, e.FlatPct, e.CumSecond, e.CumPct)
		}
		fmt.Fprintf(w, "  by cumulative time:\n")
		for _, e := range p.Cumulative {
			fmt.Fprintf(w, "  %s\t%.2f\t%.1f\t%.2f\t%.1f\n", e.Function, e.FlatSecond, e.FlatPct, e.CumSecond, e.CumPct)
		}
		fmt.Fprintln(w)
	}
	_ = w.Flush()
	if len(r.Notes) > 0 {
		fmt.Fprintf(out, "\nnotes:\n  - %s\n", strings.Join(r.Notes, "\n  - "))
	}
}

// printArchiveOff prints items 1-5.
func (r *Results) printArchiveOff(w io.Writer) {
	in := r.Ingestion
	fmt.Fprintf(w, "1-2. INGESTION (%d senders, %d events each)\trate/s\tratio\tp50 ms\tp99 ms\twrites/delivery\n", r.Settings.Senders, in.Events)
	fmt.Fprintf(w, "  raw create of a minimal WebhookEvent (ceiling)\t%s\t1.000\t%s\t%s\t-\n", f1(in.RawCreatesPerSecond),
		f2(in.RawCreateLatency.P50), f2(in.RawCreateLatency.P99))
	fmt.Fprintf(w, "  raw create of a stored delivery (same object the receiver stores)\t%s\t%.3f of raw\t%s\t%s\t-\n",
		f1(in.RawStoredDeliveryPerSecond), ratio(in.RawStoredDeliveryPerSecond, in.RawCreatesPerSecond),
		f2(in.RawStoredDeliveryLatency.P50), f2(in.RawStoredDeliveryLatency.P99))
	fmt.Fprintf(w, "  receiver: accepted\t%s\t%.3f of raw (%.3f of the stored-delivery create)\t%s\t%s\t%s\n", f1(in.AcceptedPerSecond),
		in.AcceptedToRaw, in.AcceptedToRawStoredDelivery, f2(in.AcceptedLatency.P50), f2(in.AcceptedLatency.P99), f2(in.WritesPerAccepted))
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
	if u := c.UnderCapacity; u != nil {
		fmt.Fprintf(w, "  at half the pipeline's rate only (%d events): writes / refused\t%s / %s\n", u.Events,
			f2(u.WritesPerEvent), f2(u.RefusedWritesPerEvent))
		for _, s := range u.Writes {
			if s.PerEvent >= 0.05 {
				fmt.Fprintf(w, "    %s\t%s\n", s.Write, f2(s.PerEvent))
			}
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
	fmt.Fprintf(w, "  billing provider calls per settlement: POST / GET by key (lists: %d)\t%s / %s\n", c.ProviderListsDuringPhase,
		f2(c.ProviderPostsPerSettlement), f2(c.ProviderLookupsPerSettlement))
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
	fmt.Fprintln(w)
}

// print writes item 6.
func (a *ArchivePhase) print(w io.Writer) {
	fmt.Fprintf(w, "6. SUSTAINED, ARCHIVE ON (%d events, --archive-after=%gs, reconciliation every %gs, PostgreSQL %s, %.0fs)\n",
		a.Events, a.ArchiveAfterSeconds, a.ReconcileIntervalSeconds, a.PostgresVersion, a.DurationSeconds)
	if c := a.Calibration; c != nil {
		fmt.Fprintf(w, "  calibration burst of %d: accepted %s/s, then settled %s/s, fully archived %s/s (middle 60%%, an upper bound)\n",
			c.Events, f1(c.AcceptedPerSecond), f1(c.SettledPerSecond), f1(c.ProcessedPerSecond))
		var steps []string
		for _, st := range c.Steps {
			mark := "kept up"
			if !st.KeptUp {
				mark = "fell behind"
			}
			steps = append(steps, fmt.Sprintf("%s/s: backlog %d→%d %s", f1(st.PerSecond), st.BacklogMiddle, st.BacklogEnd, mark))
		}
		fmt.Fprintf(w, "  staircase (%s) → sustainable %s/s\n", strings.Join(steps, "; "), f1(c.SustainablePerSecond))
	}
	fmt.Fprintf(w, "  load: target %s/s (%.2f of sustainable), ended at %s/s after %d cuts; offered %s/s; 429/503 %d/%d; failed %d; not archived %d\n",
		f1(a.TargetPerSecond), a.LoadFraction, f1(a.FinalTargetPerSecond), a.RateCuts, f1(a.OfferedPerSecond),
		a.Retried429, a.Retried503, a.Failed, a.Unprocessed)
	fmt.Fprintf(w, "  sample\tprocessed\tbacklog\tlive WE/JC/BS\tEvents\tetcd raw in use\tetcd compacted\trecords in etcd\tRSS\theap in use\tlive heap\tPostgreSQL\tpass s (truncated, needs review)\tlisted-until lag s\n")
	var load []int
	for i, s := range a.Samples {
		if s.Label == "load" && s.Seconds >= a.FitFromSeconds {
			load = append(load, i)
		}
	}
	row := func(name string, s ArchiveSample) {
		pass := "-"
		if p := s.LastPass; p != nil {
			pass = fmt.Sprintf("%.1f (%v, %d)", p.Seconds, p.Truncated, p.NeedsReview)
		}
		fmt.Fprintf(w, "  %s\t%d\t%d\t%d/%d/%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\n", name, s.Processed, s.Backlog,
			s.LiveObjects["WebhookEvent"], s.LiveObjects["JobCompletion"], s.LiveObjects["BillingSettlement"], s.LiveObjects["Event"],
			mib(s.EtcdRawInUseBytes), mib(s.EtcdCompactedBytes), mib(s.LiveRecordBytes), mib(s.RSSBytes), mib(s.HeapInuseBytes), mib(s.LiveHeapBytes),
			mib(s.PostgresBytes), pass, s.ListedUntilLagSeconds)
	}
	for i, s := range a.Samples {
		name := s.Label
		if len(load) > 0 {
			switch i {
			case load[0]:
				name = "start (load)"
			case load[len(load)/2]:
				name = "middle (load)"
			case load[len(load)-1]:
				name = "end (load)"
			}
		}
		row(name, s)
	}
	sl := a.Slopes
	fmt.Fprintf(w, "  per processed event, over the %d samples under load from %.0fs (load began at %.0fs)\tleast squares\tend − start\n",
		a.FitSamples, a.FitFromSeconds, a.LoadStartSeconds)
	for _, x := range []struct {
		name string
		s    Slope
	}{
		{"manager RSS (B)", sl.RSSBytes}, {"manager heap in use (B)", sl.HeapInuseBytes},
		{"manager live heap, after a forced GC (B)", sl.LiveHeapBytes},
		{"manager stacks in use (B)", sl.StackInuseBytes}, {"manager idle heap not returned (B)", sl.HeapIdleBytes},
		{"manager goroutines", sl.Goroutines},
		{"etcd, compacted + defragmented (B)", sl.EtcdCompactedBytes},
		{"etcd, compacted, without Kubernetes Events (B)", sl.EtcdCompactedNoEvent},
		{"  live WebhookEvent+JobCompletion+BillingSettlement (B)", sl.EtcdRecordBytes},
		{"  live Kubernetes Events (B; expire after --event-ttl)", sl.EtcdEventBytes},
		{"etcd history written, until compaction (B)", sl.EtcdHistoryBytes},
		{"PostgreSQL, 3 tables (B)", sl.PostgresBytes}, {"PostgreSQL, pg_database_size (B)", sl.PostgresDatabase},
	} {
		fmt.Fprintf(w, "  %s\t%s\t%s\n", x.name, f1(x.s.LeastSquares), f1(x.s.EndMinusStart))
	}
	for _, k := range sortedKeys(sl.LiveObjects) {
		fmt.Fprintf(w, "  live %s objects\t%.4f\t%.4f\n", k, sl.LiveObjects[k].LeastSquares, sl.LiveObjects[k].EndMinusStart)
	}
	r := a.Rates
	fmt.Fprintf(w, "  rates over %.0fs under load: accepted %s/s, settled %s/s, fully archived %s/s (WE %s, JC %s, BS %s; %s records/s); archived ÷ accepted %.3f; backlog %d → %d\n",
		r.WindowSeconds, f2(r.AcceptedPerSecond), f2(r.SettledPerSecond), f2(r.ProcessedPerSecond),
		f2(r.ArchivedPerSecond["WebhookEvent"]), f2(r.ArchivedPerSecond["JobCompletion"]), f2(r.ArchivedPerSecond["BillingSettlement"]),
		f2(r.ArchivedRecordsPerSecond), r.ArchivedToAccepted, r.BacklogStart, r.BacklogEnd)
	l := a.Latency
	fmt.Fprintf(w, "  latency from scheduled, p50/p99 ms: ack %s/%s, settled %s/%s, reconciled %s/%s, archived %s/%s\n",
		f1(l.Ack.P50), f1(l.Ack.P99), f1(l.Settled.P50), f1(l.Settled.P99), f1(l.Reconciled.P50), f1(l.Reconciled.P99),
		f1(l.Archived.P50), f1(l.Archived.P99))
	pg := a.Postgres
	fmt.Fprintf(w, "  PostgreSQL after %d archived events: %s in 3 tables = %.0f B/event (database grew %.0f B/event); object JSONB %.0f B/event stored (%.0f B as JSON text; %.0f%% of rows compressed), duplicated JSON columns %.0f B/event\n",
		pg.ArchivedEvents, mib(pg.TotalBytes), pg.BytesPerArchivedEvent, pg.DatabaseGrowthPerEvent, pg.ObjectBytesPerEvent,
		pg.ObjectTextBytesPerEvent, 100*pg.CompressedObjectShare, pg.DuplicatedJSONBytesPerEvent)
	for _, k := range []string{"WebhookEvent", "JobCompletion", "BillingSettlement"} {
		t := pg.Tables[k]
		fmt.Fprintf(w, "    %s\t%d rows\t%.0f B/row (table %.0f + indexes %.0f); mean row %.0f B, object %.0f B\n", t.Table, t.Rows, t.BytesPerRow,
			perRow(t.TableBytes, t.Rows), perRow(t.IndexBytes, t.Rows), t.MeanRowBytes, t.MeanObjectBytes)
	}
	fmt.Fprintf(w, "  API-server writes per event %s, etcd puts %s, bytes sent to etcd %.0f\n", f2(a.WritesPerEvent), f2(a.EtcdPutsPerEvent), a.EtcdReceivedBytesPerEvent)
	for _, s := range a.Writes {
		if s.PerEvent >= 0.05 {
			fmt.Fprintf(w, "    %s\t%s\n", s.Write, f2(s.PerEvent))
		}
	}
	for _, ctl := range sortedKeys(a.Controllers) {
		cc := a.Controllers[ctl]
		total := 0.0
		for _, v := range cc.ReconcilesPerEvent {
			total += v
		}
		if total < 0.05 {
			continue
		}
		fmt.Fprintf(w, "  %s controller\t%.2f reconciles × %.1f ms = %.1f worker-ms/event; %d workers → ≤ %.0f events/s\n",
			ctl, total, cc.MeanReconcileMs, cc.WorkerMsPerEvent, cc.Workers, cc.MaxEventsPerSecond)
	}
	for _, k := range sortedKeys(a.ArchiveMetrics) {
		fmt.Fprintf(w, "  %s\t%.0f\n", k, a.ArchiveMetrics[k])
	}
	fmt.Fprintf(w, "  GOALS (reported, not asserted)\tgoal\tmeasured\tmet\n")
	for _, g := range a.Goals {
		fmt.Fprintf(w, "  %s\t%s\t%s %s\t%v\n", g.Name, g.Goal, f2(g.Value), g.Unit, g.Met)
	}
	for _, n := range a.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

func perRow(b, rows int64) float64 {
	if rows == 0 {
		return 0
	}
	return float64(b) / float64(rows)
}
