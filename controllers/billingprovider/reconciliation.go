package billingprovider

import (
	"github.com/settlement-operator/settlement-operator/internal/index"

	"github.com/settlement-operator/settlement-operator/internal/archivelookup"

	"github.com/settlement-operator/settlement-operator/internal/metrics"
	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/settlement-operator/settlement-operator/internal/providerclient"

	"github.com/settlement-operator/settlement-operator/internal/settlement"

	"github.com/settlement-operator/settlement-operator/internal/statuspatch"

	"github.com/settlement-operator/settlement-operator/internal/conditions"

	"context"
	"fmt"
	"hash/fnv"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// maxReportItems is how many findings a report lists; counts are always complete.
const maxReportItems = 100

// findingMemory keeps, per BillingProvider (by UID), the findings of its last pass, so
// that settlement_reconciliation_discrepancies_total counts a finding once rather than
// on every pass that sees it again: an alert on its rate then means "something new",
// and the reports keep the full picture. It lives in memory: after a restart or a
// change of leader every open finding is counted once more (docs/decisions.md
// "Metrics (issue 13)"). A finding is kept as a 64-bit hash of its type, object and
// provider record, so a pass with many findings costs 8 bytes per finding.
type findingMemory struct {
	mu         sync.Mutex
	byProvider map[types.UID]map[uint64]struct{}
}

// last returns the findings of the provider's last pass (nil before its first).
func (m *findingMemory) last(uid types.UID) map[uint64]struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byProvider[uid]
}

// remember stores a pass's findings. A pass that ended early (complete false) may have
// missed findings it did not get to: they are kept from the pass before, so they are
// not counted as new when the next pass sees them.
func (m *findingMemory) remember(uid types.UID, seen, previous map[uint64]struct{}, complete bool) {
	if !complete {
		for k := range previous {
			seen[k] = struct{}{}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byProvider == nil {
		m.byProvider = map[types.UID]map[uint64]struct{}{}
	}
	m.byProvider[uid] = seen
}

// Forget drops a deleted provider's findings.
func (m *findingMemory) forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.byProvider, uid)
}

// listWalk is a walk of the provider's list that a pass cut at the page limit: the
// next pass goes on from its cursor instead of from the start, so a list longer than
// one pass may walk still ends and the mark (providerListedUntil) advances. Without
// it, a provider listing more than maxListPages pages between the mark less the
// overlap and now (5,000 records: 5.6 events/s with the 15-minute overlap) was walked
// from the same start by every pass, forever, and every settlement past the cut was
// confirmed by a lookup of its own (docs/decisions.md "Reconciliation walks").
// The mark a finished walk sets is the time its first pass started, not its last: the
// list contract promises no order, so a record created while the walk went on may
// have sorted before its cursor; the next walk, from that mark less the overlap,
// lists it. It lives in memory: after a restart or a change of leader the walk starts
// again from the mark; a failed page or a changed BillingProvider spec drops it too.
type listWalk struct {
	// mark is the providerListedUntil the walk started from (zero before the first
	// complete walk); since is where it lists from; started is when its first pass
	// began; generation is the BillingProvider's (an endpoint change starts over).
	mark, since, started time.Time
	generation           int64
	cursor               string
	// seen holds the idempotency keys of this provider's settlements whose settled
	// Record the walk listed (each was then confirmed or reported).
	seen map[string]bool
}

type walkMemory struct {
	mu         sync.Mutex
	byProvider map[types.UID]*listWalk
}

// take removes and returns the provider's unfinished walk (nil when there is none).
func (m *walkMemory) take(uid types.UID) *listWalk {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.byProvider[uid]
	delete(m.byProvider, uid)
	return w
}

// keep stores an unfinished walk for the provider's next pass.
func (m *walkMemory) keep(uid types.UID, w *listWalk) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byProvider == nil {
		m.byProvider = map[types.UID]*listWalk{}
	}
	m.byProvider[uid] = w
}

// pending says whether the provider has an unfinished walk.
func (m *walkMemory) pending(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byProvider[uid] != nil
}

