package providerclient

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// TestProviderHealth pins what one call says about a provider, and that a failure
// stands against successes for Hold while a change of failure shows at once.
func TestProviderHealth(t *testing.T) {
	now := time.Unix(1000, 0)
	h := NewHealth()
	h.Now = func() time.Time { return now }
	bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "billing", UID: "u1"},
		Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://billing.example.com",
			CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "billing-token"}}}
	rejected := &billing.Error{Class: billing.Terminal, Status: 401, Code: "401"}
	refused := &billing.Error{Class: billing.Transient, Code: "connection_refused"}
	serverError := &billing.Error{Class: billing.Ambiguous, Status: 503, Code: "503"}

	steps := []struct {
		after  time.Duration
		err    error
		reason string // "" = no condition yet
		events int    // reason changes announced so far
	}{
		{0, errors.New("not from the adapter"), "", 0},
		{0, &billing.Error{Code: "canceled"}, "", 0},
		{0, nil, hooksv1alpha1.ReasonCallsSucceeding, 1},
		{0, &billing.Error{Status: 409}, hooksv1alpha1.ReasonCallsSucceeding, 1}, // one settlement's story
		{0, rejected, hooksv1alpha1.ReasonCredentialsRejected, 2},
		{10 * time.Second, nil, hooksv1alpha1.ReasonCredentialsRejected, 2}, // held
		{0, refused, hooksv1alpha1.ReasonEndpointUnreachable, 3},            // another failure shows at once
		{31 * time.Second, nil, hooksv1alpha1.ReasonCallsSucceeding, 4},
		{0, serverError, hooksv1alpha1.ReasonProviderErroring, 5},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		h.observe(bp, s.err)
		_, reason, _, ok := h.Condition(bp.UID, bp.Generation)
		if !ok {
			reason = ""
		}
		if reason != s.reason || len(h.changed) != s.events {
			t.Fatalf("step %d: reason %q with %d changes, want %q with %d", i, reason, len(h.changed), s.reason, s.events)
		}
	}
	// A new spec (another endpoint) starts over; a late call through the old one is ignored.
	newer := bp.DeepCopy()
	newer.Generation = 2
	if _, _, _, ok := h.Condition(newer.UID, newer.Generation); ok {
		t.Fatal("the calls to generation 1 speak for generation 2")
	}
	h.observe(newer, rejected)
	h.observe(bp, nil)
	if _, reason, _, _ := h.Condition(newer.UID, newer.Generation); reason != hooksv1alpha1.ReasonCredentialsRejected {
		t.Fatalf("generation 2: %q after a late call through generation 1", reason)
	}
	// Reached and not answered within requestTimeout (capped at a minute): named so.
	slow := bp.DeepCopy()
	slow.UID, slow.Spec.RequestTimeout = "slow", &metav1.Duration{Duration: time.Hour}
	h.observe(slow, &billing.Error{Code: "timeout"})
	if _, reason, msg, _ := h.Condition(slow.UID, slow.Generation); reason != hooksv1alpha1.ReasonProviderNotAnswering ||
		!strings.Contains(msg, "requestTimeout (1m0s)") {
		t.Fatalf("a timed-out call: %q %q", reason, msg)
	}
	h.Forget(bp.UID)
	if _, _, _, ok := h.Condition(newer.UID, newer.Generation); ok {
		t.Fatal("a forgotten provider still has a condition")
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{rejected, hooksv1alpha1.ReasonCredentialsRejected},
		{&billing.Error{Status: 403}, hooksv1alpha1.ReasonCredentialsRejected},
		{refused, hooksv1alpha1.ReasonEndpointUnreachable},
		{&billing.Error{Code: "dns_failure"}, hooksv1alpha1.ReasonEndpointUnreachable},
		{&billing.Error{Code: "timeout"}, hooksv1alpha1.ReasonProviderNotAnswering},
		{serverError, hooksv1alpha1.ReasonProviderCallFailed},
		{errors.New("the API server timed out"), hooksv1alpha1.ReasonAPIServerFailure},
	} {
		if got := ReportFailureReason(c.err); got != c.want {
			t.Errorf("reportFailureReason(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// TestHTTPRefusalBeforeSendingSaysNothingAboutTheProvider: a request the HTTP adapter
// refuses before sending anything (an empty settlement key) is that settlement's
// story, not the provider's health.
func TestHTTPRefusalBeforeSendingSaysNothingAboutTheProvider(t *testing.T) {
	bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "billing", UID: "u1"},
		Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://127.0.0.1:1"}}
	c, err := billing.NewHTTP(billing.HTTPConfig{Endpoint: bp.Spec.Endpoint, Token: "t", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(t.Context(), billing.Request{IdempotencyKey: "k", Type: billing.TypeCharge})
	if err == nil {
		t.Fatal("a request without a settlement key was sent")
	}
	if reason, msg := healthOf(bp, err); reason != "" {
		t.Fatalf("a refusal made before sending set the provider's health to %s: %s", reason, msg)
	}
}
