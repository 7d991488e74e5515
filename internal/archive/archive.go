// Package archive keeps finished records in PostgreSQL so that the cluster holds only
// what is in flight (docs/design.md §12). Event receipts, job completions and
// settlements are inserted once, read back and compared, and never updated: a
// correction is a new settlement, as in the cluster. The tables' unique constraints
// mirror the objects' names and keys, so an archived record still counts for
// deduplication, ordering and "never charge twice".
//
// Writes are idempotent: archiving the same content again is a no-op, archiving other
// content under an archived name or key is a *ConflictError (never overwritten).
package archive

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Config says where the archive is and how the operator talks to it.
type Config struct {
	// URL is a PostgreSQL connection URL or DSN (pgx syntax). TLS is configured in it:
	// sslmode=verify-full with sslrootcert (and sslcert/sslkey for client certificates).
	URL string
	// MaxConns bounds the pool (default 8).
	MaxConns int32
	// StatementTimeout bounds every statement on the server (default 5s).
	StatementTimeout time.Duration
	// ReadOnly makes every session read-only (default_transaction_read_only), for
	// readers such as kubectl-settlement: they never write, whatever the credentials.
	ReadOnly bool
	// ApplicationName is shown in pg_stat_activity (default "settlement-operator").
	ApplicationName string
}

// Store is the archive. Its methods are safe for concurrent use.
type Store struct {
	pool     *pgxpool.Pool
	migrated atomic.Bool
	// callTimeout bounds every call on the client side as well (the statement timeout
	// plus a margin): a server that silently stops answering must not hold a
	// reconciler's worker for the minutes TCP keepalive takes to notice.
	callTimeout time.Duration
	// held, when set, keeps the archive unavailable although its schema is there (its
	// identity is not checked yet, or is not the one the cluster archived to).
	held atomic.Pointer[error]
	// wm is the archive's position against the cluster's watermark (watermark.go).
	wm watermarkState
	// changes counts holds, releases and behind-state changes (Changes).
	changes atomic.Uint64
}

// Hold keeps the archive unavailable with reason (nil releases it).
func (s *Store) Hold(reason error) {
	s.changes.Add(1)
	if reason == nil {
		s.held.Store(nil)
		return
	}
	s.held.Store(&reason)
}

// Identity is the archive's ID, created once with its schema.
func (s *Store) Identity(ctx context.Context) (string, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var id string
	if err := s.pool.QueryRow(ctx, `SELECT id FROM archive_identity ORDER BY created_at LIMIT 1`).Scan(&id); err != nil {
		return "", fmt.Errorf("read the archive's identity: %w", err)
	}
	return id, nil
}

// bound gives a call its client-side deadline.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.callTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.callTimeout)
}

// ErrNotReady is returned until the schema has been migrated.
var ErrNotReady = errors.New("the archive's schema is not migrated yet")

// ConflictError says an archived row under the same name or key holds other content:
// the record is not archived (and so stays in the cluster), and a human looks.
type ConflictError struct {
	Kind, Namespace, Name string
	// Detail names what differs, never values.
	Detail string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("archive already holds a different %s %s/%s: %s", e.Kind, e.Namespace, e.Name, e.Detail)
}

// IsConflict reports whether err is a *ConflictError.
func IsConflict(err error) bool {
	var c *ConflictError
	return errors.As(err, &c)
}

// Open creates the pool. It does not connect: the archive may be down when the
// manager starts, and receipt never depends on it. Call Migrate (the manager runs
// archiver.Migrator) before anything else.
func Open(cfg Config) (*Store, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		// pgx's message may quote the URL; never repeat a password.
		return nil, errors.New("the archive database URL is not valid (pgx connection string syntax)")
	}
	pc.MaxConns = cfg.MaxConns
	if pc.MaxConns <= 0 {
		pc.MaxConns = 8
	}
	timeout := cfg.StatementTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	pc.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(timeout.Milliseconds(), 10)
	pc.ConnConfig.RuntimeParams["application_name"] = "settlement-operator"
	if cfg.ApplicationName != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = cfg.ApplicationName
	}
	if cfg.ReadOnly {
		pc.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	}
	if pc.ConnConfig.ConnectTimeout == 0 || pc.ConnConfig.ConnectTimeout > 10*time.Second {
		pc.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pc.HealthCheckPeriod = 10 * time.Second
	s := &Store{callTimeout: timeout + 2*time.Second}
	pc.AfterConnect = s.checkOnConnect
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("archive pool: %w", err)
	}
	s.pool = pool
	return s, nil
}

