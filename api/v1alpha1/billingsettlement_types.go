package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SettlementType is the kind of financial operation.
// +kubebuilder:validation:Enum=Charge;Refund;Void
type SettlementType string

const (
	// SettlementCharge charges the customer.
	SettlementCharge SettlementType = "Charge"
	// SettlementRefund returns money for a settled charge (compensation).
	SettlementRefund SettlementType = "Refund"
	// SettlementVoid cancels a charge that has not settled yet (compensation).
	SettlementVoid SettlementType = "Void"
)

// SettlementState is where a settlement stands.
// +kubebuilder:validation:Enum=Pending;Submitted;Settled;Failed;RequiresReconciliation
type SettlementState string

const (
	// SettlementPending: not yet sent to the provider (or waiting to retry a call that
	// provably did not reach it).
	SettlementPending SettlementState = "Pending"
	// SettlementSubmitted: sent at least once; the provider's final answer is not known
	// yet. It is resolved by retrying with the same key or asking the provider by key.
	SettlementSubmitted SettlementState = "Submitted"
	// SettlementSettled: the provider settled it. Final.
	SettlementSettled SettlementState = "Settled"
	// SettlementFailed: the provider refused it, or retries ran out (see DeadLettered).
	// Final until replayed.
	SettlementFailed SettlementState = "Failed"
	// SettlementRequiresReconciliation: the provider's record conflicts with ours (e.g.
	// the key was used with other parameters); a human must decide.
	SettlementRequiresReconciliation SettlementState = "RequiresReconciliation"
)

// Condition types of BillingSettlement.
const (
	// ConditionSubmitted is True once the settlement has been sent to the provider.
	ConditionSubmitted = "Submitted"
	// ConditionSettled is True once the provider settled it.
	ConditionSettled = "Settled"
	// ConditionDeadLettered is True when retries ran out; replay to resume.
	ConditionDeadLettered = "DeadLettered"
	// ConditionReconciled is True when a reconciliation pass confirmed the settlement
	// against the provider's record.
	ConditionReconciled = "Reconciled"
)

// Reasons on BillingSettlement conditions and Kubernetes Events.
const (
	ReasonAwaitingSubmission   = "AwaitingSubmission"
	ReasonSubmittedToProvider  = "SubmittedToProvider"
	ReasonProviderPending      = "ProviderPending"
	ReasonProviderSettled      = "ProviderSettled"
	ReasonProviderFailed       = "ProviderFailed"
	ReasonTransientError       = "TransientError"
	ReasonTerminalError        = "TerminalError"
	ReasonOutcomeUnknown       = "OutcomeUnknown"
	ReasonKeyReused            = "IdempotencyKeyReused"
	ReasonRetriesExhausted     = "RetriesExhausted"
	ReasonReplayed             = "Replayed"
	ReasonConfirmedByProvider  = "ConfirmedByProvider"
	ReasonMismatchWithProvider = "MismatchWithProvider"
	ReasonDeletionBlocked      = "DeletionBlocked"
)

