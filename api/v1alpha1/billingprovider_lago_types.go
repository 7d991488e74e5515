package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// BillingProviderLago sends usage to Lago's events API (docs/design.md §13): a usage
// charge becomes one event, its transaction_id the settlement's idempotency key.
const BillingProviderLago BillingProviderType = "Lago"

// LagoSettings configures a BillingProvider of type Lago: which billable metric each
// usage meter feeds, and how events are dated. spec.endpoint is Lago's API host
// (https://api.getlago.com for Lago Cloud US, https://api.eu.getlago.com for the EU,
// the lago-api service of a self-hosted Lago), without /api/v1.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.eventPipeline) || oldSelf.eventPipeline != 'ClickHouse' || (has(self.eventPipeline) && self.eventPipeline == 'ClickHouse')",message="eventPipeline cannot go from ClickHouse to Postgres in place: a charge ClickHouse may still be ingesting would not be found by a lookup, that lookup would then be trusted and the charge sent again; create another BillingProvider for the Postgres pipeline (docs/runbook.md)"
type LagoSettings struct {
	// metrics maps the settlements' usage meters (spec.usage.meter) to Lago billable
	// metrics. A usage charge for a meter not listed is refused, never sent under a
	// guessed code. Each billable metric code is mapped from one usage meter only: an
	// event read back from Lago names its usage meter by its code.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=meter
	// +kubebuilder:validation:XValidation:rule="self.all(m, self.exists_one(o, o.code == m.code))",message="each Lago billable metric code is mapped from one usage meter only: an event read back from Lago names its usage meter by its code"
	Metrics []LagoMetric `json:"metrics"`

	// gracePeriod is the invoice grace period of the Lago organization (Settings →
	// Invoices; the shortest of any customer's own). When set, usage is sent dated at
	// the job's completion while it reaches Lago well inside this period of it (10
	// minutes in hand), and dated at the operator's first attempt after that; unset,
	// every event is dated at the operator's first attempt. Lago accepts an event for a
	// billing period whose invoice is finalized and never bills it, so a completion is
	// used only while its period's invoice may still be a draft. Set it no longer than
	// the organization's.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1h') && duration(self) <= duration('2160h')",message="gracePeriod is the Lago organization's invoice grace period: between 1h and 90 days (2160h)"
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`

	// eventPipeline is how the Lago organization ingests events. Postgres (the default
	// pipeline) stores an event before it answers, so a lookup by transaction_id that
	// finds nothing proves nothing is there. ClickHouse (the high-volume pipeline) takes
	// events through Kafka asynchronously and does not guarantee a transaction_id is
	// unique: a lookup that finds nothing proves nothing, so the operator never decides
	// "nothing was charged" from it, and never resends a charge that may have been
	// ingested; one whose outcome stays unknown stops for a person (docs/runbook.md).
	// Set ClickHouse when the organization uses that pipeline.
	// +optional
	// +kubebuilder:default=Postgres
	// +kubebuilder:validation:Enum=Postgres;ClickHouse
	EventPipeline LagoEventPipeline `json:"eventPipeline,omitempty"`
}

// LagoEventPipeline is how a Lago organization ingests events.
type LagoEventPipeline string

// The Lago event pipelines.
const (
	LagoPipelinePostgres   LagoEventPipeline = "Postgres"
	LagoPipelineClickHouse LagoEventPipeline = "ClickHouse"
)

// LagoMetric is one Lago billable metric that usage is reported to.
// +kubebuilder:validation:XValidation:rule="self.fieldName != 'settlement_key' && self.fieldName != 'settlement_unit'",message="fieldName settlement_key and settlement_unit are the properties the operator writes to identify its events; choose the billable metric's own field"
type LagoMetric struct {
	// meter is the usage meter as settlements name it (spec.usage.meter).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Meter string `json:"meter"`

	// code is the Lago billable metric's code (the event's code).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	Code string `json:"code"`

	// fieldName is the billable metric's field_name: the event property its
	// aggregation (sum, max, latest, weighted sum) reads; the settlement's quantity is
	// sent under it. A count metric ignores it and counts one per event.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	FieldName string `json:"fieldName"`
}
