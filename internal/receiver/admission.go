package receiver

import (
	"context"
	"sync"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/keyedsem"
)

// Limits a delivery can hit, answered 429 with the limit named in the error code and in
// the metric label (docs/design.md §4; decisions.md "Receiver admission").
const (
	// LimitProvider: the provider already has --receiver-max-in-flight-per-provider
	// deliveries in flight (reading their bodies or being stored).
	LimitProvider = "provider"
	// LimitNamespace: the provider's namespace (the tenant) already has
	// --receiver-max-in-flight-per-namespace deliveries in flight.
	LimitNamespace = "namespace"
	// LimitGlobal: --receiver-max-in-flight deliveries are verifying or talking to the
	// API server on this replica.
	LimitGlobal = "global"
)

// tenantSlots bounds the deliveries in flight per namespace and per provider. A
// delivery takes one of each once its headers are in and its provider is known (from
// the informer cache), and keeps them until it is answered, body read included: a
// tenant that floods or stalls uses up its own slots, never another tenant's.
//
// A delivery that finds no free slot waits for one up to the admission wait, so a
// sender's burst is smoothed instead of refused (many senders treat a 429 as a failed
// delivery and retry only much later); a waiting delivery holds no slot.
//
// Semaphores live only while someone uses them, so the map is bounded by what is in
// flight or waiting, not by the names senders try (unknown providers never get here).
type tenantSlots struct {
	perNamespace, perProvider int

	sems keyedsem.Set
}

func newTenantSlots(perNamespace, perProvider int) *tenantSlots {
	return &tenantSlots{perNamespace: perNamespace, perProvider: perProvider}
}

// enter takes a slot of the provider (namespace + "/" + name) and then of its
// namespace, waiting until ctx ends or wait has passed. It returns the release
// function, or the limit that refused the delivery (and then holds nothing).
func (t *tenantSlots) enter(ctx context.Context, namespace, provider string, wait time.Duration) (release func(), limit string) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	// The provider's own limit first: a provider at its limit is told so, even when
	// its namespace is full as well.
	releaseProvider, ok := t.acquire(ctx, timer.C, "p/"+provider, t.perProvider)
	if !ok {
		return nil, LimitProvider
	}
	releaseNamespace, ok := t.acquire(ctx, timer.C, "n/"+namespace, t.perNamespace)
	if !ok {
		releaseProvider()
		return nil, LimitNamespace
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			releaseNamespace()
			releaseProvider()
		})
	}, ""
}

func (t *tenantSlots) acquire(ctx context.Context, expired <-chan time.Time, key string, size int) (func(), bool) {
	return t.sems.Acquire(ctx, expired, key, size)
}

// acquireGlobal takes one of the replica's slots, waiting as enter does.
func acquireGlobal(ctx context.Context, slots chan struct{}, wait time.Duration) (func(), bool) {
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, true
	default:
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, true
	case <-timer.C:
	case <-ctx.Done():
	}
	return nil, false
}
