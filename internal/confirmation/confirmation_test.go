package confirmation

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

func settlement(uid, rv string) *hooksv1alpha1.BillingSettlement {
	return &hooksv1alpha1.BillingSettlement{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), ResourceVersion: rv, Name: "s-" + uid},
		Spec:       hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing"},
		Status:     hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSettled, ProviderRef: "ch_1"},
	}
}

func report(name, provider, providerUID string, end time.Time, reason string, versions ...string) hooksv1alpha1.ReconciliationReport {
	return hooksv1alpha1.ReconciliationReport{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       hooksv1alpha1.ReconciliationReportSpec{BillingProviderRef: provider, WindowEnd: metav1.NewTime(end)},
		Status: hooksv1alpha1.ReconciliationReportStatus{Confirmed: &hooksv1alpha1.SettlementConfirmations{
			BillingProviderUID: providerUID,
			ByReason:           []hooksv1alpha1.ConfirmationGroup{{Reason: reason, Settlements: versions}}}},
	}
}

// A report confirms exactly one version of one settlement, for the provider that wrote
// it; the newest of several is named.
func TestFind(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	bs := settlement("u1", "7")
	reports := []hooksv1alpha1.ReconciliationReport{
		report("older", "billing", "bp1", t0, hooksv1alpha1.ReasonConfirmedByProvider, "u1/7"),
		report("newer", "billing", "bp1", t0.Add(time.Minute), hooksv1alpha1.ReasonVoided, "u0/1", "u1/7"),
		report("other-version", "billing", "bp1", t0.Add(time.Hour), hooksv1alpha1.ReasonConfirmedByProvider, "u1/6"),
		report("other-provider-uid", "billing", "bp0", t0.Add(time.Hour), hooksv1alpha1.ReasonConfirmedByProvider, "u1/7"),
		report("other-provider", "stripe", "bp1", t0.Add(time.Hour), hooksv1alpha1.ReasonConfirmedByProvider, "u1/7"),
	}
	rr, reason, ok := Find(reports, "bp1", bs)
	if !ok || rr.Name != "newer" || reason != hooksv1alpha1.ReasonVoided {
		t.Fatalf("Find = %v %q %v, want newer Voided", rr, reason, ok)
	}
	if _, _, ok := Find(reports, "bp1", settlement("u1", "8")); ok {
		t.Fatal("a version no report confirms was found confirmed")
	}
	if _, _, ok := Find(reports, "bp2", bs); ok {
		t.Fatal("another provider's reports confirmed it")
	}

	Apply(bs, rr, reason)
	c := bs.Status.Conditions[0]
	if c.Type != hooksv1alpha1.ConditionReconciled || c.Status != metav1.ConditionTrue || c.Reason != hooksv1alpha1.ReasonVoided ||
		!strings.Contains(c.Message, "newer") || !c.LastTransitionTime.Equal(&rr.Spec.WindowEnd) || !bs.Status.LastReconciledAt.Equal(&rr.Spec.WindowEnd) {
		t.Fatalf("Apply wrote %+v, lastReconciledAt %v", c, bs.Status.LastReconciledAt)
	}
}

// A pass's confirmations stop at the cap (the caller marks the rest), count a settlement
// once, and a settlement confirmed at another version than it has is asked about again.
func TestSet(t *testing.T) {
	s := NewSet([]hooksv1alpha1.ReconciliationReport{
		report("kept", "billing", "bp1", time.Now(), hooksv1alpha1.ReasonConfirmedByProvider, "changed/1", "same/1"),
	}, "bp1")
	if !s.ChangedSince(settlement("changed", "2")) || s.ChangedSince(settlement("same", "1")) || s.ChangedSince(settlement("new", "1")) {
		t.Fatal("ChangedSince: only a settlement confirmed at another version changed since")
	}
	if !s.Holds(settlement("same", "1")) || s.Holds(settlement("changed", "2")) || s.Holds(settlement("new", "1")) {
		t.Fatal("Holds: only a settlement a kept report confirmed at its current version is held")
	}
	if other := NewSet([]hooksv1alpha1.ReconciliationReport{
		report("kept", "billing", "bp1", time.Now(), hooksv1alpha1.ReasonConfirmedByProvider, "same/1"),
	}, "bp2"); other.Holds(settlement("same", "1")) {
		t.Fatal("Holds: another provider's report confirms nothing")
	}
	for i := range hooksv1alpha1.MaxConfirmedSettlements {
		if !s.Add(hooksv1alpha1.ReasonConfirmedByProvider, settlement(fmt.Sprint(i), "1")) {
			t.Fatalf("refused confirmation %d, under the cap", i)
		}
	}
	if !s.Add(hooksv1alpha1.ReasonConfirmedByProvider, settlement("0", "1")) {
		t.Fatal("a settlement confirmed twice counts once")
	}
	if s.Add(hooksv1alpha1.ReasonConfirmedByProvider, settlement("past-the-cap", "1")) {
		t.Fatal("a confirmation past the cap was taken")
	}
	var st hooksv1alpha1.ReconciliationReportStatus
	s.Fill(&st, "bp1")
	if st.Confirmed == nil || len(st.Confirmed.ByReason) != 1 || len(st.Confirmed.ByReason[0].Settlements) != hooksv1alpha1.MaxConfirmedSettlements {
		t.Fatalf("Fill wrote %+v", st.Confirmed)
	}
}
