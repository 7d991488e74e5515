package metrics

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// Metric labels name the namespace and the BillingProvider (or WebhookProvider), never
// an event ID, a key or a customer: their values are bounded by the objects a platform
// team creates, not by what senders send (docs/decisions.md "Metrics").
var (
	providerCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_provider_calls_total",
		Help: "Calls to billing providers by namespace, BillingProvider, operation (submit, lookup, list) and outcome (ok, transient, ambiguous, terminal).",
	}, []string{"namespace", "billing_provider", "operation", "outcome"})

	billingCallDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "settlement_billing_call_duration_seconds",
		Help:    "Duration of calls to billing providers by namespace, BillingProvider, operation and outcome (as settlement_provider_calls_total).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"namespace", "billing_provider", "operation", "outcome"})

	SettlementTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_transitions_total",
		Help: "BillingSettlement state transitions by namespace, BillingProvider and the state entered.",
	}, []string{"namespace", "billing_provider", "state"})

	DeadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_dead_letters_total",
		Help: "BillingSettlements dead-lettered (retries exhausted or terminal error) by namespace and BillingProvider; replay to resume.",
	}, []string{"namespace", "billing_provider"})

	ProviderSlotWaits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_provider_slot_waits_total",
		Help: "Settlement reconciles requeued, nothing changed, because their BillingProvider's share of the settlement workers was in use, by namespace and BillingProvider.",
	}, []string{"namespace", "billing_provider"})

	ReceiptToSettled = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "settlement_receipt_to_settled_seconds",
		Help:    "Time from the source event's receipt to the provider's settlement.",
		Buckets: prometheus.ExponentialBuckets(0.05, 2, 16),
	})

	EventsExpired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "settlement_events_expired_total",
		Help: "Complete WebhookEvents deleted by retention.",
	})

	JobTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_job_completion_transitions_total",
		Help: "JobCompletion state transitions by the state entered.",
	}, []string{"state"})
)

// Collectors are the controllers' metrics, registered with controller-runtime's
// registry at start (the ObjectsCollector is registered by the manager, which owns the
// cache it reads). test/prometheus checks the shipped alerts and dashboard against them.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{EventsExpired, providerCalls, billingCallDuration, SettlementTransitions, DeadLetters, ProviderSlotWaits,
		ReceiptToSettled, JobTransitions, DiscrepanciesFound, RepairsCarriedOut,
		ArchivedRecords, ArchivedDuplicates, ArchiveFailures, archiveEnabled, archiveUp, archiveBehind,
		ArchiveBatchSize}
}

func init() { crmetrics.Registry.MustRegister(Collectors()...) }

// ObserveBillingCall counts one call to a billing provider and records its duration.
func ObserveBillingCall(namespace, billingProvider, operation string, start time.Time, err error) {
	outcome := "ok"
	if err != nil {
		outcome = classLabel(err)
	}
	providerCalls.WithLabelValues(namespace, billingProvider, operation, outcome).Inc()
	billingCallDuration.WithLabelValues(namespace, billingProvider, operation, outcome).Observe(time.Since(start).Seconds())
}

// ObjectsCollector reports how many objects of each kind are in each state, counted
// from the informer cache at scrape time (no API call, no deep copies: it only reads
// a field), so capacity and backlogs can be watched: settlement_objects{kind,state}.
//
// It also reports settlement_oldest_unsettled_seconds{namespace,billing_provider}: the
// age of the oldest settlement not yet sent or answered (Pending or Submitted), 0 for a
// BillingProvider with none, so "stuck Submitted" is one threshold on one series per
// provider rather than a scan of objects.
type ObjectsCollector struct {
	Reader client.Reader
	// Now is the clock (time.Now when nil).
	Now        func() time.Time
	desc       *prometheus.Desc
	oldestDesc *prometheus.Desc
}

