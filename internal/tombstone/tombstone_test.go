package tombstone

import (
	"strings"
	"testing"
)

// TestConfigMapNamePinned pins where a tombstone is kept: the name is the stored
// format, and a change would lose every tombstone written before it (a namespace
// created again would then charge its earlier life's keys again).
func TestConfigMapNamePinned(t *testing.T) {
	for _, c := range []struct{ prefix, ns, name, want string }{
		{"settlement-operator.hooks.settlement.dev", "tenant-a", "inference-stl-0123456789abcdef0123456789abcdef",
			"settlement-operator.hooks.settlement.dev-tombstones-684efcffd66093bc-d"},
		{"p", "tenant-b", "x", "p-tombstones-34faf5fe1411a1b3-2"},
	} {
		if got := ConfigMapName(c.prefix, c.ns, c.name); got != c.want {
			t.Errorf("ConfigMapName(%q, %q, %q) = %q, want %q", c.prefix, c.ns, c.name, got, c.want)
		}
	}
}

// TestShards checks that one namespace's tombstones spread over exactly Shards
// ConfigMaps, and that two namespaces never share one.
func TestShards(t *testing.T) {
	seen := map[string]string{}
	for _, ns := range []string{"tenant-a", "tenant-b"} {
		n := 0
		for i := range 2000 {
			name := ConfigMapName("p", ns, "inference-stl-"+strings.Repeat("a", i%7)+string(rune('a'+i%26))+strings.Repeat("0", i%13))
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
