// Package archiver moves finished records from the cluster into the archive in
// PostgreSQL (docs/design.md §12), and checks the archive's schema and identity at
// start.
package archiver
