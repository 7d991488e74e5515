package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EventPhase summarises an event's operations; it mirrors the children, never drives them.
// +kubebuilder:validation:Enum=Received;Dispatching;Complete;PartiallyFailed;RequiresReconciliation;Quarantined;Ignored
type EventPhase string

const (
	// EventReceived: stored by the receiver, not yet dispatched.
	EventReceived EventPhase = "Received"
	// EventDispatching: children created or linked, some not final yet.
	EventDispatching EventPhase = "Dispatching"
	// EventComplete: every operation reached its final good state (or was superseded).
	EventComplete EventPhase = "Complete"
	// EventPartiallyFailed: at least one operation failed or is being retried while
	// others succeeded.
	EventPartiallyFailed EventPhase = "PartiallyFailed"
	// EventRequiresReconciliation: an operation's outcome is ambiguous or conflicting.
	EventRequiresReconciliation EventPhase = "RequiresReconciliation"
	// EventQuarantined: a delivery reused an event ID with a different payload; it is
	// kept for review and never dispatched.
	EventQuarantined EventPhase = "Quarantined"
	// EventIgnored: stored although no route matched (storeUnroutedEvents).
	EventIgnored EventPhase = "Ignored"
)

// OperationOutcome is what happened to one operation of an event.
// +kubebuilder:validation:Enum=Pending;Created;Linked;Superseded;Conflict;Failed;Unmapped
type OperationOutcome string

const (
	// OutcomePending: the child is not created yet.
	OutcomePending OperationOutcome = "Pending"
	// OutcomeCreated: this event created the child.
	OutcomeCreated OperationOutcome = "Created"
	// OutcomeLinked: the child already existed for the same fact (from another event).
	OutcomeLinked OperationOutcome = "Linked"
	// OutcomeSuperseded: a newer version of the fact was already applied; this one is
	// recorded and never moves the record backward.
	OutcomeSuperseded OperationOutcome = "Superseded"
	// OutcomeConflict: the child exists with the same key but different content.
	OutcomeConflict OperationOutcome = "Conflict"
	// OutcomeFailed: the child could not be created (e.g. invalid extracted fields).
	OutcomeFailed OperationOutcome = "Failed"
	// OutcomeUnmapped: the job's state is not in the provider's spec.states nor one
	// the operator knows; nothing was created for the job (docs/design.md §5).
	OutcomeUnmapped OperationOutcome = "Unmapped"
)

// Condition types of WebhookEvent.
const (
	// ConditionDispatched is True once every operation has a child (or a final outcome).
	ConditionDispatched = "Dispatched"
)

// Reasons on WebhookEvent conditions and Kubernetes Events.
const (
	ReasonAccepted              = "Accepted"
	ReasonConflictingEventReuse = "ConflictingEventReuse"
	// ReasonDeliveriesRejected is the Warning Event on a WebhookProvider whose
	// deliveries are being refused (400, 401, 413, 415): at most one a minute per
	// provider; status.lastRejection holds the details.
	ReasonDeliveriesRejected   = "DeliveriesRejected"
	ReasonAllOperationsDone    = "AllOperationsDone"
	ReasonOperationsInProgress = "OperationsInProgress"
	ReasonOperationFailed      = "OperationFailed"
	ReasonOperationAmbiguous   = "OperationAmbiguous"
	ReasonRetentionExpired     = "RetentionExpired"
	// ReasonUnmappedState: a job completion's state is not mapped (spec.states of the
	// WebhookProvider); the condition's message names the state.
	ReasonUnmappedState = "UnmappedState"
	// ReasonReplayNotApplied is the Warning Event of an event replay that changed
	// nothing: its states are still unmapped, map to different meanings, or the event
	// holds no facts for their meaning. status.replay.message says which.
	ReasonReplayNotApplied = "ReplayNotApplied"
)

// JobCompletionFacts is one job completion extracted from a payload at receipt.
type JobCompletionFacts struct {
	// jobID is the job's ID at the sender.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	JobID string `json:"jobID"`

	// version of this completion; a newer report about the same job has a greater one.
	// +required
	// +kubebuilder:validation:Minimum=0
	Version int64 `json:"version"`

	// state the job ended in.
	// +required
	State JobState `json:"state"`

	// completedAt is when the job completed, as reported by the sender.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// usage the job reported.
	// +optional
	Usage *Usage `json:"usage,omitempty"`

	// sink is where the completion is applied, copied from the route at receipt so a
	// later route edit does not change what an accepted event does.
	// +optional
	Sink *JobSink `json:"sink,omitempty"`
}

