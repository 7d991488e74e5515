package archiver

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// TestHeldChecksLeaveTheRequestPathConnections: the archiver runs a hundred workers per
// kind, and when a batch of settlements leaves, a hundred jobs ask the archive for
// their charge at once. Those checks share the pool with the settlement controller's
// pre-submit check, which fails closed when it cannot get a connection: they may hold
// only a few of its connections at any moment, never all of them.
func TestHeldChecksLeaveTheRequestPathConnections(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "held-lookups")
	_, store, _ := newDatabase(t) // MaxConns 8
	r := &Reconciler{Client: k8s, Archive: store}

	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := int64(store.InUse()); n > peak.Load() {
				peak.Store(n)
			}
		}
	}()
	const jobs = 200
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	for i := range jobs {
		wg.Go(func() {
			jc := &hooksv1alpha1.JobCompletion{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("job-%d", i)},
				Spec: hooksv1alpha1.JobCompletionSpec{Provider: "sender", JobID: fmt.Sprintf("job-%d", i),
					Completion: hooksv1alpha1.Completion{State: hooksv1alpha1.JobFailed}},
			}
			if _, err := r.jobHeld(ctx, jc); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	time.Sleep(10 * time.Millisecond)
	close(stop)
	<-sampled
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := peak.Load(); got > int64(DefaultLookupConcurrency) {
		t.Fatalf("%d concurrent held checks took %d of the pool's 8 connections at once; at most %d may be theirs",
			jobs, got, DefaultLookupConcurrency)
	}
	if peak.Load() == 0 {
		t.Fatal("no held check was seen holding a connection: the sampling measured nothing")
	}
}
