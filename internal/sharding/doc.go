// Package sharding turns --watch-namespaces into the cache's namespaces, so that
// several deployments can each serve their own tenants.
package sharding
