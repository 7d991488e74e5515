package archive

// Finding archived records: by any name or key a person holds (Find), and the
// settlements of a period for finance (ListSettlements, ExportSettlements). Every
// statement is parameterised: SQL text is assembled only from constant fragments and
// numbered placeholders ($1, $2, …); values never enter it.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// CheckSchema makes the store usable without changing the database: it checks that the
// schema was migrated (by the operator) at least to the version this build knows.
// Readers that must never write, such as kubectl-settlement, call it instead of Migrate.
func (s *Store) CheckSchema(ctx context.Context) error {
	want, err := latestMigration()
	if err != nil {
		return err
	}
	var have int
	err = s.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&have)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w: the database has no schema_migrations table (has the operator ever run against it?)", ErrNotReady)
	}
	if err != nil {
		return fmt.Errorf("read the archive's schema version: %w", err)
	}
	if have < want {
		return fmt.Errorf("%w: the archive's schema is at version %d, this program needs %d (upgrade the operator, or use an older kubectl-settlement)", ErrNotReady, have, want)
	}
	s.migrated.Store(true)
	return nil
}

func latestMigration() (int, error) {
	files, err := migrations.ReadDir("migrations")
	if err != nil {
		return 0, err
	}
	latest := 0
	for _, f := range files {
		v, err := strconv.Atoi(strings.SplitN(f.Name(), "_", 2)[0])
		if err != nil {
			return 0, fmt.Errorf("migration %s: the name must start with its version number", f.Name())
		}
		latest = max(latest, v)
	}
	return latest, nil
}

// ArchivedSettlement is a settlement as archived.
type ArchivedSettlement struct {
	// Object is the archived object, decoded.
	Object hooksv1alpha1.BillingSettlement
	// Raw is the object exactly as archived (JSON), including any field this build's
	// API types do not know.
	Raw json.RawMessage
	// ArchivedAt is when the operator archived it.
	ArchivedAt time.Time
}

// ArchivedJob is one archived version of a job's completion.
type ArchivedJob struct {
	Object     hooksv1alpha1.JobCompletion
	Raw        json.RawMessage
	ArchivedAt time.Time
}

// ArchivedEvent is an archived event receipt.
type ArchivedEvent struct {
	Object     hooksv1alpha1.WebhookEvent
	Raw        json.RawMessage
	ArchivedAt time.Time
}

// Found is everything the archive holds under one reference.
type Found struct {
	// Settlements whose settlement key, idempotency key, name or job ID is the
	// reference, by namespace and creation time.
	Settlements []ArchivedSettlement
	// Jobs holds every archived version of each job whose job ID or JobCompletion name
	// is the reference, by namespace, provider, job ID and version.
	Jobs []ArchivedJob
	// Events whose event ID or WebhookEvent name is the reference, by namespace and
	// receipt time.
	Events []ArchivedEvent
}

// Len is the number of records found.
func (f Found) Len() int { return len(f.Settlements) + len(f.Jobs) + len(f.Events) }

// ErrEmptyReference is returned by Find for an empty reference.
var ErrEmptyReference = errors.New("an empty reference matches nothing")

