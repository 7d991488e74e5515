// Package keyedsem is a set of counting semaphores by key (a tenant, a charge), each
// living only while someone holds or waits for it, so the set is bounded by what is in
// flight, not by the keys ever seen.
package keyedsem

import (
	"context"
	"sync"
	"time"
)

// Set holds the semaphores. The zero value is ready to use.
type Set struct {
	mu   sync.Mutex
	sems map[string]*semaphore
}

type semaphore struct {
	slots chan struct{}
	users int // holding or waiting for a slot
}

// Acquire takes one of key's size slots (size is fixed by the first user of a key),
// waiting until one is free, expired fires or ctx ends (a nil expired never fires). A
// slot free at once is taken even when ctx has ended. It returns the release, or
// ok=false when it holds nothing.
func (s *Set) Acquire(ctx context.Context, expired <-chan time.Time, key string, size int) (release func(), ok bool) {
	s.mu.Lock()
	if s.sems == nil {
		s.sems = map[string]*semaphore{}
	}
	sem := s.sems[key]
	if sem == nil {
		sem = &semaphore{slots: make(chan struct{}, size)}
		s.sems[key] = sem
	}
	sem.users++
	s.mu.Unlock()
	done := func() {
		s.mu.Lock()
		if sem.users--; sem.users == 0 {
			delete(s.sems, key)
		}
		s.mu.Unlock()
	}
	select {
	case sem.slots <- struct{}{}:
		return func() { <-sem.slots; done() }, true
	default:
	}
	select {
	case sem.slots <- struct{}{}:
		return func() { <-sem.slots; done() }, true
	case <-expired:
	case <-ctx.Done():
	}
	done()
	return nil, false
}

// TryAcquire takes one of key's size slots only if one is free now; it never waits.
// ok=false: all are held, and nothing is held for the caller.
func (s *Set) TryAcquire(key string, size int) (release func(), ok bool) {
	return s.Acquire(context.Background(), closed, key, size)
}

// closed is an expiry that has already fired: Acquire gives up at once.
var closed = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()

// Len is how many keys have a semaphore now (held or waited for).
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sems)
}
