// Package senders turns a WebhookProvider's sender preset into the configuration it
// stands for (docs/design.md §4, "Sender presets"). It is the one place that knows
// what each preset fixes: the webhookprovider controller validates, and the receiver
// serves, the spec Apply returns, so Ready and the receiver never disagree.
//
// A preset fills only what the sender's documentation fixes and the spec leaves
// unset; the CRD's rules refuse a spec that sets what a preset fixes.
package senders

import (
	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/signature"
)

// GitHub's signature header, as GitHub documents it ("Validating webhook deliveries").
const (
	GitHubSignatureHeader = "X-Hub-Signature-256"
	GitHubSignaturePrefix = "sha256="
)

// CloudEvents binary-mode attribute headers the receiver reads for sender CloudEvents.
// The extractor is given the event's ID and type by the receiver instead (see
// IsCloudEvents); these only keep the compiled spec complete.
const (
	cloudEventsIDHeader   = "ce-id"
	cloudEventsTypeHeader = "ce-type"
)

// Apply returns spec with its sender preset applied: a copy in which the signature
// scheme and headers, the event ID and the event type the preset fixes are filled in
// where spec leaves them unset. Without a preset (unset or Generic) it returns spec
// unchanged. spec itself is never modified.
func Apply(spec *hooksv1alpha1.WebhookProviderSpec) hooksv1alpha1.WebhookProviderSpec {
	out := *spec
	sig := &out.Signature
	defaultID := func(id hooksv1alpha1.EventIDSource) {
		if out.EventID.Header == "" && out.EventID.JSONPath == "" && len(out.EventID.DerivedFrom) == 0 {
			out.EventID = id
		}
	}
	defaultType := func(t hooksv1alpha1.FieldSource) {
		if out.EventType.Header == "" && out.EventType.JSONPath == "" {
			out.EventType = t
		}
	}
	switch spec.Sender {
	case hooksv1alpha1.SenderStandardWebhooks, hooksv1alpha1.SenderSvix:
		sig.Scheme = hooksv1alpha1.SchemeStandardWebhooks
		defaultID(hooksv1alpha1.EventIDSource{Header: signature.HeaderWebhookID})
		defaultType(hooksv1alpha1.FieldSource{JSONPath: ".type"})
	case hooksv1alpha1.SenderStripe:
		sig.Scheme = hooksv1alpha1.SchemeStripe
		defaultID(hooksv1alpha1.EventIDSource{JSONPath: ".id"})
		defaultType(hooksv1alpha1.FieldSource{JSONPath: ".type"})
	case hooksv1alpha1.SenderGitHub:
		sig.Scheme = hooksv1alpha1.SchemeHMACSHA256
		sig.Header, sig.Prefix, sig.Encoding = GitHubSignatureHeader, GitHubSignaturePrefix, hooksv1alpha1.EncodingHex
		if len(out.States) == 0 {
			out.States = GitHubStates()
		}
	case hooksv1alpha1.SenderEventBridge:
		sig.Scheme = hooksv1alpha1.SchemeAPIKey
		defaultID(hooksv1alpha1.EventIDSource{JSONPath: ".id"})
		defaultType(hooksv1alpha1.FieldSource{JSONPath: ".detail-type"})
	case hooksv1alpha1.SenderCloudEvents:
		sig.Scheme = hooksv1alpha1.SchemeAPIKey
		out.EventID = hooksv1alpha1.EventIDSource{Header: cloudEventsIDHeader}
		out.EventType = hooksv1alpha1.FieldSource{Header: cloudEventsTypeHeader}
	}
	return out
}

// GitHubStates is sender GitHub's default spec.states: every conclusion GitHub
// documents for a workflow run, workflow job and check run (decisions.md "Job
// states"). Only success is charged as Succeeded; a run that waits for approval
// (action_required) is not over, so it creates nothing and a later delivery brings its
// conclusion.
func GitHubStates() []hooksv1alpha1.JobStateMapping {
	return []hooksv1alpha1.JobStateMapping{
		{State: "success", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded)},
		{State: "failure", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobFailed)},
		{State: "timed_out", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobFailed)},
		{State: "startup_failure", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobFailed)},
		{State: "cancelled", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobCancelled)},
		{State: "skipped", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobCancelled)},
		{State: "stale", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobCancelled)},
		{State: "neutral", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded)},
		{State: "action_required", As: hooksv1alpha1.JobStateIgnored},
	}
}

// RunPodStates is the spec.states a RunPod serverless endpoint's webhook needs (its
// job status: COMPLETED, FAILED, CANCELLED, TIMED_OUT; IN_QUEUE and IN_PROGRESS are
// not ends). RunPod has no sender preset (its webhook is configured as Generic), so
// this is the table the documentation and samples give, not a default.
func RunPodStates() []hooksv1alpha1.JobStateMapping {
	return []hooksv1alpha1.JobStateMapping{
		{State: "COMPLETED", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded)},
		{State: "FAILED", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobFailed)},
		{State: "TIMED_OUT", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobFailed)},
		{State: "CANCELLED", As: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobCancelled)},
		{State: "IN_QUEUE", As: hooksv1alpha1.JobStateIgnored},
		{State: "IN_PROGRESS", As: hooksv1alpha1.JobStateIgnored},
	}
}

// IsCloudEvents reports whether the receiver reads the provider's deliveries as
// CloudEvents: the event ID is ce-id within ce-source, the type ce-type, and the
// payload routes read is the event's data, in binary and structured mode alike.
func IsCloudEvents(spec *hooksv1alpha1.WebhookProviderSpec) bool {
	return spec.Sender == hooksv1alpha1.SenderCloudEvents
}
