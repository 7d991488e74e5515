package archive

import "context"

// ExecForTest runs a statement directly, to show what the schema refuses.
func (s *Store) ExecForTest(ctx context.Context, sql string) error {
	_, err := s.pool.Exec(ctx, sql)
	return err
}

// MigrateToForTest applies the migrations up to version upTo only, to write rows of an
// earlier schema.
func (s *Store) MigrateToForTest(ctx context.Context, upTo int) error { return s.migrate(ctx, upTo) }

// ObjectJSONForTest is the record as the archive keeps it (objectJSON).
func ObjectJSONForTest(obj any, kind string) ([]byte, error) { return objectJSON(obj, kind) }

// QueryRowForTest reads one value directly.
func (s *Store) QueryRowForTest(ctx context.Context, sql string, dest any) error {
	return s.pool.QueryRow(ctx, sql).Scan(dest)
}
