package billingsettlement

import "testing"

// TestProviderShare: a quarter of the workers by default, at least one, and never
// more than all of them.
func TestProviderShare(t *testing.T) {
	for _, c := range []struct{ workers, share, want int }{
		{0, 0, 1}, {1, 0, 1}, {3, 0, 1}, {4, 0, 1}, {8, 0, 2}, {16, 0, 4},
		{16, 2, 2}, {16, 16, 16}, {16, 40, 16}, {1, 3, 1},
	} {
		r := &Reconciler{MaxConcurrentReconciles: c.workers, ProviderShare: c.share}
		if got := r.providerShare(); got != c.want {
			t.Errorf("workers %d, share %d: %d, want %d", c.workers, c.share, got, c.want)
		}
	}
}
