package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Sender names a kind of sender whose documented format a preset configures
// (docs/design.md §4, "Sender presets").
// +kubebuilder:validation:Enum=Generic;StandardWebhooks;Svix;GitHub;Stripe;EventBridge;CloudEvents
type Sender string

const (
	// SenderGeneric: nothing preset; signature.scheme, eventID and eventType say it all.
	// A provider without spec.sender is Generic.
	SenderGeneric Sender = "Generic"
	// SenderStandardWebhooks: scheme StandardWebhooks, event ID webhook-id, type ".type".
	SenderStandardWebhooks Sender = "StandardWebhooks"
	// SenderSvix: as StandardWebhooks; Svix's svix-id, svix-timestamp and
	// svix-signature headers are read as their webhook-* aliases.
	SenderSvix Sender = "Svix"
	// SenderGitHub: HMAC-SHA256 of the body in X-Hub-Signature-256 ("sha256=", hex),
	// no timestamp (signature.insecureAllowReplay must be set); event ID and type from
	// the payload, given in eventID and eventType (GitHub's X-GitHub-Delivery and
	// X-GitHub-Event headers are not signed).
	SenderGitHub Sender = "GitHub"
	// SenderStripe: scheme Stripe, event ID ".id", type ".type".
	SenderStripe Sender = "Stripe"
	// SenderEventBridge: EventBridge API destinations, which sign nothing: the
	// connection's API key (or "Basic …" value) in signature.header is compared with
	// the Secret's key; event ID ".id", type ".detail-type".
	SenderEventBridge Sender = "EventBridge"
	// SenderCloudEvents: CloudEvents 1.0 over HTTP, binary or structured mode; the
	// event ID is ce-id within ce-source, the type ce-type, and routes' JSON paths read
	// the event's data. Authenticated like EventBridge, by a credential in
	// signature.header.
	SenderCloudEvents Sender = "CloudEvents"
)

// SignatureScheme is how a sender signs its deliveries.
// +kubebuilder:validation:Enum=StandardWebhooks;Stripe;HMACSHA256;APIKey
type SignatureScheme string

const (
	// SchemeStandardWebhooks: webhook-id / webhook-timestamp / webhook-signature headers,
	// v1 HMAC-SHA256 (base64) over "id.timestamp.body", "whsec_" secrets.
	SchemeStandardWebhooks SignatureScheme = "StandardWebhooks"
	// SchemeStripe: Stripe-Signature "t=…,v1=…", hex HMAC-SHA256 over "t.body".
	SchemeStripe SignatureScheme = "Stripe"
	// SchemeHMACSHA256: a generic HMAC-SHA256 of the body (or "timestamp.body") in a
	// configurable header, hex or base64, with an optional prefix.
	SchemeHMACSHA256 SignatureScheme = "HMACSHA256"
	// SchemeAPIKey: no signature; the whole value of a configured header must equal
	// the Secret's key (an API key, or a "Basic …"/"Bearer …" value), compared in
	// constant time. Nothing binds the body or a time to it.
	SchemeAPIKey SignatureScheme = "APIKey"
)

// SignatureEncoding is how a generic HMAC is written in its header.
// +kubebuilder:validation:Enum=Hex;Base64
type SignatureEncoding string

const (
	EncodingHex    SignatureEncoding = "Hex"
	EncodingBase64 SignatureEncoding = "Base64"
)

