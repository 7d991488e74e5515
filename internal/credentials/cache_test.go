package credentials

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// countingReader serves one Secret and counts the reads; the cache's rules (TTL,
// Failures never kept, forget) are about when it reads, not about the API server.
type countingReader struct {
	client.Reader
	reads int
	token string
	err   error
}

func (c *countingReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	c.reads++
	if c.err != nil {
		return c.err
	}
	s := obj.(*corev1.Secret)
	*s = corev1.Secret{Data: map[string][]byte{"token": []byte(c.token)}}
	s.Name, s.Namespace = key.Name, key.Namespace
	return nil
}

func TestSecretReaderReadsOncePerTTL(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	src := &countingReader{token: "one"}
	r := &SecretReader{Reader: src, TTL: SecretTTL, now: func() time.Time { return now }}
	key := client.ObjectKey{Namespace: "ns", Name: "billing"}
	read := func() {
		t.Helper()
		var s corev1.Secret
		if err := r.Get(context.Background(), key, &s); err != nil {
			t.Fatal(err)
		}
		s.Data["token"] = []byte("mutated by a caller") // must not reach the cached copy
	}
	for range 5 {
		read()
	}
	if src.reads != 1 {
		t.Fatalf("5 uses within the TTL read the Secret %d times, want 1", src.reads)
	}
	var s corev1.Secret
	_ = r.Get(context.Background(), key, &s)
	if string(s.Data["token"]) != "one" {
		t.Fatalf("cached copy was changed through a caller: %q", s.Data["token"])
	}
	now = now.Add(SecretTTL)
	read()
	if src.reads != 2 {
		t.Fatalf("after the TTL: %d reads, want 2", src.reads)
	}
	r.Forget(key)
	read()
	if src.reads != 3 {
		t.Fatalf("after forget (a 401/403): %d reads, want 3", src.reads)
	}
	src.err = errors.New("secrets \"billing\" not found")
	r.Forget(key)
	for range 2 {
		if err := r.Get(context.Background(), key, &corev1.Secret{}); err == nil {
			t.Fatal("a failed read must fail")
		}
	}
	if src.reads != 5 {
		t.Fatalf("failures are never kept: %d reads, want 5", src.reads)
	}
}

// blockingReader holds a read until released, to interleave a forget with it.
type blockingReader struct {
	countingReader
	started, release chan struct{}
}

func (b *blockingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	close(b.started)
	<-b.release
	return b.countingReader.Get(ctx, key, obj, opts...)
}

func TestSecretReaderKeepsNoReadThatStartedBeforeAForget(t *testing.T) {
	src := &blockingReader{countingReader: countingReader{token: "refused"}, started: make(chan struct{}), release: make(chan struct{})}
	r := &SecretReader{Reader: src, TTL: SecretTTL}
	key := client.ObjectKey{Namespace: "ns", Name: "billing"}
	done := make(chan error)
	go func() { done <- r.Get(context.Background(), key, &corev1.Secret{}) }()
	<-src.started
	r.Forget(key) // a 401 for the token this read is about to return
	close(src.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	_, kept := r.entries[key]
	r.mu.Unlock()
	if kept {
		t.Fatal("a read that started before the forget was kept: the refused token would be used for another TTL")
	}
}