// findingID identifies a finding across passes: its type, the object it concerns and
// the provider's record (for findings with no local object).
func findingID(d hooksv1alpha1.Discrepancy) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(string(d.Type) + "\x00" + d.Object + "\x00" + d.ProviderRef))
	return h.Sum64()
}

// passState accumulates one pass's findings.
type passState struct {
	// namespace and provider label the pass's metrics.
	namespace, provider string
	// previous holds the last pass's findings; seen this pass's.
	previous, seen map[uint64]struct{}
	report         *hooksv1alpha1.ReconciliationReportStatus
	byType         map[hooksv1alpha1.DiscrepancyType]int32
	examined       map[string]int32
	// listedAll is true when the provider's records were walked to the end, by a walk
	// whose first pass started at walkStarted.
	listedAll   bool
	walkStarted time.Time
	// windowStart is the report's window start.
	windowStart time.Time
	// items keeps up to maxReportItems findings per type until the report is filled.
	items map[hooksv1alpha1.DiscrepancyType][]hooksv1alpha1.Discrepancy
}

func (p *passState) add(d hooksv1alpha1.Discrepancy) {
	p.byType[d.Type]++
	p.report.Discrepancies++
	if d.CarriedOut {
		p.report.Repaired++
	}
	if d.Action == hooksv1alpha1.RepairManualReview {
		p.report.NeedsReview++
	}
	id := findingID(d)
	_, before := p.previous[id]
	if _, again := p.seen[id]; !before && !again {
		metrics.DiscrepanciesFound.WithLabelValues(p.namespace, p.provider, string(d.Type)).Inc()
	}
	p.seen[id] = struct{}{}
	metrics.RepairsCarriedOut.WithLabelValues(string(d.Action), fmt.Sprint(d.CarriedOut)).Inc()
	if p.items == nil {
		p.items = map[hooksv1alpha1.DiscrepancyType][]hooksv1alpha1.Discrepancy{}
	}
	if len(p.items[d.Type]) < maxReportItems {
		d.Message = truncateTo(d.Message, 500)
		p.items[d.Type] = append(p.items[d.Type], d)
	}
}

// itemOrder lists discrepancy types in the order their findings fill a report:
// repairs the pass carried out first, then what needs a human.
var itemOrder = []hooksv1alpha1.DiscrepancyType{
	hooksv1alpha1.DiscrepancyProviderSettledLocalPending, hooksv1alpha1.DiscrepancySettlementStuck,
	hooksv1alpha1.DiscrepancyEventNotComplete, hooksv1alpha1.DiscrepancyAmountMismatch,
	hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown, hooksv1alpha1.DiscrepancyJobWithoutSettlement,
	hooksv1alpha1.DiscrepancySettlementWithoutJob, hooksv1alpha1.DiscrepancySettlementWithoutBillingProvider,
	hooksv1alpha1.DiscrepancyEventQuarantined, hooksv1alpha1.DiscrepancyProviderRecordWithoutSettlement,
	hooksv1alpha1.DiscrepancyUsageTotalMismatch,
}

// fillItems takes findings round-robin across types, so that a flood of one kind
// (say, a thousand provider records we do not know) never hides another kind.
func (p *passState) fillItems() {
	for i := 0; len(p.report.Items) < maxReportItems; i++ {
		took := false
		for _, t := range itemOrder {
			if i < len(p.items[t]) && len(p.report.Items) < maxReportItems {
				p.report.Items = append(p.report.Items, p.items[t][i])
				took = true
			}
		}
		if !took {
			break
		}
	}
	if int(p.report.Discrepancies) > len(p.report.Items) {
		p.report.Truncated = true
	}
}

func truncateTo(s string, n int) string {
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}

