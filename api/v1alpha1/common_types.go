package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Labels and annotations link objects without ownerReferences: financial records must
// never be garbage-collected together with the events that caused them (docs/design.md §1.4).
const (
	// LabelProvider names the WebhookProvider an object came from.
	LabelProvider = "hooks.settlement.dev/provider"
	// LabelEvent carried the hash part of the WebhookEvent name that created an object.
	// Records made by older operators have it; nothing writes or selects on it now (the
	// event is spec.sourceEvent / spec.completion.sourceEvent).
	LabelEvent = "hooks.settlement.dev/event"
	// LabelJob carries the hash of the job ID a settlement belongs to (a job's other
	// settlements are listed by it). JobCompletions made by older operators have it too.
	LabelJob = "hooks.settlement.dev/job"
	// LabelSettlement carried the hash of a settlement key. Settlements made by older
	// operators have it; nothing writes or selects on it now (the name holds the hash).
	LabelSettlement = "hooks.settlement.dev/settlement"
	// LabelBillingProvider names the BillingProvider a settlement or report belongs to.
	LabelBillingProvider = "hooks.settlement.dev/billing-provider"

	// AnnotationReplay, set to a new value on a dead-lettered or failed settlement,
	// asks the controller to resume it through the normal path with the same
	// idempotency key; on a WebhookEvent with unmapped job states, to read them again
	// through the provider's current spec.states (docs/design.md §5.1, "Replay").
	// Only the value's change matters; it is recorded in status.
	AnnotationReplay = "hooks.settlement.dev/replay"

	// AnnotationReconcileRequest is set by a reconciliation pass (to the report's
	// name) to ask a record's own controller to repair it through its normal path: a
	// settlement asks its provider by key and imports the answer; an event is
	// dispatched again. Users may set it too.
	AnnotationReconcileRequest = "hooks.settlement.dev/reconcile-request"

	// AnnotationFreshForJob is set by the operator on a settlement it creates in the
	// same dispatch that first created the job's JobCompletion, to the JobCompletion's
	// UID: the job was never seen before, so nothing can have been sent under the
	// settlement's key, and the first submission needs no lookup. The controller
	// checks it against the JobCompletion (same UID, created together); a copy on a
	// settlement created again later proves nothing and is ignored.
	AnnotationFreshForJob = "hooks.settlement.dev/fresh-for-job"

	// LabelCredentialFor opts a Secret in to one use by the operator: "billing" (a
	// BillingProvider's bearer token) or "job-sink" (an HTTP job sink's bearer
	// token). The operator sends no Secret that does not carry it with the use's value,
	// so a user who may create BillingProviders or WebhookProviders but not read
	// Secrets cannot make the operator send one of the namespace's Secrets anywhere
	// (docs/design.md §6, decisions.md "Credentials"). Adding a label needs
	// `patch` on the Secret, which a user who cannot read it does not have. A label,
	// not an annotation, so `kubectl get secrets -A -l hooks.settlement.dev/credential-for`
	// lists everything the operator may send.
	LabelCredentialFor = "hooks.settlement.dev/credential-for"

	// AnnotationCredentialDestinations lists, on a Secret that opts in with
	// LabelCredentialFor, where its value may be sent: URL prefixes separated by
	// commas or white space, e.g. "https://billing.example.com/v1". A BillingProvider's
	// endpoint or a job sink's url must match one (same scheme, host and port; the
	// path equal to the prefix's or below it), or the Secret is not sent: an opted-in
	// billing token cannot be pointed at another server by whoever may edit a
	// BillingProvider.
	AnnotationCredentialDestinations = "hooks.settlement.dev/credential-destinations"

	// FinalizerSettlementProtection blocks deletion of a BillingSettlement whose outcome
	// at the provider is unknown, so a charge can never lose its local record.
	FinalizerSettlementProtection = "hooks.settlement.dev/settlement-protection"
)

// Condition types shared by several kinds. Kind-specific ones live beside their kind.
const (
	// ConditionReady is True when the object is usable (configuration valid, secret
	// found) or, for records, when it reached a final, good state.
	ConditionReady = "Ready"
	// ConditionReconciling is kstatus's "still working on it": on a provider kind it is
	// True, with Ready False, while the operator waits for something that may still
	// come (a Secret or BillingProvider not created yet, a provider that does not
	// answer), for at most the waiting grace; it is absent otherwise. GitOps tools
	// (Flux's wait, Argo CD, kstatus) show the object as in progress meanwhile.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is kstatus's "cannot go on without help": on a provider kind it
	// is True, with Ready False, when the configuration cannot work as it is (an
	// invalid spec, a refused Secret or key, credentials the provider rejects) or what
	// it waits for has not come within the waiting grace; it is absent otherwise.
	// GitOps tools report the object as failed and stop waiting. Its reason is Ready's.
	ConditionStalled = "Stalled"
)