// SignatureSpec configures how deliveries are authenticated.
// +kubebuilder:validation:XValidation:rule="!has(self.scheme) || ((self.scheme == 'HMACSHA256' || self.scheme == 'APIKey') ? has(self.header) : !has(self.header))",message="header is required for scheme HMACSHA256 or APIKey and not allowed for other schemes (their header names are fixed)"
// +kubebuilder:validation:XValidation:rule="!has(self.scheme) || self.scheme == 'HMACSHA256' || (!has(self.prefix) && !has(self.encoding) && !has(self.timestampHeader) && !has(self.signedHeaders))",message="prefix, encoding, timestampHeader and signedHeaders only apply to scheme HMACSHA256"
// +kubebuilder:validation:XValidation:rule="!has(self.signedHeaders) || self.signedHeaders.all(h, self.signedHeaders.filter(x, x.lowerAscii() == h.lowerAscii()).size() == 1)",message="signedHeaders lists a header twice (names are case-insensitive)"
// +kubebuilder:validation:XValidation:rule="!has(self.signedHeaders) || self.signedHeaders.all(h, (!has(self.header) || h.lowerAscii() != self.header.lowerAscii()) && (!has(self.timestampHeader) || h.lowerAscii() != self.timestampHeader.lowerAscii()))",message="signedHeaders must not list the signature header or the timestamp header (the timestamp is signed already)"
// +kubebuilder:validation:XValidation:rule="!has(self.scheme) || self.scheme != 'HMACSHA256' || has(self.timestampHeader) || (has(self.insecureAllowReplay) && self.insecureAllowReplay)",message="scheme HMACSHA256 needs timestampHeader: the timestamp is signed with the body and checked against tolerance, so a captured delivery cannot be replayed later; only if the sender cannot send one, set insecureAllowReplay: true and accept that a captured delivery can be replayed forever"
// +kubebuilder:validation:XValidation:rule="!(has(self.insecureAllowReplay) && self.insecureAllowReplay) || !has(self.scheme) || (self.scheme == 'HMACSHA256' && !has(self.timestampHeader))",message="insecureAllowReplay only applies to scheme HMACSHA256 without timestampHeader (every other configuration signs a timestamp, or signs nothing: APIKey)"
type SignatureSpec struct {
	// scheme is the signature format the sender uses. Required without spec.sender
	// (or with sender Generic); with a sender preset it must be unset: the preset
	// decides it.
	// +optional
	Scheme SignatureScheme `json:"scheme,omitempty"`

	// secretRef names the Secret holding the signing secret and the key(s) of it that
	// sign deliveries.
	// +required
	SecretRef SigningSecretReference `json:"secretRef"`

	// header carrying the signature, for scheme HMACSHA256 (e.g. "X-Signature"), or
	// the credential, for scheme APIKey and senders EventBridge and CloudEvents (e.g.
	// "x-api-key", or "Authorization" for Basic).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9-]+$`
	Header string `json:"header,omitempty"`

	// prefix stripped from the header value before decoding, for scheme HMACSHA256
	// (e.g. "sha256=").
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Prefix string `json:"prefix,omitempty"`

	// encoding of the signature, for scheme HMACSHA256.
	// +optional
	Encoding SignatureEncoding `json:"encoding,omitempty"`

	// timestampHeader, for scheme HMACSHA256, names a header with a unix timestamp that
	// is signed together with the body ("timestamp.body") and checked against the
	// tolerance. Without it a generic HMAC cannot reject replays of old deliveries.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9-]+$`
	TimestampHeader string `json:"timestampHeader,omitempty"`

	// signedHeaders, for scheme HMACSHA256 only, lists request headers the sender signs
	// with the body, in this order: the signed content is
	// "<timestamp>.<value 1>\n<value 2>\n…<body>" (each value followed by a line
	// break; no timestamp part without timestampHeader). An event ID or type may come
	// from a header only if it is listed here: CloudEvents binary mode sends them as
	// ce-id and ce-type. A delivery without one of them is refused (401).
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9-]+$`
	// +listType=atomic
	SignedHeaders []string `json:"signedHeaders,omitempty"`

	// insecureAllowReplay, for scheme HMACSHA256 only, accepts a sender that signs the
	// body alone, with no timestamp: a captured delivery then verifies forever, and only
	// event-ID deduplication (for as long as the event is kept) stands between a replay
	// and its effects. Without timestampHeader this must be set explicitly;
	// `kubectl get whp` shows it in the REPLAYABLE column.
	// +optional
	// +kubebuilder:default=false
	InsecureAllowReplay bool `json:"insecureAllowReplay,omitempty"`

	// tolerance is how far a signed timestamp may be from the receiver's clock, in
	// either direction, before the delivery is refused as a possible replay.
	// +optional
	// +kubebuilder:default="5m"
	Tolerance *metav1.Duration `json:"tolerance,omitempty"`
}

// SigningSecretReference names a Secret in the provider's namespace and the keys of it
// whose values sign deliveries (docs/design.md §15). It only names keys: how a value is
// decoded (raw bytes, "whsec_" base64...) is the signature scheme's business.
type SigningSecretReference struct {
	// name of the Secret, in the same namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`

	// keys names the Secret's data keys that sign deliveries, in the order they are
	// tried. Name one; name two only while rotating (add the new key to the Secret, name
	// it here beside the old one, switch the sender, then remove the old name and key).
	// No other key of the Secret is ever used. A key named like a certificate or a
	// private key (tls.crt, tls.key, ca.crt, *.pem, *.crt, *.key), a value that is PEM,
	// or a Secret of type kubernetes.io/tls is refused: Ready=False, reason
	// SigningKeyRefused, and deliveries are answered 503.
	// When unset (providers created before this field), a Secret holding exactly one
	// key signs with it; one holding several is refused (reason SigningKeysUnnamed)
	// until they are named here.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[-._a-zA-Z0-9]+$`
	// +listType=set
	Keys []string `json:"keys,omitempty"`
}

// FieldSource locates a value in a delivery: a request header or a JSON path. A
// header is accepted only where the signature covers it (WebhookProviderSpec's rules).
// +kubebuilder:validation:XValidation:rule="!(has(self.header) && has(self.jsonPath))",message="set exactly one of header or jsonPath"
type FieldSource struct {
	// header is the name of a request header holding the value.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9-]+$`
	Header string `json:"header,omitempty"`

	// jsonPath into the payload, in kubectl's syntax, e.g. ".data.id" or "{.data.id}".
	// +optional
	// +kubebuilder:validation:MaxLength=256
	JSONPath string `json:"jsonPath,omitempty"`
}

