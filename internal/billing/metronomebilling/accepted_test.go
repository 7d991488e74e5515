package metronomebilling_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/metronomebilling"
)

// The ingest answered with another 2xx than 200 took the event (or may have): never
// Terminal, which the decision reads as "refused, nothing ingested".
func TestAcceptedIngestIsNeverTerminal(t *testing.T) {
	for _, status := range []int{http.StatusAccepted, http.StatusNoContent} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
		c, err := metronomebilling.New(metronomebilling.Config{Endpoint: srv.URL, Token: "t", Timeout: time.Second,
			Meters: map[string]metronomebilling.Meter{"tokens": {EventType: "tokens"}}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Submit(context.Background(), billing.Request{SettlementKey: "s", IdempotencyKey: "k", Type: billing.TypeCharge,
			Customer: "c", Usage: &billing.Usage{Meter: "tokens", Quantity: "3"}, KeyNamespaced: true})
		srv.Close()
		if e, ok := billing.AsError(err); ok && e.Class == billing.Terminal {
			t.Errorf("HTTP %d to the ingest classified %s: %v", status, e.Class, err)
		}
	}
}
