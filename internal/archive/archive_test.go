package archive_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
)

var server *pgtest.Server

func TestMain(m *testing.M) {
	s, err := pgtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start PostgreSQL:", err)
		os.Exit(1)
	}
	server = s
	code := m.Run()
	s.Close()
	os.Exit(code)
}

var dbs atomic.Int32

// newStore opens a migrated store on a database of its own.
func newStore(t *testing.T) *archive.Store {
	t.Helper()
	s, _ := newStoreDB(t)
	return s
}

// newStoreDB is newStore, and the database's name.
func newStoreDB(t *testing.T) (*archive.Store, string) {
	t.Helper()
	name := fmt.Sprintf("t%d", dbs.Add(1))
	if err := server.CreateDatabase(name); err != nil {
		t.Fatal(err)
	}
	s, err := archive.Open(archive.Config{URL: server.URL(name)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, name
}

func settled(name string) *hooksv1alpha1.BillingSettlement {
	now := metav1.NewTime(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	return &hooksv1alpha1.BillingSettlement{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "17",
			CreationTimestamp: now, Finalizers: []string{hooksv1alpha1.FinalizerSettlementProtection},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: `["tenant-a","job","acme","` + name + `"]`,
			IdempotencyKey: "stl_" + name, Type: hooksv1alpha1.SettlementCharge, Customer: "cus_1",
			Usage: &hooksv1alpha1.Usage{Meter: "tokens", Quantity: "1523", Unit: "token"}, JobID: "job-" + name,
			WebhookProvider: "acme", SourceEvent: "acme-abc"},
		Status: hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSettled, Attempts: 1, ProviderRef: "ch_1",
			Exposure: hooksv1alpha1.ExposureConfirmed, ChargedAmount: &hooksv1alpha1.Amount{Minor: 152300, Currency: "USD"},
			SentTo:           &hooksv1alpha1.ProviderTarget{Endpoint: "https://billing.example", BillingProviderUID: "bp-1", CredentialsSecret: "token"},
			FirstSubmittedAt: &now, SettledAt: &now,
			Conditions: []metav1.Condition{{Type: hooksv1alpha1.ConditionReconciled, Status: metav1.ConditionTrue, Reason: "ConfirmedByProvider", LastTransitionTime: now}}},
	}
}

func TestSettlementRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	bs := settled("a")
	if err := s.ArchiveSettlement(ctx, bs); err != nil {
		t.Fatal(err)
	}
	// The same content again — after a crash, or once more through the finalizer with a
	// deletion timestamp, another resourceVersion and new conditions — is a no-op.
	again := bs.DeepCopy()
	again.ResourceVersion = "18"
	del := metav1.Now()
	again.DeletionTimestamp = &del
	again.Status.Conditions = append(again.Status.Conditions, metav1.Condition{Type: "Deleting", Status: metav1.ConditionTrue, Reason: "x"})
	if err := s.ArchiveSettlement(ctx, again); err != nil {
		t.Fatalf("re-archiving the same settlement: %v", err)
	}
	got, err := s.Settlement(ctx, "tenant-a", "a")
	if err != nil || got == nil {
		t.Fatalf("settlement not found: %v", err)
	}
	if got.Status.ProviderRef != "ch_1" || got.Spec.IdempotencyKey != "stl_a" || got.UID != bs.UID || got.ManagedFields != nil {
		t.Fatalf("round trip lost fields: %+v", got)
	}
	if got.DeletionTimestamp != nil {
		t.Fatal("the first archived version is kept, never overwritten")
	}
	byKey, err := s.SettlementByKey(ctx, "tenant-a", "stl_a")
	if err != nil || byKey == nil || byKey.Name != "a" {
		t.Fatalf("by idempotency key: %v %v", byKey, err)
	}
	if other, _ := s.SettlementByKey(ctx, "tenant-b", "stl_a"); other != nil {
		t.Fatal("another namespace's archive must not answer")
	}

	// Other content under the archived name: an error, nothing overwritten.
	changed := bs.DeepCopy()
	changed.Status.ProviderRef = "ch_2"
	if err := s.ArchiveSettlement(ctx, changed); !archive.IsConflict(err) {
		t.Fatalf("other content must be a conflict, got %v", err)
	}
	// A re-created object (new UID) under the name: a conflict as well.
	recreated := bs.DeepCopy()
	recreated.UID = "uid-other"
	if err := s.ArchiveSettlement(ctx, recreated); !archive.IsConflict(err) {
		t.Fatalf("a re-created object must be a conflict, got %v", err)
	}
	// Another name with the archived idempotency key: refused by the unique key.
	twin := settled("b")
	twin.Spec.IdempotencyKey = "stl_a"
	if err := s.ArchiveSettlement(ctx, twin); !archive.IsConflict(err) {
		t.Fatalf("a second settlement under an archived key must be a conflict, got %v", err)
	}
	got, _ = s.Settlement(ctx, "tenant-a", "a")
	if got.Status.ProviderRef != "ch_1" {
		t.Fatal("the archived row changed")
	}
	known, err := s.KnownIdempotencyKeys(ctx, "tenant-a", []string{"stl_a", "stl_b", "stl_z"})
	if err != nil || !known["stl_a"] || known["stl_b"] || known["stl_z"] {
		t.Fatalf("known keys: %v %v", known, err)
	}
}

