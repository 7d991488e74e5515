// Package index names the field indexes the reconcilers register on the manager's
// cache, so that the reconciler that reads an index and the one that registers it
// agree on its name.
package index
