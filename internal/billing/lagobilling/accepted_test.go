package lagobilling_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/lagobilling"
)

// A 2xx other than 200/201 to the POST (202 Accepted, 204 from a proxy) says the event
// was taken: it must never read as Terminal ("refused, nothing committed"), which lets
// the decision dead-letter the charge as nothing charged.
func TestAcceptedPostIsNeverTerminal(t *testing.T) {
	for _, status := range []int{http.StatusAccepted, http.StatusNoContent} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
		c, err := lagobilling.New(lagobilling.Config{Endpoint: srv.URL, APIKey: "k", Timeout: time.Second,
			Metrics: map[string]lagobilling.Metric{"tokens": {Code: "llm_tokens", FieldName: "tokens"}}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Submit(context.Background(), billing.Request{SettlementKey: "s", IdempotencyKey: "stl_x", Type: billing.TypeCharge,
			Customer: "sub_1", Usage: &billing.Usage{Meter: "tokens", Quantity: "3"}})
		srv.Close()
		if e, ok := billing.AsError(err); ok && e.Class == billing.Terminal {
			t.Errorf("HTTP %d to the POST classified %s: %v", status, e.Class, err)
		}
	}
}