// Reasons shared by several kinds.
const (
	ReasonValid          = "Valid"
	ReasonInvalidSpec    = "InvalidSpec"
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonBillingProviderNotFound: a route charges through a BillingProvider that
	// does not exist in the namespace; its settlements wait until it is created.
	ReasonBillingProviderNotFound = "BillingProviderNotFound"
	ReasonSecretInvalid           = "SecretInvalid"
	ReasonReconciling             = "Reconciling"
	ReasonAPIServerFailure        = "APIServerFailure"
	// ReasonReconciliationFailed: a reconciliation pass could not compare with the
	// provider (its report says why); the next pass comes at the usual interval.
	ReasonReconciliationFailed = "ReconciliationFailed"
	// ReasonDiscrepanciesNeedReview: a pass found discrepancies a human must review.
	ReasonDiscrepanciesNeedReview = "DiscrepanciesNeedReview"
	// ReasonBillingProviderNotReady: a record waits for its BillingProvider or the
	// provider's credentials.
	ReasonBillingProviderNotReady = "BillingProviderNotReady"
	// ReasonCredentialsNotAllowed: the referenced Secret does not opt in to this use
	// or this destination (LabelCredentialFor, AnnotationCredentialDestinations); it is
	// not sent, and everything that needs it waits. The message names what to add.
	ReasonCredentialsNotAllowed = "CredentialsNotAllowed"
	// ReasonSigningKeyRefused: a WebhookProvider's signing Secret is of type
	// kubernetes.io/tls, or a key it would sign with is named like a certificate or a
	// private key, or holds PEM. Such a value may be public (a certificate), so a
	// signature made with it proves nothing; deliveries are answered 503 until a real
	// signing secret is named. The message names the key and what to do.
	ReasonSigningKeyRefused = "SigningKeyRefused"
	// ReasonSigningKeysUnnamed: a WebhookProvider names no signing key and its Secret
	// holds several; none is used (deliveries are answered 503) until
	// spec.signature.secretRef.keys names the one(s) that sign.
	ReasonSigningKeysUnnamed = "SigningKeysUnnamed"
)

// Values of LabelCredentialFor: the uses a Secret can opt in to.
const (
	// CredentialForBilling: a BillingProvider's bearer token.
	CredentialForBilling = "billing"
	// CredentialForJobSink: an HTTP job sink's bearer token.
	CredentialForJobSink = "job-sink"
)