// UnmappedJobState is a job completion the receiver could not map: its state is not in
// the provider's spec.states nor one the operator knows. Nothing is created for it.
type UnmappedJobState struct {
	// jobID is the job's ID at the sender; empty when the state was read by a when
	// condition (jobState()) rather than by a JobCompletion operation.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	JobID string `json:"jobID,omitempty"`

	// state as the sender wrote it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	State string `json:"state"`
}

// HeldFacts is what an event's route yields if every unmapped job state of the event
// meant `as`, beyond what it yielded at receipt. Nothing held is dispatched until a
// replay finds the states mapped to `as`.
type HeldFacts struct {
	// as is the meaning assumed for the event's unmapped job states.
	// +required
	// +kubebuilder:validation:Enum=Succeeded;Failed;Cancelled
	As JobStateMeaning `json:"as"`

	// jobCompletions the route yields then, beyond spec.jobCompletions.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	JobCompletions []JobCompletionFacts `json:"jobCompletions,omitempty"`

	// settlements the route yields then, beyond spec.settlements.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Settlements []SettlementFacts `json:"settlements,omitempty"`
}

// SettlementFacts is one charge extracted from a payload at receipt.
// +kubebuilder:validation:XValidation:rule="has(self.usage) || has(self.amount)",message="a settlement needs usage, amount or both"
type SettlementFacts struct {
	// settlementKey identifies the logical charge; the same key is charged once.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	SettlementKey string `json:"settlementKey"`

	// billingProviderRef names the BillingProvider that settles it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	BillingProviderRef string `json:"billingProviderRef"`

	// customer is the billing customer's ID.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Customer string `json:"customer"`

	// jobID the charge is for, when it is one-per-job.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	JobID string `json:"jobID,omitempty"`

	// usage to charge for.
	// +optional
	Usage *Usage `json:"usage,omitempty"`

	// amount to charge.
	// +optional
	Amount *Amount `json:"amount,omitempty"`
}

// QuarantineInfo describes a delivery that reused an event ID with other content.
type QuarantineInfo struct {
	// originalEvent is the name of the WebhookEvent first stored under this event ID.
	// +required
	// +kubebuilder:validation:MaxLength=253
	OriginalEvent string `json:"originalEvent"`

	// originalPayloadHash is the canonical hash of the first payload.
	// +required
	// +kubebuilder:validation:MaxLength=71
	OriginalPayloadHash string `json:"originalPayloadHash"`
}

// WebhookEventSpec is the durable receipt of one delivered event. It is immutable:
// it records what was received, and everything done about it is in status and in
// the child records.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="WebhookEvent spec is immutable: it is the record of what was received"
type WebhookEventSpec struct {
	// provider is the WebhookProvider that received it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Provider string `json:"provider"`

	// eventID is the sender's ID of the event.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	EventID string `json:"eventID"`

	// eventType is the sender's type of the event.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	EventType string `json:"eventType"`

	// sequence is the sender's ordering number, when it has one.
	// +optional
	Sequence *int64 `json:"sequence,omitempty"`

	// payloadHash is "sha256:" and the hex SHA-256 of the RFC 8785 (JCS) canonical
	// payload (or of the provider's hashFields). Redeliveries must match it.
	// +required
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	PayloadHash string `json:"payloadHash"`

	// receivedAt is when the receiver stored the event (informational; nothing is keyed
	// on it).
	// +required
	ReceivedAt metav1.Time `json:"receivedAt"`

	// jobCompletions extracted from the payload by the route.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	JobCompletions []JobCompletionFacts `json:"jobCompletions,omitempty"`

	// unmappedJobStates are the job completions of the payload whose state the
	// provider does not map (spec.states): stored so the event shows them, never
	// dispatched.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	UnmappedJobStates []UnmappedJobState `json:"unmappedJobStates,omitempty"`

	// settlements extracted from the payload by the route.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Settlements []SettlementFacts `json:"settlements,omitempty"`

	// quarantine is set on the record of a conflicting reuse of an event ID; such an
	// event is never dispatched.
	// +optional
	Quarantine *QuarantineInfo `json:"quarantine,omitempty"`

	// heldFacts are, for an event with unmapped job states, what its route yields if
	// those states meant Succeeded, Failed or Cancelled (one entry per meaning), beyond
	// what it yields now: kept at receipt, so that a replay, once spec.states maps the
	// states, dispatches exactly what a delivery would have (docs/design.md §5.1,
	// "Replay"). The payload itself is not kept.
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +listType=atomic
	HeldFacts []HeldFacts `json:"heldFacts,omitempty"`

	// rawPayload is the payload as received, only when the provider opts in, capped at
	// its maxBytes.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	RawPayload string `json:"rawPayload,omitempty"`

	// rawPayloadTruncated is true when rawPayload was cut at the cap.
	// +optional
	RawPayloadTruncated bool `json:"rawPayloadTruncated,omitempty"`
}

