// Package billingprovider is the BillingProvider reconciler: it reports whether a
// billing backend is usable, holds its deletion while settlements may have money
// there, and runs the reconciliation pass that compares the provider's records and
// usage totals with the cluster and the archive (docs/design.md §7).
package billingprovider
