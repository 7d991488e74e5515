package archiver

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// A settlement confirmed only by a report (no Reconciled condition of its own) whose
// finalizer comes back between the archiver's release and its DELETE: the DELETE is
// refused, and the settlement, now at a version the report does not name, is still
// the content the report confirmed and that is archived. It must still go — released
// again and deleted — not wait, unprotected or protected, for a pass to confirm a
// version that differs only by the finalizer.
func TestReleaseOfAReportConfirmedSettlementRacedByTheFinalizer(t *testing.T) {
	ctx := context.Background()
	const n = 6
	ns := newNamespace(t, "confirmed-race")
	_, store, _ := newDatabase(t)
	_, _, bss := finishedRecords(t, ns, n)
	keeper, _ := newWatermark(t, store, k8s)

	bp := fixtures.BillingProvider(ns, "http://127.0.0.1:1")
	bp.Name = "billing" // finishedRecords' settlements name it
	if err := k8s.Create(ctx, bp); err != nil {
		t.Fatal(err)
	}
	// Confirmed by a report only: the condition goes, the report names each version.
	var versions []string
	for _, bs := range bss {
		apimeta.RemoveStatusCondition(&bs.Status.Conditions, hooksv1alpha1.ConditionReconciled)
		if err := k8s.Status().Update(ctx, bs); err != nil {
			t.Fatal(err)
		}
		versions = append(versions, confirmation.Version(bs))
	}
	now := time.Now()
	rr := &hooksv1alpha1.ReconciliationReport{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing-pass-1",
			Labels: map[string]string{hooksv1alpha1.LabelBillingProvider: bp.Name}},
		Spec: hooksv1alpha1.ReconciliationReportSpec{BillingProviderRef: bp.Name,
			WindowStart: metav1.NewTime(now.Add(-2 * time.Hour)), WindowEnd: metav1.NewTime(now)},
	}
	if err := k8s.Create(ctx, rr); err != nil {
		t.Fatal(err)
	}
	base := rr.DeepCopy()
	rr.Status.Phase = hooksv1alpha1.ReportCompleted
	rr.Status.Confirmed = &hooksv1alpha1.SettlementConfirmations{BillingProviderUID: string(bp.UID),
		ByReason: []hooksv1alpha1.ConfirmationGroup{{Reason: hooksv1alpha1.ReasonConfirmedByProvider, Settlements: versions}}}
	if err := k8s.Status().Patch(ctx, rr, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}

	am := newManager(t, ns)
	r := &Reconciler{Client: am.GetClient(), Archive: store, Watermark: keeper, After: time.Nanosecond,
		Recorder: am.GetEventRecorder(ControllerName)}
	var released map[string]int
	var mu *sync.Mutex
	r.at, released, mu = finalizerBackOnFirstRelease(t)
	if err := r.SetupWithManager(am); err != nil {
		t.Fatal(err)
	}
	start(t, am)
	// A bound on liveness, not a speed goal: at a load of 19 (three suites beside it)
	// one minute was seen to run out.
	eventually(t, 3*time.Minute, "every report-confirmed settlement archived and gone", func() (bool, error) {
		var l hooksv1alpha1.BillingSettlementList
		if err := k8s.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false, err
		}
		return len(l.Items) == 0, fmt.Errorf("%d left", len(l.Items))
	})
	for _, bs := range bss {
		got, err := store.Settlement(ctx, ns, bs.Name)
		if err != nil || got == nil {
			t.Fatalf("%s not archived: %v", bs.Name, err)
		}
		if !apimeta.IsStatusConditionTrue(got.Status.Conditions, hooksv1alpha1.ConditionReconciled) {
			t.Errorf("%s archived without the report's confirmation", bs.Name)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, bs := range bss {
		if released[bs.Name] != 2 {
			t.Errorf("%s's finalizer removed %d times, want twice (once more after it came back)", bs.Name, released[bs.Name])
		}
	}
}
