package archivelookup

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// ErrUnavailable wraps an archive that did not answer where the next step
// depends on what it holds.
var ErrUnavailable = errors.New("the archive did not answer")

// Settlement reads a settlement by name from the cluster, then, when
// it is not there and an archive is configured, from the archive. found is false when
// neither has it; an archive that does not answer is an error (never "not found").
func Settlement(ctx context.Context, reader client.Reader, store *archive.Store, ns, name string) (
	bs *hooksv1alpha1.BillingSettlement, archived bool, err error) {
	var obj hooksv1alpha1.BillingSettlement
	err = reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &obj)
	if err == nil {
		return &obj, false, nil
	}
	if !apierrors.IsNotFound(err) || store == nil {
		return nil, false, err
	}
	got, aerr := store.Settlement(ctx, ns, name)
	metrics.NoteArchive("BillingSettlement", aerr)
	if aerr != nil {
		return nil, false, fmt.Errorf("%w: look up settlement %s: %v", ErrUnavailable, name, aerr)
	}
	if got == nil {
		return nil, false, err // the NotFound
	}
	return got, true, nil
}

// Operation finds the archived settlement of the same logical operation as
// bs (nil when the archive holds none).
func Operation(ctx context.Context, store *archive.Store, bs *hooksv1alpha1.BillingSettlement) (*hooksv1alpha1.BillingSettlement, error) {
	names, keys := settlement.OperationIdentities(bs.Namespace, bs.Name, bs.Spec.SettlementKey, bs.Spec.IdempotencyKey)
	got, err := store.SettlementMatching(ctx, bs.Namespace, names, keys)
	metrics.NoteArchive("BillingSettlement", err)
	return got, err
}

// RetryInterval is how soon archival is tried again after the archive failed to answer.
const RetryInterval = 10 * time.Second

// ReversedKey is the settlement key of the settlement a Refund or Void reverses, and
// the provider's reference of it: the one pinned when the compensation was first sent
// (status.reversesRef), else the original's ("" for a charge, or when the original is
// gone).
func ReversedKey(ctx context.Context, reader client.Reader, store *archive.Store, bs *hooksv1alpha1.BillingSettlement) (key, ref string, _ error) {
	if bs.Spec.Reverses == "" {
		return "", "", nil
	}
	orig, _, err := Settlement(ctx, reader, store, bs.Namespace, bs.Spec.Reverses)
	if apierrors.IsNotFound(err) {
		return "", bs.Status.ReversesRef, nil
	}
	if err != nil {
		return "", "", fmt.Errorf("get reversed settlement %s: %w", bs.Spec.Reverses, err)
	}
	return orig.Spec.SettlementKey, settlement.ReversesRefOf(bs, orig), nil
}
