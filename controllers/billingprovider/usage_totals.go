package billingprovider

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/big"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivelookup"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

const (
	// defaultUsageTotalsLag is how far behind now a usage-totals window ends: Stripe
	// aggregates meter events asynchronously ("an eventually consistent view"), and a
	// total read too soon would miss events it accepted.
	defaultUsageTotalsLag = time.Hour
	// defaultUsageClockSkew widens each settlement's span at the provider for the
	// difference between the provider's clock and ours.
	defaultUsageClockSkew = time.Minute
	// maxUsageTotals bounds the totals (one customer and meter each) one pass reads.
	maxUsageTotals = 200
)

// usageMarks remembers, per BillingProvider, where the last usage-totals comparison
// ended, so that a failed pass's window is compared by the next. In memory: after a
// restart the window starts from the pass's own window start.
type usageMarks struct {
	mu         sync.Mutex
	byProvider map[types.UID]time.Time
}

func (m *usageMarks) get(uid types.UID) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byProvider[uid]
}

func (m *usageMarks) set(uid types.UID, t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byProvider == nil {
		m.byProvider = map[types.UID]time.Time{}
	}
	m.byProvider[uid] = t
}

// usageGroup is one total: a usage meter and a customer.
type usageGroup struct{ meter, customer string }

// usageBounds is what the settlements of one group can add up to at the provider over
// the window: low counts those certainly there and in the window, high those possibly.
type usageBounds struct {
	low, high          *big.Rat
	certain, uncertain int
}

// usageSpan is when the provider may have received one usage charge.
type usageSpan struct {
	from, to time.Time
	// settled: the provider answered it settled, and nothing that may have moved money
	// reverses it.
	settled bool
}

func (b *usageBounds) add(q *big.Rat, s usageSpan, start, end time.Time, skew time.Duration) {
	from, to := s.from.Add(-skew), s.to.Add(skew)
	if !from.Before(end) || to.Before(start) {
		return // certainly outside the window
	}
	b.high.Add(b.high, q)
	if s.settled && !from.Before(start) && to.Before(end) {
		b.low.Add(b.low, q)
		b.certain++
		return
	}
	b.uncertain++
}