// EventIDSource says where a delivery's event ID comes from.
// +kubebuilder:validation:XValidation:rule="[has(self.header), has(self.jsonPath), has(self.derivedFrom)].filter(x, x).size() <= 1",message="set exactly one of header, jsonPath or derivedFrom"
type EventIDSource struct {
	// header is the name of a request header holding the event ID: only "webhook-id"
	// with scheme StandardWebhooks, the one header a scheme signs that identifies an
	// event. Stripe and HMACSHA256 sign only the body (and a timestamp), so their
	// event ID must come from the payload (jsonPath or derivedFrom).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9-]+$`
	Header string `json:"header,omitempty"`

	// jsonPath to the event ID in the payload.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	JSONPath string `json:"jsonPath,omitempty"`

	// derivedFrom lists JSON paths of stable business fields for senders that send no
	// event ID; the ID is their values joined with NUL and hashed. Pick fields that
	// identify the fact (job ID and completion version), never a send time.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=256
	// +listType=atomic
	DerivedFrom []string `json:"derivedFrom,omitempty"`
}

// OperationType is a business effect a route asks for.
// +kubebuilder:validation:Enum=JobCompletion;BillingSettlement
type OperationType string

const (
	OperationJobCompletion     OperationType = "JobCompletion"
	OperationBillingSettlement OperationType = "BillingSettlement"
)

// UsageMapping locates usage in the payload.
// +kubebuilder:validation:XValidation:rule="has(self.meter) != has(self.meterPath)",message="set exactly one of meter or meterPath"
type UsageMapping struct {
	// quantity is the JSON path of the used quantity (a number or a decimal string).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Quantity string `json:"quantity"`

	// meter is a fixed meter name for every delivery of this route.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Meter string `json:"meter,omitempty"`

	// meterPath is the JSON path of the meter name in the payload.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	MeterPath string `json:"meterPath,omitempty"`

	// unit of the quantity, e.g. "tokens".
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Unit string `json:"unit,omitempty"`
}

// AmountMapping locates a monetary amount in the payload.
// +kubebuilder:validation:XValidation:rule="has(self.currency) != has(self.currencyPath)",message="set exactly one of currency or currencyPath"
type AmountMapping struct {
	// minor is the JSON path of the amount in the currency's ISO 4217 minor unit (an
	// integer: 1250 for 12.50 USD, 500 for 500 JPY, 1234 for 1.234 KWD).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Minor string `json:"minor"`

	// currency is a fixed ISO 4217 code for every delivery of this route.
	// +optional
	// +kubebuilder:validation:Pattern=`^[A-Z]{3}$`
	Currency string `json:"currency,omitempty"`

	// currencyPath is the JSON path of the ISO 4217 code in the payload.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	CurrencyPath string `json:"currencyPath,omitempty"`
}

// JobCompletionMapping says how to read a job completion from a payload.
// The https rule lives here, where users write sinks, and not on JobSink: events and
// job completions stored before it copy their sink unchanged and must stay valid.
// +kubebuilder:validation:XValidation:rule="!has(self.sink) || !has(self.sink.url) || self.sink.url.startsWith('https://') || (has(self.sink.allowInsecureHTTP) && self.sink.allowInsecureHTTP)",message="sink.url must use https:// unless sink.allowInsecureHTTP is true (a bearer token and job data would travel in clear text)"
type JobCompletionMapping struct {
	// jobID is the JSON path of the job's ID.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	JobID string `json:"jobID"`

	// completionVersion is the JSON path of the completion's version (an integer that
	// grows with every newer report about the same job). When unset, the event's
	// sequence is used, and without a sequence every completion has version 1.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	CompletionVersion string `json:"completionVersion,omitempty"`

	// state is the JSON path of the job's result, read through spec.states (and, for a
	// state not listed there, as Succeeded, Failed or Cancelled, case insensitive, or a
	// common spelling of one). When unset the job is taken as Succeeded.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	State string `json:"state,omitempty"`

	// completedAt is the JSON path of the completion time (RFC 3339).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	CompletedAt string `json:"completedAt,omitempty"`

	// usage locates the job's usage, if it reports any.
	// +optional
	Usage *UsageMapping `json:"usage,omitempty"`

	// sink is where the completion is applied.
	// +optional
	Sink *JobSink `json:"sink,omitempty"`
}

