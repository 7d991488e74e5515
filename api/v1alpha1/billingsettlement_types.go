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
	// SettlementVoid cancels a whole charge (compensation): one that has not settled
	// yet, or a settled one its provider can still cancel (Stripe: a meter event within
	// 24 hours, an invoice item until it is invoiced).
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

// Exposure answers one question about a settlement: could money have moved under its
// idempotency key at its provider? It is persisted before every call that could move
// money and lowered only by an authoritative answer from the provider (docs/design.md
// §11). Dead-letter eligibility, the deletion hold, the lookup before a submission and
// "may resubmit directly" are all derived from it.
// +kubebuilder:validation:Enum=None;Possible;Confirmed
type Exposure string

const (
	// ExposureNone: nothing can have moved. The settlement was never sent, every
	// attempt provably did not reach the provider, or the provider answered that it has
	// nothing under the key. It may be sent directly and dead-lettered.
	ExposureNone Exposure = "None"
	// ExposurePossible: an attempt may have reached the provider (a call was made or was
	// about to be made, a timeout, a 5xx, a crash mid-call), or the settlement may have
	// been sent before it was created again. The provider is asked by key before
	// anything else; it is never dead-lettered, deleted or sent anywhere else.
	ExposurePossible Exposure = "Possible"
	// ExposureConfirmed: the provider holds a record under the key that is ours
	// (pending or settled). A pending one is polled until final.
	ExposureConfirmed Exposure = "Confirmed"
)

// SubmissionOutcome is what the provider's answer to the latest submission proves.
// +kubebuilder:validation:Enum=Accepted;NotReceived;Refused;MaybeReceived
type SubmissionOutcome string

