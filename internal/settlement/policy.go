package settlement

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

type RetryPolicy struct {
	MaxAttempts                                         int32
	MaxElapsed, Initial, Max, KeyWindow, RequestTimeout time.Duration
}

func PolicyOf(bp *hooksv1alpha1.BillingProvider) RetryPolicy {
	p := RetryPolicy{MaxAttempts: DefaultMaxAttempts, MaxElapsed: DefaultMaxElapsed, Initial: DefaultInitialBackoff,
		Max: DefaultMaxBackoff, KeyWindow: DurationOr(bp.Spec.IdempotencyWindow, DefaultIdempotencyWindow),
		RequestTimeout: DurationOr(bp.Spec.RequestTimeout, DefaultRequestTimeout)}
	if rp := bp.Spec.Retry; rp != nil {
		if rp.MaxAttempts > 0 {
			p.MaxAttempts = rp.MaxAttempts
		}
		p.MaxElapsed = DurationOr(rp.MaxElapsed, p.MaxElapsed)
		p.Initial = DurationOr(rp.InitialBackoff, p.Initial)
		p.Max = DurationOr(rp.MaxBackoff, p.Max)
	}
	return p
}

// Defaults applied when a BillingProvider predates a field (the API server defaults
// them on write; these keep a zero from ever meaning "retry in a tight loop").
const (
	DefaultMaxAttempts       = 10
	DefaultMaxElapsed        = time.Hour
	DefaultInitialBackoff    = time.Second
	DefaultMaxBackoff        = 5 * time.Minute
	DefaultIdempotencyWindow = 24 * time.Hour
	DefaultRequestTimeout    = 10 * time.Second
	maxPollInterval          = time.Minute
)

// DurationOr returns d's value, or def when d is unset or zero (the API server
// defaults these fields, but a zero must never mean "retry in a tight loop").
func DurationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil || d.Duration <= 0 {
		return def
	}
	return d.Duration
}
