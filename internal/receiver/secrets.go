package receiver

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
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
//     within ttl, or sooner: a signature mismatch refreshes an entry older than
//     refreshAfter, so a sender that already signs with a new key is accepted promptly.
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
	keys    [][]byte  // the last keys read, nil if none was ever read
	fetched time.Time // when keys were read
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

// get returns the Secret's values ordered by key name, and whether they were read for
// this call (fresh). refresh asks for keys newer than refreshAfter (used after a
// signature mismatch); it is honoured only if the last read is older than that.
func (c *secretCache) get(ctx context.Context, key types.NamespacedName, refresh bool) ([][]byte, bool, error) {
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
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, false, errSecretUnavailable{fmt.Errorf("read signing secret %s: %w", key, ctx.Err())}
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if e.err != nil {
			return nil, false, e.err
		}
		return e.keys, true, nil
	}
	now := c.now()
	recentlyTried := !e.tried.IsZero() && now.Sub(e.tried) < c.refreshAfter
	switch {
	case recentlyTried && e.err != nil && (refresh || e.keys == nil || now.Sub(e.fetched) >= c.ttl):
		// The read this call would make failed a moment ago: our failure (503).
		err := e.err
		c.mu.Unlock()
		return nil, false, err
	case e.keys != nil && now.Sub(e.fetched) < c.ttl && (!refresh || recentlyTried):
		keys := e.keys
		c.mu.Unlock()
		return keys, false, nil
	}
	done := make(chan struct{})
	e.loading, e.tried = done, now
	c.mu.Unlock()

	keys, err := c.read(ctx, key)

	c.mu.Lock()
	if err != nil {
		e.err = err
	} else {
		e.keys, e.fetched, e.err = keys, now, nil
	}
	e.loading = nil
	close(done)
	c.mu.Unlock()
	if err != nil {
		return nil, false, err
	}
	return keys, true, nil
}

func (c *secretCache) read(ctx context.Context, key types.NamespacedName) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	var s corev1.Secret
	if err := c.reader.Get(ctx, key, &s); err != nil {
		return nil, errSecretUnavailable{fmt.Errorf("read signing secret %s: %w", key, err)}
	}
	names := make([]string, 0, len(s.Data))
	for k, v := range s.Data {
		if len(v) > 0 {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	keys := make([][]byte, 0, len(names))
	for _, k := range names {
		keys = append(keys, s.Data[k])
	}
	return keys, nil
}
