package archive

import "context"

// ExecForTest runs a statement directly, to show what the schema refuses.
func (s *Store) ExecForTest(ctx context.Context, sql string) error {
	_, err := s.pool.Exec(ctx, sql)
	return err
}
