// Package conditions sets the status conditions every reconciler writes, stamped with
// the object's generation, and keeps their messages within the CRDs' bounds.
package conditions
