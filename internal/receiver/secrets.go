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
// A rotation (a key added to the Secret) is seen within ttl, or sooner: a signature
// mismatch refreshes an entry older than refreshAfter once, so a sender that already
// signs with a new key is accepted promptly while a flood of forged requests costs at
// most one GET per refreshAfter per Secret.
type secretCache struct {
	reader       client.Reader
	ttl          time.Duration
	refreshAfter time.Duration
	now          func() time.Time

	mu      sync.Mutex
	entries map[types.NamespacedName]*secretEntry
}

type secretEntry struct {
	keys    [][]byte
	fetched time.Time
}

func newSecretCache(reader client.Reader, ttl, refreshAfter time.Duration) *secretCache {
	return &secretCache{
		reader: reader, ttl: ttl, refreshAfter: refreshAfter, now: time.Now,
		entries: map[types.NamespacedName]*secretEntry{},
	}
}

// errSecretUnavailable means we could not read the Secret: our problem, answered 503.
type errSecretUnavailable struct{ err error }

func (e errSecretUnavailable) Error() string { return e.err.Error() }
func (e errSecretUnavailable) Unwrap() error { return e.err }

// get returns the Secret's values ordered by key name. forceIfOlder re-reads an entry
// older than refreshAfter (used after a signature mismatch).
func (c *secretCache) get(ctx context.Context, key types.NamespacedName, forceIfOlder bool) ([][]byte, bool, error) {
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	now := c.now()
	if ok {
		age := now.Sub(e.fetched)
		if age < c.ttl && !(forceIfOlder && age >= c.refreshAfter) {
			return e.keys, false, nil
		}
		if forceIfOlder && age < c.refreshAfter {
			return e.keys, false, nil
		}
	}
	var s corev1.Secret
	if err := c.reader.Get(ctx, key, &s); err != nil {
		return nil, false, errSecretUnavailable{fmt.Errorf("read signing secret %s: %w", key, err)}
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
	c.mu.Lock()
	c.entries[key] = &secretEntry{keys: keys, fetched: now}
	c.mu.Unlock()
	return keys, true, nil
}
