package statuspatch

import (
	"context"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Patch is the one way every reconciler writes status: once per
// reconcile, only when the status differs from the snapshot taken at the start (no
// write that changes nothing a reader sees), as a merge patch of the status
// subresource. With optimisticLock the patch carries the snapshot's resourceVersion,
// so a reconcile that worked from a stale copy gets a conflict (and a requeue with
// fresh state) instead of overwriting what a newer one wrote. It reports whether it
// wrote.
func Patch(ctx context.Context, c client.Client, obj, before client.Object, optimisticLock bool) (bool, error) {
	if equality.Semantic.DeepEqual(statusOf(before), statusOf(obj)) {
		return false, nil
	}
	var patch client.Patch = client.MergeFrom(before)
	if optimisticLock {
		patch = client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	}
	if err := c.Status().Patch(ctx, obj, patch); err != nil {
		return false, fmt.Errorf("patch status of %T %s: %w", obj, obj.GetName(), err)
	}
	return true, nil
}

// statusOf returns the Status field of one of our API objects (all have one).
func statusOf(obj client.Object) any {
	v := reflect.ValueOf(obj)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if f := v.FieldByName("Status"); f.IsValid() {
		return f.Interface()
	}
	return nil
}
