package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReportPhase is where a reconciliation pass stands.
// +kubebuilder:validation:Enum=Running;Completed;Failed
type ReportPhase string

const (
	ReportRunning   ReportPhase = "Running"
	ReportCompleted ReportPhase = "Completed"
	ReportFailed    ReportPhase = "Failed"
)

// DiscrepancyType names one question of docs/design.md §7.
// +kubebuilder:validation:Enum=JobWithoutSettlement;SettlementWithoutJob;SettlementStuck;ProviderSettledLocalPending;LocalSettledProviderUnknown;ProviderRecordWithoutSettlement;EventNotComplete;EventQuarantined;AmountMismatch;SettlementWithoutBillingProvider;UsageTotalMismatch
type DiscrepancyType string

const (
	DiscrepancyJobWithoutSettlement            DiscrepancyType = "JobWithoutSettlement"
	DiscrepancySettlementWithoutJob            DiscrepancyType = "SettlementWithoutJob"
	DiscrepancySettlementStuck                 DiscrepancyType = "SettlementStuck"
	DiscrepancyProviderSettledLocalPending     DiscrepancyType = "ProviderSettledLocalPending"
	DiscrepancyLocalSettledProviderUnknown     DiscrepancyType = "LocalSettledProviderUnknown"
	DiscrepancyProviderRecordWithoutSettlement DiscrepancyType = "ProviderRecordWithoutSettlement"
	DiscrepancyEventNotComplete                DiscrepancyType = "EventNotComplete"
	DiscrepancyEventQuarantined                DiscrepancyType = "EventQuarantined"
	DiscrepancyAmountMismatch                  DiscrepancyType = "AmountMismatch"
	// DiscrepancySettlementWithoutBillingProvider: a settlement names a BillingProvider
	// that does not exist in its namespace (a typo in a route, a provider deleted), so
	// no provider's pass compares it; every pass of the namespace reports it.
	DiscrepancySettlementWithoutBillingProvider DiscrepancyType = "SettlementWithoutBillingProvider"
	// DiscrepancyUsageTotalMismatch: a provider that totals usage instead of listing
	// it (Stripe's meter event summaries) holds, for one customer and meter over a
	// window, a total outside what the settlements sent for them can add up to; or
	// the provider's meter does not total what is sent (docs/design.md §13).
	DiscrepancyUsageTotalMismatch DiscrepancyType = "UsageTotalMismatch"
)

// RepairAction is what is done about a discrepancy.
// +kubebuilder:validation:Enum=AutoRetry;AuthoritativeQuery;Compensation;ManualReview
type RepairAction string

const (
	// RepairAutoRetry re-drives the normal path (e.g. re-dispatches an event).
	RepairAutoRetry RepairAction = "AutoRetry"
	// RepairAuthoritativeQuery asks the provider by key and imports its final status.
	RepairAuthoritativeQuery RepairAction = "AuthoritativeQuery"
	// RepairCompensation creates a Refund or Void settlement.
	RepairCompensation RepairAction = "Compensation"
	// RepairManualReview needs a human; see docs/runbook.md.
	RepairManualReview RepairAction = "ManualReview"
)

// Discrepancy is one finding of a pass.
type Discrepancy struct {
	// type of finding.
	// +required
	Type DiscrepancyType `json:"type"`

	// object is the kind/name of the local object concerned, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=300
	Object string `json:"object,omitempty"`

	// providerRef is the provider's ID of the record concerned, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ProviderRef string `json:"providerRef,omitempty"`

	// action is the repair this finding calls for.
	// +required
	Action RepairAction `json:"action"`

	// carriedOut is true when an automatic repair was started through the normal path.
	// +optional
	CarriedOut bool `json:"carriedOut,omitempty"`

	// message explains the finding.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
}

// DiscrepancyCount counts findings of one type.
type DiscrepancyCount struct {
	// type of finding.
	// +required
	Type DiscrepancyType `json:"type"`

	// count of findings of this type.
	// +required
	Count int32 `json:"count"`
}

// MaxConfirmedSettlements caps how many settlements one report lists as confirmed
// (about 48 bytes each: the report stays well under the API server's object limit).
const MaxConfirmedSettlements = 5000

