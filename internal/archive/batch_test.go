package archive_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
)

// newLoggedStore is newStore on a database whose every statement PostgreSQL logs, and
// a function counting the statements executed there since the previous call (one
// statement, one round trip: the store sends no pipelines).
func newLoggedStore(t *testing.T) (*archive.Store, func() map[string]int) {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t%d", dbs.Add(1))
	if err := server.CreateDatabase(name); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, server.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER DATABASE `+name+` SET log_statement = 'all'`); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	s, err := archive.Open(archive.Config{URL: server.URL(name)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	seen := len(server.Log())
	stmt := regexp.MustCompile(`(?m)LOG:  (?:execute [^:]*|statement): (INSERT INTO \w+|SELECT)`)
	return s, func() map[string]int {
		log := server.Log()
		out := map[string]int{}
		for _, m := range stmt.FindAllStringSubmatch(log[seen:], -1) {
			out[m[1]]++
		}
		seen = len(log)
		return out
	}
}

// A batch of every kind is archived with one INSERT and one read-back per table — six
// statements for 3×N records, where the single path takes 2 per record — and every
// record is read back and compared, its seq covered by LastReadBack. The same batch
// again is a no-op that still reads every row back.
func TestArchiveBatchOneInsertAndOneReadBackPerTable(t *testing.T) {
	ctx := context.Background()
	s, statements := newLoggedStore(t)
	const n = 50
	var recs []archive.Record
	for i := range n {
		ev, jc, bs := happyPath(i)
		recs = append(recs, archive.EventRecord(ev), archive.JobRecord(jc), archive.SettlementRecord(bs))
	}
	for round := 1; round <= 2; round++ {
		errs := s.ArchiveBatch(ctx, recs)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: record %d: %v", round, i, err)
			}
		}
		got := statements()
		want := map[string]int{"INSERT INTO event_receipts": 1, "INSERT INTO job_completions": 1, "INSERT INTO settlements": 1, "SELECT": 3}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("round %d: %d records took statements %v, want %v", round, len(recs), got, want)
		}
	}
	// What readers get is what was archived: the store's own lookups find them all.
	for i := range n {
		ev, jc, bs := happyPath(i)
		if got, err := s.Settlement(ctx, bs.Namespace, bs.Name); err != nil || got == nil || archive.SettlementContentHash(got) != archive.SettlementContentHash(bs) {
			t.Fatalf("settlement %d: %v %v", i, got, err)
		}
		if got, err := s.LatestJob(ctx, jc.Namespace, jc.Spec.Provider, jc.Spec.JobID); err != nil || got == nil || archive.JobContentHash(got) != archive.JobContentHash(jc) {
			t.Fatalf("job %d: %v %v", i, got, err)
		}
		if got, err := s.Event(ctx, ev.Namespace, ev.Spec.Provider, ev.Spec.EventID); err != nil || got == nil || got.UID != string(ev.UID) {
			t.Fatalf("event %d: %v %v", i, got, err)
		}
	}
	var rows int
	if err := s.QueryRowForTest(ctx, `SELECT (SELECT count(*) FROM event_receipts) + (SELECT count(*) FROM job_completions) + (SELECT count(*) FROM settlements)`, &rows); err != nil {
		t.Fatal(err)
	}
	if rows != 3*n {
		t.Fatalf("%d rows, want %d: each record once", rows, 3*n)
	}
	var maxSeq int64
	if err := s.QueryRowForTest(ctx, `SELECT greatest((SELECT max(seq) FROM event_receipts), (SELECT max(seq) FROM job_completions), (SELECT max(seq) FROM settlements))`, &maxSeq); err != nil {
		t.Fatal(err)
	}
	if got := s.LastReadBack(); got.Seq != maxSeq {
		t.Fatalf("LastReadBack %v, want the batch's highest seq %d", got, maxSeq)
	}
}

// Each record of a batch is judged on its own, as the single path judges it: other
// content under its name, or its key held by another record, is that record's
// ConflictError; content PostgreSQL refuses (a NUL character) refuses that record and
// no other; everything else in the batch is archived and read back.
func TestArchiveBatchRefusesOnlyTheRecordAtFault(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	_, _, differs := happyPath(1)
	other := differs.DeepCopy()
	other.Status.ProviderRef = "ch_elsewhere"
	if err := s.ArchiveSettlement(ctx, other); err != nil {
		t.Fatal(err)
	}
	_, _, holder := happyPath(2)
	if err := s.ArchiveSettlement(ctx, holder); err != nil {
		t.Fatal(err)
	}
	_, _, keyTaken := happyPath(3)
	keyTaken.Name, keyTaken.UID = "another-name", "uid-another"
	_, _, nul := happyPath(4)
	nul.Spec.Customer = "cus\x00_1"
	ev5, jc5, ok5 := happyPath(5)
	_, _, ok6 := happyPath(6)
	keyTaken.Spec.IdempotencyKey = holder.Spec.IdempotencyKey

	recs := []archive.Record{archive.SettlementRecord(ok5), archive.SettlementRecord(differs), archive.SettlementRecord(keyTaken),
		archive.EventRecord(ev5), archive.SettlementRecord(nul), archive.JobRecord(jc5), archive.SettlementRecord(ok6)}
	errs := s.ArchiveBatch(ctx, recs)
	for i, want := range []string{"", "has other content", "holds one of its unique keys", "", "SQLSTATE 22", "", ""} {
		err := errs[i]
		switch {
		case want == "" && err != nil:
			t.Errorf("record %d: %v, want archived", i, err)
		case want != "" && !archive.IsConflict(err):
			t.Errorf("record %d: %v, want a conflict (%s)", i, err, want)
		case want != "" && !strings.Contains(err.Error(), want):
			t.Errorf("record %d: %v, want %q", i, err, want)
		}
	}
	for _, bs := range []*hooksv1alpha1.BillingSettlement{ok5, ok6} {
		got, err := s.Settlement(ctx, bs.Namespace, bs.Name)
		if err != nil || got == nil {
			t.Fatalf("%s not archived: %v", bs.Name, err)
		}
	}
	for _, name := range []string{"another-name", nul.Name} {
		if got, err := s.Settlement(ctx, nul.Namespace, name); err != nil || got != nil {
			t.Fatalf("%s archived (%v), want refused", name, err)
		}
	}
	if got, _ := s.Settlement(ctx, differs.Namespace, differs.Name); got == nil || got.Status.ProviderRef != "ch_elsewhere" {
		t.Fatalf("the row under %s was overwritten: %v", differs.Name, got)
	}
}

// A batch while the archive is not ready archives nothing and says so for every record.
func TestArchiveBatchNotReady(t *testing.T) {
	s, err := archive.Open(archive.Config{URL: server.URL("postgres")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, _, bs := happyPath(1)
	ev, _, _ := happyPath(2)
	for i, err := range s.ArchiveBatch(context.Background(), []archive.Record{archive.SettlementRecord(bs), archive.EventRecord(ev)}) {
		if err == nil || archive.IsConflict(err) {
			t.Fatalf("record %d: %v, want the archive not ready", i, err)
		}
	}
}

// A batch's statements are not kept as prepared statements: their text differs with
// every batch size (one row of placeholders per record), so caching them would keep up
// to a connection's whole statement cache of them, each holding its SQL and
// description, in the manager and in PostgreSQL's backend — memory that grows with
// every new size a batch happens to have. Batches of new sizes leave the connection's
// prepared statements as they were.
func TestArchiveBatchesOfNewSizesPrepareNothingMore(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("t%d", dbs.Add(1))
	if err := server.CreateDatabase(name); err != nil {
		t.Fatal(err)
	}
	s, err := archive.Open(archive.Config{URL: server.URL(name), MaxConns: 1}) // one connection: its statements are the store's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	next := 0
	batches := func(from, to int) int {
		for size := from; size <= to; size++ {
			var recs []archive.Record
			for range size {
				ev, jc, bs := happyPath(next)
				next++
				recs = append(recs, archive.EventRecord(ev), archive.JobRecord(jc), archive.SettlementRecord(bs))
			}
			for i, err := range s.ArchiveBatch(ctx, recs) {
				if err != nil {
					t.Fatalf("batch of %d: record %d: %v", size, i, err)
				}
			}
		}
		var prepared int
		if err := s.QueryRowForTest(ctx, `SELECT count(*) FROM pg_prepared_statements`, &prepared); err != nil {
			t.Fatal(err)
		}
		return prepared
	}
	before := batches(2, 6)
	if after := batches(7, 16); after != before {
		t.Fatalf("batches of 10 new sizes took the connection's prepared statements from %d to %d", before, after)
	}
}
