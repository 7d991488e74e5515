package billingsettlement

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// TestCompensationLocks: compensations of one charge take turns; others do not wait.
func TestCompensationLocks(t *testing.T) {
	var k chargeLocks
	comp := func(ns, reverses string) *hooksv1alpha1.BillingSettlement {
		return &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns},
			Spec: hooksv1alpha1.BillingSettlementSpec{Reverses: reverses}}
	}
	ctx := context.Background()
	lock := func(bs *hooksv1alpha1.BillingSettlement) func() {
		t.Helper()
		unlock, err := k.lock(ctx, bs)
		if err != nil {
			t.Fatal(err)
		}
		return unlock
	}
	unlock := lock(comp("ns", "charge"))
	done := make(chan struct{})
	go func() {
		unlock, err := k.lock(ctx, comp("ns", "charge"))
		if err == nil {
			unlock()
		}
		close(done)
	}()
	lock(comp("ns", "another"))()              // another charge: not held up
	lock(comp("other", "charge"))()            // the same name in another namespace: not held up
	lock(&hooksv1alpha1.BillingSettlement{})() // a charge itself: no lock
	stopped, cancel := context.WithCancel(ctx) // a worker waiting while the manager stops
	cancel()
	if _, err := k.lock(stopped, comp("ns", "charge")); err == nil {
		t.Fatal("a cancelled wait took the lock")
	}
	select {
	case <-done:
		t.Fatal("a second compensation of the charge went while the first held it")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the second compensation never got its turn")
	}
	if n := k.sems.Len(); n != 0 {
		t.Fatalf("%d locks kept after use", n)
	}
}

// TestCompensationLockWaitIsBounded: a compensation whose charge's lock another holds
// (its POST may last the provider's whole requestTimeout) gives up after a bounded
// wait, so it is requeued instead of holding a settlement worker for as long.
func TestCompensationLockWaitIsBounded(t *testing.T) {
	var k chargeLocks
	bs := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"},
		Spec: hooksv1alpha1.BillingSettlementSpec{Reverses: "charge"}}
	unlock, err := k.lock(context.Background(), bs)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	got := make(chan error, 1)
	go func() {
		unlock, err := k.lock(context.Background(), bs)
		if err == nil {
			unlock()
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err == nil {
			t.Fatal("a second compensation of the charge took the lock the first holds")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a compensation waited for its charge's lock for good, holding its worker")
	}
}
