package adapters

import (
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/metronomebilling"
)

// newMetronome builds the Metronome adapter from spec.metronome: each usage meter's
// event type and the property that carries its quantity.
func newMetronome(s Settings) (billing.Client, error) {
	return metronomebilling.FromProvider(s.Provider, s.Token, s.Timeout, s.Now)
}
