package receiver

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Outcomes label every answer; they are a closed set so the metric's cardinality is
// bounded whatever senders do.
const (
	OutcomeAccepted         = "accepted"
	OutcomeDuplicate        = "duplicate"
	OutcomeIgnored          = "ignored"
	OutcomeConflict         = "conflicting_event_reuse"
	OutcomeMethodNotAllowed = "method_not_allowed"
	OutcomeUnsupportedType  = "unsupported_media_type"
	OutcomeTooLarge         = "payload_too_large"
	OutcomeUnknownProvider  = "unknown_provider"
	OutcomeUnauthorized     = "invalid_signature"
	OutcomeBadRequest       = "invalid_event"
	// 429s, one per limit (admission.go), so the answer and the metric say which
	// limit was hit.
	OutcomeBusyGlobal    = "too_many_requests_global"
	OutcomeBusyNamespace = "too_many_requests_namespace"
	OutcomeBusyProvider  = "too_many_requests_provider"
	// OutcomeBusyAddress: the source address's slots for unauthenticated deliveries
	// were busy (docs/design.md §15); the address is in no label.
	OutcomeBusyAddress = "too_many_requests_address"
	// OutcomeBodyTimeout: the body did not arrive within BodyReadTimeout (408).
	OutcomeBodyTimeout      = "body_read_timeout"
	OutcomeUnavailable      = "unavailable"
	OutcomeProviderNotReady = "provider_not_ready"
	// OutcomeNotServed: the namespace is not one this deployment serves (--watch-namespaces).
	OutcomeNotServed         = "namespace_not_served"
	outcomeLabelUnknownValue = "unknown"
)

var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_receiver_requests_total",
		Help: "Webhook deliveries answered, by the WebhookProvider's namespace and name (both \"unknown\" until the provider is found) and outcome.",
	}, []string{"namespace", "provider", "outcome"})

	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "settlement_receiver_request_duration_seconds",
		Help:    "Time from request start to answer, by outcome.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"outcome"})

	inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "settlement_receiver_in_flight_requests",
		Help: "Webhook deliveries admitted (past their source address's limit) and not answered yet, body read included.",
	})

	throttled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_receiver_throttled_total",
		Help: "Deliveries answered 429, by the limit that was hit: address (the source address's unauthenticated deliveries; the address is not a label), provider, namespace or global.",
	}, []string{"limit"})

	archiveLookups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_receiver_archive_lookups_total",
		Help: "Archive lookups on a cache miss, by result (hit: answered from the archive; miss: not archived; error: the archive did not answer in time, the delivery was stored anyway).",
	}, []string{"result"})

	rejectionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_receiver_rejections_total",
		Help: "Deliveries to a known WebhookProvider refused with 400, 401, 413 or 415, by namespace, provider and reason (the closed set of status.lastRejection.reason).",
	}, []string{"namespace", "provider", "reason"})

	unmappedJobStates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_receiver_unmapped_job_states_total",
		Help: "Job completions in accepted events whose state the WebhookProvider's spec.states does not map (nothing is created or charged for them), by namespace and provider; the state is not a label (senders choose it), the event's status names it.",
	}, []string{"namespace", "provider"})

	signatureSecretIndex = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settlement_receiver_signature_key_matches_total",
		Help: "Verified deliveries by the WebhookProvider's namespace and name and the position in spec.signature.secretRef.keys of the key that matched; an old key with no matches can be removed.",
	}, []string{"namespace", "provider", "key_index"})
)

// MetricCollectors are the receiver's metrics, registered with controller-runtime's
// registry at start; test/prometheus checks the shipped alerts and dashboard against them.
func MetricCollectors() []prometheus.Collector {
	return []prometheus.Collector{requestsTotal, requestDuration, inFlight, throttled, signatureSecretIndex, archiveLookups, rejectionsTotal, unmappedJobStates}
}

func init() { metrics.Registry.MustRegister(MetricCollectors()...) }