// OperationStatus is the outcome of one operation of an event.
type OperationStatus struct {
	// type of the operation.
	// +required
	Type OperationType `json:"type"`

	// key of the operation: the job ID or the settlement key.
	// +required
	// +kubebuilder:validation:MaxLength=512
	Key string `json:"key"`

	// child is the name of the JobCompletion or BillingSettlement.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Child string `json:"child,omitempty"`

	// outcome of creating or linking the child.
	// +required
	Outcome OperationOutcome `json:"outcome"`

	// state is the child's state as last seen, mirrored so the event tells its story;
	// "Retrying" while the child is being retried after an error.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	State string `json:"state,omitempty"`

	// message explains a Conflict, Superseded or Failed outcome.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// EventReplayStatus records the replays of an event (docs/design.md §5.1, "Replay").
type EventReplayStatus struct {
	// lastToken is the replay annotation value last acted on.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	LastToken string `json:"lastToken,omitempty"`

	// count of replays acted on.
	// +optional
	Count int32 `json:"count,omitempty"`

	// lastAt is when the last replay was acted on.
	// +optional
	LastAt *metav1.Time `json:"lastAt,omitempty"`

	// mappedAs is the meaning a replay found the event's unmapped job states mapped to
	// (spec.states of the WebhookProvider, read then): the event has dispatched its
	// heldFacts for it (nothing for Ignored). Set once; later replays change nothing.
	// +optional
	MappedAs JobStateMeaning `json:"mappedAs,omitempty"`

	// message says what the last replay did, or why it did nothing.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// WebhookEventStatus is written by the WebhookEvent controller.
type WebhookEventStatus struct {
	// observedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase is derived from the operations' children.
	// +optional
	Phase EventPhase `json:"phase,omitempty"`

	// operations has one entry per operation of the event's route.
	// +optional
	// +kubebuilder:validation:MaxItems=128
	// +listType=atomic
	Operations []OperationStatus `json:"operations,omitempty"`

	// replay records replays requested through the hooks.settlement.dev/replay
	// annotation and what the last one did.
	// +optional
	Replay *EventReplayStatus `json:"replay,omitempty"`

	// deleteAfter is when retention will delete this event, once it is complete.
	// +optional
	DeleteAfter *metav1.Time `json:"deleteAfter,omitempty"`

	// conditions: Dispatched and Ready (every operation final and good).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// WebhookEvent is the durable receipt of one delivered event: who sent it, its ID,
// type and canonical payload hash, and the business facts extracted from it. Its name
// is derived from (namespace, provider, event ID), so a redelivery cannot create a
// second one.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=whe,categories=settlement
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.eventType`
// +kubebuilder:printcolumn:name="Event-ID",type=string,JSONPath=`.spec.eventID`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type WebhookEvent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the immutable receipt.
	// +required
	Spec WebhookEventSpec `json:"spec"`

	// status is written by the operator.
	// +optional
	Status WebhookEventStatus `json:"status,omitempty"`
}

// WebhookEventList is a list of WebhookEvents.
// +kubebuilder:object:root=true
type WebhookEventList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookEvent `json:"items"`
}

func init() {
	SchemeBuilder.Register(&WebhookEvent{}, &WebhookEventList{})
}
