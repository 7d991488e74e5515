// Package tombstone keeps, outside a tenant's namespace, the name and idempotency key
// of every settlement that presented its key to a provider and left the cluster
// without an archive — in practice, with its namespace (docs/design.md §8, "A
// namespace deleted without an archive").
//
// Settlement names and keys are derived from the namespace and the settlement key
// (docs/design.md §3), so a namespace created again under the same name derives the
// same ones. Without a record anywhere, such a settlement looks never presented —
// exposure None, one POST with no lookup — and once the provider's key window has
// passed that POST is a second charge. A tombstone is that record: the settlement
// controller writes it before it releases the settlement's finalizer, and reads it
// before it takes a settlement for never presented.
//
// Tombstones live in ConfigMaps in the operator's namespace, one set per tenant
// namespace (label hooks.settlement.dev/tombstones-of), spread over Shards ConfigMaps
// by a hash of the settlement's name, each holding at most MaxBytes of entries: a
// namespace's tombstones are bounded, and one that would go past the bound is not
// written (ErrFull), so its settlement stays held and says why. Reads and writes go
// to the API server (no cache to lag); writes are optimistically locked.
package tombstone

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

const (
	// Shards is how many ConfigMaps one namespace's tombstones are spread over. Many
	// small ones rather than a few large ones: each tombstone rewrites its whole
	// ConfigMap, and a namespace's settlements leave at once, so the size of one
	// ConfigMap is what each of them writes to etcd's history.
	Shards = 256
	// MaxBytes bounds the entries (keys and values) of one tombstone ConfigMap: about
	// 190 settlements per ConfigMap, 48,000 per namespace.
	MaxBytes = 32 << 10
)

// ErrOff is returned by Record when no operator namespace is configured: there is
// nowhere outside the tenant's namespace to write the tombstone.
var ErrOff = errors.New("no operator namespace is configured (--operator-namespace, POD_NAMESPACE) to keep tombstones in")

// ErrFull is returned by Record when the namespace's tombstone ConfigMap that would
// hold the entry has reached MaxBytes.
var ErrFull = errors.New("the namespace's tombstones are full")

// Tombstone is what is kept of one settlement that left without an archive.
type Tombstone struct {
	// IdempotencyKey is the key it presented (what to ask the provider by).
	IdempotencyKey string `json:"idempotencyKey"`
	// State and ProviderRef are its last state and the provider's reference.
	State       hooksv1alpha1.SettlementState `json:"state,omitempty"`
	ProviderRef string                        `json:"providerRef,omitempty"`
	// DeletedAt is when the tombstone was written, as the settlement left.
	DeletedAt metav1.Time `json:"deletedAt"`
}

// Keeper writes and reads tombstones. A nil Keeper, or one without a namespace, keeps
// none: Record answers ErrOff and Find finds nothing.
type Keeper struct {
	// Client reads and writes the ConfigMaps (a direct client: no cache to lag).
	Client client.Client
	// Namespace is the operator's own namespace, where the ConfigMaps are.
	Namespace string
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Off reports whether the keeper keeps no tombstones.
func (k *Keeper) Off() bool { return k == nil || k.Namespace == "" }

// ConfigMapName is the ConfigMap that holds (or would hold) the tombstone of
// settlement name in namespace ns. It is part of the stored format: a change would
// lose every tombstone written before (pinned by a test).
//
// It depends on nothing of the deployment (not its leader election ID): a namespace
// deleted and created again may be served by another deployment, or by a reinstalled
// one, and that one must find the earlier life's tombstones.
func ConfigMapName(ns, name string) string {
	shard := identity.Hash32("tombstone", ns, name)[:2] // two hex digits: Shards
	return fmt.Sprintf("settlement-operator-tombstones-%s-%s", identity.Hash32("tombstones-of", ns)[:16], shard)
}

// Where names the ConfigMap holding settlement name of namespace ns, for messages.
func (k *Keeper) Where(ns, name string) string {
	return k.Namespace + "/" + ConfigMapName(ns, name)
}

func (k *Keeper) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

// contended is how often Record tries again when another writer got to the same
// ConfigMap first: a namespace's deletion releases all its settlements at once, and
// they share 16 ConfigMaps.
var contended = wait.Backoff{Steps: 8, Duration: 20 * time.Millisecond, Factor: 1.5, Jitter: 1}

// Record writes bs's tombstone, unless one is there already. It returns ErrOff when
// the keeper keeps none and ErrFull when the ConfigMap is full; any other error is
// the API server's (a conflict that lasted past a few tries included: call again).
func (k *Keeper) Record(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) error {
	if k.Off() {
		return ErrOff
	}
	return retry.OnError(contended, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	}, func() error { return k.record(ctx, bs) })
}

// record is one try of Record: read the ConfigMap, add the entry, write it with the
// resourceVersion read.
func (k *Keeper) record(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) error {
	t := Tombstone{IdempotencyKey: bs.Spec.IdempotencyKey, State: bs.Status.State, ProviderRef: bs.Status.ProviderRef,
		DeletedAt: metav1.NewTime(k.now().UTC().Truncate(time.Second))}
	value, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode tombstone of billingsettlement %s/%s: %w", bs.Namespace, bs.Name, err)
	}
	key := types.NamespacedName{Namespace: k.Namespace, Name: ConfigMapName(bs.Namespace, bs.Name)}
	var cm corev1.ConfigMap
	err = k.Client.Get(ctx, key, &cm)
	if apierrors.IsNotFound(err) {
		cm = corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
				Labels: map[string]string{hooksv1alpha1.LabelTombstonesOf: bs.Namespace}},
			Data: map[string]string{bs.Name: string(value)},
		}
		if err := k.Client.Create(ctx, &cm); err != nil {
			return fmt.Errorf("create tombstone ConfigMap %s: %w", key, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read tombstone ConfigMap %s: %w", key, err)
	}
	if _, ok := cm.Data[bs.Name]; ok {
		return nil // written before (a retry, or the namespace's earlier life)
	}
	size := len(bs.Name) + len(value)
	for name, v := range cm.Data {
		size += len(name) + len(v)
	}
	if size > MaxBytes {
		return fmt.Errorf("%w: ConfigMap %s holds %d bytes of tombstones, at most %d", ErrFull, key, size-len(bs.Name)-len(value), MaxBytes)
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[bs.Name] = string(value)
	// Update carries the resourceVersion read: two writers cannot lose each other's entry.
	if err := k.Client.Update(ctx, &cm); err != nil {
		return fmt.Errorf("write tombstone ConfigMap %s: %w", key, err)
	}
	return nil
}

// Find returns the tombstone of the first of names (settlements of namespace ns) that
// has one, with that name, or nil when none has.
func (k *Keeper) Find(ctx context.Context, ns string, names ...string) (*Tombstone, string, error) {
	if k.Off() {
		return nil, "", nil
	}
	for _, name := range names {
		key := types.NamespacedName{Namespace: k.Namespace, Name: ConfigMapName(ns, name)}
		var cm corev1.ConfigMap
		err := k.Client.Get(ctx, key, &cm)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("read tombstone ConfigMap %s: %w", key, err)
		}
		v, ok := cm.Data[name]
		if !ok {
			continue
		}
		var t Tombstone
		if err := json.Unmarshal([]byte(v), &t); err != nil {
			// Unreadable, but there: the key was presented. Say so rather than guess.
			t = Tombstone{IdempotencyKey: "(unreadable entry: " + err.Error() + ")"}
		}
		return &t, name, nil
	}
	return nil, "", nil
}