// Find returns every archived record that ref names: a settlement by settlement key,
// idempotency key, object name or job ID; every archived version of a job by job ID or
// JobCompletion name; an event receipt by event ID or WebhookEvent name. Matching is
// exact. namespace "" searches every namespace. The three kinds are read in one
// read-only snapshot. Nothing found is an empty Found and no error.
//
// Within a namespace, PostgreSQL looks each column up in its (namespace, column)
// index (a BitmapOr); every index leads with the namespace, so across all namespaces
// the tables are scanned (see docs/archive.md).
func (s *Store) Find(ctx context.Context, namespace, ref string) (Found, error) {
	var f Found
	if err := s.ready(); err != nil {
		return f, err
	}
	if ref == "" {
		return f, ErrEmptyReference
	}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var w where
		r := w.arg(ref)
		w.and("(settlement_key = " + r + " OR idempotency_key = " + r + " OR name = " + r + " OR job_id = " + r + ")")
		w.namespace(namespace)
		rows, err := tx.Query(ctx, `SELECT settlement_object(settlements), archived_at FROM settlements WHERE `+w.sql()+
			` ORDER BY namespace, created_at, name`, w.args...)
		if err != nil {
			return fmt.Errorf("find archived settlements: %w", err)
		}
		if f.Settlements, err = collect(rows, func(raw []byte, at time.Time) (ArchivedSettlement, error) {
			a := ArchivedSettlement{Raw: raw, ArchivedAt: at}
			return a, decode(raw, &a.Object, "settlement")
		}); err != nil {
			return err
		}

		w = where{}
		r = w.arg(ref)
		w.and("(name = " + r + " OR job_id = " + r + ")")
		w.namespace(namespace)
		rows, err = tx.Query(ctx, `SELECT job_completion_object(t), archived_at FROM job_completions t WHERE `+w.sql()+
			` ORDER BY namespace, provider, job_id, version`, w.args...)
		if err != nil {
			return fmt.Errorf("find archived job completions: %w", err)
		}
		if f.Jobs, err = collect(rows, func(raw []byte, at time.Time) (ArchivedJob, error) {
			a := ArchivedJob{Raw: raw, ArchivedAt: at}
			return a, decode(raw, &a.Object, "job completion")
		}); err != nil {
			return err
		}

		w = where{}
		r = w.arg(ref)
		w.and("(name = " + r + " OR event_id = " + r + ")")
		w.namespace(namespace)
		// A receipt written since migration 0002 stores no object: event_receipt_object
		// builds it from the columns (0001 rows: the stored object); so does
		// job_completion_object above for job completions.
		rows, err = tx.Query(ctx, `SELECT event_receipt_object(t), archived_at FROM event_receipts t WHERE `+w.sql()+
			` ORDER BY namespace, received_at, name`, w.args...)
		if err != nil {
			return fmt.Errorf("find archived events: %w", err)
		}
		f.Events, err = collect(rows, func(raw []byte, at time.Time) (ArchivedEvent, error) {
			a := ArchivedEvent{Raw: raw, ArchivedAt: at}
			return a, decode(raw, &a.Object, "event")
		})
		return err
	})
	return f, err
}

// TimeField is the time a Filter's Since and Until bound, and lists are ordered by.
type TimeField string

const (
	// ByCreated is the settlement's creation time (created_at): when the operator
	// decided the charge, refund or void, normally moments after the event that caused
	// it was received. Always set and never changed, so a period's rows stay the same
	// once all its settlements are archived. The default.
	ByCreated TimeField = "created"
	// BySettled is when the provider settled it (settled_at). A settlement that never
	// settled (Failed, RequiresReconciliation) has none: a Since or Until leaves it
	// out, and without them it comes last.
	BySettled TimeField = "settled"
	// ByArchived is when the operator archived it (archived_at). A record archived
	// late (the archive was down, or the settlement took long to finish) lands in a
	// later window than it was made in, so this is the field for an incremental copy,
	// not for a period's charges. archived_at is the inserting transaction's start
	// time (now()), and inserts commit in a slightly different order: an incremental
	// copy starts each run a few minutes before the previous run's latest archived_at
	// and drops rows it already holds (namespace and name; rows never change).
	ByArchived TimeField = "archived"
)

func (b TimeField) column() (string, error) {
	switch b {
	case "", ByCreated:
		return "created_at", nil
	case BySettled:
		return "settled_at", nil
	case ByArchived:
		return "archived_at", nil
	}
	return "", fmt.Errorf("unknown time field %q: want %s, %s or %s", string(b), ByCreated, BySettled, ByArchived)
}

