package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BillingProviderType is the kind of billing backend.
// The enum lists exactly the types with an adapter (internal/billing/adapters), so no
// config is accepted that the operator cannot serve.
// +kubebuilder:validation:Enum=HTTP;Stripe;Lago;Metronome;OpenMeter
type BillingProviderType string

const (
	// BillingProviderHTTP speaks the generic HTTP contract of docs/design.md §6.1.
	BillingProviderHTTP BillingProviderType = "HTTP"
	// BillingProviderStripe calls Stripe's API (docs/design.md §13): usage charges become
	// Billing Meter Events, amounts Invoice Items.
	BillingProviderStripe BillingProviderType = "Stripe"
)

// Key modes of a Stripe provider (status.mode).
const (
	StripeModeTest = "test"
	StripeModeLive = "live"
)

// StripeSettings configures a BillingProvider of type Stripe.
type StripeSettings struct {
	// meters maps the settlements' usage meters (spec.usage.meter) to Stripe meters. A
	// usage charge for a meter not listed is refused, never sent under a guessed name.
	// Each Stripe meter (event name, id) is mapped once: reconciliation compares one
	// usage meter's usage with its Stripe meter's totals.
	// +optional
	// +listType=map
	// +listMapKey=meter
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(m, self.exists_one(o, o.eventName == m.eventName))",message="each Stripe eventName is mapped from one usage meter only: reconciliation compares a usage meter's usage with its Stripe meter's totals"
	// +kubebuilder:validation:XValidation:rule="self.all(m, !has(m.id) || m.id == '' || self.exists_one(o, has(o.id) && o.id == m.id))",message="each Stripe meter id is mapped from one usage meter only: reconciliation compares a usage meter's usage with its Stripe meter's totals"
	Meters []StripeMeter `json:"meters,omitempty"`
}

// StripeTimestamp says how a meter event is dated.
// +kubebuilder:validation:Enum=Receipt;Completion
type StripeTimestamp string

const (
	// StripeTimestampReceipt: no timestamp is sent; Stripe dates the event when it
	// receives it, so it is always billed (at worst in the period after the job's).
	StripeTimestampReceipt StripeTimestamp = "Receipt"
	// StripeTimestampCompletion: the event is dated at the job's completion, but only
	// while Stripe still bills it there: see StripeMeter.gracePeriod.
	StripeTimestampCompletion StripeTimestamp = "Completion"
)

