// Package confirmation is what a reconciliation pass confirmed, as its
// ReconciliationReport records it with the archive on (docs/design.md §7, §12): per
// settlement its UID and the resourceVersion the pass compared, under the reason of the
// Reconciled condition. The pass collects them; the archiver reads them and writes the
// condition into the object it archives, so no settlement is written for them.
package confirmation

import (
	"fmt"
	"strings"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// Version names one version of a settlement: "<uid>/<resourceVersion>".
func Version(bs *hooksv1alpha1.BillingSettlement) string {
	return hooksv1alpha1.ConfirmedVersion(string(bs.UID), bs.ResourceVersion)
}

// UIDOf is the UID part of a confirmed version ("" when it is malformed).
func UIDOf(v string) types.UID {
	uid, _, ok := strings.Cut(v, "/")
	if !ok {
		return ""
	}
	return types.UID(uid)
}

// Confirmed reports a settled settlement that already carries Reconciled=True.
func Confirmed(bs *hooksv1alpha1.BillingSettlement) bool {
	return apimeta.IsStatusConditionTrue(bs.Status.Conditions, hooksv1alpha1.ConditionReconciled)
}

// Find returns the newest of reports that confirms bs at exactly its current version,
// for the BillingProvider with UID providerUID, and the reason it confirmed it for.
// A report of another provider, or of an earlier provider under the same name, or one
// that confirmed an earlier version of bs (a refund added to reversedBy since) confirms
// nothing. reports are read, never changed.
func Find(reports []hooksv1alpha1.ReconciliationReport, providerUID types.UID,
	bs *hooksv1alpha1.BillingSettlement) (*hooksv1alpha1.ReconciliationReport, string, bool) {
	if providerUID == "" || bs.UID == "" || bs.ResourceVersion == "" {
		return nil, "", false
	}
	want := Version(bs)
	var found *hooksv1alpha1.ReconciliationReport
	reason := ""
	for i := range reports {
		rr := &reports[i]
		c := rr.Status.Confirmed
		if c == nil || types.UID(c.BillingProviderUID) != providerUID || rr.Spec.BillingProviderRef != bs.Spec.BillingProviderRef {
			continue
		}
		if found != nil && !found.Spec.WindowEnd.Before(&rr.Spec.WindowEnd) {
			continue
		}
		for _, g := range c.ByReason {
			if contains(g.Settlements, want) {
				found, reason = rr, g.Reason
				break
			}
		}
	}
	return found, reason, found != nil
}

func contains(vs []string, v string) bool {
	for _, s := range vs {
		if s == v {
			return true
		}
	}
	return false
}

// Message is the Reconciled condition's message for a settlement a report confirmed.
func Message(reason string, bs *hooksv1alpha1.BillingSettlement, report string) string {
	switch reason {
	case hooksv1alpha1.ReasonConfirmedByProvider:
		if bs.Status.ProviderRef != "" {
			return fmt.Sprintf("the provider's record %s matches (ReconciliationReport %s)", bs.Status.ProviderRef, report)
		}
		return fmt.Sprintf("the provider's record matches (ReconciliationReport %s)", report)
	case hooksv1alpha1.ReasonProviderCannotAnswer:
		return fmt.Sprintf("the provider cannot list or read back this kind of record: it rests on the provider's answer to its submission (ReconciliationReport %s)", report)
	case hooksv1alpha1.ReasonVoided:
		return fmt.Sprintf("the provider no longer has %s: a settled Void cancelled it (ReconciliationReport %s)", bs.Status.ProviderRef, report)
	}
	return fmt.Sprintf("confirmed by ReconciliationReport %s", report)
}

// Apply sets Reconciled=True and lastReconciledAt on bs as report rr confirmed it, at
// the time of its pass. It changes only bs (the caller's copy).
func Apply(bs *hooksv1alpha1.BillingSettlement, rr *hooksv1alpha1.ReconciliationReport, reason string) {
	at := rr.Spec.WindowEnd
	bs.Status.LastReconciledAt = &at
	apimeta.SetStatusCondition(&bs.Status.Conditions, metav1.Condition{Type: hooksv1alpha1.ConditionReconciled,
		Status: metav1.ConditionTrue, Reason: reason, Message: Message(reason, bs, rr.Name),
		ObservedGeneration: bs.Generation, LastTransitionTime: at})
}

// Set collects one pass's confirmations, bounded by
// hooksv1alpha1.MaxConfirmedSettlements.
type Set struct {
	byReason map[string][]string
	seen     map[types.UID]bool
	n        int
	// Marked counts confirmations past the cap (written on the settlements instead).
	Marked int32
	// earlier holds, per settlement UID, the versions the provider's kept reports
	// confirmed.
	earlier map[types.UID]map[string]bool
}

// NewSet starts a pass's confirmations, knowing what the provider's kept reports
// (those with providerUID) confirmed.
func NewSet(reports []hooksv1alpha1.ReconciliationReport, providerUID types.UID) *Set {
	s := &Set{byReason: map[string][]string{}, seen: map[types.UID]bool{}, earlier: map[types.UID]map[string]bool{}}
	for i := range reports {
		c := reports[i].Status.Confirmed
		if c == nil || types.UID(c.BillingProviderUID) != providerUID {
			continue
		}
		for _, g := range c.ByReason {
			for _, v := range g.Settlements {
				uid := UIDOf(v)
				if s.earlier[uid] == nil {
					s.earlier[uid] = map[string]bool{}
				}
				s.earlier[uid][v] = true
			}
		}
	}
	return s
}

// Add records that the pass confirmed bs at its current version for reason; false
// when the report is full (the caller marks the settlement itself).
func (s *Set) Add(reason string, bs *hooksv1alpha1.BillingSettlement) bool {
	if s.seen[bs.UID] {
		return true
	}
	if s.n >= hooksv1alpha1.MaxConfirmedSettlements {
		return false
	}
	s.seen[bs.UID] = true
	s.n++
	s.byReason[reason] = append(s.byReason[reason], Version(bs))
	return true
}

// Len is how many settlements this pass confirmed into its report.
func (s *Set) Len() int { return s.n }

// Holds reports a settlement a kept report confirmed at exactly its current version:
// the archiver counts it as confirmed (Find), so a pass need not ask about it again.
func (s *Set) Holds(bs *hooksv1alpha1.BillingSettlement) bool {
	return s.earlier[bs.UID][Version(bs)]
}

// ChangedSince reports a settlement a kept report confirmed at another version than
// its current one, and that carries no Reconciled condition: it changed after it was
// confirmed (a refund added to reversedBy), so the archiver waits, and the pass asks
// the provider about it again rather than let it wait for ever.
func (s *Set) ChangedSince(bs *hooksv1alpha1.BillingSettlement) bool {
	vs, ok := s.earlier[bs.UID]
	// One being deleted is on its way out (the archiver's delete changed it).
	return ok && !vs[Version(bs)] && !Confirmed(bs) && bs.DeletionTimestamp.IsZero()
}

// Fill writes the confirmations into a report's status (nothing when there are none).
func (s *Set) Fill(st *hooksv1alpha1.ReconciliationReportStatus, providerUID types.UID) {
	if s.n == 0 && s.Marked == 0 {
		return
	}
	c := &hooksv1alpha1.SettlementConfirmations{BillingProviderUID: string(providerUID), MarkedOnSettlements: s.Marked}
	for _, reason := range []string{hooksv1alpha1.ReasonConfirmedByProvider, hooksv1alpha1.ReasonProviderCannotAnswer, hooksv1alpha1.ReasonVoided} {
		if vs := s.byReason[reason]; len(vs) > 0 {
			c.ByReason = append(c.ByReason, hooksv1alpha1.ConfirmationGroup{Reason: reason, Settlements: vs})
		}
	}
	st.Confirmed = c
}