// InUse is how many of the pool's connections are held by calls right now.
func (s *Store) InUse() int { return int(s.pool.Stat().AcquiredConns()) }

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Ping checks that the archive answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.ready(); err != nil {
		return err
	}
	return s.pool.Ping(ctx)
}

// Ready reports whether the schema is migrated.
func (s *Store) Ready() bool { return s.ready() == nil }

// Migrate applies the embedded migrations not yet recorded in schema_migrations, each
// in its own transaction, under an advisory lock so replicas starting together apply
// each once.
func (s *Store) Migrate(ctx context.Context) error { return s.migrate(ctx, 0) }

// migrate applies the migrations up to version upTo (0: all of them).
func (s *Store) migrate(ctx context.Context, upTo int) error {
	files, err := migrations.ReadDir("migrations")
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for _, f := range files {
		names = append(names, f.Name())
	}
	sort.Strings(names)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect to the archive: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(7410524)`); err != nil {
		return fmt.Errorf("lock the archive schema: %w", err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock(7410524)`) }()
	// Only created when missing: a role with INSERT/SELECT only (the schema applied by a
	// DBA) must be able to start, and CREATE ... IF NOT EXISTS needs CREATE on the schema.
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("read schema_migrations: %w", err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
	}
	for _, name := range names {
		version, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migration %s: the name must start with its version number", name)
		}
		var applied bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, version).Scan(&applied); err != nil {
			return fmt.Errorf("read schema_migrations: %w", err)
		}
		if applied || (upTo > 0 && version > upTo) {
			continue
		}
		sql, err := migrations.ReadFile("migrations/" + name)
		if err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, version, name)
			return err
		})
		if err != nil {
			return fmt.Errorf("apply migration %s: %w", name, err)
		}
	}
	s.migrated.Store(true)
	return nil
}

// SchemaVersion is the highest migration applied.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}

func (s *Store) ready() error {
	if h := s.held.Load(); h != nil {
		return *h
	}
	if !s.migrated.Load() {
		return ErrNotReady
	}
	return nil
}

// objectJSON is the record as kubectl would show it, without what carries no
// information once it has left the cluster (migration 0002, docs/archive.md):
// managedFields, the resourceVersion (a revision of this cluster's etcd), the
// operator's own labels (hooks.settlement.dev/…: selectors for the informers, each a
// hash of spec fields the row holds as columns) and its protection finalizer (always
// there while a record is archived). Labels, annotations and finalizers of anyone else
// are kept. No content hash covers any of it.
func objectJSON(obj any, kind string) ([]byte, error) {
	m, err := objectMap(obj, kind)
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// objectMap is objectJSON before it is encoded.
func objectMap(obj any, kind string) (map[string]any, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	// Numbers stay exact (a version or sequence may be a nanosecond timestamp, past
	// float64's 2^53).
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	m["apiVersion"] = hooksv1alpha1.GroupVersion.String()
	m["kind"] = kind
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "managedFields")
		delete(md, "resourceVersion")
		if labels, ok := md["labels"].(map[string]any); ok {
			for k := range labels {
				if strings.HasPrefix(k, hooksv1alpha1.GroupVersion.Group+"/") {
					delete(labels, k)
				}
			}
			if len(labels) == 0 {
				delete(md, "labels")
			}
		}
		if fins, ok := md["finalizers"].([]any); ok {
			kept := fins[:0]
			for _, f := range fins {
				if f != hooksv1alpha1.FinalizerSettlementProtection {
					kept = append(kept, f)
				}
			}
			if len(kept) == 0 {
				delete(md, "finalizers")
			} else {
				md["finalizers"] = kept
			}
		}
	}
	return m, nil
}

func hashOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain API types are hashed
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// row is one record as the archive stores it: its table, the columns an insert
// writes (a column may carry a cast for its value, "usage_quantity::numeric") and their
// values, the select list that reads the row back (over the table as t: the object as
// readers get it, its stored content hash, whether the row is of 0001's form, its
// seq), the columns beyond namespace and name that identify it (a job's version), and
// check, which recomputes the content hash from what is stored next to the record's own.
type row struct {
	kind, namespace, name string
	table                 string
	columns               []string
	values                []any
	readBack              string
	key                   []string
	keyValues             []any
	check                 func(stored []byte, legacy bool) (got, want string, err error)
}