// compareUsageTotals compares a provider's usage totals per customer and meter (Stripe's
// meter event summaries: meter events cannot be listed or read back one by one;
// Metronome's batched usage: its events cannot be listed by time) with
// what the settlements in the cluster and in the archive sent, over a window that ends
// lag before now (docs/design.md §13). Each settlement's time at the provider is known
// only to lie between its first attempt and its answer, so the settlements give a range,
// not a number: a total outside it is a UsageTotalMismatch for review — Stripe holds
// usage nobody here sent, or lacks usage Stripe answered for. Totals that cannot be
// compared (a meter without an ID) are counted in examined.UsageTotalNotComparable.
func (r *Reconciler) compareUsageTotals(ctx context.Context, bp *hooksv1alpha1.BillingProvider, t billing.UsageTotaler,
	windowStart, now time.Time, settlements []hooksv1alpha1.BillingSettlement, p *passState) error {
	lag, skew := r.usageTotalsLag(), r.usageClockSkew()
	// A settlement's answer is dated at the start of its reconcile, before the call:
	// the provider may receive it up to a request timeout later.
	timeout := settlement.RequestTimeoutOf(bp)
	start, end := windowStart.Add(-lag).Truncate(time.Minute), now.Add(-lag).Truncate(time.Minute)
	if m := r.usage.get(bp.UID); !m.IsZero() {
		start = m // the last comparison ended there: a window Stripe did not answer for is not skipped
	} else {
		r.usage.set(bp.UID, start) // from here, even if this pass cannot compare
	}
	if oldest := now.Add(-firstWindow - lag).Truncate(time.Minute); start.Before(oldest) {
		log.FromContext(ctx).Info("usage totals older than a day were not compared", "from", start, "until", oldest)
		start = oldest
	}
	if !end.After(start) {
		return nil
	}
	groups := map[usageGroup]*usageBounds{}
	add := func(meter, customer, quantity string, s usageSpan) {
		q, ok := new(big.Rat).SetString(quantity)
		if !ok {
			return // admission refuses such a quantity; nothing was sent for it
		}
		g := usageGroup{meter, customer}
		b := groups[g]
		if b == nil {
			b = &usageBounds{low: new(big.Rat), high: new(big.Rat)}
			groups[g] = b
		}
		s.to = s.to.Add(timeout)
		b.add(q, s, start, end, skew)
	}
	// Where the provider points now: usage sent elsewhere (another endpoint, a
	// BillingProvider created again, another Secret, a key of the other mode) is in
	// other books and not in these totals.
	target := providerclient.TargetOf(bp)
	target.Mode = bp.Status.Mode
	// A Void, or a Refund without an amount, cancels the usage at the provider (a
	// Stripe meter event adjustment); a refund of an amount is a credit of its own.
	reversed := map[string]bool{}
	for i := range settlements {
		bs := &settlements[i]
		cancels := bs.Spec.Type == hooksv1alpha1.SettlementVoid || (bs.Spec.Type == hooksv1alpha1.SettlementRefund && bs.Spec.Amount == nil)
		if bs.Spec.Reverses != "" && cancels && settlement.EffectiveExposure(&bs.Status) != hooksv1alpha1.ExposureNone {
			reversed[bs.Spec.Reverses] = true
		}
	}
	live := map[string]types.UID{}
	var usage []*hooksv1alpha1.BillingSettlement
	for i := range settlements {
		bs := &settlements[i]
		if bs.Spec.BillingProviderRef != bp.Name {
			continue
		}
		live[bs.Name] = bs.UID
		if bs.Spec.Type != hooksv1alpha1.SettlementCharge || bs.Spec.Usage == nil ||
			(bs.Status.SentTo != nil && *bs.Status.SentTo != target) {
			continue
		}
		usage = append(usage, bs)
	}
	if r.Archive != nil && len(usage) > 0 {
		// A cancellation of a charge in the cluster may already be archived.
		names := make([]string, 0, len(usage))
		for _, bs := range usage {
			names = append(names, bs.Name)
		}
		cancelled, err := r.Archive.CancelledAmong(ctx, bp.Namespace, names)
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return fmt.Errorf("%w: usage totals: %v", archivelookup.ErrUnavailable, err)
		}
		for n := range cancelled {
			reversed[n] = true
		}
	}
	for _, bs := range usage {
		s, ok := liveUsageSpan(bs, reversed[bs.Name])
		if !ok {
			continue
		}
		add(bs.Spec.Usage.Meter, bs.Spec.Customer, bs.Spec.Usage.Quantity, s)
	}
	if r.Archive != nil {
		// Listed after the cluster: a settlement archived and deleted in between is in
		// both lists (counted once, by UID); none is in neither. One created again under
		// the name of an archived one is another settlement.
		err := r.Archive.SettledUsage(ctx, bp.Namespace, bp.Name, start.Add(-skew-timeout), end.Add(skew), func(u archive.UsageRow) error {
			unknown := u.SentTo == hooksv1alpha1.ProviderTarget{} // an older operator's: counted, as uncertain
			if uid, ok := live[u.Name]; (ok && string(uid) == u.UID) || (!unknown && u.SentTo != target) {
				return nil
			}
			p.examined["ArchivedUsage"]++
			add(u.Meter, u.Customer, u.Quantity, usageSpan{from: u.FirstSubmittedAt, to: u.SettledAt,
				settled: !unknown && !u.Reversed && !reversed[u.Name]})
			return nil
		})
		metrics.NoteArchive("BillingSettlement", err)
		if err != nil {
			return fmt.Errorf("%w: usage totals: %v", archivelookup.ErrUnavailable, err)
		}
	}

	keys := make([]usageGroup, 0, len(groups))
	for g, b := range groups {
		if b.certain+b.uncertain > 0 {
			keys = append(keys, g)
		}
	}
	// In an order that differs from window to window, so that past the cap it is not
	// always the same customers that are left out.
	order := func(g usageGroup) uint64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(g.meter + "\x00" + g.customer + "\x00" + now.String()))
		return h.Sum64()
	}
	sort.Slice(keys, func(i, j int) bool { return order(keys[i]) < order(keys[j]) })
	if len(keys) > maxUsageTotals {
		p.examined["UsageTotalNotCompared"] = int32(len(keys) - maxUsageTotals)
		keys = keys[:maxUsageTotals]
	}
	window := fmt.Sprintf("%s to %s", start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339))
	notComparable := map[string]bool{}
	// Findings are added once the window is compared to its end: a window Stripe stops
	// answering for is compared again, whole, by the next pass, and its findings are
	// reported then, once.
	var found []hooksv1alpha1.Discrepancy
	for n, g := range keys {
		if notComparable[g.meter] {
			p.examined["UsageTotalNotComparable"]++
			continue
		}
		called := time.Now()
		total, err := t.UsageTotal(ctx, g.meter, g.customer, start, end)
		metrics.ObserveBillingCall(bp.Namespace, bp.Name, "usage_total", called, err)
		e, _ := billing.AsError(err)
		switch {
		case err == nil:
		case e != nil && e.Unanswerable:
			notComparable[g.meter] = true
			p.examined["UsageTotalNotComparable"]++
			if !e.Unreadable {
				// The meter does not total what is sent, or cannot be read: once per meter.
				found = append(found, hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyUsageTotalMismatch, Object: "BillingProvider/" + bp.Name,
					ProviderRef: "meter " + g.meter, Action: hooksv1alpha1.RepairManualReview,
					Message: conditions.TruncateMessage(fmt.Sprintf("usage meter %q cannot be compared with the provider's totals: %s", g.meter, e.Message))})
			}
			continue
		case e != nil && e.Class == billing.Terminal:
			// This customer's total cannot be read (the provider refuses the customer:
			// then every event of it was refused too) or compared.
			found = append(found, hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyUsageTotalMismatch, Object: "BillingProvider/" + bp.Name,
				ProviderRef: truncateTo(fmt.Sprintf("meter %s, customer %s, %s", g.meter, g.customer, window), 256),
				Action:      hooksv1alpha1.RepairManualReview,
				Message: conditions.TruncateMessage(fmt.Sprintf("the provider's total for usage meter %q, customer %s, from %s could not be read (the settlements add up to %s): %s",
					g.meter, g.customer, window, rangeOf(groups[g]), e.Message))})
			continue
		default:
			// The provider is unavailable for now: the window is compared again by the
			// next pass (the mark stays); the rest of the pass goes on.
			p.examined["UsageTotalNotCompared"] += int32(len(keys) - n)
			log.FromContext(ctx).Info("usage totals not compared this pass; the next pass tries the window again", "error", err.Error())
			return nil
		}
		got, ok := new(big.Rat).SetString(total)
		if !ok {
			return fmt.Errorf("the provider's usage total of meter %q is not a number", g.meter)
		}
		p.examined["UsageTotal"]++
		b := groups[g]
		if got.Cmp(b.low) >= 0 && got.Cmp(b.high) <= 0 {
			continue
		}
		why := "more than the settlements sent: usage reported by something else than this operator, or a settlement deleted without being archived"
		if got.Cmp(b.low) < 0 {
			why = "less than the settlements the provider answered for: an event the provider refused after accepting it (Stripe: the meter's error reports), or usage cancelled in its dashboard"
		}
		found = append(found, hooksv1alpha1.Discrepancy{Type: hooksv1alpha1.DiscrepancyUsageTotalMismatch, Object: "BillingProvider/" + bp.Name,
			ProviderRef: truncateTo(fmt.Sprintf("meter %s, customer %s, %s", g.meter, g.customer, window), 256),
			Action:      hooksv1alpha1.RepairManualReview,
			Message: conditions.TruncateMessage(fmt.Sprintf("the provider totals %s for usage meter %q, customer %s, from %s; the settlements add up to %s (%d settled in the window, %d that may or may not count): %s",
				got.FloatString(decimals(got)), g.meter, g.customer, window, rangeOf(b), b.certain, b.uncertain, why))})
	}
	for _, d := range found {
		p.add(d)
	}
	r.usage.set(bp.UID, end)
	return nil
}