// pass runs one reconciliation and returns its report's name and, when it finished a
// walk of the provider's list, the time that walk started (the new mark; else zero).
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

	err := r.compare(ctx, bp, c, policy, now, rr.Name, p)
	r.findings.remember(bp.UID, p.seen, p.previous, err == nil && p.listedAll)
	p.fillItems()
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
		conditions.Set(&rr.Status.Conditions, rr.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue,
			hooksv1alpha1.ReasonValid, fmt.Sprintf("%d discrepancies, %d repaired, %d need review",
				rr.Status.Discrepancies, rr.Status.Repaired, rr.Status.NeedsReview))
	}
	if _, perr := statuspatch.Patch(ctx, r.Client, rr, base, false); perr != nil {
		return "", time.Time{}, fmt.Errorf("write report %s: %w", rr.Name, perr)
	}
	if rr.Status.NeedsReview > 0 {
		r.Recorder.Eventf(bp, rr, corev1.EventTypeWarning, hooksv1alpha1.ReasonDiscrepanciesNeedReview, "Reconcile",
			"%s: %d discrepancies need review (see docs/runbook.md)", rr.Name, rr.Status.NeedsReview)
	}
	if p.listedAll && err == nil {
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
		if !billable[jc.Spec.Provider] || jc.Status.State != hooksv1alpha1.JobCompletionApplied ||
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

// archivedCheck is a finding that stands only if the archive does not hold key.
type archivedCheck struct {
	key string
	d   hooksv1alpha1.Discrepancy
}

// addUnlessArchived adds the findings whose key (the name of the missing object) the
// archive does not hold (all of them without an archive) and that the API server does
// not have either: the pass compares cached lists taken one after the other, so a
// Record created or archived in between would otherwise be reported as missing. An
// archive that does not answer fails the pass: reporting an archived record as missing
// would send a human after a charge that is fine.
func (r *Reconciler) addUnlessArchived(ctx context.Context, ns string, checks []archivedCheck, p *passState,
	known func(context.Context, string, []string) (map[string]bool, error), newObj func() client.Object) error {
	if len(checks) == 0 {
		return nil
	}
	archived := map[string]bool{}
	if r.Archive != nil {
		keys := make([]string, 0, len(checks))
		for _, c := range checks {
			keys = append(keys, c.key)
		}
		var err error
		archived, err = known(ctx, ns, keys)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return fmt.Errorf("%w: compare with the archive: %v", archivelookup.ErrUnavailable, err)
		}
		p.examined["Archived"] += int32(len(archived))
	}
	for _, c := range checks {
		if archived[c.key] || r.existsLive(ctx, ns, c.key, newObj()) {
			continue
		}
		p.add(c.d)
	}
	return nil
}

// orphanedSettlements reports the namespace's unfinished settlements that name a
// BillingProvider which does not exist (a typo in a route, a provider deleted before
// it was protected): no provider's pass compares them and nothing is sent for them,
// so every pass of their namespace lists them. A finished one (Settled, Failed) names
// a provider that may be retired on purpose and is not reported.
func (r *Reconciler) orphanedSettlements(ctx context.Context, ns string,
	settlements []hooksv1alpha1.BillingSettlement, p *passState) error {
	var providers hooksv1alpha1.BillingProviderList
	if err := r.List(ctx, &providers, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list billing providers: %w", err)
	}
	known := map[string]bool{}
	for _, bp := range providers.Items {
		known[bp.Name] = true
	}
	missing := map[string]bool{} // confirmed live once per pass
	for i := range settlements {
		bs := &settlements[i]
		ref := bs.Spec.BillingProviderRef
		if known[ref] || bs.Status.State == hooksv1alpha1.SettlementSettled || bs.Status.State == hooksv1alpha1.SettlementFailed {
			continue
		}
		gone, checked := missing[ref]
		if !checked {
			// The cache may not have seen a provider created moments ago.
			gone = !r.existsLive(ctx, ns, ref, &hooksv1alpha1.BillingProvider{})
			missing[ref] = gone
		}
		if !gone {
			continue
		}
		p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancySettlementWithoutBillingProvider,
			Object: "BillingSettlement/" + bs.Name, Action: hooksv1alpha1.RepairManualReview,
			Message: conditions.TruncateMessage(fmt.Sprintf("names BillingProvider %q, which does not exist in %s: nothing is sent for it and no pass "+
				"compares it; create that provider, or fix the route that made it (kubectl get webhookproviders -n %s) "+
				"and delete this settlement once nothing was sent (its exposure is %s)",
				ref, ns, ns, settlement.EffectiveExposure(&bs.Status)))})
	}
	return nil
}

