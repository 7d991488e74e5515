package billingprovider

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

// pass runs one reconciliation and returns its report's name and, when it finished a
// walk of the provider's list, the time that walk started (the new mark; else zero),
// or earlier when lookups by key wait for the next pass (passState.markAtMost).
func (r *Reconciler) pass(ctx context.Context, bp *hooksv1alpha1.BillingProvider, c billing.Client,
	policy reconciliationPolicy, now time.Time) (string, time.Time, error) {
	start := now.Add(-firstWindow)
	if bp.Status.LastReconciliation != nil {
		start = bp.Status.LastReconciliation.Time
	}
	rr := &hooksv1alpha1.ReconciliationReport{
		ObjectMeta: metav1.ObjectMeta{Namespace: bp.Namespace, Name: ReportName(bp.Name, now),
			Labels: map[string]string{hooksv1alpha1.LabelBillingProvider: bp.Name}},
		Spec: hooksv1alpha1.ReconciliationReportSpec{BillingProviderRef: bp.Name,
			WindowStart: metav1.NewTime(start), WindowEnd: metav1.NewTime(now)},
	}
	if err := r.Create(ctx, rr); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", time.Time{}, fmt.Errorf("create report %s: %w", rr.Name, err)
	} else if apierrors.IsAlreadyExists(err) {
		return rr.Name, time.Time{}, nil // a pass for this second already ran
	}
	base := rr.DeepCopy()
	p := &passState{report: &rr.Status, byType: map[hooksv1alpha1.DiscrepancyType]int32{}, examined: map[string]int32{},
		namespace: bp.Namespace, provider: bp.Name, previous: r.findings.last(bp.UID), seen: map[uint64]struct{}{}, windowStart: start}
	rr.Status.Phase = hooksv1alpha1.ReportRunning
	if r.Archive != nil {
		kept, err := r.reportsOf(ctx, bp)
		if err != nil {
			return "", time.Time{}, err
		}
		p.confirmed = confirmation.NewSet(kept, bp.UID)
	}

	cctx, cancel := context.WithTimeout(ctx, passDeadline(bp))
	err := r.compare(cctx, bp, c, policy, now, rr.Name, p)
	cancel()
	// A pass whose lookups wait for the next did not get to every finding: those of the
	// last pass are kept, so that one seen again later is not counted as new.
	r.findings.remember(bp.UID, p.seen, p.previous, err == nil && p.listedAll && p.lookupsWait == "")
	p.fillItems()
	if p.confirmed != nil {
		p.confirmed.Fill(&rr.Status, bp.UID)
	}
	rr.Status.ObservedGeneration = rr.Generation
	rr.Status.Examined = p.examined
	types := make([]string, 0, len(p.byType))
	for t := range p.byType {
		types = append(types, string(t))
	}
	sort.Strings(types)
	for _, t := range types {
		rr.Status.ByType = append(rr.Status.ByType, hooksv1alpha1.DiscrepancyCount{Type: hooksv1alpha1.DiscrepancyType(t), Count: p.byType[hooksv1alpha1.DiscrepancyType(t)]})
	}
	done := metav1.NewTime(r.now())
	rr.Status.CompletedAt = &done
	if err != nil {
		rr.Status.Phase = hooksv1alpha1.ReportFailed
		conditions.Set(&rr.Status.Conditions, rr.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			providerclient.ReportFailureReason(err), conditions.TruncateMessage(err.Error()))
	} else {
		rr.Status.Phase = hooksv1alpha1.ReportCompleted
		msg := fmt.Sprintf("%d discrepancies, %d repaired, %d need review", rr.Status.Discrepancies, rr.Status.Repaired, rr.Status.NeedsReview)
		if p.lookupsWait != "" {
			msg += "; " + p.lookupsWait
		}
		conditions.Set(&rr.Status.Conditions, rr.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue,
			hooksv1alpha1.ReasonValid, conditions.TruncateMessage(msg))
	}
	if _, perr := statuspatch.Patch(ctx, r.Client, rr, base, false); perr != nil {
		// The report held this pass's confirmations: a cut walk starts again from the mark,
		// so the pages it listed before are listed, and confirmed, again.
		r.walks.take(bp.UID)
		return "", time.Time{}, fmt.Errorf("write report %s: %w", rr.Name, perr)
	}
	if rr.Status.NeedsReview > 0 {
		r.Recorder.Eventf(bp, rr, corev1.EventTypeWarning, hooksv1alpha1.ReasonDiscrepanciesNeedReview, "Reconcile",
			"%s: %d discrepancies need review (see docs/runbook.md)", rr.Name, rr.Status.NeedsReview)
	}
	if p.listedAll && err == nil {
		if !p.markAtMost.IsZero() && p.markAtMost.Before(p.walkStarted) {
			return rr.Name, p.markAtMost, nil
		}
		return rr.Name, p.walkStarted, nil
	}
	return rr.Name, time.Time{}, err
}