// liveUsageSpan is when the provider may have received a settlement's usage; ok is
// false when nothing can have been sent (exposure None).
func liveUsageSpan(bs *hooksv1alpha1.BillingSettlement, reversed bool) (usageSpan, bool) {
	st := &bs.Status
	exposure := settlement.EffectiveExposure(st)
	if exposure == hooksv1alpha1.ExposureNone {
		return usageSpan{}, false
	}
	s := usageSpan{from: bs.CreationTimestamp.Time, to: farFuture}
	if st.FirstSubmittedAt != nil {
		s.from = st.FirstSubmittedAt.Time
	}
	if st.UsageDatedAt != nil && st.UsageDatedAt.Time.Before(s.from) {
		// Dated at its usage time: the provider totals it there, before it was sent.
		s.from = st.UsageDatedAt.Time
	}
	if st.State == hooksv1alpha1.SettlementSettled && exposure == hooksv1alpha1.ExposureConfirmed && st.SettledAt != nil {
		// Where an older operator sent it is not recorded: counted, as uncertain.
		s.to, s.settled = st.SettledAt.Time, !reversed && st.SentTo != nil
	}
	return s, true
}

// farFuture ends the span of a settlement whose answer is not known yet.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

func rangeOf(b *usageBounds) string {
	if b.low.Cmp(b.high) == 0 {
		return b.low.FloatString(decimals(b.low))
	}
	return fmt.Sprintf("between %s and %s", b.low.FloatString(decimals(b.low)), b.high.FloatString(decimals(b.high)))
}

// decimals is how many decimal places show q exactly (quantities are decimal literals,
// so their sums have finite expansions; capped for safety).
func decimals(q *big.Rat) int {
	for n := 0; n < 12; n++ {
		scaled := new(big.Rat).Mul(q, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(n)), nil)))
		if scaled.IsInt() {
			return n
		}
	}
	return 12
}

func (r *Reconciler) usageTotalsLag() time.Duration {
	if r.UsageTotalsLag != 0 {
		return r.UsageTotalsLag
	}
	return defaultUsageTotalsLag
}

func (r *Reconciler) usageClockSkew() time.Duration {
	if r.UsageClockSkew != 0 {
		return r.UsageClockSkew
	}
	return defaultUsageClockSkew
}
