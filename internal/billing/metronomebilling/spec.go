package metronomebilling

import (
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// FromProvider builds the adapter a BillingProvider of type Metronome describes: its
// endpoint, its spec.metronome meters, the token from its credentials Secret and the
// request timeout (the registry's factory, internal/billing/adapters); now is the clock
// its windows are measured on (time.Now when nil).
func FromProvider(bp *hooksv1alpha1.BillingProvider, token string, timeout time.Duration, now func() time.Time) (billing.Client, error) {
	meters := map[string]Meter{}
	if m := bp.Spec.Metronome; m != nil {
		for _, mm := range m.Meters {
			meters[mm.Meter] = Meter{EventType: mm.EventType, QuantityProperty: mm.QuantityProperty, BillableMetricID: mm.BillableMetricID}
		}
	}
	return New(Config{Endpoint: bp.Spec.Endpoint, Token: token, Timeout: timeout, Meters: meters, Now: now})
}