// existsLive reads an object from the API server (not the cache); an error counts as
// "not there", so a finding is reported rather than hidden.
func (r *Reconciler) existsLive(ctx context.Context, ns, name string, obj client.Object) bool {
	if r.APIReader == nil || name == "" {
		return false
	}
	return r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj) == nil
}

// inFlight reports whether the settlement a provider record names exists now, under
// the record's idempotency key (live, not from the cache).
func (r *Reconciler) inFlight(ctx context.Context, ns string, rec billing.Record) bool {
	k, ok := identity.ParseSettlementKey(rec.SettlementKey)
	if !ok {
		return false
	}
	var bs hooksv1alpha1.BillingSettlement
	return r.existsLive(ctx, ns, identity.SettlementNameFor(k.Provider, rec.SettlementKey), &bs) &&
		bs.Spec.IdempotencyKey == rec.IdempotencyKey
}

func (r *Reconciler) archivedSettlementNames(ctx context.Context, ns string, names []string) (map[string]bool, error) {
	return r.Archive.KnownSettlementNames(ctx, ns, names)
}

func (r *Reconciler) archivedJobNames(ctx context.Context, ns string, names []string) (map[string]bool, error) {
	return r.Archive.KnownJobNames(ctx, ns, names)
}

// compareUnknown reports the provider's records that no settlement in the cluster
// knows: those the archive does not know either, and those whose archived settlement
// they do not prove (another record, other content, or a settlement archived as
// Failed that the provider holds). An archived record is final, so nothing is
// repaired automatically: a human looks.
func (r *Reconciler) compareUnknown(ctx context.Context, ns string, recs []billing.Record, p *passState) error {
	if len(recs) == 0 {
		return nil
	}
	archived := map[string]*hooksv1alpha1.BillingSettlement{}
	if r.Archive != nil {
		keys := make([]string, 0, len(recs))
		for _, rec := range recs {
			keys = append(keys, rec.IdempotencyKey)
		}
		var err error
		archived, err = r.Archive.SettlementsByIdempotencyKey(ctx, ns, keys)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return fmt.Errorf("%w: compare with the archive: %v", archivelookup.ErrUnavailable, err)
		}
		p.examined["Archived"] += int32(len(archived))
	}
	for _, rec := range recs {
		bs, ok := archived[rec.IdempotencyKey]
		if !ok && r.inFlight(ctx, ns, rec) {
			continue // created after the pass listed the settlements: the next pass compares it
		}
		if !ok {
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderRecordWithoutSettlement,
				ProviderRef: rec.ID, Action: hooksv1alpha1.RepairManualReview,
				Message: fmt.Sprintf("the provider has %s %s for key %q (settlement key %q) that no local or archived settlement knows",
					rec.Type, rec.Status, rec.IdempotencyKey, rec.SettlementKey)})
			continue
		}
		object := "BillingSettlement/" + bs.Name + " (archived)"
		switch {
		case r.notProvablyOurs(ctx, bs, rec) != "":
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: object, ProviderRef: rec.ID,
				Action: hooksv1alpha1.RepairManualReview, Message: r.notProvablyOurs(ctx, bs, rec)})
		case bs.Status.State == hooksv1alpha1.SettlementSettled && bs.Status.ProviderRef != "" && rec.ID != bs.Status.ProviderRef:
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: object, ProviderRef: rec.ID,
				Action: hooksv1alpha1.RepairManualReview,
				Message: fmt.Sprintf("the provider has record %s under key %s, but the archived settlement recorded %s: more than one record under one key",
					rec.ID, bs.Spec.IdempotencyKey, bs.Status.ProviderRef)})
		case bs.Status.State != hooksv1alpha1.SettlementSettled && (rec.Status == billing.StatusSettled || rec.Status == billing.StatusPending):
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderSettledLocalPending, Object: object, ProviderRef: rec.ID,
				Action: hooksv1alpha1.RepairManualReview,
				Message: fmt.Sprintf("the provider has %s %s under key %s, but the settlement was archived as %s; archived records are final: review it",
					rec.ID, rec.Status, bs.Spec.IdempotencyKey, settlement.StateOrNew(bs.Status.State))})
		}
	}
	return nil
}

