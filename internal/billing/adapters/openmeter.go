package adapters

import (
	"errors"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/openmeterbilling"
)

// newOpenMeter builds the OpenMeter adapter from spec.openMeter: each usage meter's
// event type and value property, the CloudEvents source, and the install's
// deduplication window (none when absent).
func newOpenMeter(s Settings) (billing.Client, error) {
	om := s.Provider.Spec.OpenMeter
	if om == nil {
		return nil, errors.New("a provider of type OpenMeter needs spec.openMeter: the event type of each usage meter")
	}
	source := om.Source
	if source == "" {
		source = hooksv1alpha1.DefaultOpenMeterSource
	}
	meters := make(map[string]openmeterbilling.Meter, len(om.Meters))
	for _, m := range om.Meters {
		meters[m.Meter] = openmeterbilling.Meter{EventType: m.EventType, ValueProperty: m.ValueProperty}
	}
	return openmeterbilling.New(openmeterbilling.Config{Endpoint: s.Provider.Spec.Endpoint, Token: s.Token, Timeout: s.Timeout, Now: s.Now,
		Source: source, Meters: meters, Deduplication: openMeterDeduplication(s.Provider)})
}

// openMeterDeduplication is the install's deduplication window as the spec declares
// it; 0 when it declares none (it does not deduplicate).
func openMeterDeduplication(bp *hooksv1alpha1.BillingProvider) time.Duration {
	if om := bp.Spec.OpenMeter; om != nil && om.Deduplication != nil {
		return om.Deduplication.Window.Duration
	}
	return 0
}

// openMeterCapabilities is what the OpenMeter install bp describes can answer about r,
// before a client is built: the client's own declaration.
func openMeterCapabilities(bp *hooksv1alpha1.BillingProvider, r billing.Request) billing.Capabilities {
	return openmeterbilling.RequestCapabilities(openMeterDeduplication(bp), r)
}