// SecretReference names a Secret in the same namespace as the referring object.
// Cross-namespace references are deliberately impossible: a tenant can only point
// at credentials in its own namespace.
type SecretReference struct {
	// name of the Secret, in the same namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// SecretKeyReference names one key of a Secret in the same namespace.
type SecretKeyReference struct {
	// name of the Secret, in the same namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`

	// key within the Secret's data.
	// +optional
	// +kubebuilder:default=token
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key,omitempty"`
}

// Usage is a metered quantity, e.g. 1523 tokens of meter "gpt-tokens".
type Usage struct {
	// meter is the billing provider's name for what was used.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Meter string `json:"meter"`

	// quantity used, a non-negative decimal written as a string so that no precision is
	// lost to floating point (e.g. "1523" or "12.5").
	// +required
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	Quantity string `json:"quantity"`

	// unit of the quantity, e.g. "tokens" or "gpu-seconds".
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Unit string `json:"unit,omitempty"`
}

// Amount is money in the currency's minor unit (cents for USD), never a float.
type Amount struct {
	// minor is the amount in the currency's ISO 4217 minor unit, e.g. 1250 for 12.50 USD,
	// 500 for 500 JPY; an adapter converts it to its provider's unit (Stripe's ISK is ×100).
	// +required
	// +kubebuilder:validation:Minimum=0
	Minor int64 `json:"minor"`

	// currency is the ISO 4217 code in upper case, e.g. "USD".
	// +required
	// +kubebuilder:validation:Pattern=`^[A-Z]{3}$`
	Currency string `json:"currency"`
}

// JobState is the result a job reports in its completion.
// +kubebuilder:validation:Enum=Succeeded;Failed;Cancelled
type JobState string

const (
	JobSucceeded JobState = "Succeeded"
	JobFailed    JobState = "Failed"
	JobCancelled JobState = "Cancelled"
)

// JobSinkType selects where a job completion is applied.
// +kubebuilder:validation:Enum=None;HTTP
type JobSinkType string

const (
	// JobSinkNone keeps the JobCompletion object itself as the record of completion.
	JobSinkNone JobSinkType = "None"
	// JobSinkHTTP posts the completion to a job service (docs/design.md §6.2).
	JobSinkHTTP JobSinkType = "HTTP"
)

// JobSink says where a job's completion is applied.
// +kubebuilder:validation:XValidation:rule="self.type == 'HTTP' ? has(self.url) : !has(self.url)",message="url is required when type is HTTP and not allowed otherwise"
// +kubebuilder:validation:XValidation:rule="!has(self.credentialsSecretRef) || self.type == 'HTTP'",message="credentialsSecretRef only makes sense when type is HTTP"
type JobSink struct {
	// type of sink: None (the JobCompletion is the record) or HTTP (docs/design.md §6.2).
	// +optional
	// +kubebuilder:default=None
	Type JobSinkType `json:"type,omitempty"`

	// url of the job service; completions are posted to {url}/jobs/{jobID}/completion.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	URL string `json:"url,omitempty"`

	// allowInsecureHTTP permits an http:// url (a job service inside the cluster
	// network, or a local test); a WebhookProvider route refuses http:// without it.
	// A bearer token is still sent only to a destination its Secret lists
	// (hooks.settlement.dev/credential-destinations), scheme included.
	// +optional
	AllowInsecureHTTP bool `json:"allowInsecureHTTP,omitempty"`

	// credentialsSecretRef names the Secret key holding a bearer token for the job
	// service. The Secret must opt in: label hooks.settlement.dev/credential-for=job-sink
	// and the url listed in annotation hooks.settlement.dev/credential-destinations;
	// until then nothing is sent and the completion waits.
	// +optional
	CredentialsSecretRef *SecretKeyReference `json:"credentialsSecretRef,omitempty"`

	// deferDeadline bounds how long a completion for a job the sink does not know yet
	// (404) is retried before the record asks for reconciliation.
	// +optional
	// +kubebuilder:default="1h"
	DeferDeadline *metav1.Duration `json:"deferDeadline,omitempty"`
}

// Reasons of the archive (docs/design.md §12), on every archived kind.
const (
	// ReasonArchiveConflict: the archive already holds other content under the
	// record's name or key; the record is not archived and stays in the cluster.
	ReasonArchiveConflict = "ArchiveConflict"
	// ReasonArchiveUnavailable: the archive did not answer, and what comes next
	// depends on it (is this event or key already archived?): the record waits.
	ReasonArchiveUnavailable = "ArchiveUnavailable"
	// ReasonArchivedDuplicate: the archive already holds this event, job version or
	// settlement key; nothing is dispatched or sent again.
	ReasonArchivedDuplicate = "ArchivedDuplicate"
	// ReasonArchiveBehind: the archive lacks a record the cluster archived and read
	// back (restored from an older copy, a lagging standby); "the archive holds none"
	// proves nothing, so a settlement not yet sent is looked up by key first. On the
	// archive's identity ConfigMap as a Warning Event, and on such a settlement.
	ReasonArchiveBehind = "ArchiveBehind"
	// ReasonArchiveBehindConfirmed: a person removed the watermark of an archive found
	// behind; the state is cleared and the watermark starts again (a Normal Event on
	// the archive's identity ConfigMap).
	ReasonArchiveBehindConfirmed = "ArchiveBehindConfirmed"
)

// A namespace deleted without an archive (docs/design.md §8): the settlements that
// presented their key leave a tombstone — their name and idempotency key — in the
// operator's namespace, and a namespace created again under the same name never takes
// one of those keys for one never presented.
const (
	// LabelTombstonesOf is on every tombstone ConfigMap, in the operator's namespace;
	// its value is the namespace whose settlements it records (kubectl get configmaps
	// -l hooks.settlement.dev/tombstones-of=<namespace>).
	LabelTombstonesOf = "hooks.settlement.dev/tombstones-of"
	// ReasonTombstoneNotWritten: a settlement being deleted without an archive that
	// presented its key keeps its finalizer until its tombstone is written; the
	// message says why it is not (no operator namespace, the namespace's tombstones
	// full, the API server refused).
	ReasonTombstoneNotWritten = "TombstoneNotWritten"
	// ReasonPresentedBeforeNamespaceDeletion: a settlement of this name and key
	// presented its key before its namespace was deleted without an archive (a
	// tombstone holds it): this one is not taken as never presented, and the provider
	// is asked by key before anything is sent.
	ReasonPresentedBeforeNamespaceDeletion = "PresentedBeforeNamespaceDeletion"
)
