package settlement

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// TestReversalConflict: a Void goes only alone, a Refund never beside a Void, and a
// compensation that never sent anything itself (held by its guard, say) blocks nothing.
// (That two compensations of one charge cannot both pass is the lock's and the
// bracket's doing: see TestCompensationLocks.)
func TestReversalConflict(t *testing.T) {
	orig := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Name: "charge"}}
	comp := func(name string, typ hooksv1alpha1.SettlementType, st hooksv1alpha1.BillingSettlementStatus) hooksv1alpha1.BillingSettlement {
		return hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: hooksv1alpha1.BillingSettlementSpec{Type: typ, Reverses: orig.Name}, Status: st}
	}
	settled := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSettled, Exposure: hooksv1alpha1.ExposureConfirmed,
		Attempts: 1, FirstSubmittedAt: &metav1.Time{}}
	bracketed := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSubmitted, Exposure: hooksv1alpha1.ExposurePossible,
		Attempts: 1, FirstSubmittedAt: &metav1.Time{}, SentTo: &hooksv1alpha1.ProviderTarget{Endpoint: "x"}}
	held := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementPending, Exposure: hooksv1alpha1.ExposurePossible}
	claimed := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementPending, Exposure: hooksv1alpha1.ExposureNone, ClaimedAt: &metav1.Time{}}
	refused := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementFailed, Exposure: hooksv1alpha1.ExposureNone, Attempts: 1,
		FirstSubmittedAt: &metav1.Time{}}
	unknown := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementRequiresReconciliation, Exposure: hooksv1alpha1.ExposurePossible,
		Attempts: 1, FirstSubmittedAt: &metav1.Time{}}
	// Never sent by themselves, but something may be at the provider under their keys.
	foundOther := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementRequiresReconciliation,
		Exposure: hooksv1alpha1.ExposurePossible, Disagreement: &hooksv1alpha1.ProviderDisagreement{Reason: hooksv1alpha1.ReasonMismatchWithProvider}}
	cannotAsk := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementRequiresReconciliation, Exposure: hooksv1alpha1.ExposurePossible}
	void, refund := hooksv1alpha1.SettlementVoid, hooksv1alpha1.SettlementRefund
	other := hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"},
		Spec: hooksv1alpha1.BillingSettlementSpec{Type: void, Reverses: "another-charge"}, Status: settled}

	for _, c := range []struct {
		name    string
		bs      hooksv1alpha1.BillingSettlement
		others  []hooksv1alpha1.BillingSettlement
		blocked bool
	}{
		{"a Void alone", comp("b", void, held), []hooksv1alpha1.BillingSettlement{other}, false},
		{"a Void beside a settled Refund", comp("b", void, held), []hooksv1alpha1.BillingSettlement{comp("a", refund, settled)}, true},
		{"a Void beside a Refund in flight", comp("a", void, held), []hooksv1alpha1.BillingSettlement{comp("b", refund, bracketed)}, true},
		{"a Void beside a Void whose outcome is unknown", comp("a", void, held), []hooksv1alpha1.BillingSettlement{comp("b", void, unknown)}, true},
		{"a Void beside a refused Refund", comp("b", void, held), []hooksv1alpha1.BillingSettlement{comp("a", refund, refused)}, false},
		{"a Void beside a Void held by its guard", comp("b", void, held), []hooksv1alpha1.BillingSettlement{comp("a", void, held)}, false},
		{"a Void beside a Refund that claimed the charge (it may be sending, in another process)", comp("b", void, held),
			[]hooksv1alpha1.BillingSettlement{comp("a", refund, claimed)}, true},
		{"a Refund beside a Void that claimed the charge", comp("b", refund, held),
			[]hooksv1alpha1.BillingSettlement{comp("a", void, claimed)}, true},
		{"a Void beside a Refund held by its guard", comp("b", void, held), []hooksv1alpha1.BillingSettlement{comp("a", refund, held)}, false},
		{"a Refund beside a settled Void", comp("b", refund, held), []hooksv1alpha1.BillingSettlement{comp("a", void, settled)}, true},
		{"a Refund beside a Void in flight", comp("b", refund, held), []hooksv1alpha1.BillingSettlement{comp("a", void, bracketed)}, true},
		{"a Refund beside a refused Void", comp("b", refund, held), []hooksv1alpha1.BillingSettlement{comp("a", void, refused)}, false},
		{"a Refund beside another Refund (the total decides)", comp("b", refund, held), []hooksv1alpha1.BillingSettlement{comp("a", refund, settled)}, false},
		{"a Void beside a Refund never sent that found a record not provably its own", comp("b", void, held),
			[]hooksv1alpha1.BillingSettlement{comp("a", refund, foundOther)}, true},
		{"a Void beside a Refund never sent whose lookup could not answer", comp("b", void, held),
			[]hooksv1alpha1.BillingSettlement{comp("a", refund, cannotAsk)}, true},
	} {
		bs := c.bs
		all := append([]hooksv1alpha1.BillingSettlement{bs}, c.others...)
		if why := ReversalConflict(&bs, orig, all); (why != "") != c.blocked {
			t.Errorf("%s: %q, want blocked=%v", c.name, why, c.blocked)
		}
	}
}