// failedChild names a child of ev in state Failed, if any.
func failedChild(ev *hooksv1alpha1.WebhookEvent) string {
	for _, op := range ev.Status.Operations {
		if op.State == string(hooksv1alpha1.SettlementFailed) {
			return op.Child
		}
	}
	return ""
}

func phaseOrNew(ev *hooksv1alpha1.WebhookEvent) string {
	if ev.Status.Phase == "" {
		return string(hooksv1alpha1.EventReceived)
	}
	return string(ev.Status.Phase)
}

// eventConcerns scopes events to a billing provider: those that charge at it, and
// those with no settlement at all (job-only events, quarantine records), which every
// billing provider of the namespace reports.
func eventConcerns(ev *hooksv1alpha1.WebhookEvent, bp string) bool {
	if len(ev.Spec.Settlements) == 0 {
		return true
	}
	for _, s := range ev.Spec.Settlements {
		if s.BillingProviderRef == bp {
			return true
		}
	}
	return false
}

// jobRouteExists reports whether a webhook provider records job completions at all:
// only then is a settlement without one a discrepancy.
func jobRouteExists(providers []hooksv1alpha1.WebhookProvider, name string) bool {
	for _, wp := range providers {
		if wp.Name != name {
			continue
		}
		for _, route := range wp.Spec.Routes {
			for _, op := range route.Operations {
				if op.Type == hooksv1alpha1.OperationJobCompletion {
					return true
				}
			}
		}
	}
	return false
}

func lastActivity(bs *hooksv1alpha1.BillingSettlement) time.Time {
	switch {
	case bs.Status.LastAttemptAt != nil:
		return bs.Status.LastAttemptAt.Time
	case bs.Status.FirstSubmittedAt != nil:
		return bs.Status.FirstSubmittedAt.Time
	}
	return bs.CreationTimestamp.Time
}

// stuckSince: Submitted (outcome unknown or pending) or Pending past the threshold.
func stuckSince(bs *hooksv1alpha1.BillingSettlement, after time.Duration, now time.Time) bool {
	switch bs.Status.State {
	case hooksv1alpha1.SettlementSubmitted, hooksv1alpha1.SettlementPending, "":
		start := bs.CreationTimestamp.Time
		if bs.Status.FirstSubmittedAt != nil {
			start = bs.Status.FirstSubmittedAt.Time
		}
		return now.Sub(start) >= after
	}
	return false
}

func (r *Reconciler) maxListPages() int {
	if r.MaxListPages > 0 {
		return r.MaxListPages
	}
	return maxListPages
}

