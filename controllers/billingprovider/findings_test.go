package billingprovider

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
)

// TestNewFindingsCountedOnce runs passes of one provider through passState and
// findingMemory as pass() does and checks which findings are counted as new.
func TestNewFindingsCountedOnce(t *testing.T) {
	stuck := hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancySettlementStuck, Object: "BillingSettlement/a"}
	stranger := hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderRecordWithoutSettlement, ProviderRef: "pay_1"}
	otherStranger := hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderRecordWithoutSettlement, ProviderRef: "pay_2"}
	passes := []struct {
		name     string
		findings []hooksv1alpha1.Discrepancy
		complete bool
		// newStuck, newStrangers: how much each counter grows in this pass.
		newStuck, newStrangers float64
	}{
		{"first pass counts everything", []hooksv1alpha1.Discrepancy{stuck, stranger}, true, 1, 1},
		{"the same findings again count nothing", []hooksv1alpha1.Discrepancy{stuck, stranger}, true, 0, 0},
		{"a finding listed twice in one pass counts once", []hooksv1alpha1.Discrepancy{stuck, stranger, otherStranger, otherStranger}, true, 0, 1},
		{"a pass cut short forgets nothing", []hooksv1alpha1.Discrepancy{stuck}, false, 0, 0},
		{"so the next complete pass does not count them again", []hooksv1alpha1.Discrepancy{stuck, stranger, otherStranger}, true, 0, 0},
		{"gone for a complete pass", []hooksv1alpha1.Discrepancy{stuck}, true, 0, 0},
		{"and back: new again", []hooksv1alpha1.Discrepancy{stuck, stranger}, true, 0, 1},
	}
	var mem findingMemory
	const ns, bp, uid = "findings-test", "billing", "uid-1"
	stuckC := metrics.DiscrepanciesFound.WithLabelValues(ns, bp, string(hooksv1alpha1.DiscrepancySettlementStuck))
	strangerC := metrics.DiscrepanciesFound.WithLabelValues(ns, bp, string(hooksv1alpha1.DiscrepancyProviderRecordWithoutSettlement))
	for _, pass := range passes {
		stuckBefore, strangersBefore := testutil.ToFloat64(stuckC), testutil.ToFloat64(strangerC)
		p := &passState{report: &hooksv1alpha1.ReconciliationReportStatus{}, byType: map[hooksv1alpha1.DiscrepancyType]int32{},
			examined: map[string]int32{}, namespace: ns, provider: bp, previous: mem.last(uid), seen: map[uint64]struct{}{}}
		for _, d := range pass.findings {
			p.add(d)
		}
		mem.remember(uid, p.seen, p.previous, pass.complete)
		if got := testutil.ToFloat64(stuckC) - stuckBefore; got != pass.newStuck {
			t.Errorf("%s: %v new SettlementStuck, want %v", pass.name, got, pass.newStuck)
		}
		if got := testutil.ToFloat64(strangerC) - strangersBefore; got != pass.newStrangers {
			t.Errorf("%s: %v new ProviderRecordWithoutSettlement, want %v", pass.name, got, pass.newStrangers)
		}
	}
	mem.forget(uid)
	if mem.last(uid) != nil {
		t.Error("a deleted provider's findings are kept")
	}
}
