package billingsettlement

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// After datedUntil a request goes undated, but the copy the provider may hold is the
// dated one: every request sent or asked about (and the reconciliation pass's, built by
// settlement.RequestOf) carries the pinned usage date, so a lookup reaches back to it.
func TestUndatedRequestCarriesThePinnedUsageDate(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	done := metav1.NewTime(now.Add(-10 * time.Minute))
	until := metav1.NewTime(now.Add(40 * time.Minute))
	bs := &hooksv1alpha1.BillingSettlement{Spec: hooksv1alpha1.BillingSettlementSpec{Type: hooksv1alpha1.SettlementCharge,
		Usage: &hooksv1alpha1.Usage{Meter: "tokens", Quantity: "5"}, OccurredAt: &done},
		Status: hooksv1alpha1.BillingSettlementStatus{UsageDatedAt: &done, DatedUntil: &until}}
	s := &settlementScope{bs: bs, now: now, client: dater{until: until.Time}}
	late := s.requestAt(until.Add(time.Hour))
	if !late.OccurredAt.IsZero() {
		t.Fatalf("sent dated %v after datedUntil", late.OccurredAt)
	}
	if !late.DatedAt.Equal(done.Time) {
		t.Fatalf("the undated request after datedUntil carries usage date %v, want the pinned %v", late.DatedAt, done.Time)
	}
	if got := settlement.RequestOf(bs, "", "").DatedAt; !got.Equal(done.Time) {
		t.Fatalf("the reconciliation pass's request carries usage date %v, want the pinned %v", got, done.Time)
	}
}
