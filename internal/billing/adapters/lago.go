package adapters

import (
	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/lagobilling"
)

// newLago builds the Lago adapter from spec.lago: each usage meter's billable metric
// (code and field_name), and the grace period within which usage is dated at the job's
// completion.
func newLago(s Settings) (billing.Client, error) {
	cfg := lagobilling.Config{Endpoint: s.Provider.Spec.Endpoint, APIKey: s.Token, Timeout: s.Timeout, Now: s.Now, Metrics: map[string]lagobilling.Metric{}}
	if l := s.Provider.Spec.Lago; l != nil {
		for _, m := range l.Metrics {
			cfg.Metrics[m.Meter] = lagobilling.Metric{Code: m.Code, FieldName: m.FieldName}
		}
		if l.GracePeriod != nil {
			cfg.GracePeriod = l.GracePeriod.Duration
		}
		cfg.AsyncIngest = lagoAsync(s.Provider)
	}
	// A request may be sent up to the key window after its first attempt, or as long as
	// the retry budget lasts when spec.retry.maxElapsed is longer: List reaches back so far.
	cfg.LateRetry = lagobilling.DefaultLateRetry
	if w := s.Provider.Spec.IdempotencyWindow; w != nil && w.Duration > 0 {
		cfg.LateRetry = w.Duration
	}
	if r := s.Provider.Spec.Retry; r != nil && r.MaxElapsed != nil && r.MaxElapsed.Duration > cfg.LateRetry {
		cfg.LateRetry = r.MaxElapsed.Duration
	}
	return lagobilling.New(cfg)
}

// lagoAsync says whether bp's Lago organization ingests asynchronously (ClickHouse).
func lagoAsync(bp *hooksv1alpha1.BillingProvider) bool {
	return bp.Spec.Lago != nil && bp.Spec.Lago.EventPipeline == hooksv1alpha1.LagoPipelineClickHouse
}

func lagoCapabilities(bp *hooksv1alpha1.BillingProvider, r billing.Request) billing.Capabilities {
	return lagobilling.PipelineCapabilities(lagoAsync(bp), r)
}
