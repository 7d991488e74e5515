package archive

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Mark names one archived row by the archive's insert sequence (migration 0003): its
// seq, table, namespace and name. The cluster keeps the latest Mark it read back (its
// watermark); since seq order is commit order, an archive that holds that row holds
// everything archived before it, and one that lacks it is behind the cluster.
type Mark struct {
	Seq       int64  `json:"seq"`
	Table     string `json:"table"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// IsZero reports a mark that names nothing (no row archived since migration 0003).
func (m Mark) IsZero() bool { return m.Seq == 0 }

func (m Mark) String() string {
	return fmt.Sprintf("seq %d (%s %s/%s)", m.Seq, m.Table, m.Namespace, m.Name)
}

// markTables are the tables a Mark may name (a Mark read from a ConfigMap is never
// put into SQL unless it names one of them).
var markTables = map[string]bool{"event_receipts": true, "job_completions": true, "settlements": true}

// tableOf is the table a kind is archived to.
func tableOf(kind string) string {
	switch kind {
	case "WebhookEvent":
		return "event_receipts"
	case "JobCompletion":
		return "job_completions"
	}
	return "settlements"
}

// watermarkState is what this process knows about the archive's position.
type watermarkState struct {
	mu sync.Mutex
	// readBack is the row with the highest seq this Store has read back.
	readBack Mark
	// watermark is the cluster's watermark, as last loaded or written.
	watermark Mark
	// behind is why the archive is behind the cluster ("" when it is not known to be).
	behind string
}

// LastReadBack is the row with the highest seq this Store has inserted or found and
// read back (zero before any). Every row it names was committed when it was read.
func (s *Store) LastReadBack() Mark {
	s.wm.mu.Lock()
	defer s.wm.mu.Unlock()
	return s.wm.readBack
}

func (s *Store) noteReadBack(m Mark) {
	s.wm.mu.Lock()
	defer s.wm.mu.Unlock()
	if m.Seq > s.wm.readBack.Seq {
		s.wm.readBack = m
	}
}

// SetWatermark records the cluster's watermark in this process: every new connection
// to the archive is checked against it before it is used.
func (s *Store) SetWatermark(m Mark) {
	s.wm.mu.Lock()
	defer s.wm.mu.Unlock()
	s.wm.watermark = m
}

// Watermark is the cluster's watermark as this process last knew it.
func (s *Store) Watermark() Mark {
	s.wm.mu.Lock()
	defer s.wm.mu.Unlock()
	return s.wm.watermark
}

// SetBehind records that the archive is behind the cluster, and why ("" clears it:
// only once a person has confirmed, docs/archive-operations.md).
func (s *Store) SetBehind(why string) {
	s.wm.mu.Lock()
	defer s.wm.mu.Unlock()
	if s.wm.behind != why {
		s.changes.Add(1)
	}
	s.wm.behind = why
}

// Changes counts the times the archive was held, released, or found behind or no
// longer behind: what was read from it before a change may not hold after it.
func (s *Store) Changes() uint64 { return s.changes.Load() }

// Behind says why the archive is behind the cluster: it lacks a row the cluster read
// back from it ("" when it is not known to be). In that state "the archive holds no
// such record" is no proof that none was archived.
func (s *Store) Behind() string {
	if s == nil {
		return ""
	}
	s.wm.mu.Lock()
	defer s.wm.mu.Unlock()
	return s.wm.behind
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckMark reports whether the archive holds the row m names (held), and if not,
// why. A zero mark is always held. An error is the archive not answering.
//
// It runs while the archive is still held (its identity and watermark are checked
// before anything else reads it), so it needs only the schema.
func (s *Store) CheckMark(ctx context.Context, m Mark) (held bool, why string, err error) {
	if !s.migrated.Load() {
		return false, "", ErrNotReady
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return checkMark(ctx, s.pool, m)
}

func checkMark(ctx context.Context, q querier, m Mark) (bool, string, error) {
	if m.IsZero() {
		return true, "", nil
	}
	if !markTables[m.Table] {
		return false, "", fmt.Errorf("the watermark names table %q, which the archive does not have", m.Table)
	}
	var counter int64
	var exists bool
	err := q.QueryRow(ctx, `SELECT archive_insert_counter(),
		EXISTS (SELECT 1 FROM `+m.Table+` WHERE seq = $1 AND namespace = $2 AND name = $3)`,
		m.Seq, m.Namespace, m.Name).Scan(&counter, &exists)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "42883") {
		// No counter function or no seq column: a database from before migration 0003,
		// while the cluster read back rows written since.
		return false, fmt.Sprintf("the archive lacks the insert sequence (migration 0003), but the cluster read back row %s from it", m), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("check the archive against the watermark: %w", err)
	}
	switch {
	case !exists:
		return false, fmt.Sprintf("the archive lacks row %s, which the cluster archived, read back and may have deleted; "+
			"its insert counter is at %d", m, counter), nil
	case counter < m.Seq:
		return false, fmt.Sprintf("the archive's insert counter is at %d, behind row %s that the cluster read back", counter, m), nil
	}
	return true, "", nil
}

// checkOnConnect checks a new connection against the watermark before it is used: a
// database restored from an older copy or a promoted standby is reached through new
// connections, so it is found behind before anything is read from or written to it.
// A check that fails refuses the connection (the archive then counts as not
// answering, and what depends on it waits): an unchecked connection is never used
// while there is a watermark to check.
func (s *Store) checkOnConnect(ctx context.Context, conn *pgx.Conn) error {
	m := s.Watermark()
	if m.IsZero() || !s.migrated.Load() {
		return nil
	}
	held, why, err := checkMark(ctx, conn, m)
	if err != nil {
		return err
	}
	if !held {
		s.SetBehind(why)
	}
	return nil
}

// ResetReadBack forgets the rows read back so far: after a person confirmed an archive
// behind the cluster, the watermark starts again from rows the archive holds now.
func (s *Store) ResetReadBack() {
	s.wm.mu.Lock()
	defer s.wm.mu.Unlock()
	s.wm.readBack = Mark{}
}

// Position is where the archive ends, for a person looking for what a restore lost
// (kubectl settlement archive gap).
type Position struct {
	// Counter is the insert counter (migration 0003): the seq the last insert took.
	Counter int64
	// Latest is the row with the highest seq (zero when no row has one), and
	// LatestArchivedAt when it was archived: about where a restored archive ends.
	Latest           Mark
	LatestArchivedAt time.Time
}

// InsertCounter is the archive's insert counter: it only grows, so a value below one
// read before means the archive was restored to an earlier point.
func (s *Store) InsertCounter(ctx context.Context) (int64, error) {
	if err := s.ready(); err != nil {
		return 0, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT archive_insert_counter()`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the archive's insert counter: %w", err)
	}
	return n, nil
}

