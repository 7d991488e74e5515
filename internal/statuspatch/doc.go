// Package statuspatch writes an object's status the one way every reconciler does:
// once per reconcile, only when it differs from the snapshot taken at the start.
package statuspatch
