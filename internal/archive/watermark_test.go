package archive_test

import (
	"context"
	"strings"
	"testing"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
)

// TestRestoredArchiveIsBehind restores a real PostgreSQL from a copy of its data
// directory taken before a settlement was archived: the archive keeps its identity,
// but it lacks the row the cluster's watermark names, and that is found on the first
// new connection and by every check after — also once new rows have reused its seq.
func TestRestoredArchiveIsBehind(t *testing.T) {
	ctx := context.Background()
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.CreateDatabase("archive"); err != nil {
		t.Fatal(err)
	}
	s, err := archive.Open(archive.Config{URL: srv.URL("archive")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	id, err := s.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if err := s.ArchiveSettlement(ctx, settled("stl-before")); err != nil {
		t.Fatal(err)
	}
	before := s.LastReadBack()
	if before.IsZero() || before.Table != "settlements" || before.Name != "stl-before" {
		t.Fatalf("LastReadBack after the first insert = %+v", before)
	}

	// The backup: a copy of the data directory, taken now.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	backup, err := srv.CopyData()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	reconnect(t, s)

	// Archived after the backup; re-archiving an older record does not move the mark.
	if err := s.ArchiveSettlement(ctx, settled("stl-after")); err != nil {
		t.Fatal(err)
	}
	if err := s.ArchiveSettlement(ctx, settled("stl-before")); err != nil {
		t.Fatal(err)
	}
	wm := s.LastReadBack()
	if wm.Seq <= before.Seq || wm.Name != "stl-after" {
		t.Fatalf("LastReadBack = %+v, want stl-after past %d", wm, before.Seq)
	}
	s.SetWatermark(wm)
	if held, why, err := s.CheckMark(ctx, wm); err != nil || !held {
		t.Fatalf("CheckMark before the restore = %v, %q, %v", held, why, err)
	}
	if why := s.Behind(); why != "" {
		t.Fatalf("Behind before the restore: %s", why)
	}

	// The restore.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	srv.WaitGone(10e9)
	if err := srv.RestoreData(backup); err != nil {
		t.Fatal(err)
	}
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	reconnect(t, s)

	// Same identity: the identity check passes, as before.
	if got, err := s.Identity(ctx); err != nil || got != id {
		t.Fatalf("identity after restore = %q, %v; want %q", got, err, id)
	}
	// The first new connection found it behind, before it was used.
	if why := s.Behind(); !strings.Contains(why, "lacks row") {
		t.Fatalf("Behind after the restore = %q", why)
	}
	held, why, err := s.CheckMark(ctx, wm)
	if err != nil || held || !strings.Contains(why, "stl-after") {
		t.Fatalf("CheckMark after the restore = %v, %q, %v", held, why, err)
	}
	// What the restored archive says about the lost settlement: nothing — the lie the
	// watermark exists to catch.
	if got, err := s.Settlement(ctx, "tenant-a", "stl-after"); err != nil || got != nil {
		t.Fatalf("the restored archive holds stl-after: %v, %v", got, err)
	}

	// New rows after the restore reuse the lost seq: the mark still names a row that
	// is not there (other name), and a seq reused never advances past it by itself.
	for _, n := range []string{"stl-new-1", "stl-new-2", "stl-new-3"} {
		if err := s.ArchiveSettlement(ctx, settled(n)); err != nil {
			t.Fatal(err)
		}
	}
	if held, _, err := s.CheckMark(ctx, wm); err != nil || held {
		t.Fatalf("CheckMark after new rows reused the seq = %v, %v", held, err)
	}
}

// TestMarkOfEveryKind: each kind's read-back names its own table, and a mark naming a
// table the archive does not have is refused, never put into SQL.
func TestMarkOfEveryKind(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ev, jc, bs := happyPath(3)
	var marks []archive.Mark
	for _, f := range []func() error{
		func() error { return s.ArchiveEvent(ctx, ev) },
		func() error { return s.ArchiveJobCompletion(ctx, jc) },
		func() error { return s.ArchiveSettlement(ctx, bs) },
	} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
		marks = append(marks, s.LastReadBack())
	}
	for i, table := range []string{"event_receipts", "job_completions", "settlements"} {
		if marks[i].Table != table || (i > 0 && marks[i].Seq <= marks[i-1].Seq) {
			t.Fatalf("marks = %+v", marks)
		}
		if held, why, err := s.CheckMark(ctx, marks[i]); err != nil || !held {
			t.Fatalf("CheckMark(%+v) = %v, %q, %v", marks[i], held, why, err)
		}
	}
	if _, _, err := s.CheckMark(ctx, archive.Mark{Seq: 1, Table: "pg_authid; --", Name: "x"}); err == nil {
		t.Fatal("a mark naming an unknown table was accepted")
	}
	if held, _, err := s.CheckMark(ctx, archive.Mark{Seq: marks[2].Seq, Table: "settlements", Namespace: bs.Namespace, Name: "other"}); err != nil || held {
		t.Fatalf("a mark with another name under the seq was held: %v, %v", held, err)
	}
}

// reconnect drops the pool's connections to a server that was restarted (the first
// use of each fails), so the next call opens a new one.
func reconnect(t *testing.T, s *archive.Store) {
	t.Helper()
	for i := 0; i < 20; i++ {
		if s.Ping(context.Background()) == nil {
			return
		}
	}
	t.Fatal("the archive does not answer after a restart")
}