// insertSQL is the row's single-row insert: ON CONFLICT DO NOTHING on every unique
// constraint.
func (r *row) insertSQL() string {
	names := make([]string, len(r.columns))
	params := make([]string, len(r.columns))
	for i, c := range r.columns {
		name, cast, _ := strings.Cut(c, "::")
		names[i], params[i] = name, "$"+strconv.Itoa(i+1)
		if cast != "" {
			params[i] += "::" + cast
		}
	}
	return "INSERT INTO " + r.table + " (" + strings.Join(names, ", ") + ") VALUES (" + strings.Join(params, ",") + ") ON CONFLICT DO NOTHING"
}

// readBackSQL reads the row under the record's own name (and key) back.
func (r *row) readBackSQL() (string, []any) {
	where := []string{"t.namespace = $1", "t.name = $2"}
	args := []any{r.namespace, r.name}
	for i, k := range r.key {
		args = append(args, r.keyValues[i])
		where = append(where, "t."+k+" = $"+strconv.Itoa(len(args)))
	}
	return "SELECT " + r.readBack + " FROM " + r.table + " t WHERE " + strings.Join(where, " AND "), args
}

// insertReadBack inserts one row (ON CONFLICT DO NOTHING: every unique constraint),
// then reads the row under the record's own name back: its stored content hash, and
// its content hash recomputed from what is stored (readBack selects the object as
// readers get it, its content hash, whether the row is of 0001's form, and its seq,
// which LastReadBack then covers). check
// returns the recomputed hash and the archived record's own (of the same form). A row
// that is missing after the insert means another record holds one of its keys.
func (s *Store) insertReadBack(ctx context.Context, r *row) error {
	kind, ns, name := r.kind, r.namespace, r.name
	if err := s.ready(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if _, err := s.pool.Exec(ctx, r.insertSQL(), r.values...); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
			// A data exception (say, a NUL character): this record can never be
			// archived as it is; retrying would only report the archive as down.
			return &ConflictError{Kind: kind, Namespace: ns, Name: name,
				Detail: "the archive refuses its content (SQLSTATE " + pgErr.Code + ")"}
		}
		return fmt.Errorf("archive %s %s/%s: %w", kind, ns, name, err)
	}
	var rb readBackRow
	readBack, readArgs := r.readBackSQL()
	err := s.pool.QueryRow(ctx, readBack, readArgs...).Scan(&rb.stored, &rb.storedHash, &rb.legacy, &rb.seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return r.missing()
	}
	if err != nil {
		return fmt.Errorf("read back %s %s/%s: %w", kind, ns, name, err)
	}
	return s.verify(r, rb)
}

// readBackRow is what a read-back selects: the object as readers get it, its stored
// content hash, whether the row is of 0001's form, and its seq (NULL before 0003).
type readBackRow struct {
	stored     []byte
	storedHash string
	legacy     bool
	seq        *int64
}

// missing is the record's error when no row is under its own name (and key) after
// its insert: another record holds one of its keys.
func (r *row) missing() error {
	return &ConflictError{Kind: r.kind, Namespace: r.namespace, Name: r.name,
		Detail: "another archived record holds one of its unique keys (event ID, job version, settlement or idempotency key)"}
}

// verify compares the row read back under the record's name with the record (the
// single and the batched path alike) and, when they match, notes its seq for the
// watermark (LastReadBack).
func (s *Store) verify(r *row, rb readBackRow) error {
	kind, ns, name := r.kind, r.namespace, r.name
	stored, storedHash, legacy, seq := rb.stored, rb.storedHash, rb.legacy, rb.seq
	got, want, err := r.check(stored, legacy)
	if err != nil {
		return fmt.Errorf("read back %s %s/%s: the stored object does not decode: %w", kind, ns, name, err)
	}
	if storedHash != want {
		return &ConflictError{Kind: kind, Namespace: ns, Name: name, Detail: "the archived row has other content (a different object or outcome under the same name)"}
	}
	if got != want {
		return &ConflictError{Kind: kind, Namespace: ns, Name: name,
			Detail: "the stored object does not read back as what was archived (its encoding lost something)"}
	}
	if seq != nil { // NULL: a row archived before migration 0003
		s.noteReadBack(Mark{Seq: *seq, Table: tableOf(kind), Namespace: ns, Name: name})
	}
	return nil
}
