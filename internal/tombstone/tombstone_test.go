package tombstone

import (
	"fmt"
	"testing"
)

// TestConfigMapNamePinned pins where a tombstone is kept: the name is the stored
// format, and a change would lose every tombstone written before it (a namespace
// created again would then charge its earlier life's keys again).
func TestConfigMapNamePinned(t *testing.T) {
	for _, c := range []struct{ ns, name, want string }{
		{"tenant-a", "inference-stl-0123456789abcdef0123456789abcdef", "settlement-operator-tombstones-684efcffd66093bc-dd"},
		{"tenant-b", "x", "settlement-operator-tombstones-34faf5fe1411a1b3-22"},
	} {
		if got := ConfigMapName(c.ns, c.name); got != c.want {
			t.Errorf("ConfigMapName(%q, %q) = %q, want %q", c.ns, c.name, got, c.want)
		}
	}
}

// TestShards checks that one namespace's tombstones spread over exactly Shards
// ConfigMaps, and that two namespaces never share one.
func TestShards(t *testing.T) {
	seen := map[string]string{}
	for _, ns := range []string{"tenant-a", "tenant-b"} {
		n := 0
		for i := range 20000 {
			name := ConfigMapName(ns, fmt.Sprintf("inference-stl-%032x", i))
			if other, ok := seen[name]; ok && other != ns {
				t.Fatalf("ConfigMap %s holds tombstones of %s and %s", name, other, ns)
			}
			if _, ok := seen[name]; !ok {
				n++
			}
			seen[name] = ns
		}
		if n != Shards {
			t.Errorf("namespace %s: %d ConfigMaps, want %d", ns, n, Shards)
		}
	}
}
