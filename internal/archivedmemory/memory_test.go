package archivedmemory

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// TestArchivedMemoryForgetsWhatAChangedArchiveMayNotHold: a record remembered as
// compared clean with its archived settlement is compared again once the archive may no
// longer hold that settlement — found behind and confirmed by a person between two passes
// (no pass saw it behind), restored to an earlier point the watermark did not catch (its
// insert counter went back), or held — and a deleted provider's records are dropped.
func TestArchivedMemoryForgetsWhatAChangedArchiveMayNotHold(t *testing.T) {
	const uid, gen = types.UID("bp-1"), int64(3)
	now := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	rec := billing.Record{ID: "st_1", Status: billing.StatusSettled, IdempotencyKey: "k1", SettlementKey: "ns/p/1"}
	store := &archive.Store{}
	var m Memory
	pass := func(counter int64) { m.SameArchive(State{Changes: store.Changes(), Counter: counter}) }

	pass(100)
	m.Remember(uid, gen, rec, now)
	pass(101)
	if !m.Clean(uid, gen, rec, now) {
		t.Fatal("a record compared clean, with nothing changed since, must not be read back again")
	}
	changed := rec
	changed.Status = billing.StatusPending
	if m.Clean(uid, gen, changed, now) || m.Clean(uid, gen+1, rec, now) {
		t.Fatal("a changed record, or a changed spec, must be compared again")
	}

	store.SetBehind("a row the cluster read back is missing")
	store.SetBehind("") // a person confirmed the restore before the next pass
	pass(101)
	if m.Clean(uid, gen, rec, now) {
		t.Fatal("after the archive was found behind, a record must be compared again, even if no pass saw it behind")
	}

	m.Remember(uid, gen, rec, now)
	pass(90) // restored to an earlier point
	if m.Clean(uid, gen, rec, now) {
		t.Fatal("after the insert counter went back, a record must be compared again")
	}

	m.Remember(uid, gen, rec, now)
	store.Hold(nil)
	pass(90)
	if m.Clean(uid, gen, rec, now) {
		t.Fatal("after the archive was held or released, a record must be compared again")
	}

	m.Remember(uid, gen, rec, now)
	m.Drop(uid)
	if m.Clean(uid, gen, rec, now) || len(m.byProvider) != 0 {
		t.Fatal("a deleted provider's records must be dropped")
	}

	m.Remember(uid, gen, rec, now)
	m.Prune(uid, now.Add(time.Second))
	if m.Clean(uid, gen, rec, now) {
		t.Fatal("a record no pass listed since the cut-off must be forgotten")
	}
}

// TestArchivedMemoryHoldsOneWindow: the memory keeps the records of the provider's
// listing window, not every record ever archived. A walk that ends forgets what it did not
// list (those records left the window, and windows only move forward), and keeps what it
// listed, in whichever of its passes; at a steady rate the memory stays at one window.
func TestArchivedMemoryHoldsOneWindow(t *testing.T) {
	const uid, gen = types.UID("bp-1"), int64(1)
	start := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	var m Memory
	rec := func(i int) billing.Record {
		return billing.Record{ID: fmt.Sprintf("st_%d", i), Status: billing.StatusSettled, IdempotencyKey: fmt.Sprintf("k%d", i)}
	}
	const perPass, window = 10, 3 // records archived per pass; passes a record stays listed
	next := 0
	for pass := 0; pass < 50; pass++ {
		now := start.Add(time.Duration(pass) * 5 * time.Second)
		for i := 0; i < perPass; i++ { // newly archived records, compared once
			m.Remember(uid, gen, rec(next), now)
			next++
		}
		for i := max(0, next-window*perPass); i < next-perPass; i++ { // listed again, still in the window
			if !m.Clean(uid, gen, rec(i), now) {
				t.Fatalf("pass %d: record %d, listed in every pass of the window, was forgotten", pass, i)
			}
		}
		m.WalkEnded(uid, now)
		if n := m.size(uid); n > window*perPass {
			t.Fatalf("pass %d: %d records remembered, want at most one window (%d)", pass, n, window*perPass)
		}
	}

	// A walk cut into several passes keeps what any of its passes listed.
	walk := start.Add(time.Hour)
	m.Remember(uid, gen, rec(1000), walk)
	m.Remember(uid, gen, rec(1001), walk.Add(5*time.Second))
	m.WalkEnded(uid, walk)
	if !m.Clean(uid, gen, rec(1000), walk) || !m.Clean(uid, gen, rec(1001), walk) {
		t.Fatal("a record listed in any pass of the ended walk must be kept")
	}
}

// size is how many records are remembered for the provider.
func (m *Memory) size(uid types.UID) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.byProvider[uid]; c != nil {
		return len(c.seen)
	}
	return 0
}