// Filter selects archived settlements.
type Filter struct {
	// Namespace "" is every namespace.
	Namespace string
	// Customer, when set, is the customer ID (exact).
	Customer string
	// State, when set, is the settlement's state (exact).
	State hooksv1alpha1.SettlementState
	// Since and Until bound By, half-open: Since <= t < Until. A zero time is unbounded.
	Since, Until time.Time
	// By is the time Since and Until bound, and rows are ordered by (then namespace
	// and name); "" is ByCreated.
	By TimeField
	// Limit caps the rows; 0 is no cap.
	Limit int
}

func (f Filter) query(columns string) (string, []any, error) {
	col, err := f.By.column()
	if err != nil {
		return "", nil, err
	}
	if f.Limit < 0 {
		return "", nil, fmt.Errorf("a negative limit (%d)", f.Limit)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return "", nil, fmt.Errorf("until (%s) must be after since (%s)", f.Until.UTC().Format(time.RFC3339), f.Since.UTC().Format(time.RFC3339))
	}
	var w where
	w.namespace(f.Namespace)
	if f.Customer != "" {
		w.and("customer = " + w.arg(f.Customer))
	}
	if f.State != "" {
		w.and("state = " + w.arg(string(f.State)))
	}
	if !f.Since.IsZero() {
		w.and(col + " >= " + w.arg(f.Since.UTC()))
	}
	if !f.Until.IsZero() {
		w.and(col + " < " + w.arg(f.Until.UTC()))
	}
	q := `SELECT ` + columns + ` FROM settlements WHERE ` + w.sql() + ` ORDER BY ` + col + `, namespace, name`
	if f.Limit > 0 {
		q += ` LIMIT ` + w.arg(f.Limit)
	}
	return q, w.args, nil
}

// ListSettlements returns the archived settlements f selects, ordered by f.By. Every
// row is held in memory: bound it with Limit or a time range, or use ExportSettlements.
func (s *Store) ListSettlements(ctx context.Context, f Filter) ([]ArchivedSettlement, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	q, args, err := f.query(`settlement_object(settlements), archived_at`)
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list archived settlements: %w", err)
	}
	return collect(rows, func(raw []byte, at time.Time) (ArchivedSettlement, error) {
		a := ArchivedSettlement{Raw: raw, ArchivedAt: at}
		return a, decode(raw, &a.Object, "settlement")
	})
}

// SettlementRow is one archived settlement as its table's columns, for finance exports.
// Columns that are NULL in the table are "" (text), nil (numbers and times).
type SettlementRow struct {
	Namespace, Name               string
	SettlementKey, IdempotencyKey string
	Type                          string // Charge, Refund or Void
	Reverses                      string // the name of the settlement a Refund or Void reverses
	Customer, JobID               string
	UsageMeter, UsageUnit         string
	UsageQuantity                 string // decimal text, exactly as archived (e.g. "1523", "12.5")
	AmountMinor                   *int64 // spec.amount, in the currency's minor unit
	AmountCurrency                string
	ChargedMinor                  *int64 // status.chargedAmount: what the provider reported
	ChargedCurrency               string
	State, Exposure               string
	Attempts                      int32
	ProviderRef, BillingProvider  string
	SentToEndpoint                string
	FirstSubmittedAt, SettledAt   *time.Time
	CreatedAt, ArchivedAt         time.Time
	// Object is the archived BillingSettlement exactly as stored, as one line of JSON.
	Object json.RawMessage
}

const rowColumns = `namespace, name, settlement_key, idempotency_key, type, reverses, customer, job_id,
	usage_meter, usage_quantity::text, usage_unit, amount_minor, amount_currency, charged_minor, charged_currency,
	state, exposure, attempts, provider_ref, billing_provider, sent_to_endpoint,
	first_submitted_at, settled_at, created_at, archived_at, settlement_object(settlements)`

// exportBatch is how many rows ExportSettlements holds at a time.
const exportBatch = 500