// SettlementMapping says how to read a billing settlement from a payload.
// +kubebuilder:validation:XValidation:rule="has(self.usage) || has(self.amount)",message="a settlement needs usage, amount or both"
// +kubebuilder:validation:XValidation:rule="has(self.keyFrom) || has(self.jobID)",message="set keyFrom, or jobID for the job's default key"
type SettlementMapping struct {
	// billingProviderRef names the BillingProvider (same namespace) that settles it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	BillingProviderRef string `json:"billingProviderRef"`

	// jobID is the JSON path of the job's ID; the default settlement key is
	// ["job","<namespace>","<webhook provider>","<jobID>"], so one job is charged once
	// however often it is reported, and never shares a key with another namespace's.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	JobID string `json:"jobID,omitempty"`

	// keyFrom lists JSON paths whose values form the settlement key, for charges that
	// are not one-per-job (e.g. a line item). The key is a JSON array,
	// ["key","<namespace>","<webhook provider>","<value 1>",...], so values containing
	// "/" never collide; two items of one event with the same key are refused (400).
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=256
	// +listType=atomic
	KeyFrom []string `json:"keyFrom,omitempty"`

	// customer is the JSON path of the billing customer's ID.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Customer string `json:"customer"`

	// usage locates the usage to charge for.
	// +optional
	Usage *UsageMapping `json:"usage,omitempty"`

	// amount locates a fixed amount to charge.
	// +optional
	Amount *AmountMapping `json:"amount,omitempty"`
}

// RouteOperation is one business effect of an event type.
// +kubebuilder:validation:XValidation:rule="self.type == 'JobCompletion' ? (has(self.jobCompletion) && !has(self.settlement)) : (has(self.settlement) && !has(self.jobCompletion))",message="type JobCompletion needs jobCompletion, type BillingSettlement needs settlement, and not the other"
type RouteOperation struct {
	// type of effect.
	// +required
	Type OperationType `json:"type"`

	// forEach is the JSON path of an array: the operation is done once per item, and
	// its other paths are read from the item (a path starting with "$." still reads
	// the whole payload). For events that cover several jobs or line items.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ForEach string `json:"forEach,omitempty"`

	// jobCompletion maps the payload to a job completion.
	// +optional
	JobCompletion *JobCompletionMapping `json:"jobCompletion,omitempty"`

	// settlement maps the payload to a billing settlement.
	// +optional
	Settlement *SettlementMapping `json:"settlement,omitempty"`
	// when is a CEL expression that decides, per delivery (per item with forEach),
	// whether this operation is done. When it is false the operation is not produced
	// and the event keeps its other operations: a failed job is completed but not
	// charged. Unset: always.
	//
	// Expression environment (CEL):
	// - payload: the JSON body, a map (numbers are int when integral, else double).
	// - item: the current item, for a forEach operation only.
	// - jobState(string) -> string: a job state read as the JobCompletion state field
	// reads it, through spec.states: "success", "completed", "Succeeded" give
	// "Succeeded"; "error", "failure", "Failed" give "Failed"; "canceled", "Cancelled"
	// give "Cancelled"; a state spec.states maps gives its meaning (possibly
	// "Ignored"). An unmapped state does not produce the operation (the event shows
	// it as UnmappedState); it is not an evaluation error.
	//
	// The expression must have type bool (compare a field explicitly, e.g.
	// payload.data.charge == true). It is compiled when the provider is reconciled: an
	// invalid one makes the provider Ready=False (InvalidSpec) with the compiler's
	// message, and its deliveries are answered 503 until it is fixed. The conditions of
	// one delivery may cost at most 1,000,000 CEL cost units together: enough to look
	// through thousands of items, not for work that grows with the square of the
	// payload. A delivery that
	// cannot be evaluated (a missing key, a wrong type, the cost limit) is answered 400 naming this field, unless it is a redelivery of an event
	// already stored (then "duplicate", as always).
	//
	// Examples:
	// - jobState(payload.data.state) == "Succeeded"
	// - item.amount_cents > 0
	// - has(payload.data.usage) && payload.data.usage.tokens > 0
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	When string `json:"when,omitempty"`
}

// Route maps one event type to the operations it causes.
type Route struct {
	// eventType as the sender names it, e.g. "job.completed".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	EventType string `json:"eventType"`

	// operations done for each event of this type, each independently idempotent.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	Operations []RouteOperation `json:"operations"`
	// when is a CEL expression that decides, per delivery, whether this route applies.
	// When it is false the event is handled like an event type with no route: answered
	// 200 "ignored" and not stored, unless storeUnroutedEvents is set. Unset: always.
	// To complete every job but charge only succeeded ones, put the condition on the
	// BillingSettlement operation instead.
	//
	// Expression environment (CEL):
	// - payload: the JSON body, a map (numbers are int when integral, else double).
	// - jobState(string) -> string: a job state read as the JobCompletion state field
	// reads it, through spec.states: "success", "completed", "Succeeded" give
	// "Succeeded"; "error", "failure", "Failed" give "Failed"; "canceled", "Cancelled"
	// give "Cancelled"; a state spec.states maps gives its meaning (possibly
	// "Ignored"). An unmapped state does not produce the operation (the event shows
	// it as UnmappedState); it is not an evaluation error.
	//
	// The expression must have type bool (compare a field explicitly, e.g.
	// payload.data.charge == true). It is compiled when the provider is reconciled: an
	// invalid one makes the provider Ready=False (InvalidSpec) with the compiler's
	// message, and its deliveries are answered 503 until it is fixed. The conditions of
	// one delivery may cost at most 1,000,000 CEL cost units together: enough to look
	// through thousands of items, not for work that grows with the square of the
	// payload. A delivery that
	// cannot be evaluated (a missing key, a wrong type, the cost limit) is answered 400 naming this field, unless it is a redelivery of an event
	// already stored (then "duplicate", as always).
	//
	// Examples:
	// - payload.data.environment == "production"
	// - jobState(payload.data.state) != "Cancelled"
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	When string `json:"when,omitempty"`
}

