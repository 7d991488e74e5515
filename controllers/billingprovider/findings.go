package billingprovider

import (
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
)

// maxReportItems is how many findings a report lists; counts are always complete.
const maxReportItems = 100

// findingMemory keeps, per BillingProvider (by UID), the findings of its last pass, so
// that settlement_reconciliation_discrepancies_total counts a finding once rather than
// on every pass that sees it again: an alert on its rate then means "something new",
// and the reports keep the full picture. It lives in memory: after a restart or a
// change of leader every open finding is counted once more (docs/decisions.md
// "Metrics"). A finding is kept as a 64-bit hash of its type, object and
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

// forget drops a deleted provider's findings.
func (m *findingMemory) forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.byProvider, uid)
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
	// markAtMost, when set, caps the mark this pass sets: a settlement whose lookup
	// waits for the next pass must stay inside that pass's window.
	markAtMost time.Time
	// windowStart is the report's window start.
	windowStart time.Time
	// confirmed collects the settlements the pass confirmed, for its report (nil
	// without the archive: they are marked on the settlements themselves).
	confirmed *confirmation.Set
	// lookupsWait says how many lookups by key wait for the next pass, and why ("" when
	// none wait).
	lookupsWait string
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