// compareProvider walks the provider's records since the window start (with an
// overlap for clock skew) and compares them with the local settlements.
func (r *Reconciler) compareProvider(ctx context.Context, bp *hooksv1alpha1.BillingProvider, c billing.Client,
	now time.Time, reportName string, byKey map[string]*hooksv1alpha1.BillingSettlement,
	mine []*hooksv1alpha1.BillingSettlement, p *passState) error {
	since, mark := now.Add(-firstWindow), time.Time{}
	if t := bp.Status.ProviderListedUntil; t != nil {
		since, mark = t.Add(-reconciliationPolicyOf(bp).stuckAfter), t.Time
	}
	seen := map[string]bool{}
	cursor, pages, records := "", 0, int32(0)
	p.walkStarted = now
	if w := r.walks.take(bp.UID); w != nil && w.mark.Equal(mark) && w.generation == bp.Generation {
		// The walk the last pass cut goes on.
		since, seen, cursor, p.walkStarted = w.since, w.seen, w.cursor, w.started
	}
	for {
		called := time.Now()
		recs, next, err := c.List(ctx, since, cursor)
		metrics.ObserveBillingCall(bp.Namespace, bp.Name, "list", called, err)
		if err != nil {
			// The walk is dropped: a refused cursor must not be retried forever, and the
			// next pass, at the usual interval, starts again from the mark.
			return fmt.Errorf("list the provider's records: %w", err)
		}
		var unknown []billing.Record
		for _, rec := range recs {
			records++
			if k, ok := identity.ParseSettlementKey(rec.SettlementKey); ok && k.Namespace != bp.Namespace {
				// Another namespace's record in a shared billing account: its own
				// pass reports it (keys minted before issue 10 carry no namespace).
				records--
				continue
			}
			bs, ok := byKey[rec.IdempotencyKey]
			if !ok {
				unknown = append(unknown, rec)
				continue
			}
			if rec.Status == billing.StatusSettled {
				// Confirmed or reported below; a pending or failed record leaves a
				// locally settled settlement to be asked about by key.
				seen[rec.IdempotencyKey] = true
			}
			if why := r.notProvablyOurs(ctx, bs, rec); why != "" {
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: "BillingSettlement/" + bs.Name,
					ProviderRef: rec.ID, Action: hooksv1alpha1.RepairManualReview, Message: why})
				continue
			}
			if bs.Status.ProviderRef != "" && rec.ID != bs.Status.ProviderRef && settlement.EffectiveExposure(&bs.Status) == hooksv1alpha1.ExposureConfirmed {
				// A second record under one key: a double charge, or the provider
				// re-created it. Never confirmed; a human looks.
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: "BillingSettlement/" + bs.Name,
					ProviderRef: rec.ID, Action: hooksv1alpha1.RepairManualReview,
					Message: fmt.Sprintf("the provider has record %s under key %s, but the settlement recorded %s: more than one record under one key",
						rec.ID, bs.Spec.IdempotencyKey, bs.Status.ProviderRef)})
				continue
			}
			switch {
			case rec.Status == billing.StatusPending && bs.Status.State == hooksv1alpha1.SettlementFailed:
				// Pending there, failed here (nothing charged, we thought): ask by key,
				// which resumes polling it.
				carried := r.requestReconcile(ctx, bs, reportName)
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderSettledLocalPending,
					Object: "BillingSettlement/" + bs.Name, ProviderRef: rec.ID, Action: hooksv1alpha1.RepairAuthoritativeQuery,
					CarriedOut: carried,
					Message:    fmt.Sprintf("the provider has %s pending; locally Failed: asking the provider by key", rec.ID)})
			case rec.Status == billing.StatusSettled && bs.Status.State != hooksv1alpha1.SettlementSettled:
				carried := r.requestReconcile(ctx, bs, reportName)
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyProviderSettledLocalPending,
					Object: "BillingSettlement/" + bs.Name, ProviderRef: rec.ID, Action: hooksv1alpha1.RepairAuthoritativeQuery,
					CarriedOut: carried,
					Message:    fmt.Sprintf("the provider settled %s; locally %s: importing the provider's final status by key", rec.ID, settlement.StateOrNew(bs.Status.State))})
			case rec.Status == billing.StatusSettled:
				r.markReconciled(ctx, bs, rec, now)
			}
		}
		// A record whose settlement left for the archive is compared with the archived one.
		if err := r.compareUnknown(ctx, bp.Namespace, unknown, p); err != nil {
			return err
		}
		pages++
		if next == "" {
			p.listedAll = true
			break
		}
		if pages >= r.maxListPages() {
			// The rest waits for the next pass, which goes on from here, soon.
			p.report.Truncated = true
			r.walks.keep(bp.UID, &listWalk{mark: mark, since: since, started: p.walkStarted,
				generation: bp.Generation, cursor: next, seen: seen})
			break
		}
		cursor = next
	}
	p.examined["ProviderRecord"] = records
	if !p.listedAll {
		// Settlements are told apart from the provider's records only once the walk
		// has ended: asking by key for every one past the cut costs a lookup each.
		return nil
	}

	// Local settled but unknown to the provider: those settled in the window that the
	// list did not show are asked by key before anything is reported.
	target := providerclient.TargetFor(bp, c)
	sentHere := func(bs *hooksv1alpha1.BillingSettlement) bool {
		return bs.Status.SentTo == nil || *bs.Status.SentTo == target
	}
	for _, bs := range mine {
		if bs.Status.State != hooksv1alpha1.SettlementSettled || seen[bs.Spec.IdempotencyKey] ||
			bs.Status.SettledAt == nil || bs.Status.SettledAt.Time.Before(since) {
			continue
		}
		reverses, reversesRef, err := archivelookup.ReversedKey(ctx, r.Client, r.Archive, bs)
		if err != nil {
			// Without the original's reference the lookup could ask about the wrong thing;
			// the pass fails and its mark stays, so the next pass asks again.
			return err
		}
		called := time.Now()
		rec, found, err := billing.LookupFor(ctx, c, settlement.RequestOf(bs, reverses, reversesRef))
		metrics.ObserveBillingCall(bp.Namespace, bp.Name, "lookup", called, err)
		if e, ok := billing.AsError(err); ok && e.Unanswerable {
			if e.Unreadable && sentHere(bs) {
				// Stripe can neither list nor read back meter events: the settlement rests
				// on the provider's answer to its submission, which it matched field by
				// field. Counted and marked (so it may be archived).
				p.examined["SettlementNotComparable"]++
				r.markCompared(ctx, bs, hooksv1alpha1.ReasonProviderCannotAnswer,
					"the provider cannot list or read back this kind of record: it rests on the provider's answer to its submission; "+
						"compare the provider's own totals (Stripe: the meter's event summaries) in its dashboard", now)
				continue
			}
			p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown, Object: "BillingSettlement/" + bs.Name,
				ProviderRef: bs.Status.ProviderRef, Action: hooksv1alpha1.RepairManualReview,
				Message: conditions.TruncateMessage(fmt.Sprintf("settled locally as %s, but the provider could not be asked about key %s: %s",
					bs.Status.ProviderRef, bs.Spec.IdempotencyKey, e.Message))})
			continue
		}
		if err != nil {
			return fmt.Errorf("look up %s: %w", bs.Spec.IdempotencyKey, err)
		}
		if found && rec.Status == billing.StatusSettled {
			if why := r.notProvablyOurs(ctx, bs, rec); why != "" {
				p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyAmountMismatch, Object: "BillingSettlement/" + bs.Name,
					ProviderRef: rec.ID, Action: hooksv1alpha1.RepairManualReview, Message: why})
				continue
			}
			r.markReconciled(ctx, bs, rec, now)
			continue
		}
		if !found {
			// A charge a settled Void cancelled is gone at a provider that deletes it
			// (Stripe): that is the Void's doing, not a loss.
			void, err := r.settledVoidOf(ctx, bs)
			if err != nil {
				return err
			}
			if void != "" {
				r.markCompared(ctx, bs, hooksv1alpha1.ReasonVoided,
					fmt.Sprintf("the provider no longer has %s: %s voided it", bs.Status.ProviderRef, void), now)
				continue
			}
		}
		state := "no record"
		if found {
			state = rec.Status
		}
		p.add(hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyLocalSettledProviderUnknown, Object: "BillingSettlement/" + bs.Name,
			ProviderRef: bs.Status.ProviderRef, Action: hooksv1alpha1.RepairManualReview,
			Message: fmt.Sprintf("settled locally as %s, but the provider has %s under key %s", bs.Status.ProviderRef, state, bs.Spec.IdempotencyKey)})
	}
	return nil
}

