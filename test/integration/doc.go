// Package integration holds the operations suite: the whole operator — receiver and
// every reconciler in one manager — against a real kube-apiserver, with a fake billing
// provider and job sink that are real HTTP servers with a ledger and fault injection.
// Its specs follow events through several reconcilers (an event's job completion and
// settlement, a settlement's reconciliation pass, a record's archival), so they live
// here rather than beside any one reconciler; each reconciler's own unit tests live in
// its package under controllers/.
package integration
