package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JobCompletionState is where a job's completion stands.
// +kubebuilder:validation:Enum=Pending;Applied;Superseded;Deferred;Failed;RequiresReconciliation
type JobCompletionState string

const (
	// JobCompletionPending: a version is proposed and not yet applied to the sink.
	JobCompletionPending JobCompletionState = "Pending"
	// JobCompletionApplied: spec.completion.version is applied (status.appliedVersion).
	JobCompletionApplied JobCompletionState = "Applied"
	// JobCompletionSuperseded: the sink already holds a newer version than the latest
	// one reported to us (409 stale_version); nothing is applied and the job's record
	// at the sink does not move backward. Final for this version.
	JobCompletionSuperseded JobCompletionState = "Superseded"
	// JobCompletionDeferred: the sink does not know the job yet (404); retried with
	// backoff until the sink's deferDeadline.
	JobCompletionDeferred JobCompletionState = "Deferred"
	// JobCompletionFailed: the sink refused the completion for good.
	JobCompletionFailed JobCompletionState = "Failed"
	// JobCompletionRequiresReconciliation: the deadline passed or the sink's answer
	// conflicts with ours; a human or the reconciliation pass must look.
	JobCompletionRequiresReconciliation JobCompletionState = "RequiresReconciliation"
)

// Condition types of JobCompletion.
const (
	// ConditionApplied is True when the latest proposed version is applied.
	ConditionApplied = "Applied"
)

// Reasons on JobCompletion conditions and Kubernetes Events.
const (
	ReasonVersionApplied    = "VersionApplied"
	ReasonVersionSuperseded = "VersionSuperseded"
	ReasonVersionConflict   = "VersionConflict"
	ReasonSinkDeferred      = "SinkDeferred"
	ReasonSinkRejected      = "SinkRejected"
	ReasonSinkUnavailable   = "SinkUnavailable"
	ReasonDeadlineExceeded  = "DeadlineExceeded"
)

// Completion is one version of a job's completion.
type Completion struct {
	// version of this completion; only a greater version replaces it.
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

	// sourceEvent is the name of the WebhookEvent that proposed this version.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SourceEvent string `json:"sourceEvent,omitempty"`
}

// JobCompletionSpec is the completion record of one job. Its identity (provider and
// job ID) never changes; its completion only moves to greater versions.
// +kubebuilder:validation:XValidation:rule="self.provider == oldSelf.provider && self.jobID == oldSelf.jobID",message="provider and jobID are immutable: they are the record's identity"
// +kubebuilder:validation:XValidation:rule="self.completion.version >= oldSelf.completion.version",message="completion.version may only grow: an older completion must never move a job backward"
// +kubebuilder:validation:XValidation:rule="self.completion.version != oldSelf.completion.version || self.completion == oldSelf.completion",message="the content of a completion version is immutable: the same version with different content is a conflict"
type JobCompletionSpec struct {
	// provider is the WebhookProvider the job's events come from.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Provider string `json:"provider"`

	// jobID is the job's ID at the sender.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	JobID string `json:"jobID"`

	// completion is the highest version proposed so far.
	// +required
	Completion Completion `json:"completion"`

	// sink is where the completion is applied.
	// +optional
	Sink *JobSink `json:"sink,omitempty"`
}

// JobCompletionStatus is written by the JobCompletion controller, except for a job
// without a sink at its first version: creating it applied it, and its status stays
// empty (read it through JobCompletion.Progress; kubectl get shows no STATE for it, and
// a SINK that is empty or None).
type JobCompletionStatus struct {
	// observedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// state of the latest proposed version.
	// +optional
	State JobCompletionState `json:"state,omitempty"`

	// appliedVersion is the highest version applied to the sink; it never decreases.
	// +optional
	AppliedVersion *int64 `json:"appliedVersion,omitempty"`

	// appliedAt is when appliedVersion was applied.
	// +optional
	AppliedAt *metav1.Time `json:"appliedAt,omitempty"`

	// attempts made for the current version.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`

	// deferredSince is when the sink first answered "unknown job" for this version.
	// +optional
	DeferredSince *metav1.Time `json:"deferredSince,omitempty"`

	// nextAttemptAt is when the controller tries again.
	// +optional
	NextAttemptAt *metav1.Time `json:"nextAttemptAt,omitempty"`

	// lastError is the latest failure, without secrets or payloads.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	LastError string `json:"lastError,omitempty"`

	// sourceEvents lists the latest events that reported this job (capped).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	SourceEvents []string `json:"sourceEvents,omitempty"`

	// conditions: Applied and Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// JobCompletion is the completion record of one job: the guarded transition that
// applies a completion version only if it is newer than the one applied, so duplicate
// and out-of-order reports never move a job backward.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=jc,categories=settlement
// +kubebuilder:printcolumn:name="Job",type=string,JSONPath=`.spec.jobID`
// +kubebuilder:printcolumn:name="Result",type=string,JSONPath=`.spec.completion.state`
// +kubebuilder:printcolumn:name="Version",type=integer,JSONPath=`.spec.completion.version`
// +kubebuilder:printcolumn:name="Sink",type=string,JSONPath=`.spec.sink.type`
// +kubebuilder:printcolumn:name="Applied",type=integer,JSONPath=`.status.appliedVersion`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type JobCompletion struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the job's identity and its latest proposed completion.
	// +required
	Spec JobCompletionSpec `json:"spec"`

	// status is written by the operator.
	// +optional
	Status JobCompletionStatus `json:"status,omitempty"`
}

// JobCompletionList is a list of JobCompletions.
// +kubebuilder:object:root=true
type JobCompletionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []JobCompletion `json:"items"`
}

func init() {
	SchemeBuilder.Register(&JobCompletion{}, &JobCompletionList{})
}
