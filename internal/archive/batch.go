package archive

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// Record is one record prepared for ArchiveBatch: its row, or why it has none (an
// object that does not encode is refused on its own, never with its batch).
type Record struct {
	row *row
	err error
}

// EventRecord prepares an event receipt for ArchiveBatch (the row ArchiveEvent writes).
func EventRecord(ev *hooksv1alpha1.WebhookEvent) Record {
	r, err := eventRow(ev)
	return Record{row: r, err: err}
}

// JobRecord prepares a job completion version for ArchiveBatch (the row
// ArchiveJobCompletion writes).
func JobRecord(jc *hooksv1alpha1.JobCompletion) Record {
	r, err := jobRow(jc)
	return Record{row: r, err: err}
}

// SettlementRecord prepares a settlement for ArchiveBatch (the row ArchiveSettlement
// writes).
func SettlementRecord(bs *hooksv1alpha1.BillingSettlement) Record {
	r, err := settlementRow(bs)
	return Record{row: r, err: err}
}

// maxParams is PostgreSQL's limit on one statement's parameters (a 16-bit count).
const maxParams = 65535

// ArchiveBatch archives records together, with the guarantees of the single path
// (insertReadBack) for each: per table one multi-row INSERT ... ON CONFLICT DO
// NOTHING, then one query that reads every row of the batch back under its record's
// own name (and key), each compared with its record by the row's check exactly as a
// single archival compares it. It returns one error per record, in order: nil when
// that record is archived and read back (its seq then counts for LastReadBack), a
// *ConflictError when the archive holds other content under its name or one of its
// keys is another record's — that record's alone, the rest of its batch goes on — and
// any other error when the archive did not answer (for every record it left
// unconfirmed).
//
// A data exception (SQLSTATE 22: content PostgreSQL cannot hold, such as a NUL
// character) refuses the whole multi-row statement; the batch is then inserted row
// by row, so that only the record at fault is refused.
func (s *Store) ArchiveBatch(ctx context.Context, recs []Record) []error {
	errs := make([]error, len(recs))
	if err := s.ready(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	// One group per table and column list (a table's rows share one).
	groups := map[string][]int{}
	var order []string
	for i, rec := range recs {
		if rec.err != nil {
			errs[i] = rec.err
			continue
		}
		if rec.row == nil {
			errs[i] = errors.New("archive: a Record not made by EventRecord, JobRecord or SettlementRecord")
			continue
		}
		sig := rec.row.table + "(" + strings.Join(rec.row.columns, ",") + ")"
		if _, ok := groups[sig]; !ok {
			order = append(order, sig)
		}
		groups[sig] = append(groups[sig], i)
	}
	for _, sig := range order {
		idx := groups[sig]
		// Chunks within the parameter limit (a settlement's row has 34 columns: 1,927
		// rows; a batch is far smaller, this only keeps a large one correct).
		per := maxParams / len(recs[idx[0]].row.columns)
		for len(idx) > 0 {
			chunk := idx[:min(len(idx), per)]
			idx = idx[len(chunk):]
			rows := make([]*row, len(chunk))
			for j, i := range chunk {
				rows[j] = recs[i].row
			}
			for j, err := range s.archiveRows(ctx, rows) {
				errs[chunk[j]] = err
			}
		}
	}
	return errs
}

// archiveRows inserts rows of one table and column list with one statement and reads
// them back with one query.
func (s *Store) archiveRows(ctx context.Context, rows []*row) []error {
	out := make([]error, len(rows))
	fail := func(err error) []error {
		for i := range out {
			if out[i] == nil {
				out[i] = err
			}
		}
		return out
	}
	bctx, cancel := s.bound(ctx)
	defer cancel()
	first := rows[0]
	insert, args := insertManySQL(rows)
	if _, err := s.pool.Exec(bctx, insert, unprepared(args)...); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
			// Nothing of the statement was written: row by row, the record at fault is
			// refused (a *ConflictError naming the SQLSTATE) and every other one archived.
			for i, r := range rows {
				out[i] = s.insertReadBack(ctx, r)
			}
			return out
		}
		return fail(fmt.Errorf("archive %d %s records (%s/%s and others): %w", len(rows), first.kind, first.namespace, first.name, err))
	}
	query, args := readBackManySQL(rows)
	res, err := s.pool.Query(bctx, query, unprepared(args)...)
	if err != nil {
		return fail(fmt.Errorf("read back %d %s records: %w", len(rows), first.kind, err))
	}
	found := make(map[string]readBackRow, len(rows))
	for res.Next() {
		var rb readBackRow
		dest := []any{&rb.stored, &rb.storedHash, &rb.legacy, &rb.seq}
		ident := make([]any, 2+len(first.key))
		for i := range ident {
			dest = append(dest, &ident[i])
		}
		if err := res.Scan(dest...); err != nil {
			res.Close()
			return fail(fmt.Errorf("read back %d %s records: %w", len(rows), first.kind, err))
		}
		found[identOf(ident...)] = rb
	}
	res.Close()
	if err := res.Err(); err != nil {
		return fail(fmt.Errorf("read back %d %s records: %w", len(rows), first.kind, err))
	}
	for i, r := range rows {
		rb, ok := found[r.ident()]
		if !ok {
			out[i] = r.missing()
			continue
		}
		out[i] = s.verify(r, rb)
	}
	return out
}

