// Package archivedmemory is a reconciliation pass's memory of archived records
// (docs/design.md §7): what it need not read back from the archive again.
package archivedmemory

import (
	"crypto/sha256"
	"encoding/json"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// Memory remembers, per BillingProvider, the provider records a pass compared
// with their archived settlement and found nothing to report about, by a hash of the
// whole record. An archived settlement never changes, so the same record compares the
// same way in the next pass: it is counted (examined.ArchivedUnchanged) without reading
// the archive again. A pass lists the last stuckAfter of records every interval — 15
// minutes every 10 by default, but every few seconds where the interval is short — and
// reading each archived settlement back every time was most of what a pass cost.
//
// What makes a record compare again: the record changes at the provider (another
// hash), the BillingProvider's spec changes (another generation), or the archive may
// no longer hold what was compared — it is found behind or unavailable, is held or
// released, a person confirms a restore, or its insert counter, which only grows, is
// lower than a pass read before (a restore to an earlier point the watermark did not
// catch): then everything is forgotten. A walk of the provider's listing that ends
// forgets the records it did not list: they left the window, and the windows only move
// forward, so no later walk lists them (the memory holds one window of records, not every
// record ever archived). A record not listed for an hour past the overlap is forgotten
// too (walks cut short for ever), and a deleted BillingProvider's records with it. It
// lives in memory: after a restart or a change of leader the first pass compares
// everything again.
type Memory struct {
	mu         sync.Mutex
	byProvider map[types.UID]*archivedClean
	archive    State
}

// State is what the memory was built against: the archive's changes count
// (archive.Store.Changes) and the highest insert counter a pass read.
type State struct {
	Changes uint64
	Counter int64
}

// SameArchive forgets everything unless the archive is the one the memory was built
// against: no change since, and an insert counter that did not go back.
func (m *Memory) SameArchive(now State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if now.Changes != m.archive.Changes || now.Counter < m.archive.Counter {
		m.byProvider = nil
	}
	m.archive = now
}

type archivedClean struct {
	generation int64
	seen       map[[32]byte]time.Time // record hash → when a pass last listed it
}

// recordHash identifies everything a provider said about one record.
func recordHash(rec billing.Record) [32]byte {
	raw, _ := json.Marshal(rec) // a struct of strings, numbers and times: cannot fail
	return sha256.Sum256(raw)
}

// clean reports whether rec compared clean with its archived settlement before, under
// this generation of the provider; a known record is marked seen now.
func (m *Memory) Clean(uid types.UID, generation int64, rec billing.Record, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.byProvider[uid]
	if c == nil || c.generation != generation {
		return false
	}
	h := recordHash(rec)
	if _, ok := c.seen[h]; !ok {
		return false
	}
	c.seen[h] = now
	return true
}

// remember notes that rec compared clean with its archived settlement.
func (m *Memory) Remember(uid types.UID, generation int64, rec billing.Record, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byProvider == nil {
		m.byProvider = map[types.UID]*archivedClean{}
	}
	c := m.byProvider[uid]
	if c == nil || c.generation != generation {
		c = &archivedClean{generation: generation, seen: map[[32]byte]time.Time{}}
		m.byProvider[uid] = c
	}
	c.seen[recordHash(rec)] = now
}

// prune forgets the provider's records no pass has listed since before.
func (m *Memory) Prune(uid types.UID, before time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.byProvider[uid]; c != nil {
		for h, t := range c.seen {
			if t.Before(before) {
				delete(c.seen, h)
			}
		}
	}
}

// walkEnded forgets the provider's records that a walk of its listing, started at
// started and now ended, did not list: every record the walk listed was marked seen at
// or after its start.
func (m *Memory) WalkEnded(uid types.UID, started time.Time) {
	m.Prune(uid, started)
}

// drop forgets one provider (it was deleted).
func (m *Memory) Drop(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.byProvider, uid)
}

// forget drops everything remembered about every provider.
func (m *Memory) Forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.byProvider = nil
}
