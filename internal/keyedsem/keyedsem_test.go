package keyedsem

import (
	"context"
	"testing"
	"time"
)

func TestAcquire(t *testing.T) {
	var s Set
	ctx := context.Background()
	r1, ok1 := s.Acquire(ctx, nil, "a", 2)
	r2, ok2 := s.Acquire(ctx, nil, "a", 2)
	if !ok1 || !ok2 {
		t.Fatal("two slots of a size-2 key were not both free")
	}
	expired := make(chan time.Time, 1)
	expired <- time.Now()
	if _, ok := s.Acquire(ctx, expired, "a", 2); ok {
		t.Fatal("a third slot of a size-2 key was taken")
	}
	if r, ok := s.Acquire(ctx, expired, "b", 2); !ok {
		t.Fatal("another key waited for a's slots")
	} else {
		r()
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, ok := s.Acquire(cancelled, nil, "a", 2); ok {
		t.Fatal("a cancelled wait took a slot")
	}
	got := make(chan bool)
	go func() {
		r, ok := s.Acquire(ctx, nil, "a", 2)
		if ok {
			r()
		}
		got <- ok
	}()
	r1()
	if !<-got {
		t.Fatal("a waiter did not get the released slot")
	}
	if r, ok := s.Acquire(cancelled, nil, "a", 2); !ok {
		t.Fatal("a free slot was refused to an ended context")
	} else {
		r()
	}
	r3, ok3 := s.TryAcquire("a", 2)
	if !ok3 {
		t.Fatal("TryAcquire refused the one free slot")
	}
	if _, ok := s.TryAcquire("a", 2); ok {
		t.Fatal("TryAcquire took a slot of a key whose slots are all held")
	}
	r3()
	r2()
	if r, ok := s.TryAcquire("a", 2); !ok {
		t.Fatal("TryAcquire refused a free slot")
	} else {
		r()
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("%d semaphores kept after use", n)
	}
}