// settledVoidOf names a settled Void of charge bs, in the cluster or the archive ("" when
// there is none).
func (r *Reconciler) settledVoidOf(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) (string, error) {
	if bs.Spec.Reverses != "" {
		return "", nil
	}
	var l hooksv1alpha1.BillingSettlementList
	if err := r.List(ctx, &l, client.InNamespace(bs.Namespace), client.MatchingFields{index.SettlementReverses: bs.Name}); err != nil {
		return "", fmt.Errorf("list compensations of %s: %w", bs.Name, err)
	}
	comps := l.Items
	if r.Archive != nil {
		archived, err := r.Archive.Reversing(ctx, bs.Namespace, bs.Name)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return "", fmt.Errorf("list archived compensations of %s: %w", bs.Name, err)
		}
		comps = append(comps, archived...)
	}
	for i := range comps {
		c := &comps[i]
		if c.Spec.Type == hooksv1alpha1.SettlementVoid && c.Spec.Reverses == bs.Name && c.Status.State == hooksv1alpha1.SettlementSettled {
			return c.Name, nil
		}
	}
	return "", nil
}

// notProvablyOurs says why a provider record under a settlement's key cannot confirm
// it ("" when it can): a field that differs or is missing (fail closed), or an earlier
// Disagreement the settlement recorded. It names fields, never another record's values.
func (r *Reconciler) notProvablyOurs(ctx context.Context, bs *hooksv1alpha1.BillingSettlement, rec billing.Record) string {
	reverses, _, _ := archivelookup.ReversedKey(ctx, r.Client, r.Archive, bs) // unreadable: "" fails the comparison, closed
	if m, ok := settlement.RecordMatches(bs, reverses, rec); !ok {
		return fmt.Sprintf("the provider's record %s under key %s is not provably this settlement: %s", rec.ID, bs.Spec.IdempotencyKey, m)
	}
	if d := bs.Status.Disagreement; d != nil {
		return fmt.Sprintf("the provider's record %s is not confirmed: the settlement recorded a disagreement (%s %s)", rec.ID, d.Reason, d.Field)
	}
	return ""
}

