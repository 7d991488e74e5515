// Package archivelookup reads a record from the cluster or, once it has been
// archived, from the archive (docs/design.md §12): a settlement by name, the archived
// settlement of the same logical operation, and the key of the settlement a
// compensation reverses. An archive that does not answer is ErrUnavailable, never
// 'not found'.
package archivelookup