// TestWithoutLaterClaims: of two claims on one charge that see each other, the earlier
// (older, then by name) waits and the later steps back; neither goes while the other
// claim stands, and a compensation already sent is never dropped.
func TestWithoutLaterClaims(t *testing.T) {
	orig := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Name: "charge"}}
	at := func(sec int64) metav1.Time { return metav1.Unix(1_700_000_000+sec, 0) }
	comp := func(name string, created metav1.Time, typ hooksv1alpha1.SettlementType, st hooksv1alpha1.BillingSettlementStatus) hooksv1alpha1.BillingSettlement {
		return hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created},
			Spec: hooksv1alpha1.BillingSettlementSpec{Type: typ, Reverses: orig.Name}, Status: st}
	}
	claimed := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementPending, ClaimedAt: &metav1.Time{}}
	sent := hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSubmitted, Exposure: hooksv1alpha1.ExposurePossible,
		Attempts: 1, FirstSubmittedAt: &metav1.Time{}, ClaimedAt: &metav1.Time{}}
	void, refund := hooksv1alpha1.SettlementVoid, hooksv1alpha1.SettlementRefund
	passes := func(bs hooksv1alpha1.BillingSettlement, others ...hooksv1alpha1.BillingSettlement) (all, withoutLater bool) {
		list := append([]hooksv1alpha1.BillingSettlement{bs}, others...)
		return ReversalConflict(&bs, orig, list) == "", ReversalConflict(&bs, orig, WithoutLaterClaims(&bs, orig, list)) == ""
	}
	for _, c := range []struct {
		name          string
		a, b          hooksv1alpha1.BillingSettlement
		aWaits, bWait bool
	}{
		{"older first", comp("z-void", at(0), void, claimed), comp("a-refund", at(1), refund, claimed), true, false},
		{"same second: by name", comp("a-void", at(0), void, claimed), comp("b-refund", at(0), refund, claimed), true, false},
		{"the other already sent: both step back or are held", comp("a-void", at(0), void, claimed), comp("b-refund", at(1), refund, sent), false, false},
	} {
		aAll, aWait := passes(c.a, c.b)
		bAll, bWait := passes(c.b, c.a)
		if aAll || bAll {
			t.Errorf("%s: a claim passed beside a conflicting one (a %v, b %v)", c.name, aAll, bAll)
		}
		if aWait != c.aWaits || bWait != c.bWait {
			t.Errorf("%s: a waits %v, b waits %v; want %v, %v", c.name, aWait, bWait, c.aWaits, c.bWait)
		}
	}
}

// TestWithArchived: an archived compensation counts even when a record of the same
// name was created again in the cluster (its ArchivedDuplicate moved nothing).
func TestWithArchived(t *testing.T) {
	mk := func(uid string, st hooksv1alpha1.SettlementState) hooksv1alpha1.BillingSettlement {
		return hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Name: "refund-1", UID: types.UID(uid)},
			Status: hooksv1alpha1.BillingSettlementStatus{State: st}}
	}
	recreated, archived := mk("u2", hooksv1alpha1.SettlementFailed), mk("u1", hooksv1alpha1.SettlementSettled)
	got := WithArchived([]hooksv1alpha1.BillingSettlement{recreated}, []hooksv1alpha1.BillingSettlement{archived, recreated})
	if len(got) != 2 || got[1].UID != "u1" {
		t.Fatalf("got %d records %+v, want the re-created one and the archived one", len(got), got)
	}
}
