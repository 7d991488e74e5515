package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BillingProviderType is the kind of billing backend.
// +kubebuilder:validation:Enum=HTTP
type BillingProviderType string

const (
	// BillingProviderHTTP speaks the generic HTTP contract of docs/design.md §6.1. (Stripe is
	// planned; the enum grows when its adapter exists, so no config is accepted that
	// the operator cannot serve.)
	BillingProviderHTTP BillingProviderType = "HTTP"
)

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
	// (ProviderErroring), or it could not be reached (EndpointUnreachable). Absent until
	// the first call.
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
	// ReasonEndpointUnreachable: calls got no answer (DNS failure, connection refused
	// or reset, timeout): the endpoint is wrong, or the provider or the network is down.
	ReasonEndpointUnreachable = "EndpointUnreachable"
	// ReasonProviderErroring: the provider answered the latest calls with 5xx errors.
	ReasonProviderErroring = "ProviderErroring"
	// ReasonProviderCallFailed: a reconciliation pass failed on a provider call for
	// another reason (e.g. a 5xx answer).
	ReasonProviderCallFailed = "ProviderCallFailed"
)

// RetryPolicy bounds how a settlement is retried. Every retry uses the same key.
// +kubebuilder:validation:XValidation:rule="duration(self.initialBackoff) <= duration(self.maxBackoff)",message="initialBackoff must not exceed maxBackoff"
type RetryPolicy struct {
	// maxAttempts before the settlement is dead-lettered.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxAttempts int32 `json:"maxAttempts,omitempty"`

	// maxElapsed since the first attempt before the settlement is dead-lettered.
	// +optional
	// +kubebuilder:default="1h"
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
type BillingProviderSpec struct {
	// type of backend.
	// +optional
	// +kubebuilder:default=HTTP
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
	// first, and only a "not found" allows a resubmission.
	// +optional
	// +kubebuilder:default="24h"
	IdempotencyWindow *metav1.Duration `json:"idempotencyWindow,omitempty"`

	// requestTimeout bounds each call to the provider.
	// +optional
	// +kubebuilder:default="10s"
	RequestTimeout *metav1.Duration `json:"requestTimeout,omitempty"`

	// retry bounds retries of a settlement.
	// +optional
	// +kubebuilder:default={maxAttempts:10,maxElapsed:"1h",initialBackoff:"1s",maxBackoff:"5m"}
	Retry *RetryPolicy `json:"retry,omitempty"`

	// reconciliation configures the periodic comparison with the provider.
	// +optional
	// +kubebuilder:default={interval:"10m",stuckAfter:"15m",eventStaleAfter:"30m",keepReports:10}
	Reconciliation *ReconciliationPolicy `json:"reconciliation,omitempty"`
}

// BillingProviderStatus reports whether the backend can be used.
type BillingProviderStatus struct {
	// observedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// lastReconciliation is when the latest reconciliation pass finished.
	// +optional
	LastReconciliation *metav1.Time `json:"lastReconciliation,omitempty"`

	// providerListedUntil is the end of the last pass that walked the provider's
	// records completely; the next pass lists from there (minus an overlap), so a failed
	// or truncated walk never skips records.
	// +optional
	ProviderListedUntil *metav1.Time `json:"providerListedUntil,omitempty"`

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

	// status is written by the operator.
	// +optional
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