// StripeMeter is one Stripe Billing Meter that usage is reported to.
// +kubebuilder:validation:XValidation:rule="!has(self.gracePeriod) || (has(self.timestamp) && self.timestamp == 'Completion')",message="gracePeriod applies only with timestamp: Completion"
// +kubebuilder:validation:XValidation:rule="!has(self.gracePeriod) || (duration(self.gracePeriod) >= duration('15m') && duration(self.gracePeriod) <= duration('72h'))",message="gracePeriod is Stripe's invoice finalization grace period: between 15m and 72h (Stripe allows 1h to 72h)"
type StripeMeter struct {
	// meter is the usage meter as settlements name it (spec.usage.meter).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Meter string `json:"meter"`

	// eventName is the Stripe meter's event_name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	EventName string `json:"eventName"`

	// id is the Stripe meter's ID (mtr_...), for reconciliation; optional.
	// +optional
	// +kubebuilder:validation:MaxLength=100
	ID string `json:"id,omitempty"`

	// customerKey is the payload key of the Stripe customer ID (Stripe's default:
	// stripe_customer_id).
	// +optional
	// +kubebuilder:validation:MaxLength=100
	CustomerKey string `json:"customerKey,omitempty"`

	// valueKey is the payload key of the quantity (Stripe's default: value).
	// +optional
	// +kubebuilder:validation:MaxLength=100
	ValueKey string `json:"valueKey,omitempty"`

	// timestamp says how events of this meter are dated: Receipt (the default) lets
	// Stripe date an event when it receives it; Completion dates it at the job's
	// completion. Stripe bills an event dated in a past billing period only until that
	// period's invoice is finalized (its grace period) and accepts it silently after,
	// so with Completion an event is dated only when its first attempt is well inside
	// gracePeriod of the completion, and never sent so dated after that (a later
	// attempt goes undated); a job reported later is dated at receipt.
	// +optional
	Timestamp StripeTimestamp `json:"timestamp,omitempty"`

	// gracePeriod is the Stripe account's invoice finalization grace period (Billing
	// settings: 1 hour by default, up to 72 hours), with timestamp: Completion. Set it
	// no longer than the account's. Default 1h.
	// +optional
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`
}

// FinalizerBillingProviderInUse is put on every BillingProvider by its controller and
// blocks its deletion while a settlement that references it may have moved money and
// is not resolved yet: such a settlement can only be resolved by asking this provider
// by key, with its endpoint and credentials. It is released as soon as no
// referencing settlement holds it (see the Deleting condition).
const FinalizerBillingProviderInUse = "hooks.settlement.dev/billing-provider-in-use"

// Condition types of BillingProvider (Ready is shared, see common_types.go).
const (
	// ConditionDeleting is True while the BillingProvider is being deleted and its
	// deletion waits for settlements that may have moved money at it; the message
	// says how many and names some of them.
	ConditionDeleting = "Deleting"
	// ConditionProviderHealthy says how the operator's latest calls to the provider
	// went: the endpoint answered and accepted the credentials (CallsSucceeding), it
	// refused them (CredentialsRejected), it answered with 5xx errors
	// (ProviderErroring), it could not be reached (EndpointUnreachable), or it gave no
	// answer within requestTimeout (ProviderNotAnswering). Absent until the first call.
	ConditionProviderHealthy = "ProviderHealthy"
)

// Reasons on BillingProvider conditions and Kubernetes Events.
const (
	// ReasonSettlementsInFlight: deletion waits because settlements that reference
	// the provider may have moved money there and are not resolved; they still use
	// it (and its credentials Secret) until the provider answers for them.
	ReasonSettlementsInFlight = "SettlementsInFlight"
	// ReasonCallsSucceeding: the latest calls reached the provider and it accepted
	// the credentials (whatever it answered about each settlement).
	ReasonCallsSucceeding = "CallsSucceeding"
	// ReasonCredentialsRejected: the provider answered 401 or 403: the token in the
	// credentials Secret is wrong, expired or lacks permission.
	ReasonCredentialsRejected = "CredentialsRejected"
	// ReasonEndpointUnreachable: calls could not reach the provider (DNS failure,
	// connection refused or reset): the endpoint is wrong, or the provider or the
	// network is down. A call that times out is ReasonProviderNotAnswering.
	ReasonEndpointUnreachable = "EndpointUnreachable"
	// ReasonProviderNotAnswering: calls reached the provider (it accepted the
	// connection) but got no answer within requestTimeout: it is overloaded or hung.
	// Its settlements wait their turn for its share of the settlement workers, so no
	// other provider's settlements wait for it (docs/design.md §5.4).
	ReasonProviderNotAnswering = "ProviderNotAnswering"
	// ReasonProviderErroring: the provider answered the latest calls with 5xx errors.
	ReasonProviderErroring = "ProviderErroring"
	// ReasonProviderCallFailed: a reconciliation pass failed on a provider call for
	// another reason (e.g. a 5xx answer).
	ReasonProviderCallFailed = "ProviderCallFailed"
)

// RetryPolicy bounds how a settlement is retried. Every retry uses the same key.
// +kubebuilder:validation:XValidation:rule="duration(self.initialBackoff) <= duration(self.maxBackoff)",message="initialBackoff must not exceed maxBackoff"
type RetryPolicy struct {
	// maxAttempts before a settlement that provably charged nothing is dead-lettered.
	// Unset: no cap on attempts, only maxElapsed bounds them.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxAttempts int32 `json:"maxAttempts,omitempty"`

	// maxElapsed since the first attempt before a settlement that provably charged
	// nothing is dead-lettered. Unset: as long as a resend under the key is safe — the
	// key window (the shorter of idempotencyWindow and the provider's own, 24h for
	// Stripe) less a minute and two request timeouts — so an outage shorter than the
	// window never needs a person. Money that may have moved is never dead-lettered.
	// +optional
	MaxElapsed *metav1.Duration `json:"maxElapsed,omitempty"`

	// initialBackoff is the delay after the first failure; it doubles per attempt, with
	// jitter, up to maxBackoff. A provider's Retry-After wins when longer.
	// +optional
	// +kubebuilder:default="1s"
	InitialBackoff *metav1.Duration `json:"initialBackoff,omitempty"`

	// maxBackoff caps the delay between attempts.
	// +optional
	// +kubebuilder:default="5m"
	MaxBackoff *metav1.Duration `json:"maxBackoff,omitempty"`
}

// ReconciliationPolicy configures the periodic comparison with the provider (docs/design.md §7).
type ReconciliationPolicy struct {
	// interval between passes.
	// +optional
	// +kubebuilder:default="10m"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// stuckAfter is how long a settlement may stay Submitted or unknown before a pass
	// reports it.
	// +optional
	// +kubebuilder:default="15m"
	StuckAfter *metav1.Duration `json:"stuckAfter,omitempty"`

	// eventStaleAfter is how long an event may stay incomplete before a pass reports it.
	// +optional
	// +kubebuilder:default="30m"
	EventStaleAfter *metav1.Duration `json:"eventStaleAfter,omitempty"`

	// keepReports is how many ReconciliationReports are kept; older ones are pruned.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	KeepReports int32 `json:"keepReports,omitempty"`
}

// BillingProviderSpec configures one billing backend.
// +kubebuilder:validation:XValidation:rule="self.endpoint.startsWith('https://') || self.allowInsecureHTTP",message="endpoint must use https:// unless allowInsecureHTTP is true"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.idempotencyWindow) || !has(self.idempotencyWindow) || duration(self.idempotencyWindow) <= duration(oldSelf.idempotencyWindow)",message="idempotencyWindow cannot be lengthened in place: the keys of charges already sent are kept by the provider for the old window, and inside the longer one a charge is resent without asking, so it could be charged again; create another BillingProvider (docs/runbook.md)"
// +kubebuilder:validation:XValidation:rule="!has(self.stripe) || (has(self.type) && self.type == 'Stripe')",message="stripe settings apply to type Stripe only"
// +kubebuilder:validation:XValidation:rule="has(self.metronome) == (has(self.type) && self.type == 'Metronome')",message="a Metronome provider needs spec.metronome (its meters), and spec.metronome applies to type Metronome only"
// +kubebuilder:validation:XValidation:rule="has(self.openMeter) == (has(self.type) && self.type == 'OpenMeter')",message="openMeter is required for type OpenMeter and applies to it only: it maps each usage meter to its OpenMeter event type"
// +kubebuilder:validation:XValidation:rule="!has(self.type) || self.type != 'Stripe' || !has(self.idempotencyWindow) || duration(self.idempotencyWindow) <= duration('24h')",message="a Stripe provider's idempotencyWindow is at most 24h: Stripe keeps idempotency keys for 24 hours"
// +kubebuilder:validation:XValidation:rule="!has(self.type) || self.type != 'Stripe' || !has(self.requestTimeout) || duration(self.requestTimeout) <= duration('1m')",message="a Stripe provider's requestTimeout is at most 1m: a resend under a key must reach Stripe inside its 24-hour window"
// +kubebuilder:validation:XValidation:rule="has(self.lago) == (has(self.type) && self.type == 'Lago')",message="lago settings are required for type Lago (spec.lago.metrics) and apply to type Lago only"
type BillingProviderSpec struct {
	// type of backend. Immutable: what a lookup's or a resend's answer proves depends on
	// it, for the charges already sent too.
	// +optional
	// +kubebuilder:default=HTTP
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="type is immutable: the charges already sent are asked about and resent by what their type proves; create another BillingProvider (docs/runbook.md)"
	Type BillingProviderType `json:"type,omitempty"`

	// endpoint is the base URL; settlements are posted to {endpoint}/settlements.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	Endpoint string `json:"endpoint"`

	// allowInsecureHTTP permits an http:// endpoint (for a backend inside the cluster
	// network or a local test). Bearer tokens then travel in clear text.
	// +optional
	AllowInsecureHTTP bool `json:"allowInsecureHTTP,omitempty"`

	// credentialsSecretRef names the Secret key holding the bearer token. The Secret
	// must opt in: label hooks.settlement.dev/credential-for=billing and the endpoint
	// listed in annotation hooks.settlement.dev/credential-destinations; until then
	// nothing is sent to the endpoint (Ready=False, CredentialsNotAllowed).
	// +required
	CredentialsSecretRef SecretKeyReference `json:"credentialsSecretRef"`

	// idempotencyWindow is how long the provider remembers an idempotency key. Inside
	// it a retry with the same key is safe; after it the provider is asked by key
	// first, and only a "not found" allows a resubmission. It may be shortened in place,
	// never lengthened (the charges already sent were kept for the old window).
	// +optional
	// +kubebuilder:default="24h"
	IdempotencyWindow *metav1.Duration `json:"idempotencyWindow,omitempty"`

	// requestTimeout bounds each call to the provider; at most 1m. The bound has three
	// reasons. A call longer than a minute is one the provider will not answer: the
	// senders whose webhooks made the charge give up on theirs in seconds, and a
	// provider this slow is hung, not working. Every call holds one of the provider's
	// share of the settlement workers for its whole length, and a tarpit's settlements
	// must hand them back often enough for its own retries and lookups to go on. And
	// the retry budget (retry.maxElapsed, unset) is the key window less two request
	// timeouts: a longer timeout eats the window in which a resend is safe. An object
	// written with a larger value before the bound keeps it while it is not changed,
	// and its calls are cut at 1m all the same (docs/decisions.md).
	// +optional
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('1m')",message="requestTimeout is at most 1m: a call holds one of the provider's settlement workers while it lasts, and a provider that takes longer does not answer"
	RequestTimeout *metav1.Duration `json:"requestTimeout,omitempty"`

	// retry bounds retries of a settlement.
	// +optional
	// +kubebuilder:default={initialBackoff:"1s",maxBackoff:"5m"}
	Retry *RetryPolicy `json:"retry,omitempty"`

	// stripe configures a provider of type Stripe: which Stripe meters usage goes to.
	// +optional
	Stripe *StripeSettings `json:"stripe,omitempty"`
	// lago configures a provider of type Lago: which billable metrics usage goes to.
	// +optional
	Lago *LagoSettings `json:"lago,omitempty"`

	// metronome configures a provider of type Metronome: the event type of each usage meter.
	// +optional
	Metronome *MetronomeSettings `json:"metronome,omitempty"`

	// openMeter configures a provider of type OpenMeter: its event types, source and deduplication.
	// +optional
	OpenMeter *OpenMeterSettings `json:"openMeter,omitempty"`

	// reconciliation configures the periodic comparison with the provider.
	// +optional
	// +kubebuilder:default={interval:"10m",stuckAfter:"15m",eventStaleAfter:"30m",keepReports:10}
	Reconciliation *ReconciliationPolicy `json:"reconciliation,omitempty"`
}

// BillingProviderStatus reports whether the backend can be used.
type BillingProviderStatus struct {
	// observedGeneration is the spec generation this status describes; 0 until the
	// operator has looked at the object.
	// +optional
	// +kubebuilder:default=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// lastReconciliation is when the latest reconciliation pass finished.
	// +optional
	LastReconciliation *metav1.Time `json:"lastReconciliation,omitempty"`

	// providerListedUntil is the end of the last pass that walked the provider's
	// records completely; the next pass lists from there (minus an overlap), so a failed
	// or truncated walk never skips records.
	// +optional
	ProviderListedUntil *metav1.Time `json:"providerListedUntil,omitempty"`

	// mode is a Stripe provider's key mode, test or live (from the key's prefix), so a
	// staging cluster pointed at live billing shows.
	// +optional
	// +kubebuilder:validation:Enum=test;live
	Mode string `json:"mode,omitempty"`

	// lastReport is the name of the latest ReconciliationReport.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	LastReport string `json:"lastReport,omitempty"`

	// conditions: Ready is True when the credentials Secret exists, opts in to billing
	// at this endpoint, and has its key;
	// Deleting is True while a deletion waits for settlements that may have moved
	// money at this provider and are not resolved yet.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// BillingProvider configures one billing backend: where it is, how to authenticate,
// how long it remembers idempotency keys, how settlements are retried, and how often
// the operator reconciles against it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bp,categories=settlement
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.mode`,description="A Stripe key's mode: test or live"
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Why it is (not) ready: the Ready condition's reason"
// +kubebuilder:printcolumn:name="Last-Report",type=string,JSONPath=`.status.lastReport`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BillingProvider struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec configures the backend.
	// +required
	Spec BillingProviderSpec `json:"spec"`

	// status is written by the operator. Until it first does, the API server shows
	// status.observedGeneration 0 (a default), so kstatus-based tools (Flux's wait)
	// see a generation not observed yet, in progress, rather than a current object.
	// +optional
	// +kubebuilder:default={observedGeneration:0}
	Status BillingProviderStatus `json:"status,omitempty"`
}

// BillingProviderList is a list of BillingProviders.
// +kubebuilder:object:root=true
type BillingProviderList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BillingProvider `json:"items"`
}

func init() {
	SchemeBuilder.Register(&BillingProvider{}, &BillingProviderList{})
}
