package credentials

import (
	"context"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// SecretTTL is how long a billing credential's Secret is used after it was read
// before it is read again: a rotation, or a Secret that stops opting in
// (docs/design.md §11, "Credentials"), takes effect within it. An answer 401/403 from
// the provider re-reads it at once.
const SecretTTL = 10 * time.Second

// SecretReader keeps Secrets read by name for CredentialTTL, so a settlement's call
// does not cost a GET of its Secret (the operator may only `get` Secrets, so it
// cannot watch them: docs/decisions.md "Credentials out of the hot path"). The
// opt-in rules are checked on every use against the copy, and a failed read is never
// kept: the next use reads again.
type SecretReader struct {
	Reader client.Reader
	TTL    time.Duration
	now    func() time.Time

	mu      sync.Mutex
	entries map[types.NamespacedName]cachedSecret
	// forgotten counts forget calls per key: a read that started before one (and may
	// carry the token just refused) is not kept.
	forgotten map[types.NamespacedName]uint64
}

type cachedSecret struct {
	secret *corev1.Secret
	read   time.Time
}

// Get implements client.Reader for Secrets (other kinds read through).
func (s *SecretReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	out, ok := obj.(*corev1.Secret)
	if !ok {
		return s.Reader.Get(ctx, key, obj, opts...)
	}
	now := s.clock()
	s.mu.Lock()
	e, hit := s.entries[key]
	epoch := s.forgotten[key]
	s.mu.Unlock()
	if hit && now.Sub(e.read) < s.TTL {
		e.secret.DeepCopyInto(out)
		return nil
	}
	var fresh corev1.Secret
	if err := s.Reader.Get(ctx, key, &fresh, opts...); err != nil {
		s.Forget(key)
		return err
	}
	s.mu.Lock()
	if s.entries == nil {
		s.entries = map[types.NamespacedName]cachedSecret{}
	}
	if s.forgotten[key] == epoch {
		s.entries[key] = cachedSecret{secret: fresh.DeepCopy(), read: now}
	}
	s.mu.Unlock()
	fresh.DeepCopyInto(out)
	return nil
}

// List reads through: the operator never lists Secrets.
func (s *SecretReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return s.Reader.List(ctx, list, opts...)
}

// Forget drops a Secret, so its next use reads it again.
func (s *SecretReader) Forget(key types.NamespacedName) {
	s.mu.Lock()
	delete(s.entries, key)
	if s.forgotten == nil {
		s.forgotten = map[types.NamespacedName]uint64{}
	}
	s.forgotten[key]++
	s.mu.Unlock()
}

func (s *SecretReader) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// Rejected reports a provider's 401/403: the token it was sent is not
// (or no longer) valid, so the Secret is read again before the next call.
func Rejected(err error) bool {
	e, ok := billing.AsError(err)
	return ok && (e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden)
}
