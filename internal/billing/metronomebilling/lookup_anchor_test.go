package metronomebilling_test

import (
	"context"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/metronomebilling"
	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
)

// A charge first sent dated at its completion, and asked about after its datedUntil,
// is asked about undated (the controller's requestAt drops OccurredAt then), so the
// lookup is anchored at FirstSubmittedAt. The event Metronome holds is the dated one,
// older than the search sees: its "not found" must not read as "nothing there".
func TestLookupAfterDatedUntilIsNotAnchoredAtTheFirstAttempt(t *testing.T) {
	fake, c := start(t)
	now := time.Now().UTC().Truncate(time.Second)
	occurred := now.Add(-metronomebilling.KeyWindow - 30*time.Minute) // dated: outside the search now
	first := now.Add(-2 * time.Hour)                                  // first attempt, inside datedUntil then
	if !first.Before(occurred.Add(metronomebilling.MaxEventAge)) {
		t.Fatal("the first attempt must have been dated")
	}
	r := fake.Charge("k-anchor")
	// What the first attempt carried, ingested when it was sent.
	fake.Put(fakemetronome.Event{TransactionID: r.IdempotencyKey, CustomerID: r.Customer, EventType: fakemetronome.DefaultEventType,
		Timestamp: occurred.Format(time.RFC3339), Properties: map[string]string{"quantity": r.Usage.Quantity,
			metronomebilling.PropSettlementKey: r.SettlementKey, metronomebilling.PropUnit: r.Usage.Unit}}, first)
	// The request as the controller builds it after datedUntil: undated, carrying the
	// pinned usage date it no longer sends.
	r.OccurredAt, r.FirstSubmittedAt, r.DatedAt = time.Time{}, first, occurred
	_, found, err := billing.LookupFor(context.Background(), c, r)
	if err == nil && !found {
		t.Fatalf("Metronome holds the key (effects %d), but the lookup answered an authoritative \"not found\"", fake.Effects(r.IdempotencyKey))
	}
}
