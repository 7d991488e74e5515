package receiver

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// secretCache keeps signing secrets in memory for a short time. It reads single
// Secrets by name with a live GET instead of watching every Secret in the cluster, so
// the receiver needs only `get` on Secrets and holds no Secret it does not use.
//
// Reading the signing keys is the only API call a delivery can cause before its
// signature is verified, so it is bounded whatever senders do (decisions.md "Receiver
// admission"): a Secret is read at most once per refreshAfter (or per ttl,
// if shorter), however many deliveries ask at once (they share one read), whether the
// read succeeds or fails.
//
//   - A loaded Secret is used for ttl. A rotation (a key added to the Secret) is seen
//     within ttl, or sooner: a signature mismatch, or keys the provider names but the
//     cached Secret cannot give, refresh an entry older than refreshAfter, so a sender
//     that already signs with a new key is accepted promptly.
//   - A failed read (the Secret is missing, the API server does not answer) is
//     remembered for refreshAfter: forged deliveries to a provider whose Secret is
//     missing cost one GET per refreshAfter, not one each.
//
// The names read are those WebhookProviders reference, never one a sender chooses.
type secretCache struct {
	reader       client.Reader
	ttl          time.Duration
	refreshAfter time.Duration
	// timeout bounds one read. The read does not end with the delivery that started
	// it: deliveries waiting for it share its result, and a sender that hangs up must
	// not be able to make it fail (a failure is remembered for refreshAfter).
	timeout time.Duration
	now     func() time.Time

	mu      sync.Mutex
	entries map[types.NamespacedName]*secretEntry
}

type secretEntry struct {
	// secret is the last Secret read (its type and data only), nil if none was ever
	// read. Which of its keys sign is decided per provider (internal/signingkeys):
	// two providers may share a Secret and name different keys.
	secret  *corev1.Secret
	fetched time.Time // when secret was read
	tried   time.Time // when the last read (successful or not) started
	err     error     // the last read's error, nil if it succeeded
	loading chan struct{}
}

func newSecretCache(reader client.Reader, ttl, refreshAfter, timeout time.Duration) *secretCache {
	return &secretCache{
		reader: reader, ttl: ttl, refreshAfter: refreshAfter, timeout: timeout, now: time.Now,
		entries: map[types.NamespacedName]*secretEntry{},
	}
}

// errSecretUnavailable means we could not read the Secret: our problem, answered 503.
type errSecretUnavailable struct{ err error }

func (e errSecretUnavailable) Error() string { return e.err.Error() }
func (e errSecretUnavailable) Unwrap() error { return e.err }

// get returns the Secret (its name, type and data; shared, never to be modified),
// and whether it was read for this call (fresh). refresh asks for a Secret newer than
// refreshAfter (used after a signature mismatch or refused keys); it is honoured only
// if the last read is older than that.
func (c *secretCache) get(ctx context.Context, key types.NamespacedName, refresh bool) (*corev1.Secret, bool, error) {
	c.mu.Lock()
	e, ok := c.entries[key]
	if !ok {
		e = &secretEntry{}
		c.entries[key] = e
	}
	if wait := e.loading; wait != nil {
		// Another delivery is reading this Secret now: share its result. Its keys are
		// as new as any this call could read, so they count as fresh.
		c.mu.Unlock()
		return c.awaitRead(ctx, e, wait, key)
	}
	now := c.now()
	recentlyTried := !e.tried.IsZero() && now.Sub(e.tried) < c.refreshAfter
	switch {
	case recentlyTried && e.err != nil && (refresh || e.secret == nil || now.Sub(e.fetched) >= c.ttl):
		// The read this call would make failed a moment ago: our failure (503).
		err := e.err
		c.mu.Unlock()
		return nil, false, err
	case e.secret != nil && now.Sub(e.fetched) < c.ttl && (!refresh || recentlyTried):
		secret := e.secret
		c.mu.Unlock()
		return secret, false, nil
	}
	done := make(chan struct{})
	e.loading, e.tried = done, now
	c.mu.Unlock()

	// The read runs on its own, up to timeout, and is shared: this delivery waits for
	// it only until its own deadline (the request's, docs/design.md §4 "Time
	// budget"), so an API server that hangs costs a sender its answer in time, a 503,
	// never a late one; the read's result still serves the next delivery.
	go func() {
		secret, err := c.read(ctx, key)
		c.mu.Lock()
		if err != nil {
			e.err = err
		} else {
			e.secret, e.fetched, e.err = secret, now, nil
		}
		e.loading = nil
		close(done)
		c.mu.Unlock()
	}()
	return c.awaitRead(ctx, e, done, key)
}

// awaitRead waits, until ctx ends, for the shared read of e that closes done, and
// returns its result (fresh: as new as any read this call could make).
func (c *secretCache) awaitRead(ctx context.Context, e *secretEntry, done <-chan struct{}, key types.NamespacedName) (*corev1.Secret, bool, error) {
	select {
	case <-done:
	case <-ctx.Done():
		return nil, false, errSecretUnavailable{fmt.Errorf("read signing secret %s: %w", key, ctx.Err())}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.err != nil {
		return nil, false, e.err
	}
	return e.secret, true, nil
}

// read returns the Secret with only what selecting its keys needs: its name, type and
// data (no labels, annotations or managed fields kept in memory).
func (c *secretCache) read(ctx context.Context, key types.NamespacedName) (*corev1.Secret, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	var s corev1.Secret
	if err := c.reader.Get(ctx, key, &s); err != nil {
		return nil, errSecretUnavailable{fmt.Errorf("read signing secret %s: %w", key, err)}
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name}, Type: s.Type, Data: s.Data}, nil
}