// BillingSettlementSpec is one logical financial operation. It is immutable: a
// correction is a new settlement of type Refund or Void that names what it reverses.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="BillingSettlement spec is immutable: financial records are never edited; create a Refund or Void that reverses it instead"
// +kubebuilder:validation:XValidation:rule="self.type == 'Charge' ? !has(self.reverses) : has(self.reverses)",message="a Refund or Void must name the settlement it reverses, and a Charge must not"
// +kubebuilder:validation:XValidation:rule="has(self.usage) || has(self.amount)",message="a settlement needs usage, amount or both"
// +kubebuilder:validation:XValidation:rule="self.type != 'Refund' || has(self.amount)",message="a Refund needs an amount"
type BillingSettlementSpec struct {
	// billingProviderRef names the BillingProvider (same namespace) that settles it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	BillingProviderRef string `json:"billingProviderRef"`

	// settlementKey identifies the logical operation; for a job's charge
	// ["job","<namespace>","<webhook provider>","<jobID>"] ("<provider>/<jobID>" for
	// settlements created before keys were namespaced).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	SettlementKey string `json:"settlementKey"`

	// idempotencyKey is sent with every attempt and replay: "stl_" and the first 32 hex
	// characters of SHA-256 of the JSON array ["settlement","<namespace>","<settlementKey>"]
	// (of settlementKey alone for settlements created before keys were namespaced).
	// Set once at creation, never changed.
	// +required
	// +kubebuilder:validation:Pattern=`^stl_[0-9a-f]{32}$`
	IdempotencyKey string `json:"idempotencyKey"`

	// type of operation.
	// +optional
	// +kubebuilder:default=Charge
	Type SettlementType `json:"type,omitempty"`

	// reverses is the name of the settlement a Refund or Void compensates.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Reverses string `json:"reverses,omitempty"`

	// customer is the billing customer's ID.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Customer string `json:"customer"`

	// usage to charge for.
	// +optional
	Usage *Usage `json:"usage,omitempty"`

	// amount to charge or refund.
	// +optional
	Amount *Amount `json:"amount,omitempty"`

	// jobID the settlement is for, when it is one-per-job.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	JobID string `json:"jobID,omitempty"`

	// webhookProvider is the WebhookProvider whose event caused it, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	WebhookProvider string `json:"webhookProvider,omitempty"`

	// sourceEvent is the name of the WebhookEvent that created it, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SourceEvent string `json:"sourceEvent,omitempty"`

	// metadata is passed to the provider as-is (small, non-secret key/values).
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SettlementError is the latest failure of a settlement, classified once by the
// provider adapter.
type SettlementError struct {
	// class says what the controller does about it: Transient (retry with the same
	// key), Terminal (stop), Ambiguous (ask the provider by key).
	// +required
	// +kubebuilder:validation:Enum=Transient;Terminal;Ambiguous
	Class string `json:"class"`

	// code is the provider's error code or the HTTP status, e.g. "503" or
	// "idempotency_key_reused".
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Code string `json:"code,omitempty"`

	// message is a short description, without secrets or payloads.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// at is when it happened.
	// +required
	At metav1.Time `json:"at"`
}

// ReplayStatus records replays requested through the replay annotation.
type ReplayStatus struct {
	// lastToken is the replay annotation value last acted on.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	LastToken string `json:"lastToken,omitempty"`

	// count of replays acted on.
	// +optional
	Count int32 `json:"count,omitempty"`

	// lastAt is when the last replay was acted on; the retry budget (maxElapsed)
	// restarts from it.
	// +optional
	LastAt *metav1.Time `json:"lastAt,omitempty"`

	// attemptsBefore is status.attempts when the last replay was acted on; the retry
	// budget (maxAttempts) counts attempts after it.
	// +optional
	AttemptsBefore int32 `json:"attemptsBefore,omitempty"`
}

// BillingSettlementStatus is written by the BillingSettlement controller.
type BillingSettlementStatus struct {
	// observedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// state of the settlement.
	// +optional
	State SettlementState `json:"state,omitempty"`

	// attempts is how many calls were made to submit it (all with the same key).
	// +optional
	Attempts int32 `json:"attempts,omitempty"`

	// providerRef is the provider's ID of the settlement.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ProviderRef string `json:"providerRef,omitempty"`

	// providerStatus is the provider's last reported status (pending, settled, failed).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	ProviderStatus string `json:"providerStatus,omitempty"`

	// firstSubmittedAt is persisted before the first call to the provider: if it is set
	// and the outcome is unknown, the provider is asked by key before anything else.
	// +optional
	FirstSubmittedAt *metav1.Time `json:"firstSubmittedAt,omitempty"`

	// outcomeUnknown is true while an attempt may have reached the provider without
	// its answer arriving (a timeout, a 5xx, a crash mid-call). The provider is then
	// asked by key before anything else, and the settlement is never dead-lettered
	// while it is true: only the provider's answer clears it.
	// +optional
	OutcomeUnknown bool `json:"outcomeUnknown,omitempty"`

	// lastAttemptAt is when the latest call was made.
	// +optional
	LastAttemptAt *metav1.Time `json:"lastAttemptAt,omitempty"`

	// nextAttemptAt is when the controller calls the provider again.
	// +optional
	NextAttemptAt *metav1.Time `json:"nextAttemptAt,omitempty"`

	// settledAt is when the provider settled it.
	// +optional
	SettledAt *metav1.Time `json:"settledAt,omitempty"`

	// lastError is the latest failure.
	// +optional
	LastError *SettlementError `json:"lastError,omitempty"`

	// replay records replays requested through the replay annotation.
	// +optional
	Replay *ReplayStatus `json:"replay,omitempty"`

	// reconcileRequest is the reconcile-request annotation value last acted on.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ReconcileRequest string `json:"reconcileRequest,omitempty"`

	// lastReconciledAt is when a reconciliation pass last confirmed this settlement
	// against the provider's record.
	// +optional
	LastReconciledAt *metav1.Time `json:"lastReconciledAt,omitempty"`

	// reversedBy lists settlements that compensate this one.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	ReversedBy []string `json:"reversedBy,omitempty"`

	// conditions: Submitted, Settled, DeadLettered, Reconciled, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// BillingSettlement is one logical financial operation (a charge, or a refund or void
// that compensates one) with a stable idempotency key reused on every attempt. It is
// never owned by an event, never edited, and cannot be deleted while its outcome at
// the provider is unknown.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bs,categories=settlement
// +kubebuilder:printcolumn:name="Customer",type=string,JSONPath=`.spec.customer`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Amount",type=integer,JSONPath=`.spec.amount.minor`,description="Amount in the currency's minor unit"
// +kubebuilder:printcolumn:name="Currency",type=string,JSONPath=`.spec.amount.currency`
// +kubebuilder:printcolumn:name="Usage",type=string,JSONPath=`.spec.usage.quantity`
// +kubebuilder:printcolumn:name="Unit",type=string,JSONPath=`.spec.usage.unit`,priority=1
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Attempts",type=integer,JSONPath=`.status.attempts`
// +kubebuilder:printcolumn:name="Provider-Ref",type=string,JSONPath=`.status.providerRef`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Why it is in its state (the Ready condition's reason)"
// +kubebuilder:printcolumn:name="Key",type=string,JSONPath=`.spec.settlementKey`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BillingSettlement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the immutable financial operation.
	// +required
	Spec BillingSettlementSpec `json:"spec"`

	// status is written by the operator.
	// +optional
	Status BillingSettlementStatus `json:"status,omitempty"`
}

// BillingSettlementList is a list of BillingSettlements.
// +kubebuilder:object:root=true
type BillingSettlementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BillingSettlement `json:"items"`
}

func init() {
	SchemeBuilder.Register(&BillingSettlement{}, &BillingSettlementList{})
}