// requestReconcile asks a settlement's own controller to query the provider by key,
// by setting the reconcile-request annotation to the report's name.
func (r *Reconciler) requestReconcile(ctx context.Context, bs *hooksv1alpha1.BillingSettlement, reportName string) bool {
	if bs.Annotations[hooksv1alpha1.AnnotationReconcileRequest] == reportName {
		return true
	}
	patch := client.MergeFrom(bs.DeepCopy())
	if bs.Annotations == nil {
		bs.Annotations = map[string]string{}
	}
	bs.Annotations[hooksv1alpha1.AnnotationReconcileRequest] = reportName
	if err := r.Patch(ctx, bs, patch); err != nil {
		log.FromContext(ctx).Error(err, "request reconcile", "settlement", bs.Name)
		return false
	}
	return true
}

// touch asks an event's controller to dispatch it again.
func (r *Reconciler) touch(ctx context.Context, ev *hooksv1alpha1.WebhookEvent, reportName string) bool {
	patch := client.MergeFrom(ev.DeepCopy())
	if ev.Annotations == nil {
		ev.Annotations = map[string]string{}
	}
	ev.Annotations[hooksv1alpha1.AnnotationReconcileRequest] = reportName
	if err := r.Patch(ctx, ev, patch); err != nil {
		log.FromContext(ctx).Error(err, "request re-dispatch", "event", ev.Name)
		return false
	}
	return true
}

// markReconciled sets the Reconciled condition on a settled settlement the provider
// confirmed. Settled settlements are final, so their controller no longer writes
// them; the optimistic lock still guards against a concurrent write (next pass
// retries).
func (r *Reconciler) markReconciled(ctx context.Context, bs *hooksv1alpha1.BillingSettlement, rec billing.Record, now time.Time) {
	if bs.Status.ProviderRef != "" && rec.ID != bs.Status.ProviderRef {
		return // another record than the one the settlement adopted confirms nothing
	}
	r.markCompared(ctx, bs, hooksv1alpha1.ReasonConfirmedByProvider, fmt.Sprintf("the provider's record %s matches", rec.ID), now)
}

// markCompared sets Reconciled=True: the pass has done what it can for this settlement.
func (r *Reconciler) markCompared(ctx context.Context, bs *hooksv1alpha1.BillingSettlement, reason, message string, now time.Time) {
	if c := apimeta.FindStatusCondition(bs.Status.Conditions, hooksv1alpha1.ConditionReconciled); c != nil && c.Status == metav1.ConditionTrue {
		return
	}
	base := bs.DeepCopy()
	t := metav1.NewTime(now)
	bs.Status.LastReconciledAt = &t
	conditions.Set(&bs.Status.Conditions, bs.Generation, hooksv1alpha1.ConditionReconciled, metav1.ConditionTrue, reason, conditions.TruncateMessage(message))
	if _, err := statuspatch.Patch(ctx, r.Client, bs, base, true); err != nil {
		log.FromContext(ctx).V(1).Info("mark reconciled skipped", "settlement", bs.Name, "error", err.Error())
	}
}