// compare answers each question of docs/design.md §7 for one provider's namespace.
func (r *Reconciler) compare(ctx context.Context, bp *hooksv1alpha1.BillingProvider, c billing.Client,
	policy reconciliationPolicy, now time.Time, reportName string, p *passState) error {
	ns := client.InNamespace(bp.Namespace)
	var settlements hooksv1alpha1.BillingSettlementList
	if err := r.List(ctx, &settlements, ns); err != nil {
		return fmt.Errorf("list settlements: %w", err)
	}
	byKey := map[string]*hooksv1alpha1.BillingSettlement{}
	byName := map[string]*hooksv1alpha1.BillingSettlement{}
	var mine []*hooksv1alpha1.BillingSettlement
	for i := range settlements.Items {
		bs := &settlements.Items[i]
		byName[bs.Name] = bs
		if bs.Spec.BillingProviderRef == bp.Name {
			byKey[bs.Spec.IdempotencyKey] = bs
			mine = append(mine, bs)
		}
	}
	p.examined["BillingSettlement"] = int32(len(mine))
	if err := r.orphanedSettlements(ctx, bp.Namespace, settlements.Items, p); err != nil {
		return err
	}

	var jobs hooksv1alpha1.JobCompletionList
	if err := r.List(ctx, &jobs, ns); err != nil {
		return fmt.Errorf("list job completions: %w", err)
	}
	jobsByName := map[string]*hooksv1alpha1.JobCompletion{}
	for i := range jobs.Items {
		jobsByName[jobs.Items[i].Name] = &jobs.Items[i]
	}
	p.examined["JobCompletion"] = int32(len(jobs.Items))

	var providers hooksv1alpha1.WebhookProviderList
	if err := r.List(ctx, &providers, ns); err != nil {
		return fmt.Errorf("list webhook providers: %w", err)
	}

	// 1. Completed billable jobs without a settlement: jobs of a webhook provider
	// whose routes charge one-per-job at this billing provider.
	billable := map[string]bool{}
	for _, wp := range providers.Items {
		for _, route := range wp.Spec.Routes {
			for _, op := range route.Operations {
				if s := op.Settlement; s != nil && s.BillingProviderRef == bp.Name && len(s.KeyFrom) == 0 && s.JobID != "" {
					billable[wp.Name] = true
				}
			}
		}
	}
	var jobFindings []archivedCheck
	for _, jc := range jobs.Items {
		if !billable[jc.Spec.Provider] || jc.Progress().State != hooksv1alpha1.JobCompletionApplied ||
			jc.Spec.Completion.State != hooksv1alpha1.JobSucceeded {
			continue
		}
		name := identity.SettlementName(jc.Spec.Provider, identity.DefaultSettlementKey(jc.Spec.Provider, jc.Spec.JobID))
		if _, ok := byName[name]; ok {
			continue
		}
		jobFindings = append(jobFindings, archivedCheck{key: name, d: hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyJobWithoutSettlement, Object: "JobCompletion/" + jc.Name,
			Action: hooksv1alpha1.RepairManualReview,
			Message: fmt.Sprintf("job %q completed (version %d) but no settlement %s exists: its event was routed without a charge (route changed?) or the settlement was deleted; the customer is not known from the job alone",
				jc.Spec.JobID, jc.Spec.Completion.Version, name)}})
	}
	// A settlement that left for the archive is not missing.
	if err := r.addUnlessArchived(ctx, bp.Namespace, jobFindings, p, r.archivedSettlementNames,
		func() client.Object { return &hooksv1alpha1.BillingSettlement{} }); err != nil {
		return err
	}

	// 2. Settlements without a completed job, and 3. settlements stuck.
	var settlementFindings []archivedCheck
	for _, bs := range mine {
		if bs.Spec.Type == hooksv1alpha1.SettlementCharge && bs.Spec.JobID != "" && bs.Spec.WebhookProvider != "" {
			jcName := identity.JobCompletionName(bs.Spec.WebhookProvider, bs.Spec.JobID)
			jc, ok := jobsByName[jcName]
			switch {
			case !ok:
				if jobRouteExists(providers.Items, bs.Spec.WebhookProvider) {
					settlementFindings = append(settlementFindings, archivedCheck{key: jcName, d: hooksv1alpha1.Discrepancy{
						Type: hooksv1alpha1.DiscrepancySettlementWithoutJob, Object: "BillingSettlement/" + bs.Name,
						Action:  hooksv1alpha1.RepairManualReview,
						Message: fmt.Sprintf("settlement for job %q has no JobCompletion", bs.Spec.JobID)}})
				}
			case jc.Spec.Completion.State != hooksv1alpha1.JobSucceeded && bs.Status.State == hooksv1alpha1.SettlementSettled &&
				len(bs.Status.ReversedBy) == 0:
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancySettlementWithoutJob, Object: "BillingSettlement/" + bs.Name,
					Action: hooksv1alpha1.RepairCompensation,
					Message: fmt.Sprintf("charged, but job %q ended %s (version %d); if it should not be billed, create a Refund that reverses %s",
						bs.Spec.JobID, jc.Spec.Completion.State, jc.Spec.Completion.Version, bs.Name)})
			}
		}
		if stuckSince(bs, policy.stuckAfter, now) {
			carried := r.requestReconcile(ctx, bs, reportName)
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancySettlementStuck, Object: "BillingSettlement/" + bs.Name,
				Action: hooksv1alpha1.RepairAuthoritativeQuery, CarriedOut: carried,
				Message: fmt.Sprintf("%s since %s; asked the provider by key", bs.Status.State, lastActivity(bs).UTC().Format(time.RFC3339))})
		}
	}

	// A job whose completion left for the archive is not missing.
	if err := r.addUnlessArchived(ctx, bp.Namespace, settlementFindings, p, r.archivedJobNames,
		func() client.Object { return &hooksv1alpha1.JobCompletion{} }); err != nil {
		return err
	}

	// 4-6. The provider's records against ours. An unreachable provider does not stop
	// the local checks; the report says the comparison was skipped and fails.
	providerErr := r.compareProvider(ctx, bp, c, now, reportName, byKey, mine, p)
	if t, ok := billing.UsageTotalsOf(c); ok {
		// A provider that totals usage instead of listing it (Stripe's meter events).
		// Its errors never fail the pass; only the archive's do, as everywhere here.
		if err := r.compareUsageTotals(ctx, bp, t, p.windowStart, now, settlements.Items, p); err != nil && providerErr == nil {
			providerErr = err
		}
	}

	// 7-8. Events not complete past a threshold, and quarantined events.
	var events hooksv1alpha1.WebhookEventList
	if err := r.List(ctx, &events, ns); err != nil {
		return fmt.Errorf("list events: %w", err)
	}
	examinedEvents := int32(0)
	for i := range events.Items {
		ev := &events.Items[i]
		if !eventConcerns(ev, bp.Name) {
			continue
		}
		examinedEvents++
		switch ev.Status.Phase {
		case hooksv1alpha1.EventComplete, hooksv1alpha1.EventIgnored:
		case hooksv1alpha1.EventQuarantined:
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyEventQuarantined, Object: "WebhookEvent/" + ev.Name,
				Action:  hooksv1alpha1.RepairManualReview,
				Message: fmt.Sprintf("event ID %q was reused with another payload; it had no effect", ev.Spec.EventID)})
		default:
			if now.Sub(ev.Spec.ReceivedAt.Time) < policy.eventStaleAfter {
				continue
			}
			d := hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyEventNotComplete, Object: "WebhookEvent/" + ev.Name,
				Action:  hooksv1alpha1.RepairAutoRetry,
				Message: fmt.Sprintf("%s since %s", phaseOrNew(ev), ev.Spec.ReceivedAt.UTC().Format(time.RFC3339))}
			if ev.Status.Phase == hooksv1alpha1.EventRequiresReconciliation {
				d.Action = hooksv1alpha1.RepairManualReview
				d.Message += "; an operation conflicts or its record was deleted (see the event's status.operations)"
			} else if failed := failedChild(ev); failed != "" {
				// Dispatching again retries nothing: the child is dead-lettered or refused.
				d.Action = hooksv1alpha1.RepairManualReview
				d.Message += "; " + failed + " failed: fix the cause and replay it (docs/runbook.md)"
			} else {
				d.CarriedOut = r.touch(ctx, ev, reportName)
				d.Message += "; dispatched again"
			}
			p.add(d)
		}
	}
	p.examined["WebhookEvent"] = examinedEvents
	if providerErr != nil {
		return fmt.Errorf("local checks done; comparison with the provider skipped: %w", providerErr)
	}
	return nil
}