func TestAppendOnly(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if err := s.ArchiveSettlement(ctx, settled("a")); err != nil {
		t.Fatal(err)
	}
	if err := s.ExecForTest(ctx, `UPDATE settlements SET state = 'Failed'`); err == nil {
		t.Fatal("an UPDATE of an archived row must be refused")
	}
	if err := s.ExecForTest(ctx, `DELETE FROM settlements`); err == nil {
		t.Fatal("a DELETE of an archived row must be refused")
	}
	for _, table := range []string{"settlements", "job_completions", "event_receipts"} {
		if err := s.ExecForTest(ctx, `TRUNCATE `+table); err == nil {
			t.Fatalf("a TRUNCATE of %s must be refused", table)
		}
	}
}

func TestJobVersions(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	v := int64(2)
	jc := &hooksv1alpha1.JobCompletion{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "acme-job-x", UID: "u1", CreationTimestamp: metav1.Now()},
		Spec: hooksv1alpha1.JobCompletionSpec{Provider: "acme", JobID: "x",
			Completion: hooksv1alpha1.Completion{Version: 2, State: hooksv1alpha1.JobSucceeded, SourceEvent: "acme-e2",
				Usage: &hooksv1alpha1.Usage{Meter: "tokens", Quantity: "12.5", Unit: "token"}}},
		Status: hooksv1alpha1.JobCompletionStatus{State: hooksv1alpha1.JobCompletionApplied, AppliedVersion: &v},
	}
	if err := s.ArchiveJobCompletion(ctx, jc); err != nil {
		t.Fatal(err)
	}
	if err := s.ArchiveJobCompletion(ctx, jc.DeepCopy()); err != nil {
		t.Fatalf("idempotent: %v", err)
	}
	// The job came back as v3 (a new object): a second row.
	v3 := jc.DeepCopy()
	v3.UID, v3.Spec.Completion.Version, v3.Spec.Completion.SourceEvent = "u2", 3, "acme-e3"
	three := int64(3)
	v3.Status.AppliedVersion = &three
	if err := s.ArchiveJobCompletion(ctx, v3); err != nil {
		t.Fatal(err)
	}
	latest, err := s.LatestJob(ctx, "tenant-a", "acme", "x")
	if err != nil || latest == nil || latest.Spec.Completion.Version != 3 {
		t.Fatalf("latest: %+v %v", latest, err)
	}
	// v2 with other content: a conflict.
	other := jc.DeepCopy()
	other.Spec.Completion.Usage.Quantity = "13"
	if err := s.ArchiveJobCompletion(ctx, other); !archive.IsConflict(err) {
		t.Fatalf("other content for an archived version must conflict, got %v", err)
	}
	if none, _ := s.LatestJob(ctx, "tenant-a", "acme", "y"); none != nil {
		t.Fatal("unknown job found")
	}
}

func TestEventReceipts(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ev := &hooksv1alpha1.WebhookEvent{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "acme-e1", UID: "u1", CreationTimestamp: metav1.Now()},
		Spec: hooksv1alpha1.WebhookEventSpec{Provider: "acme", EventID: "evt_1", EventType: "job.completed", PayloadHash: "abc",
			ReceivedAt: metav1.Now()},
		Status: hooksv1alpha1.WebhookEventStatus{Phase: hooksv1alpha1.EventComplete, Operations: []hooksv1alpha1.OperationStatus{
			{Type: hooksv1alpha1.OperationJobCompletion, Key: "x", Child: "acme-job-x", Outcome: hooksv1alpha1.OutcomeCreated, State: "Applied", Message: "version 1"}}},
	}
	if err := s.ArchiveEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	mirrored := ev.DeepCopy()
	mirrored.Status.Operations[0].State, mirrored.Status.Operations[0].Message = "Superseded", "later"
	if err := s.ArchiveEvent(ctx, mirrored); err != nil {
		t.Fatalf("a mirrored state or message is not content: %v", err)
	}
	got, err := s.Event(ctx, "tenant-a", "acme", "evt_1")
	if err != nil || got == nil || got.PayloadHash != "abc" || got.Name != "acme-e1" {
		t.Fatalf("receipt: %+v %v", got, err)
	}
	dup := ev.DeepCopy()
	dup.Name, dup.UID = "acme-e1-again", "u2"
	if err := s.ArchiveEvent(ctx, dup); !archive.IsConflict(err) {
		t.Fatalf("a second receipt of one event ID must conflict, got %v", err)
	}
}