// ExportSettlements calls fn with each archived settlement f selects, in f.By order,
// without holding more than a few hundred rows in memory: the rows come from a cursor
// in one read-only snapshot, fetched in batches (each fetch bounded by the statement
// timeout, however long the whole export takes). An error from fn stops the export and
// is returned as is.
func (s *Store) ExportSettlements(ctx context.Context, f Filter, fn func(SettlementRow) error) error {
	if err := s.ready(); err != nil {
		return err
	}
	q, args, err := f.query(rowColumns)
	if err != nil {
		return err
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("export archived settlements: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `DECLARE settlement_export NO SCROLL CURSOR FOR `+q, args...); err != nil {
		return fmt.Errorf("export archived settlements: %w", err)
	}
	batch := make([]SettlementRow, 0, exportBatch)
	for {
		rows, err := tx.Query(ctx, `FETCH `+strconv.Itoa(exportBatch)+` FROM settlement_export`)
		if err != nil {
			return fmt.Errorf("export archived settlements: %w", err)
		}
		batch = batch[:0]
		for rows.Next() {
			r, err := scanRow(rows)
			if err != nil {
				rows.Close()
				return err
			}
			batch = append(batch, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("export archived settlements: %w", err)
		}
		// The batch is read off the connection before fn runs, so a slow consumer never
		// keeps a statement open.
		for _, r := range batch {
			if err := fn(r); err != nil {
				return err
			}
		}
		if len(batch) < exportBatch {
			return nil
		}
	}
}

func scanRow(rows pgx.Rows) (SettlementRow, error) {
	var r SettlementRow
	var meter, qty, unit, cur, ccur *string
	var raw []byte
	err := rows.Scan(&r.Namespace, &r.Name, &r.SettlementKey, &r.IdempotencyKey, &r.Type, &r.Reverses, &r.Customer, &r.JobID,
		&meter, &qty, &unit, &r.AmountMinor, &cur, &r.ChargedMinor, &ccur,
		&r.State, &r.Exposure, &r.Attempts, &r.ProviderRef, &r.BillingProvider, &r.SentToEndpoint,
		&r.FirstSubmittedAt, &r.SettledAt, &r.CreatedAt, &r.ArchivedAt, &raw)
	if err != nil {
		return r, fmt.Errorf("read archived settlement: %w", err)
	}
	r.UsageMeter, r.UsageQuantity, r.UsageUnit, r.AmountCurrency, r.ChargedCurrency = str(meter), str(qty), str(unit), str(cur), str(ccur)
	for _, t := range []*time.Time{r.FirstSubmittedAt, r.SettledAt, &r.CreatedAt, &r.ArchivedAt} {
		if t != nil {
			*t = t.UTC()
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return r, fmt.Errorf("archived settlement %s/%s: the stored object is not JSON: %w", r.Namespace, r.Name, err)
	}
	r.Object = compact.Bytes()
	return r, nil
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// where assembles a WHERE clause from constant fragments; values go to args and into
// the SQL only as their placeholder.
type where struct {
	conds []string
	args  []any
}

// arg adds a value and returns its placeholder.
func (w *where) arg(v any) string {
	w.args = append(w.args, v)
	return "$" + strconv.Itoa(len(w.args))
}

// and adds a condition: a constant fragment and placeholders from arg, nothing else.
func (w *where) and(cond string) { w.conds = append(w.conds, cond) }

func (w *where) namespace(ns string) {
	if ns != "" {
		w.and("namespace = " + w.arg(ns))
	}
}

func (w *where) sql() string {
	if len(w.conds) == 0 {
		return "TRUE"
	}
	return strings.Join(w.conds, " AND ")
}

func collect[T any](rows pgx.Rows, mk func([]byte, time.Time) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		var raw []byte
		var at time.Time
		if err := rows.Scan(&raw, &at); err != nil {
			return nil, fmt.Errorf("read archived record: %w", err)
		}
		v, err := mk(compactJSON(raw), at.UTC())
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read archived records: %w", err)
	}
	return out, nil
}

func decode(raw []byte, into any, what string) error {
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("decode archived %s: %w", what, err)
	}
	return nil
}

// compactJSON drops the spaces PostgreSQL puts in jsonb's text form (a stored object
// that is not JSON is left as is, and fails to decode).
func compactJSON(raw []byte) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}
