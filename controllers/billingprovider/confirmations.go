package billingprovider

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
)

// reportsOf lists the provider's reports in the cache, read-only: they may hold
// thousands of confirmations each, and are not copied to be read.
func (r *Reconciler) reportsOf(ctx context.Context, bp *hooksv1alpha1.BillingProvider) ([]hooksv1alpha1.ReconciliationReport, error) {
	var l hooksv1alpha1.ReconciliationReportList
	if err := r.List(ctx, &l, client.InNamespace(bp.Namespace), client.UnsafeDisableDeepCopy,
		client.MatchingLabels{hooksv1alpha1.LabelBillingProvider: bp.Name}); err != nil {
		return nil, fmt.Errorf("list reports of %s: %w", bp.Name, err)
	}
	return l.Items, nil
}

// confirmBeforePrune keeps the confirmations of reports about to be pruned that the
// archiver has not taken yet: each settlement a pruned report confirmed, still in the
// cluster at the version confirmed, not marked, and confirmed by no kept report, is
// marked Reconciled=True on the settlement itself, naming the report. Otherwise a
// settlement settled before the next passes' window, whose confirmation is pruned
// before it is archived (an archive down for longer than keepReports passes, an
// --archive-after longer than that), would never be confirmed again and would stay in
// the cluster for ever. It costs a write only in that case.
//
// A report one of whose confirmations could not be marked (the write refused or
// failed) is not pruned this time: it is returned in held, and tried again at the next
// pass, so that no confirmation is lost while the settlement waits. So is a report
// that confirmed another version of a settlement than it has now, while the lookup
// that would confirm the version it has waits (lookupState.changed): that report is
// what has the next passes ask about it, after a restart too, and once it is pruned
// nothing would (docs/design.md §7, "Lookups by key").
func (r *Reconciler) confirmBeforePrune(ctx context.Context, bp *hooksv1alpha1.BillingProvider,
	pruned, kept []hooksv1alpha1.ReconciliationReport) (held map[string]bool, err error) {
	type pending struct {
		version, reason string
		report          *hooksv1alpha1.ReconciliationReport
	}
	byUID := map[types.UID]pending{}
	for i := range pruned {
		c := pruned[i].Status.Confirmed
		if c == nil || types.UID(c.BillingProviderUID) != bp.UID {
			continue
		}
		for _, g := range c.ByReason {
			for _, v := range g.Settlements {
				byUID[confirmation.UIDOf(v)] = pending{version: v, reason: g.Reason, report: &pruned[i]}
			}
		}
	}
	if len(byUID) == 0 {
		return nil, nil
	}
	// Read from the cache without copies; only a settlement to be marked is copied.
	var settlements hooksv1alpha1.BillingSettlementList
	if err := r.List(ctx, &settlements, client.InNamespace(bp.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list settlements: %w", err)
	}
	now := r.now()
	lookups := r.lookups.state(bp.UID)
	// waits says whether a pass still has to ask about bs, which a pruned report
	// confirmed at another version than it has: as the passes remember it, or, before
	// a pass of this process got to its lookups (after a restart, or while every pass
	// fails before them), from what is stored: settled, not confirmed, not going away,
	// and no kept report confirming the version it has.
	waits := func(bs *hooksv1alpha1.BillingSettlement) bool {
		if lookups.ran {
			return lookups.changed[bs.UID]
		}
		if bs.Status.State != hooksv1alpha1.SettlementSettled || confirmation.Confirmed(bs) || !bs.DeletionTimestamp.IsZero() {
			return false
		}
		_, _, confirmed := confirmation.Find(kept, bp.UID, bs)
		return !confirmed
	}
	for i := range settlements.Items {
		bs := &settlements.Items[i]
		pd, ok := byUID[bs.UID]
		if ok && pd.version != confirmation.Version(bs) && bs.Spec.BillingProviderRef == bp.Name && waits(bs) {
			if held == nil {
				held = map[string]bool{}
			}
			held[pd.report.Name] = true
			continue
		}
		if !ok || pd.version != confirmation.Version(bs) || confirmation.Confirmed(bs) || bs.Spec.BillingProviderRef != bp.Name {
			continue
		}
		if _, _, ok := confirmation.Find(kept, bp.UID, bs); ok {
			continue
		}
		err := r.markOnSettlement(ctx, bs.DeepCopy(), pd.reason, confirmation.Message(pd.reason, bs, pd.report.Name)+", marked as that report was pruned", now)
		if err != nil && !apierrors.IsNotFound(err) {
			if held == nil {
				held = map[string]bool{}
			}
			held[pd.report.Name] = true
			log.FromContext(ctx).Info("report kept past keepReports: a settlement it confirmed could not be marked",
				"report", pd.report.Name, "settlement", bs.Name, "error", err.Error())
		}
	}
	return held, nil
}
