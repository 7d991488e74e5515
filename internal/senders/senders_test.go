package senders

import (
	"testing"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

func TestApply(t *testing.T) {
	generic := hooksv1alpha1.WebhookProviderSpec{Signature: hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeStripe},
		EventID: hooksv1alpha1.EventIDSource{JSONPath: ".x"}, EventType: hooksv1alpha1.FieldSource{JSONPath: ".t"}}
	if got := Apply(&generic); got.Signature.Scheme != hooksv1alpha1.SchemeStripe || got.EventID.JSONPath != ".x" {
		t.Errorf("a provider without a preset changed: %+v", got)
	}
	svix := hooksv1alpha1.WebhookProviderSpec{Sender: hooksv1alpha1.SenderSvix}
	got := Apply(&svix)
	if got.Signature.Scheme != hooksv1alpha1.SchemeStandardWebhooks || got.EventID.Header != "webhook-id" || got.EventType.JSONPath != ".type" {
		t.Errorf("Svix = %+v", got)
	}
	if svix.Signature.Scheme != "" {
		t.Error("Apply modified its argument")
	}
	stripe := hooksv1alpha1.WebhookProviderSpec{Sender: hooksv1alpha1.SenderStripe, EventType: hooksv1alpha1.FieldSource{JSONPath: ".data.object.type"}}
	got = Apply(&stripe)
	if got.EventID.JSONPath != ".id" || got.EventType.JSONPath != ".data.object.type" {
		t.Errorf("Stripe: the preset's defaults must yield to the spec's own: %+v", got)
	}
	gh := Apply(&hooksv1alpha1.WebhookProviderSpec{Sender: hooksv1alpha1.SenderGitHub})
	if gh.Signature.Header != "X-Hub-Signature-256" || gh.Signature.Prefix != "sha256=" || gh.Signature.Encoding != hooksv1alpha1.EncodingHex {
		t.Errorf("GitHub = %+v", gh.Signature)
	}
	eb := Apply(&hooksv1alpha1.WebhookProviderSpec{Sender: hooksv1alpha1.SenderEventBridge, Signature: hooksv1alpha1.SignatureSpec{Header: "x-api-key"}})
	if eb.Signature.Scheme != hooksv1alpha1.SchemeAPIKey || eb.Signature.Header != "x-api-key" || eb.EventType.JSONPath != ".detail-type" {
		t.Errorf("EventBridge = %+v", eb)
	}
}
