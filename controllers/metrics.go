package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

var (
	settlementAttempts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_provider_calls_total",
		Help: "Calls to billing providers by operation (submit, lookup) and outcome (ok, transient, ambiguous, terminal).",
	}, []string{"operation", "outcome"})

	settlementTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_transitions_total",
		Help: "BillingSettlement state transitions by the state entered.",
	}, []string{"state"})

	deadLetters = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "settlement_dead_letters_total",
		Help: "BillingSettlements dead-lettered (retries exhausted or terminal error); replay to resume.",
	})

	receiptToSettled = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "settlement_receipt_to_settled_seconds",
		Help:    "Time from the source event's receipt to the provider's settlement.",
		Buckets: prometheus.ExponentialBuckets(0.05, 2, 16),
	})

	eventsExpired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "settlement_events_expired_total",
		Help: "Complete WebhookEvents deleted by retention.",
	})

	jobTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_job_completion_transitions_total",
		Help: "JobCompletion state transitions by the state entered.",
	}, []string{"state"})
)

func init() {
	metrics.Registry.MustRegister(eventsExpired, settlementAttempts, settlementTransitions, deadLetters, receiptToSettled, jobTransitions)
}

// ObjectsCollector reports how many objects of each kind are in each state, counted
// from the informer cache at scrape time (no API call, no deep copies: it only reads
// a field), so capacity and backlogs can be watched: settlement_objects{kind,state}.
type ObjectsCollector struct {
	Reader client.Reader
	desc   *prometheus.Desc
}

// NewObjectsCollector returns a collector reading from reader (the manager's cache).
func NewObjectsCollector(reader client.Reader) *ObjectsCollector {
	return &ObjectsCollector{Reader: reader, desc: prometheus.NewDesc("settlement_objects",
		"Objects by kind and state/phase, from the operator's cache.", []string{"kind", "state"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *ObjectsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

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
	}
}
