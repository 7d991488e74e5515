package settlement

import (
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// RetryPolicy is how a settlement is retried at its provider: every retry uses the
// same key. MaxAttempts 0 means no cap on attempts (MaxElapsed bounds them).
type RetryPolicy struct {
	MaxAttempts                                         int32
	MaxElapsed, Initial, Max, KeyWindow, RequestTimeout time.Duration
}

// PolicyOf is bp's retry policy for a request its provider answers as caps says. The
// key window is the shorter of spec.idempotencyWindow and the provider's own
// (caps.Window), and zero for a provider that does not deduplicate
// (caps.NoDeduplication). Unless spec.retry sets them, the retry budget lasts as long as a
// resend under the key is safe — the key window less what resendableUntil keeps clear
// of its end — with no cap on attempts: a short outage never becomes manual work while
// the provider would still deduplicate the resend.
func PolicyOf(bp *hooksv1alpha1.BillingProvider, caps billing.Capabilities) RetryPolicy {
	p := RetryPolicy{Initial: DefaultInitialBackoff, Max: DefaultMaxBackoff,
		KeyWindow:      DurationOr(bp.Spec.IdempotencyWindow, DefaultIdempotencyWindow),
		RequestTimeout: RequestTimeoutOf(bp)}
	if caps.Window > 0 && caps.Window < p.KeyWindow {
		p.KeyWindow = caps.Window
	}
	p.MaxElapsed = max(p.KeyWindow-resendMargin-2*p.RequestTimeout, minMaxElapsed)
	if caps.NoDeduplication {
		// Nothing is deduplicated, so no resend is ever safe after an attempt that may
		// have reached the provider: the key window is zero. The budget still bounds
		// resends of attempts that provably did not (429, refused connections), which
		// are safe whatever the provider deduplicates: spec.idempotencyWindow sets it.
		p.KeyWindow = 0
	}
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

// minMaxElapsed is the shortest default retry budget, for a key window shorter than
// its margins.
const minMaxElapsed = time.Minute

// Defaults applied when a BillingProvider predates a field (the API server defaults
// them on write; these keep a zero from ever meaning "retry in a tight loop").
const (
	DefaultInitialBackoff    = time.Second
	DefaultMaxBackoff        = 5 * time.Minute
	DefaultIdempotencyWindow = 24 * time.Hour
	DefaultRequestTimeout    = 10 * time.Second
	maxPollInterval          = time.Minute
)

// MaxRequestTimeout is the longest a call to a billing provider may take, the bound
// the CRD puts on spec.requestTimeout (docs/design.md §5.4). An object written before
// the bound keeps its larger value (validation ratcheting), and is held to this one.
const MaxRequestTimeout = time.Minute

// RequestTimeoutOf is how long each call to bp may take: spec.requestTimeout (10s
// when unset), at most MaxRequestTimeout.
func RequestTimeoutOf(bp *hooksv1alpha1.BillingProvider) time.Duration {
	return min(DurationOr(bp.Spec.RequestTimeout, DefaultRequestTimeout), MaxRequestTimeout)
}

// DurationOr returns d's value, or def when d is unset or zero (the API server
// defaults these fields, but a zero must never mean "retry in a tight loop").
func DurationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil || d.Duration <= 0 {
		return def
	}
	return d.Duration
}