// RawPayloadStorage opts in to keeping the raw payload on the WebhookEvent.
type RawPayloadStorage struct {
	// enabled keeps the raw payload. Off by default: objects should stay small, and
	// the extracted fields plus the canonical hash are enough for every operation.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// maxBytes caps the stored payload; a larger one is stored truncated and marked so.
	// +optional
	// +kubebuilder:default=4096
	// +kubebuilder:validation:Minimum=256
	// +kubebuilder:validation:Maximum=65536
	MaxBytes int32 `json:"maxBytes,omitempty"`
}

// RetentionSpec says how long received events are kept.
// +kubebuilder:validation:XValidation:rule="duration(self.events) > duration(self.providerRetryWindow)",message="events retention must be longer than providerRetryWindow, or a late retry would be processed as a new event"
type RetentionSpec struct {
	// events is how long a complete WebhookEvent is kept for deduplication. It must
	// exceed the sender's retry/replay window. Settlements and job completions are
	// never deleted by retention.
	// +optional
	// +kubebuilder:default="168h"
	Events *metav1.Duration `json:"events,omitempty"`

	// providerRetryWindow is how long the sender says it may retry or replay a delivery.
	// +optional
	// +kubebuilder:default="72h"
	ProviderRetryWindow *metav1.Duration `json:"providerRetryWindow,omitempty"`
}

