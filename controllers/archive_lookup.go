package controllers

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
)

// errArchiveUnavailable wraps an archive that did not answer where the next step
// depends on what it holds.
var errArchiveUnavailable = errors.New("the archive did not answer")

// settlementInClusterOrArchive reads a settlement by name from the cluster, then, when
// it is not there and an archive is configured, from the archive. found is false when
// neither has it; an archive that does not answer is an error (never "not found").
func settlementInClusterOrArchive(ctx context.Context, reader client.Reader, store *archive.Store, ns, name string) (
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
	noteArchive("BillingSettlement", aerr)
	if aerr != nil {
		return nil, false, fmt.Errorf("%w: look up settlement %s: %v", errArchiveUnavailable, name, aerr)
	}
	if got == nil {
		return nil, false, err // the NotFound
	}
	return got, true, nil
}