// ArchivePosition reads the insert counter and the latest row by seq (one index read
// per table).
func (s *Store) ArchivePosition(ctx context.Context) (Position, error) {
	var p Position
	if err := s.ready(); err != nil {
		return p, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.pool.QueryRow(ctx, `SELECT archive_insert_counter()`).Scan(&p.Counter); err != nil {
		return p, fmt.Errorf("read the archive's insert counter: %w", err)
	}
	for _, table := range []string{"event_receipts", "job_completions", "settlements"} {
		var m Mark
		var at time.Time
		err := s.pool.QueryRow(ctx, `SELECT seq, namespace, name, archived_at FROM `+table+
			` WHERE seq IS NOT NULL ORDER BY seq DESC LIMIT 1`).Scan(&m.Seq, &m.Namespace, &m.Name, &at)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return p, fmt.Errorf("read the latest row of %s: %w", table, err)
		}
		if m.Seq > p.Latest.Seq {
			m.Table = table
			p.Latest, p.LatestArchivedAt = m, at
		}
	}
	return p, nil
}

// ArchivedIdempotencyKeys reports which of keys the archive holds a settlement for,
// in namespace ("" for any namespace: not indexed by key alone, so it reads the table).
func (s *Store) ArchivedIdempotencyKeys(ctx context.Context, namespace string, keys []string) (map[string]bool, error) {
	out := map[string]bool{}
	if err := s.ready(); err != nil {
		return nil, err
	}
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 500)]
		keys = keys[len(batch):]
		err := func() error {
			ctx, cancel := s.bound(ctx)
			defer cancel()
			rows, err := s.pool.Query(ctx, `SELECT idempotency_key FROM settlements
				WHERE idempotency_key = ANY($1) AND ($2 = '' OR namespace = $2)`, batch, namespace)
			if err != nil {
				return fmt.Errorf("look up idempotency keys: %w", err)
			}
			defer rows.Close()
			for rows.Next() {
				var k string
				if err := rows.Scan(&k); err != nil {
					return err
				}
				out[k] = true
			}
			return rows.Err()
		}()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
