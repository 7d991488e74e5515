package bench

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

const (
	// providerName is the WebhookProvider every phase posts to.
	providerName = fixtures.WebhookProviderName
	billingToken = "bench-billing-token"
)

// tenant creates a namespace with the suites' shared tenant (test/fixtures): a
// WebhookProvider whose job.completed events complete the job (sink None) and charge
// its usage through the BillingProvider at billingURL, so the objects have the size
// and the fan-out of a typical route. billingURL "" skips the BillingProvider (the
// ingestion phase runs no controllers); tune adjusts the BillingProvider.
func tenant(ctx context.Context, k client.Client, ns, billingURL string, tune ...func(*hooksv1alpha1.BillingProvider)) error {
	objs := []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}
	for _, s := range fixtures.Secrets(ns, billingToken, billingURL) {
		objs = append(objs, s)
	}
	if billingURL != "" {
		bp := fixtures.BillingProvider(ns, billingURL)
		for _, f := range tune {
			f(bp)
		}
		objs = append(objs, bp)
	}
	objs = append(objs, fixtures.WebhookProvider(ns))
	for _, o := range objs {
		if err := k.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s/%s: %w", o, o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// payload is the shared job.completed event; id is both the event ID and the job ID.
func payload(id string, n int) []byte {
	return []byte(fixtures.JobCompletedEvent(id, 1, 1000+n))
}

// deliver posts one signed delivery and returns the receiver's answer.
func deliver(ctx context.Context, hc *http.Client, url, id string, body []byte) (sender.Response, error) {
	return sender.Send(ctx, hc, sender.Delivery{URL: url, ID: id, Body: body,
		Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks}, Secret: []byte(fixtures.StandardWebhooksSecret)})
}

// retryAfter is the wait a 429/503 asks for (1s when absent or unreadable).
func retryAfter(r sender.Response) time.Duration {
	if s, err := strconv.Atoi(r.RetryAfter); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return time.Second
}

// endpoint is the receiver URL of the bench provider in ns.
func endpoint(base, ns string) string { return base + identity.EndpointPath(ns, providerName) }

// minimalEvent is the smallest valid WebhookEvent: no facts, so nothing fans out.
func minimalEvent(ns, name, eventID string) *hooksv1alpha1.WebhookEvent {
	return &hooksv1alpha1.WebhookEvent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{hooksv1alpha1.LabelProvider: providerName}},
		Spec: hooksv1alpha1.WebhookEventSpec{Provider: providerName, EventID: eventID, EventType: "job.completed",
			PayloadHash: "sha256:" + identity.Hash32(eventID) + identity.Hash32("payload", eventID), ReceivedAt: metav1.Now()},
	}
}