// WebhookProviderSpec configures one sender of webhooks.
//
// Every field that decides an effect comes from signed bytes: a header outside the
// signature would let anyone holding one captured delivery re-type or re-identify it
// and replay it (docs/design.md §4; decisions.md "Signed fields"). The only
// header a scheme signs that can identify an event is StandardWebhooks' webhook-id.
// +kubebuilder:validation:XValidation:rule="(has(self.sender) && self.sender != 'Generic') || has(self.signature.scheme)",message="signature.scheme is required unless spec.sender names a preset (StandardWebhooks, Svix, GitHub, Stripe, EventBridge, CloudEvents) that sets it"
// +kubebuilder:validation:XValidation:rule="(has(self.sender) && self.sender != 'Generic') || (has(self.eventID) && (has(self.eventID.header) || has(self.eventID.jsonPath) || has(self.eventID.derivedFrom)))",message="eventID: set exactly one of header, jsonPath or derivedFrom (required unless spec.sender names a preset that sets it)"
// +kubebuilder:validation:XValidation:rule="(has(self.sender) && self.sender != 'Generic') || (has(self.eventType) && (has(self.eventType.header) || has(self.eventType.jsonPath)))",message="eventType: set exactly one of header or jsonPath (required unless spec.sender names a preset that sets it)"
// +kubebuilder:validation:XValidation:rule="!has(self.sender) || self.sender == 'Generic' || !has(self.signature.scheme)",message="spec.sender sets signature.scheme: leave it unset, or use sender Generic to configure the signature yourself"
// +kubebuilder:validation:XValidation:rule="!has(self.sender) || !(self.sender in ['StandardWebhooks', 'Svix', 'Stripe', 'GitHub']) || (!has(self.signature.header) && !has(self.signature.prefix) && !has(self.signature.encoding) && !has(self.signature.timestampHeader) && !has(self.signature.signedHeaders))",message="this sender's signature headers and format are fixed by its preset: leave signature.header, prefix, encoding, timestampHeader and signedHeaders unset"
// +kubebuilder:validation:XValidation:rule="!has(self.sender) || !(self.sender in ['EventBridge', 'CloudEvents']) || (has(self.signature.header) && !has(self.signature.prefix) && !has(self.signature.encoding) && !has(self.signature.timestampHeader) && !has(self.signature.signedHeaders))",message="senders EventBridge and CloudEvents sign nothing: set signature.header to the header carrying the shared credential (e.g. x-api-key, or Authorization for Basic), whose whole value the Secret's key must equal; prefix, encoding, timestampHeader and signedHeaders do not apply"
// +kubebuilder:validation:XValidation:rule="!has(self.sender) || self.sender != 'GitHub' || (has(self.signature.insecureAllowReplay) && self.signature.insecureAllowReplay)",message="GitHub signs no timestamp, so a captured delivery verifies forever: set signature.insecureAllowReplay: true to accept that (deduplication by event ID, for as long as the event is kept, bounds its effect)"
// +kubebuilder:validation:XValidation:rule="!has(self.sender) || self.sender in ['Generic', 'GitHub'] || !(has(self.signature.insecureAllowReplay) && self.signature.insecureAllowReplay)",message="insecureAllowReplay only applies to sender GitHub or scheme HMACSHA256 without timestampHeader"
// +kubebuilder:validation:XValidation:rule="!has(self.sender) || self.sender != 'GitHub' || (has(self.eventID) && (has(self.eventID.jsonPath) || has(self.eventID.derivedFrom)) && has(self.eventType) && has(self.eventType.jsonPath))",message="sender GitHub: set eventID (jsonPath or derivedFrom) and eventType.jsonPath from the payload, e.g. derivedFrom ['.workflow_job.id', '.workflow_job.run_attempt', '.action'] and jsonPath '.action'; GitHub's X-GitHub-Delivery and X-GitHub-Event headers are not signed, so they cannot identify an event"
// +kubebuilder:validation:XValidation:rule="!has(self.sender) || self.sender != 'CloudEvents' || ((!has(self.eventID) || (!has(self.eventID.header) && !has(self.eventID.jsonPath) && !has(self.eventID.derivedFrom))) && (!has(self.eventType) || (!has(self.eventType.header) && !has(self.eventType.jsonPath))))",message="sender CloudEvents takes the event ID from ce-id within ce-source and the type from ce-type: leave eventID and eventType unset"
// +kubebuilder:validation:XValidation:rule="!has(self.sender) || !has(self.retention) || !has(self.retention.providerRetryWindow) || duration(self.retention.providerRetryWindow) >= duration(self.sender in ['Stripe', 'GitHub'] ? '72h' : self.sender == 'Svix' ? '28h' : self.sender == 'EventBridge' ? '24h' : '0s')",message="retention.providerRetryWindow is shorter than this sender's documented retry window (Stripe and GitHub redeliveries: 72h, Svix: 28h, EventBridge: 24h), so a late retry would be processed as a new event"
// +kubebuilder:validation:XValidation:rule="!has(self.eventID) || !has(self.eventID.header) || (has(self.signature.scheme) && ((self.signature.scheme == 'StandardWebhooks' && self.eventID.header.lowerAscii() == 'webhook-id') || self.signature.scheme == 'APIKey' || (self.signature.scheme == 'HMACSHA256' && has(self.signature.signedHeaders) && self.signature.signedHeaders.exists(h, h.lowerAscii() == self.eventID.header.lowerAscii())))) || (has(self.sender) && ((self.sender in ['StandardWebhooks', 'Svix'] && self.eventID.header.lowerAscii() == 'webhook-id') || self.sender == 'EventBridge'))",message="eventID.header is outside the signature: only webhook-id with scheme StandardWebhooks, or a header listed in signature.signedHeaders with scheme HMACSHA256, is signed (webhook-id also with sender StandardWebhooks or Svix; with scheme APIKey or sender EventBridge nothing is signed, so any header is as authentic as the body); otherwise take the event ID from the payload (jsonPath or derivedFrom), which every scheme signs"
// +kubebuilder:validation:XValidation:rule="!has(self.eventType) || !has(self.eventType.header) || (has(self.signature.scheme) && ((self.signature.scheme == 'StandardWebhooks' && self.eventType.header.lowerAscii() == 'webhook-id') || self.signature.scheme == 'APIKey' || (self.signature.scheme == 'HMACSHA256' && has(self.signature.signedHeaders) && self.signature.signedHeaders.exists(h, h.lowerAscii() == self.eventType.header.lowerAscii())))) || (has(self.sender) && self.sender == 'EventBridge')",message="eventType.header is outside the signature, so a captured delivery could be replayed as another event type: list it in signature.signedHeaders (scheme HMACSHA256, e.g. CloudEvents binary mode's ce-type), or take the event type from the payload (jsonPath), which every scheme signs"
type WebhookProviderSpec struct {
	// sender names the kind of sender, whose preset sets what its documentation fixes:
	// the signature scheme and headers, where the event ID and type are, and the
	// shortest retention.providerRetryWindow it accepts (docs/design.md §4, "Sender
	// presets"). Unset or Generic: nothing is preset, and signature.scheme, eventID and
	// eventType must be given (providers created before this field are Generic).
	// Fields a preset sets must be left unset, except eventID and eventType where the
	// preset's default is only a default (StandardWebhooks, Svix, Stripe, EventBridge).
	// +optional
	Sender Sender `json:"sender,omitempty"`

	// signature configures authentication of deliveries.
	// +required
	Signature SignatureSpec `json:"signature"`

	// eventID says where the delivery's unique event ID is. Deliveries with the same ID
	// are the same event. Required without a sender preset (or for sender GitHub);
	// unset for sender CloudEvents.
	// +optional
	EventID EventIDSource `json:"eventID,omitempty"`

	// eventType says where the event's type is. Required without a sender preset (or
	// for sender GitHub); unset for sender CloudEvents.
	// +optional
	EventType FieldSource `json:"eventType,omitempty"`

	// sequence is the JSON path of a per-sender ordering number, if the sender has one.
	// It is the default completion version of job completions.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Sequence string `json:"sequence,omitempty"`

	// hashFields lists JSON paths whose values form the canonical hash instead of the
	// whole payload, for senders that add volatile fields (e.g. a delivery attempt
	// counter) to retries of the same event.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=256
	// +listType=atomic
	HashFields []string `json:"hashFields,omitempty"`

	// routes map event types to operations. An event type with no route is answered
	// 200 "ignored" and not stored, unless storeUnroutedEvents is set.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=eventType
	Routes []Route `json:"routes,omitempty"`

	// storeUnroutedEvents keeps a WebhookEvent for event types without a route.
	// +optional
	StoreUnroutedEvents bool `json:"storeUnroutedEvents,omitempty"`

	// rawPayload opts in to storing the raw payload, size-capped.
	// +optional
	RawPayload *RawPayloadStorage `json:"rawPayload,omitempty"`

	// retention of received events.
	// +optional
	// +kubebuilder:default={events:"168h",providerRetryWindow:"72h"}
	Retention *RetentionSpec `json:"retention,omitempty"`

	// states maps the job states this sender writes (at every JobCompletion
	// operation's jobCompletion.state, and in jobState() of when conditions) to what
	// they mean here: Succeeded, Failed, Cancelled, or Ignored (acknowledged, nothing
	// created, no job completion and no charge). States are compared ignoring case and
	// surrounding space. A state not listed is read as before this field existed
	// (Succeeded, Failed, Cancelled and their common spellings: success, completed,
	// failure, error, canceled...); any other is unmapped: the delivery is accepted
	// (200) and stored, nothing is created or charged for that job, and the event shows
	// outcome Unmapped with reason UnmappedState naming the state (docs/design.md §5,
	// "Job states"). Sender GitHub defaults it to GitHub's conclusions when unset.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(m, self.filter(x, x.state.lowerAscii().trim() == m.state.lowerAscii().trim()).size() == 1)",message="states lists a state twice (states are compared ignoring case and surrounding space)"
	// +listType=map
	// +listMapKey=state
	States []JobStateMapping `json:"states,omitempty"`
}

