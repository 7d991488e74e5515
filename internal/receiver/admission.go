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
	// verified deliveries in flight (being stored).
	LimitProvider = "provider"
	// LimitNamespace: the provider's namespace (the tenant) already has
	// --receiver-max-in-flight-per-namespace deliveries in flight.
	LimitNamespace = "namespace"
	// LimitGlobal: --receiver-max-in-flight verified deliveries are talking to the API
	// server on this replica.
	LimitGlobal = "global"
	// LimitAddress: the delivery's source address already has
	// --receiver-max-unauthenticated-per-address deliveries not yet authenticated (body
	// being read, signature being checked). The address itself is never a label.
	LimitAddress = "address"
)

// addressSlots bounds each source address's unauthenticated deliveries (docs/design.md
// §15): a delivery takes one once its provider is known and gives it back as soon as
// its signature is verified, or with its answer. Until then it holds nothing shared,
// so what a client does before it proves who it is costs only its own slots.
//
// Like tenantSlots, a delivery waits up to the admission wait for a slot, holding none
// while it waits, and semaphores live only while used: the map is bounded by what is
// in flight, not by the addresses ever seen.
type addressSlots struct {
	size int
	sems keyedsem.Set
}

// enter takes one of address's slots; release is idempotent (it is called once the
// signature is verified and again, deferred, with the answer).
func (a *addressSlots) enter(ctx context.Context, address string, wait time.Duration) (release func(), ok bool) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	rel, ok := a.sems.Acquire(ctx, timer.C, address, a.size)
	if !ok {
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(rel) }, true
}

// tenantSlots bounds the deliveries in flight per namespace and per provider. A
// delivery takes one of each once its signature is verified (its body is in), and
// keeps them until it is answered: a tenant whose senders flood uses up its own slots,
// never another tenant's, and an unauthenticated client holds none of them.
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
