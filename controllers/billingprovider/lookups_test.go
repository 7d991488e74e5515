package billingprovider

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestPassIntervalAfterRateLimit: a pass whose lookups the provider rate limited is
// followed by the next after the provider's Retry-After (at least a second), never
// later than the interval; a limit that ran out before a later pass, which did not get
// to its lookups (a failed or cut walk), hurries nothing; a deleted provider's is gone.
func TestPassIntervalAfterRateLimit(t *testing.T) {
	const uid = types.UID("bp-1")
	start := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	policy := reconciliationPolicy{interval: 10 * time.Minute}
	r := &Reconciler{}
	if got := r.passInterval(uid, policy, start); got != policy.interval {
		t.Fatalf("before any limit: %s, want the interval", got)
	}
	r.lookups.keep(uid, lookupState{resumeAt: start.Add(30 * time.Second)})
	for _, tc := range []struct {
		name string
		from time.Time
		want time.Duration
	}{
		{"from the limited pass's start", start, 30 * time.Second},
		{"from its end", start.Add(20 * time.Second), 10 * time.Second},
		{"just before it runs out", start.Add(30*time.Second - time.Millisecond), minLookupRetry},
		{"from a later pass", start.Add(31 * time.Second), policy.interval},
	} {
		if got := r.passInterval(uid, policy, tc.from); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	if got := r.passInterval(uid, reconciliationPolicy{interval: 5 * time.Second}, start); got != 5*time.Second {
		t.Errorf("a Retry-After longer than the interval: %s, want the interval", got)
	}
	r.lookups.drop(uid)
	if got := r.passInterval(uid, policy, start); got != policy.interval {
		t.Errorf("after drop: %s, want the interval", got)
	}
}
