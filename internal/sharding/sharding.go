package sharding

import (
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// WatchedNamespaces turns --watch-namespaces ("a,b") into the cache's namespaces: the
// receiver, the controllers and the archiver of this deployment then see only those,
// so several deployments can shard tenants and each one's memory follows its own.
// Empty: all namespaces (nil).
func WatchedNamespaces(list string) map[string]cache.Config {
	var out map[string]cache.Config
	for _, ns := range strings.Split(list, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			if out == nil {
				out = map[string]cache.Config{}
			}
			out[ns] = cache.Config{}
		}
	}
	return out
}
