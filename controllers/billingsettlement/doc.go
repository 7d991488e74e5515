// Package billingsettlement is the BillingSettlement reconciler: it carries out the
// decisions of internal/settlement for one financial operation — brackets the call,
// submits or looks up at the provider with the settlement's one idempotency key,
// guards compensations, and releases a settlement only once money provably is not
// pending (docs/design.md §5, §11).
package billingsettlement