// unprepared runs a batch's statement without keeping it as a prepared statement:
// its text differs with every batch size (a row of placeholders per record), so the
// connection's statement cache would fill with them, each holding its SQL and its
// description here and its plan in PostgreSQL's backend, growing with every size a
// batch happens to have (measured: 2.3 MB of SQL text and 1.5 MB of descriptions in
// the manager after 10 minutes at 12 events/s). It is described on every execution
// instead: one more round trip for a statement of up to a hundred rows, with the same
// binary formats.
func unprepared(args []any) []any {
	return append([]any{pgx.QueryExecModeDescribeExec}, args...)
}

// ident names a row by namespace, name and key values, as the read-back returns them.
func (r *row) ident() string {
	vals := append([]any{r.namespace, r.name}, r.keyValues...)
	return identOf(vals...)
}

func identOf(vals ...any) string {
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, "\x00")
}

// insertManySQL is one INSERT of every row (same table and columns), ON CONFLICT DO
// NOTHING on every unique constraint, as each row's own insertSQL.
func insertManySQL(rows []*row) (string, []any) {
	first := rows[0]
	names := make([]string, len(first.columns))
	casts := make([]string, len(first.columns))
	for i, c := range first.columns {
		name, cast, _ := strings.Cut(c, "::")
		names[i] = name
		if cast != "" {
			casts[i] = "::" + cast
		}
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + first.table + " (" + strings.Join(names, ", ") + ") VALUES ")
	args := make([]any, 0, len(rows)*len(names))
	for j, r := range rows {
		if j > 0 {
			b.WriteString(",")
		}
		b.WriteString("(")
		for i := range names {
			if i > 0 {
				b.WriteString(",")
			}
			args = append(args, r.values[i])
			b.WriteString("$" + strconv.Itoa(len(args)) + casts[i])
		}
		b.WriteString(")")
	}
	b.WriteString(" ON CONFLICT DO NOTHING")
	return b.String(), args
}

// readBackManySQL reads back every row under its record's own name (and key), with
// the identifying columns after the read-back's select list.
func readBackManySQL(rows []*row) (string, []any) {
	first := rows[0]
	cols := []string{"t.namespace", "t.name"}
	for _, k := range first.key {
		cols = append(cols, "t."+k)
	}
	var where []string
	var args []any
	for _, r := range rows {
		vals := append([]any{r.namespace, r.name}, r.keyValues...)
		conj := make([]string, len(cols))
		for i, c := range cols {
			args = append(args, vals[i])
			conj[i] = c + " = $" + strconv.Itoa(len(args))
		}
		where = append(where, "("+strings.Join(conj, " AND ")+")")
	}
	return "SELECT " + first.readBack + ", " + strings.Join(cols, ", ") + " FROM " + first.table + " t WHERE " +
		strings.Join(where, " OR "), args
}