const (
	// SubmissionAccepted: the provider answered with its record.
	SubmissionAccepted SubmissionOutcome = "Accepted"
	// SubmissionNotReceived: provably not received (429, connection refused).
	SubmissionNotReceived SubmissionOutcome = "NotReceived"
	// SubmissionRefused: refused for good (a 4xx); nothing was processed.
	SubmissionRefused SubmissionOutcome = "Refused"
	// SubmissionMaybeReceived: a timeout, a 5xx, a lost reply or a 409 "in use": the
	// provider may still commit it. A settlement is never dead-lettered after this
	// until a later submission is provably not received: a lookup's "not found" may
	// come while the provider is still processing the request.
	SubmissionMaybeReceived SubmissionOutcome = "MaybeReceived"
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
	// ReasonProviderChanged: the BillingProvider's endpoint, identity or credentials
	// changed while money may have moved at the one the settlement was sent to; it is
	// held (no call anywhere) until the provider points back there.
	ReasonProviderChanged = "ProviderChanged"
	// ReasonCompensationNotAllowed: a Refund or Void is held because sending it could
	// move money wrongly (nothing charged, another customer or currency, more than
	// what is left to refund, a Refund before the charge settled or a Void after).
	ReasonCompensationNotAllowed = "CompensationNotAllowed"
	// ReasonCompensationWaiting: another compensation of the same charge was being
	// checked or sent for longer than the bounded wait for its turn; nothing was
	// checked or sent for this one, which tries again in a moment.
	ReasonCompensationWaiting = "CompensationWaiting"
	// ReasonAwaitingLookup: the provider must answer a lookup by key before anything
	// is sent, because an earlier attempt (or an earlier life of this settlement) may
	// have moved money.
	ReasonAwaitingLookup = "AwaitingLookup"
	// ReasonDeletionAllowed: the finalizer is released because nothing can be pending
	// at the provider under the key.
	ReasonDeletionAllowed = "DeletionAllowed"
	// ReasonMissingField: the provider's record under our key lacks a field we sent,
	// so it proves nothing about what was charged; it is not adopted.
	ReasonMissingField = "MissingField"
	// ReasonInvalidIdentity: the settlement's name or idempotency key is not the one
	// derived from its settlement key; it is never sent.
	ReasonInvalidIdentity = "InvalidIdentity"
	// ReasonProviderCannotAnswer: the provider cannot be asked about this key (Stripe
	// cannot read meter events back) and the request may not be resent under it (the
	// key window passed, the retry budget is spent, the settlement is being deleted,
	// this record never sent it, or the provider does not replay it): a human compares
	// with the provider's dashboard, as the message says. Also the reason of a
	// Reconciled condition a pass sets on a settlement it can never compare.
	ReasonProviderCannotAnswer = "ProviderCannotAnswer"
	// ReasonNotDeduplicated: the provider does not deduplicate (OpenMeter without
	// deduplication, Lago's ClickHouse pipeline: a resend is new usage), an attempt may
	// have reached it, and its listing or lookup does not show the request — which
	// proves nothing while it ingests asynchronously. Nothing is ever sent again: a
	// human looks for the event, as the message says, and a reconcile request adopts
	// it once the provider shows it.
	ReasonNotDeduplicated = "NotDeduplicated"
	// ReasonVoided: the reason of a Reconciled condition a pass sets on a settled charge
	// the provider no longer has because a settled Void of it cancelled it (Stripe
	// deletes a voided invoice item).
	ReasonVoided = "Voided"
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

	// occurredAt is when the billed usage happened (the job's completion, as its
	// sender reported it). A provider that dates usage may date the charge at it
	// (Stripe, for a meter with timestamp: Completion); the others ignore it.
	// +optional
	OccurredAt *metav1.Time `json:"occurredAt,omitempty"`

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

// ProviderTarget is where a settlement's calls went: while money may have moved there,
// it is never looked up or sent anywhere else.
type ProviderTarget struct {
	// endpoint is the BillingProvider's endpoint at the time of the call.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	Endpoint string `json:"endpoint"`

	// billingProviderUID identifies the BillingProvider object: one deleted and
	// created again under the same name may point at another account.
	// +required
	// +kubebuilder:validation:MaxLength=64
	BillingProviderUID string `json:"billingProviderUID"`

	// credentialsSecret names the Secret (and key) whose token was used: another
	// Secret may hold another account's credentials. Rotating the token inside the
	// same Secret is not a change.
	// +required
	// +kubebuilder:validation:MaxLength=512
	CredentialsSecret string `json:"credentialsSecret"`

	// mode is a Stripe key's mode (test or live): a key swapped inside the same Secret
	// for one of the other mode points at other books.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Mode string `json:"mode,omitempty"`
}

// ProviderDisagreement records that the provider holds something under our key that is
// not provably this settlement: it is then never adopted from that provider (not by a
// lookup, a replay, a reconcile request or a reconciliation pass) until the provider
// answers that it has nothing under the key.
type ProviderDisagreement struct {
	// reason is MismatchWithProvider (a field differs), MissingField (the record lacks
	// a field we sent, so it proves nothing) or IdempotencyKeyReused (the provider
	// called our request a different one).
	// +required
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`

	// field names what differed or was missing (e.g. "amount", "usage.meter"); values
	// are never copied here, they may be another tenant's.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Field string `json:"field,omitempty"`

	// at is when the provider said so.
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
	// observedGeneration is the spec generation this status describes; 0 until the
	// operator has looked at the object.
	// +optional
	// +kubebuilder:default=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// state of the settlement.
	// +optional
	State SettlementState `json:"state,omitempty"`

	// charge is what the settlement charges, for reading: "12.50 USD" for an amount, "1523
	// tokens" for usage, both when it has both. Written once from the immutable spec.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Charge string `json:"charge,omitempty"`

	// attempts is how many calls were made to submit it (all with the same key).
	// +optional
	Attempts int32 `json:"attempts,omitempty"`

	// providerRef is the provider's ID of the settlement.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ProviderRef string `json:"providerRef,omitempty"`

	// usageDatedAt is when a usage charge was dated at its provider (the job's
	// completion), pinned at its first attempt; empty when the provider dates it at
	// receipt. Every attempt before datedUntil sends the same time.
	// +optional
	UsageDatedAt *metav1.Time `json:"usageDatedAt,omitempty"`

	// datedUntil is the last moment the charge is sent dated at usageDatedAt: the
	// provider could accept a later one and never bill it, so later attempts go
	// undated (under the same key, the provider refuses them if the first was
	// received, and a human looks).
	// +optional
	DatedUntil *metav1.Time `json:"datedUntil,omitempty"`

	// reversesRef is, for a Refund or Void, the provider's ID of the settlement it
	// reverses, pinned when it is first sent: every later attempt and lookup names
	// the same record, whatever happens to the original since.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ReversesRef string `json:"reversesRef,omitempty"`

	// claimedAt is, for a Refund or Void, when it claimed the charge it reverses: set
	// and persisted before its first submission bracket, then the charge's other
	// compensations are read again. Every other compensation's guard counts a claimed
	// one as possibly sent, so two managers (or two shards) can never both pass the
	// guard. Cleared when it is held, or ends having moved nothing
	// (docs/design.md §16).
	// +optional
	ClaimedAt *metav1.Time `json:"claimedAt,omitempty"`

	// providerStatus is the provider's last reported status (pending, settled, failed).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	ProviderStatus string `json:"providerStatus,omitempty"`

	// firstSubmittedAt is persisted before the first call to the provider: if it is set
	// and the outcome is unknown, the provider is asked by key before anything else.
	// +optional
	FirstSubmittedAt *metav1.Time `json:"firstSubmittedAt,omitempty"`

	// exposure says whether money could have moved under the key at the provider:
	// None, Possible or Confirmed (see docs/design.md §11). It is written before every
	// call that could move money and lowered only by the provider's authoritative
	// answer.
	// +optional
	Exposure Exposure `json:"exposure,omitempty"`

	// lastSubmission is what the provider's answer to the latest submission proves.
	// +optional
	LastSubmission SubmissionOutcome `json:"lastSubmission,omitempty"`

	// sentTo is where the settlement's provider calls went while exposure was raised.
	// +optional
	SentTo *ProviderTarget `json:"sentTo,omitempty"`

	// failures counts provider calls (submissions, lookups, polls) that failed since the
	// last answer; every retry backs off exponentially from it.
	// +optional
	Failures int32 `json:"failures,omitempty"`

	// disagreement is set when the provider holds a record under the key that is not
	// provably this settlement; it is never adopted while set.
	// +optional
	Disagreement *ProviderDisagreement `json:"disagreement,omitempty"`

	// outcomeUnknown is deprecated: exposure replaced it. It is read only to migrate a
	// settlement written by an older operator (true means exposure Possible).
	// +optional
	OutcomeUnknown bool `json:"outcomeUnknown,omitempty"`

	// lastAttemptAt is when the latest call was made.
	// +optional
	LastAttemptAt *metav1.Time `json:"lastAttemptAt,omitempty"`

	// nextAttemptAt is when the controller calls the provider again.
	// +optional
	NextAttemptAt *metav1.Time `json:"nextAttemptAt,omitempty"`

	// chargedAmount is the amount the provider reports for its record, when it
	// reports one: for a usage-priced charge it is what the provider computed, and the
	// bound for refunds of it.
	// +optional
	ChargedAmount *Amount `json:"chargedAmount,omitempty"`

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
// +kubebuilder:printcolumn:name="Charge",type=string,JSONPath=`.status.charge`,description="What it charges: an amount in the major unit with its currency, or usage with its unit"
// +kubebuilder:printcolumn:name="Amount",type=integer,JSONPath=`.spec.amount.minor`,priority=1,description="Amount in the currency's minor unit"
// +kubebuilder:printcolumn:name="Currency",type=string,JSONPath=`.spec.amount.currency`,priority=1
// +kubebuilder:printcolumn:name="Usage",type=string,JSONPath=`.spec.usage.quantity`,priority=1
// +kubebuilder:printcolumn:name="Unit",type=string,JSONPath=`.spec.usage.unit`,priority=1
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Attempts",type=integer,JSONPath=`.status.attempts`
// +kubebuilder:printcolumn:name="Exposure",type=string,JSONPath=`.status.exposure`,priority=1,description="Could money have moved under the key: None, Possible, Confirmed"
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

	// status is written by the operator. The CRD defaults status.observedGeneration
	// to 0, so kstatus-based tools (Flux's wait on a Refund kept in Git) see a
	// generation not observed yet, in progress, until the operator has looked at it.
	// +optional
	// +kubebuilder:default={observedGeneration:0}
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
