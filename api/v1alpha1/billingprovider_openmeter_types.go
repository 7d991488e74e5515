package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BillingProviderOpenMeter sends usage to OpenMeter's events API as CloudEvents
// (docs/design.md §13): one event per usage charge, its id the settlement's
// idempotency key. OpenMeter bills usage only, and has no reversal of ingested usage.
const BillingProviderOpenMeter BillingProviderType = "OpenMeter"

// OpenMeterCloudEndpoint is OpenMeter Cloud's API, the endpoint to set for a provider
// that is not self-hosted.
const OpenMeterCloudEndpoint = "https://openmeter.cloud"

// DefaultOpenMeterSource is the CloudEvents source of the events sent when
// spec.openMeter.source is not set.
const DefaultOpenMeterSource = "settlement-operator"

// DefaultOpenMeterValueProperty is the data property carrying the quantity when a
// meter does not name one.
const DefaultOpenMeterValueProperty = "value"

// OpenMeterSettings configures a BillingProvider of type OpenMeter.
// +kubebuilder:validation:XValidation:rule="!has(self.deduplication) || (has(oldSelf.deduplication) && duration(self.deduplication.window) <= duration(oldSelf.deduplication.window))",message="deduplication cannot be added or its window lengthened in place: events already sent were not remembered under it, so a resend it would allow could be counted twice; create another BillingProvider (docs/runbook.md)"
type OpenMeterSettings struct {
	// source is the CloudEvents source of every event sent. OpenMeter deduplicates
	// (when it does) by source and id, and the operator finds an event again by them,
	// so it never changes once events were sent.
	// +optional
	// +kubebuilder:default="settlement-operator"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source is immutable: OpenMeter deduplicates and the operator finds events again by source and id, so events already sent would no longer be found"
	Source string `json:"source,omitempty"`

	// meters maps the settlements' usage meters (spec.usage.meter) to the event type
	// an OpenMeter meter aggregates. A usage charge for a meter not listed is refused,
	// never sent under a guessed type.
	// +required
	// +listType=map
	// +listMapKey=meter
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Meters []OpenMeterMeter `json:"meters"`

	// deduplication says that this OpenMeter install deduplicates events by source and
	// id, and for how long. Absent, it does not (a self-hosted install's default):
	// every event is counted, a resend too, so after an attempt that may have reached
	// OpenMeter nothing is ever sent again, and a settlement whose event is not listed
	// waits in RequiresReconciliation (reason NotDeduplicated) for a human. Set it
	// only as the install is configured: a window longer than the install's would let
	// a resend be counted twice.
	// +optional
	Deduplication *OpenMeterDeduplication `json:"deduplication,omitempty"`
}

// OpenMeterMeter is one usage meter's events.
type OpenMeterMeter struct {
	// meter is the usage meter as settlements name it (spec.usage.meter).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Meter string `json:"meter"`

	// eventType is the CloudEvents type of the events: the eventType of the OpenMeter
	// meter that aggregates them.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	EventType string `json:"eventType"`

	// valueProperty is the property of the event's data that carries the quantity
	// (default value): the OpenMeter meter's valueProperty is $.<valueProperty>.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:XValidation:rule="self != 'settlement_key' && self != 'unit'",message="valueProperty may not be settlement_key or unit: the operator writes the settlement's key and unit there, so a listed event names its settlement"
	ValueProperty string `json:"valueProperty,omitempty"`
}

// OpenMeterDeduplication is an OpenMeter install's deduplication of events by source
// and id.
type OpenMeterDeduplication struct {
	// window is how long the install remembers an event's source and id (its dedupe
	// expiration). Inside it, an event sent again is dropped as a duplicate; the key
	// window is the shorter of it and spec.idempotencyWindow, and bounds the retry
	// budget.
	// +required
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="deduplication.window is at least 1m: a shorter window leaves no time to resend inside it"
	Window metav1.Duration `json:"window"`
}