// JobStateMeaning is what a sender's job state means here.
// +kubebuilder:validation:Enum=Succeeded;Failed;Cancelled;Ignored
type JobStateMeaning string

// JobStateIgnored: the delivery is acknowledged and nothing is created for the job.
const JobStateIgnored JobStateMeaning = "Ignored"

// JobStateMapping maps one job state a sender writes to its meaning.
type JobStateMapping struct {
	// state as the sender writes it, e.g. "timed_out" (GitHub) or "TIMED_OUT" (RunPod).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	State string `json:"state"`

	// as is its meaning: Succeeded, Failed, Cancelled, or Ignored.
	// +required
	As JobStateMeaning `json:"as"`
}

// WebhookProviderStatus reports whether the provider can receive.
type WebhookProviderStatus struct {
	// observedGeneration is the spec generation this status describes; 0 until the
	// operator has looked at the object.
	// +optional
	// +kubebuilder:default=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// endpointPath is the receiver path senders post to: /webhooks/{namespace}/{name}.
	// +optional
	EndpointPath string `json:"endpointPath,omitempty"`

	// secretKeys is how many keys of the signing Secret sign deliveries: those named
	// in spec.signature.secretRef.keys, or the Secret's only key when none is named.
	// +optional
	SecretKeys int32 `json:"secretKeys,omitempty"`

	// nextRetentionSweep is when complete events past retention are next deleted.
	// +optional
	NextRetentionSweep *metav1.Time `json:"nextRetentionSweep,omitempty"`

	// lastRejection is the latest kind of delivery this provider's senders had refused
	// (400, 401, 413 or 415), written by the receiver at most every few seconds. It is
	// separate from Ready, which is about the provider's configuration: a Ready provider
	// whose senders' payloads lack a routed field shows it here. It never holds a payload,
	// a value from one, or a secret.
	// +optional
	LastRejection *DeliveryRejection `json:"lastRejection,omitempty"`

	// conditions: Ready is True when the secret exists, the keys it signs with are usable
	// (reasons SecretInvalid, SigningKeyRefused, SigningKeysUnnamed otherwise; deliveries
	// are then answered 503) and every route is valid.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// Rejection reasons of status.lastRejection: a closed set. The first five are refusals
// of a delivery whose signature verified (the sender's payload does not fit the
// routes); the last three are refusals before or of the signature, which anyone who
// can reach the endpoint can cause.
const (
	// RejectionMissingField: a field the provider's routes read is absent (path named).
	RejectionMissingField = "MissingField"
	// RejectionInvalidField: a field is present but not usable (wrong type, too long,
	// not a job state...); the path is named, the value never.
	RejectionInvalidField = "InvalidField"
	// RejectionWhenFailed: a route's or operation's when condition could not be
	// evaluated on the payload; the path names the condition's field in the spec.
	RejectionWhenFailed = "WhenEvaluationFailed"
	// RejectionMalformedJSON: the signed body is not JSON.
	RejectionMalformedJSON = "MalformedJSON"
	// RejectionInvalidEvent: any other content problem (duplicate settlement keys in
	// one event, too many facts, refused by the CRD's validation).
	RejectionInvalidEvent = "InvalidEvent"
	// RejectionInvalidSignature: 401, the signature is missing, stale or does not match.
	RejectionInvalidSignature = "InvalidSignature"
	// RejectionUnsupportedMediaType: 415, the Content-Type is not JSON.
	RejectionUnsupportedMediaType = "UnsupportedMediaType"
	// RejectionPayloadTooLarge: 413, the body exceeds the receiver's limit.
	RejectionPayloadTooLarge = "PayloadTooLarge"
)

// DeliveryRejection summarizes the latest kind of refused delivery. Counts are "at
// least": each receiver replica aggregates in memory and adds its count with an
// optimistic-lock patch; a replica that stops between flushes loses its unflushed
// count (the receiver's requests metric has every refusal).
type DeliveryRejection struct {
	// reason is the kind of refusal: MissingField, InvalidField, WhenEvaluationFailed,
	// MalformedJSON, InvalidEvent (the signature verified); InvalidSignature,
	// UnsupportedMediaType, PayloadTooLarge (unauthenticated).
	// +required
	// +kubebuilder:validation:Enum=MissingField;InvalidField;WhenEvaluationFailed;MalformedJSON;InvalidEvent;InvalidSignature;UnsupportedMediaType;PayloadTooLarge
	Reason string `json:"reason"`

	// path is the JSON path of the payload field (or the spec field of the when
	// condition) at fault, when there is one.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Path string `json:"path,omitempty"`

	// message says what is wrong, without any value from the payload.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// signed is true when the delivery's signature verified: its sender is the real
	// one. A signed refusal is not replaced by an unsigned one for ten minutes, so
	// that unauthenticated traffic cannot hide it.
	// +optional
	Signed bool `json:"signed,omitempty"`

	// count is how many deliveries were refused for this reason and path since it
	// became the last rejection (at least; see the type's description).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Count int64 `json:"count,omitempty"`

	// firstTime is when this reason and path became the last rejection.
	// +optional
	FirstTime *metav1.Time `json:"firstTime,omitempty"`

	// lastTime is when the latest such delivery was refused.
	// +required
	LastTime metav1.Time `json:"lastTime"`
}

// WebhookProvider configures one sender of webhooks: how its deliveries are signed,
// where the event ID and type are, which operations each event type causes, and how
// long received events are kept for deduplication.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=whp,categories=settlement
// +kubebuilder:printcolumn:name="Scheme",type=string,JSONPath=`.spec.signature.scheme`,description="The explicit signature scheme (empty: set by the sender preset)"
// +kubebuilder:printcolumn:name="Replayable",type=boolean,JSONPath=`.spec.signature.insecureAllowReplay`,description="true: the sender signs no timestamp, so a captured delivery verifies forever (insecureAllowReplay)"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Why it is (not) ready: the Ready condition's reason"
// +kubebuilder:printcolumn:name="Sender",type=string,JSONPath=`.spec.sender`,priority=1,description="The sender preset (empty: Generic)"
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpointPath`
// +kubebuilder:printcolumn:name="Last Rejection",type=string,JSONPath=`.status.lastRejection.reason`,priority=1,description="The latest kind of refused delivery (status.lastRejection)"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="WebhookProvider names are limited to 63 characters: they are used as label values and prefix every derived object name"
type WebhookProvider struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec configures the sender.
	// +required
	Spec WebhookProviderSpec `json:"spec"`

	// status is written by the operator. Until it first does, the API server shows
	// status.observedGeneration 0 (a default), so kstatus-based tools (Flux's wait)
	// see a generation not observed yet, in progress, rather than a current object.
	// +optional
	// +kubebuilder:default={observedGeneration:0}
	Status WebhookProviderStatus `json:"status,omitempty"`
}

// WebhookProviderList is a list of WebhookProviders.
// +kubebuilder:object:root=true
type WebhookProviderList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookProvider `json:"items"`
}

func init() {
	SchemeBuilder.Register(&WebhookProvider{}, &WebhookProviderList{})
}