// NewObjectsCollector returns a collector reading from reader (the manager's cache).
func NewObjectsCollector(reader client.Reader) *ObjectsCollector {
	return &ObjectsCollector{Reader: reader, desc: prometheus.NewDesc("settlement_objects",
		"Objects by kind and state/phase, from the operator's cache.", []string{"kind", "state"}, nil),
		oldestDesc: prometheus.NewDesc("settlement_oldest_unsettled_seconds",
			"Age of the oldest BillingSettlement not yet answered by its provider (Pending or Submitted), by namespace and BillingProvider; 0 when there is none.",
			[]string{"namespace", "billing_provider"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *ObjectsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.oldestDesc
}

// unsettled says whether a settlement still waits for its provider's answer: the
// states the operator resolves on its own. Failed (dead letters) and
// RequiresReconciliation wait for a human and have their own alerts.
func unsettled(s hooksv1alpha1.SettlementState) bool {
	return s == "" || s == hooksv1alpha1.SettlementPending || s == hooksv1alpha1.SettlementSubmitted
}

// collectOldest emits the oldest unsettled settlement's age for every BillingProvider
// in the cache (0 when idle) and for every provider name a settlement refers to.
func (c *ObjectsCollector) collectOldest(ctx context.Context, ch chan<- prometheus.Metric, stls []hooksv1alpha1.BillingSettlement) {
	var bps hooksv1alpha1.BillingProviderList
	if c.Reader.List(ctx, &bps, client.UnsafeDisableDeepCopy) != nil {
		return
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	type provider struct{ namespace, name string }
	oldest := map[provider]time.Time{}
	for i := range bps.Items {
		oldest[provider{bps.Items[i].Namespace, bps.Items[i].Name}] = time.Time{}
	}
	for i := range stls {
		bs := &stls[i]
		if !unsettled(bs.Status.State) {
			continue
		}
		p := provider{bs.Namespace, bs.Spec.BillingProviderRef}
		if t, ok := oldest[p]; !ok || t.IsZero() || bs.CreationTimestamp.Time.Before(t) {
			oldest[p] = bs.CreationTimestamp.Time
		}
	}
	for p, t := range oldest {
		age := 0.0
		if !t.IsZero() && now.After(t) {
			age = now.Sub(t).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(c.oldestDesc, prometheus.GaugeValue, age, p.namespace, p.name)
	}
}

// Collect implements prometheus.Collector.
func (c *ObjectsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	emit := func(kind string, counts map[string]int) {
		for state, n := range counts {
			if state == "" {
				state = "New"
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), kind, state)
		}
	}
	var events hooksv1alpha1.WebhookEventList
	if c.Reader.List(ctx, &events, client.UnsafeDisableDeepCopy) == nil {
		counts := map[string]int{}
		for i := range events.Items {
			counts[string(events.Items[i].Status.Phase)]++
		}
		emit("WebhookEvent", counts)
	}
	var jobs hooksv1alpha1.JobCompletionList
	if c.Reader.List(ctx, &jobs, client.UnsafeDisableDeepCopy) == nil {
		counts := map[string]int{}
		for i := range jobs.Items {
			counts[string(jobs.Items[i].Status.State)]++
		}
		emit("JobCompletion", counts)
	}
	var stls hooksv1alpha1.BillingSettlementList
	if c.Reader.List(ctx, &stls, client.UnsafeDisableDeepCopy) == nil {
		counts := map[string]int{}
		for i := range stls.Items {
			counts[string(stls.Items[i].Status.State)]++
		}
		emit("BillingSettlement", counts)
		c.collectOldest(ctx, ch, stls.Items)
	}
}

var (
	ArchivedRecords = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_archived_total",
		Help: "Records archived to PostgreSQL and removed from the cluster, by kind.",
	}, []string{"kind"})
	ArchiveFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_archive_failures_total",
		Help: "Archive operations that failed, by kind and reason (unavailable: the archive did not answer; conflict: the archive holds other content under the record's name or key — alert on it).",
	}, []string{"kind", "reason"})
	// ArchiveBatchSize is observed once per archival batch (controllers/archiver).
	ArchiveBatchSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "settlement_archive_batch_size",
		Help:    "Records per archival batch (one insert and one read-back per table, one watermark write, then the deletes).",
		Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200},
	})
	ArchivedDuplicates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_archived_duplicates_total",
		Help: "Records not dispatched or sent because the archive already held them (a redelivered event, a settlement created again for an archived key), by kind.",
	}, []string{"kind"})
	archiveEnabled = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "settlement_archive_enabled",
		Help: "1 when finished records are archived to PostgreSQL; 0 when every record stays in the cluster (see docs/capacity.md).",
	})
	archiveUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "settlement_archive_up",
		Help: "1 when the archive answered its last operation, 0 when it did not.",
	})
	archiveBehind = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "settlement_archive_behind",
		Help: "1 when the archive lacks a row the cluster archived, read back and may have deleted (restored from an older copy, or a lagging standby): until a person confirms, every settlement not yet sent is looked up before its first submission. Alert on it.",
	})
)

// SetArchiveBehind records whether the archive is behind the cluster's watermark.
func SetArchiveBehind(behind bool) {
	if behind {
		archiveBehind.Set(1)
	} else {
		archiveBehind.Set(0)
	}
}

// SetArchiveEnabled records whether the manager runs with an archive.
func SetArchiveEnabled(on bool) {
	if on {
		archiveEnabled.Set(1)
	} else {
		archiveEnabled.Set(0)
	}
}

// NoteArchive records whether the archive answered.
func NoteArchive(kind string, err error) {
	switch {
	case err == nil:
		archiveUp.Set(1)
	case archive.IsConflict(err):
		archiveUp.Set(1)
		ArchiveFailures.WithLabelValues(kind, "conflict").Inc()
	default:
		archiveUp.Set(0)
		ArchiveFailures.WithLabelValues(kind, "unavailable").Inc()
	}
}

var (
	DiscrepanciesFound = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_reconciliation_discrepancies_total",
		Help: "New discrepancies found by reconciliation passes, by namespace, BillingProvider and type: a finding (type and object) the previous pass of the same BillingProvider also reported is not counted again.",
	}, []string{"namespace", "billing_provider", "type"})
	RepairsCarriedOut = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_reconciliation_repairs_total",
		Help: "Repairs named by reconciliation passes, by action and whether they were carried out.",
	}, []string{"action", "carried_out"})
)

func classLabel(err error) string {
	if e, ok := billing.AsError(err); ok {
		return strings.ToLower(e.Class.String())
	}
	return "ambiguous"
}