// SettlementConfirmations are a pass's confirmations, compactly: per reason, each
// settlement as "<uid>/<resourceVersion>", the exact version the pass compared.
type SettlementConfirmations struct {
	// billingProviderUID is the UID of the BillingProvider whose pass confirmed these:
	// a provider deleted and created again under the same name relies on none of them.
	// +required
	// +kubebuilder:validation:MaxLength=64
	BillingProviderUID string `json:"billingProviderUID"`

	// byReason lists the confirmed settlements under the reason of their Reconciled
	// condition (ConfirmedByProvider, ProviderCannotAnswer, Voided).
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +listType=map
	// +listMapKey=reason
	ByReason []ConfirmationGroup `json:"byReason,omitempty"`

	// markedOnSettlements counts confirmations past the cap, written on the
	// settlements themselves as before.
	// +optional
	MarkedOnSettlements int32 `json:"markedOnSettlements,omitempty"`
}

// ConfirmationGroup is the settlements a pass confirmed for one reason.
type ConfirmationGroup struct {
	// reason of the Reconciled condition the archiver writes into the archived object.
	// +required
	// +kubebuilder:validation:Enum=ConfirmedByProvider;ProviderCannotAnswer;Voided
	Reason string `json:"reason"`

	// settlements, each "<uid>/<resourceVersion>".
	// +optional
	// +kubebuilder:validation:MaxItems=5000
	// +listType=atomic
	Settlements []string `json:"settlements,omitempty"`
}

// ConfirmedVersion is how a report names a confirmed settlement's version.
func ConfirmedVersion(uid, resourceVersion string) string { return uid + "/" + resourceVersion }

// ReconciliationReportSpec says what a pass covers. It is immutable.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="ReconciliationReport spec is immutable"
type ReconciliationReportSpec struct {
	// billingProviderRef names the BillingProvider compared against.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	BillingProviderRef string `json:"billingProviderRef"`

	// windowStart is the start of the period compared with the provider's records.
	// +required
	WindowStart metav1.Time `json:"windowStart"`

	// windowEnd is the end of the period.
	// +required
	WindowEnd metav1.Time `json:"windowEnd"`
}

// ReconciliationReportStatus is the result of a pass.
type ReconciliationReportStatus struct {
	// observedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase of the pass.
	// +optional
	Phase ReportPhase `json:"phase,omitempty"`

	// completedAt is when the pass finished.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// examined counts what the pass looked at, by kind (e.g. "BillingSettlement": 120).
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	Examined map[string]int32 `json:"examined,omitempty"`

	// discrepancies is the total number of findings.
	// +optional
	// +kubebuilder:default=0
	Discrepancies int32 `json:"discrepancies"`

	// repaired is how many findings an automatic repair was carried out for.
	// +optional
	// +kubebuilder:default=0
	Repaired int32 `json:"repaired"`

	// needsReview is how many findings need a human (ManualReview).
	// +optional
	// +kubebuilder:default=0
	NeedsReview int32 `json:"needsReview"`

	// byType counts findings per type.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=type
	ByType []DiscrepancyCount `json:"byType,omitempty"`

	// items lists findings, capped so the report stays small; counts are always complete.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	// +listType=atomic
	Items []Discrepancy `json:"items,omitempty"`

	// truncated is true when more findings exist than items lists.
	// +optional
	Truncated bool `json:"truncated,omitempty"`

	// confirmed lists the settled settlements this pass confirmed, with the archive on:
	// the archiver takes a settlement confirmed here at exactly its current version for
	// confirmed, and no settlement is written for it (docs/design.md §7, §12). Without
	// the archive, and past the cap, the pass marks the settlement itself instead.
	// +optional
	Confirmed *SettlementConfirmations `json:"confirmed,omitempty"`

	// conditions: Ready is True once the pass completed.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ReconciliationReport is one pass comparing events, job completions, settlements and
// the billing provider's records, with each discrepancy's repair and whether it was
// carried out.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rr,categories=settlement
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.billingProviderRef`
// +kubebuilder:printcolumn:name="Window-Start",type=date,JSONPath=`.spec.windowStart`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Discrepancies",type=integer,JSONPath=`.status.discrepancies`
// +kubebuilder:printcolumn:name="Repaired",type=integer,JSONPath=`.status.repaired`
// +kubebuilder:printcolumn:name="Needs-Review",type=integer,JSONPath=`.status.needsReview`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ReconciliationReport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says what the pass covers.
	// +required
	Spec ReconciliationReportSpec `json:"spec"`

	// status is the pass's result.
	// +optional
	Status ReconciliationReportStatus `json:"status,omitempty"`
}

// ReconciliationReportList is a list of ReconciliationReports.
// +kubebuilder:object:root=true
type ReconciliationReportList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReconciliationReport `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ReconciliationReport{}, &ReconciliationReportList{})
}
