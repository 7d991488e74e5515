package v1alpha1

// BillingProviderMetronome sends usage charges to Metronome as usage events
// (POST /v1/ingest; docs/design.md §13): the settlement's idempotency key is the
// event's transaction_id, which Metronome deduplicates for 34 days.
const BillingProviderMetronome BillingProviderType = "Metronome"

// MetronomeSettings configures a BillingProvider of type Metronome: which event type
// each usage meter is reported as, and under which property its quantity goes.
type MetronomeSettings struct {
	// meters maps the settlements' usage meters (spec.usage.meter) to Metronome event
	// types. A usage charge for a meter not listed is refused, never sent under a
	// guessed event type.
	// +required
	// +listType=map
	// +listMapKey=meter
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(m, !has(m.billableMetricID) || self.exists_one(o, has(o.billableMetricID) && o.billableMetricID.lowerAscii() == m.billableMetricID.lowerAscii()))",message="each Metronome billableMetricID is mapped from one usage meter only: reconciliation compares a usage meter's usage with its billable metric's totals"
	Meters []MetronomeMeter `json:"meters"`
}

// MetronomeMeter is one usage meter reported to Metronome: the event type a billable
// metric filters on, the property it aggregates, and the billable metric whose totals
// reconciliation compares.
// +kubebuilder:validation:XValidation:rule="!has(self.quantityProperty) || !(self.quantityProperty in ['settlement_key', 'settlement_unit'])",message="quantityProperty may not be settlement_key or settlement_unit: the operator writes those properties itself"
type MetronomeMeter struct {
	// meter is the usage meter as settlements name it (spec.usage.meter).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Meter string `json:"meter"`

	// eventType is the event_type of the usage events, the one the Metronome billable
	// metric's event type filter matches.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^\S+$`
	EventType string `json:"eventType"`

	// quantityProperty is the event property that carries the quantity, the one the
	// billable metric sums (its aggregation key). Default: quantity.
	// +optional
	// +kubebuilder:default=quantity
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^\S+$`
	QuantityProperty string `json:"quantityProperty,omitempty"`

	// billableMetricID is the ID (a UUID) of the Metronome billable metric that sums this
	// meter's events: reconciliation reads its usage totals per customer (POST
	// /v1/usage) and compares them with what the settlements sent. Without it the
	// totals of this meter are not compared (counted UsageTotalNotComparable).
	// +optional
	// +kubebuilder:validation:MaxLength=36
	// +kubebuilder:validation:Pattern=`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`
	BillableMetricID string `json:"billableMetricID,omitempty"`
}
