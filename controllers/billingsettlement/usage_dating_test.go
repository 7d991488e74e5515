package billingsettlement

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// dater dates usage of meter "tokens" until a fixed time, like Stripe for a meter with
// timestamp: Completion.
type dater struct {
	billing.Client
	until time.Time
}

func (d dater) DateUsage(meter string, occurredAt, now time.Time) time.Time {
	if meter != "tokens" || !now.Before(d.until) {
		return time.Time{}
	}
	return d.until
}

// TestUsageDating: the usage time is pinned at the first attempt, sent until datedUntil
// and never after; a compensation or an adapter that does not date sends none.
func TestUsageDating(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	done := metav1.NewTime(now.Add(-10 * time.Minute))
	bs := &hooksv1alpha1.BillingSettlement{Spec: hooksv1alpha1.BillingSettlementSpec{Type: hooksv1alpha1.SettlementCharge,
		Usage: &hooksv1alpha1.Usage{Meter: "tokens", Quantity: "5"}, OccurredAt: &done}}
	s := &settlementScope{bs: bs, now: now, client: dater{until: now.Add(40 * time.Minute)}}
	s.dateUsage()
	if st := bs.Status; st.UsageDatedAt == nil || !st.UsageDatedAt.Equal(&done) || st.DatedUntil == nil || !st.DatedUntil.Time.Equal(now.Add(40*time.Minute)) {
		t.Fatalf("pinned %v until %v, want %v until +40m", st.UsageDatedAt, st.DatedUntil, done)
	}
	if got := s.request().OccurredAt; !got.Equal(done.Time) {
		t.Fatalf("sent dated %v, want %v", got, done)
	}
	// Not pinned when the first attempt could arrive after the bound.
	late := &settlementScope{bs: &hooksv1alpha1.BillingSettlement{Spec: *bs.Spec.DeepCopy()}, now: now.Add(39*time.Minute + 30*time.Second),
		client: dater{until: now.Add(40 * time.Minute)}, policy: settlement.RetryPolicy{RequestTimeout: time.Second}}
	late.dateUsage()
	if late.bs.Status.UsageDatedAt != nil {
		t.Fatalf("pinned %v for a first attempt that could arrive after the bound", late.bs.Status.UsageDatedAt)
	}
	// The adapter's answer is asked once: later it would say otherwise.
	s.client = dater{}
	s.dateUsage()
	if bs.Status.UsageDatedAt == nil {
		t.Fatal("the pinned date was dropped")
	}
	// Sent so late that it could arrive (request timeout + skew) after datedUntil.
	s.client, s.policy.RequestTimeout = dater{until: now.Add(40 * time.Minute)}, 30*time.Second
	if got := s.requestAt(now.Add(38*time.Minute + 29*time.Second)).OccurredAt; !got.Equal(done.Time) {
		t.Fatalf("sent %v 91 s before datedUntil, want dated", got)
	}
	if got := s.requestAt(now.Add(38*time.Minute + 31*time.Second)).OccurredAt; !got.IsZero() {
		t.Fatalf("sent dated %v 89 s before datedUntil with a 30 s timeout and 1 min skew, want undated", got)
	}
	// A bound the adapter lowers since (a shorter grace period) is kept too.
	s.client = dater{until: now.Add(20 * time.Minute)}
	if got := s.requestAt(now.Add(19 * time.Minute)).OccurredAt; !got.IsZero() {
		t.Fatalf("sent dated %v past the adapter's bound today, want undated", got)
	}

	for name, c := range map[string]*settlementScope{
		"an adapter that does not date": {bs: bs.DeepCopy(), now: now, client: struct{ billing.Client }{}},
		"another meter": {bs: func() *hooksv1alpha1.BillingSettlement {
			b := bs.DeepCopy()
			b.Spec.Usage.Meter = "gpu"
			return b
		}(), now: now, client: dater{until: now.Add(time.Hour)}},
		"no usage time": {bs: func() *hooksv1alpha1.BillingSettlement {
			b := bs.DeepCopy()
			b.Spec.OccurredAt = nil
			return b
		}(), now: now, client: dater{until: now.Add(time.Hour)}},
	} {
		c.bs.Status = hooksv1alpha1.BillingSettlementStatus{}
		c.dateUsage()
		if c.bs.Status.UsageDatedAt != nil || !c.request().OccurredAt.IsZero() {
			t.Errorf("%s: dated %v", name, c.bs.Status.UsageDatedAt)
		}
	}
}

// TestLateForKey: a resend of what may be at the provider is held when, by the clock
// right before the call, it could arrive after the key window; a first attempt, or one
// with nothing at the provider, never is.
func TestLateForKey(t *testing.T) {
	first := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	p := settlement.RetryPolicy{KeyWindow: 24 * time.Hour, RequestTimeout: 30 * time.Second}
	scope := func(sent bool) *settlementScope {
		bs := &hooksv1alpha1.BillingSettlement{}
		if sent {
			at := metav1.NewTime(first)
			bs.Status.FirstSubmittedAt = &at
		}
		return &settlementScope{bs: bs, before: bs.DeepCopy(), policy: p}
	}
	possible, none := hooksv1alpha1.ExposurePossible, hooksv1alpha1.ExposureNone
	edge := first.Add(24*time.Hour - 30*time.Second - dateSkew) // arrives exactly at the window's end
	for _, c := range []struct {
		name  string
		s     *settlementScope
		prior hooksv1alpha1.Exposure
		now   time.Time
		held  bool
	}{
		{"a resend well inside the window", scope(true), possible, first.Add(23 * time.Hour), false},
		{"a resend that could arrive just before the end", scope(true), possible, edge.Add(-time.Second), false},
		{"a resend that could arrive at the end", scope(true), possible, edge, true},
		{"a resend past the window", scope(true), possible, first.Add(25 * time.Hour), true},
		{"nothing at the provider", scope(true), none, first.Add(25 * time.Hour), false},
		{"a first attempt", scope(false), possible, first.Add(25 * time.Hour), false},
	} {
		h := lateForKey(c.s, c.prior, c.now)
		if (h.why != "") != c.held {
			t.Errorf("%s: hold %q, want held=%v", c.name, h.why, c.held)
		}
		if c.held && h.reason != hooksv1alpha1.ReasonOutcomeUnknown {
			t.Errorf("%s: reason %q", c.name, h.reason)
		}
	}
}