func TestNotReadyAndUnreachable(t *testing.T) {
	ctx := context.Background()
	s, err := archive.Open(archive.Config{URL: "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.ArchiveSettlement(ctx, settled("a")); err == nil {
		t.Fatal("an unmigrated store must refuse")
	}
	if err := s.Migrate(ctx); err == nil {
		t.Fatal("migrating an unreachable archive must fail")
	}
	if _, err := archive.Open(archive.Config{URL: "postgres://u:secret@%zz"}); err == nil || contains(err.Error(), "secret") {
		t.Fatalf("a bad URL is refused without repeating it: %v", err)
	}
}

func TestMigrateTwice(t *testing.T) {
	s := newStore(t)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	v, err := s.SchemaVersion(context.Background())
	if err != nil || v != 4 {
		t.Fatalf("schema version %d %v", v, err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// A role that may only read and insert (the schema applied by a DBA or an earlier
// start) can start the operator: Migrate creates nothing that exists.
func TestMigrateAsInsertOnlyRole(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	db := fmt.Sprintf("t%d", dbs.Load())
	for _, q := range []string{
		`CREATE ROLE archiver LOGIN`,
		`REVOKE CREATE ON SCHEMA public FROM PUBLIC`,
		`GRANT USAGE ON SCHEMA public TO archiver`,
		`GRANT SELECT, INSERT ON event_receipts, job_completions, settlements TO archiver`,
		`GRANT SELECT ON schema_migrations TO archiver`,
	} {
		if err := s.ExecForTest(ctx, q); err != nil && !contains(err.Error(), "already exists") {
			t.Fatalf("%s: %v", q, err)
		}
	}
	limited, err := archive.Open(archive.Config{URL: fmt.Sprintf("postgres://archiver@127.0.0.1:%d/%s?sslmode=disable", server.Port, db)})
	if err != nil {
		t.Fatal(err)
	}
	defer limited.Close()
	if err := limited.Migrate(ctx); err != nil {
		t.Fatalf("an insert-only role must be able to start: %v", err)
	}
	if err := limited.ArchiveSettlement(ctx, settled("limited")); err != nil {
		t.Fatalf("an insert-only role must be able to archive: %v", err)
	}
	// ... and to check the watermark (migration 0003: no grant on the counter needed).
	if held, why, err := limited.CheckMark(ctx, limited.LastReadBack()); err != nil || !held {
		t.Fatalf("an insert-only role must be able to check the watermark: %v, %q, %v", held, why, err)
	}
}

// A version (or sequence) past float64's 2^53 — a nanosecond timestamp, a Snowflake
// ID — is archived exactly (it was rounded on its way through a map[string]any, and
// the read-back then failed on every retry).
func TestLargeNumbersStayExact(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	v := int64(1732968000123456789)
	jc := &hooksv1alpha1.JobCompletion{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "acme-job-x", UID: "uid-jc", CreationTimestamp: metav1.Now()},
		Spec: hooksv1alpha1.JobCompletionSpec{Provider: "acme", JobID: "x",
			Completion: hooksv1alpha1.Completion{Version: v, State: hooksv1alpha1.JobSucceeded, SourceEvent: "acme-e"}},
		Status: hooksv1alpha1.JobCompletionStatus{State: hooksv1alpha1.JobCompletionApplied, AppliedVersion: &v},
	}
	if err := s.ArchiveJobCompletion(ctx, jc); err != nil {
		t.Fatal(err)
	}
	got, err := s.LatestJob(ctx, "tenant-a", "acme", "x")
	if err != nil || got == nil || got.Spec.Completion.Version != v {
		t.Fatalf("version read back %v (want %d): %v", got, v, err)
	}
}

// Content PostgreSQL cannot hold (a NUL character) is a permanent refusal, named as
// such, never "the archive is down" retried forever.
func TestUnstorableContentIsNotAnOutage(t *testing.T) {
	s := newStore(t)
	bs := settled("nul")
	bs.Spec.Customer = "cus\x00_1"
	err := s.ArchiveSettlement(context.Background(), bs)
	if !archive.IsConflict(err) {
		t.Fatalf("want a permanent refusal, got %v", err)
	}
}
