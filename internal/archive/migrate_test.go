package archive_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
)

// Rows written under migration 0001 (whole objects, conditions and operations
// columns, the event's content hash over its whole spec) keep working after 0002:
// found, read, re-archived as a no-op, other content refused, the views show them.
func TestRowsOf0001AfterMigration(t *testing.T) {
	ctx := context.Background()
	name := "legacy"
	if err := server.CreateDatabase(name); err != nil {
		t.Fatal(err)
	}
	s, err := archive.Open(archive.Config{URL: server.URL(name)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.MigrateToForTest(ctx, 1); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, server.URL(name))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	ev, jc, bs := happyPath(7)
	insert0001(t, conn, ev, jc, bs)

	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrating an archive with 0001 rows: %v", err)
	}
	// The same records again (a crash between insert and delete across the upgrade):
	// no-ops, checked against the 0001 rows' own hashes.
	if err := s.ArchiveEvent(ctx, ev); err != nil {
		t.Fatalf("re-archiving a 0001 receipt: %v", err)
	}
	if err := s.ArchiveJobCompletion(ctx, jc); err != nil {
		t.Fatalf("re-archiving a 0001 job completion: %v", err)
	}
	if err := s.ArchiveSettlement(ctx, bs); err != nil {
		t.Fatalf("re-archiving a 0001 settlement: %v", err)
	}
	changed := ev.DeepCopy()
	changed.Status.Phase = hooksv1alpha1.EventPartiallyFailed
	if err := s.ArchiveEvent(ctx, changed); !archive.IsConflict(err) {
		t.Fatalf("other content under a 0001 receipt's name must be a conflict, got %v", err)
	}
	f, err := s.Find(ctx, ev.Namespace, ev.Spec.EventID)
	if err != nil || len(f.Events) != 1 {
		t.Fatalf("find a 0001 receipt: %v %+v", err, f)
	}
	if got := f.Events[0].Object; len(got.Spec.JobCompletions) != 1 || got.Labels[hooksv1alpha1.LabelProvider] == "" {
		t.Fatalf("a 0001 receipt reads as the object it stored: %+v", got)
	}
	if got, err := s.Settlement(ctx, bs.Namespace, bs.Name); err != nil || got == nil || len(got.Status.Conditions) != 5 {
		t.Fatalf("a 0001 settlement reads back whole: %v %v", got, err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT jsonb_array_length(conditions) FROM archived_settlements WHERE name = $1`, bs.Name).Scan(&n); err != nil || n != 5 {
		t.Fatalf("archived_settlements shows a 0001 row's conditions: %d %v", n, err)
	}
	if err := conn.QueryRow(ctx, `SELECT jsonb_array_length(conditions) FROM archived_job_completions WHERE name = $1`, jc.Name).Scan(&n); err != nil || n != 2 {
		t.Fatalf("archived_job_completions shows a 0001 row's conditions: %d %v", n, err)
	}
}

// Rows written now store no object: what readers get is built from the row
// (event_receipt_object, job_completion_object, settlement_object), checked on insert,
// and is the record as archived without the cluster's bookkeeping; the views show every
// field kubectl shows.
func TestRowsOf0002ReadBackWhole(t *testing.T) {
	ctx := context.Background()
	s, db := newStoreDB(t)
	ev, jc, bs := happyPath(3)
	seq := int64(1733059680123456789) // past float64's 2^53: kept exact
	ev.Spec.Sequence = &seq
	ev.Spec.RawPayload = `{"id":"x"}`
	bs.Labels["team"] = "payments"                // anyone else's labels and finalizers are information
	jc.Spec.Completion.Usage.Quantity = "0007.50" // kept exactly as received (usage_quantity is numeric)
	jc.Spec.Sink = &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP, URL: "https://jobs.example.com"}
	jc.Annotations = map[string]string{"example.com/ticket": "OPS-1"}
	bs.Finalizers = append(bs.Finalizers, "example.com/hold")
	for _, err := range []error{s.ArchiveEvent(ctx, ev), s.ArchiveJobCompletion(ctx, jc), s.ArchiveSettlement(ctx, bs)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ArchiveEvent(ctx, ev.DeepCopy()); err != nil {
		t.Fatalf("re-archiving the same receipt: %v", err)
	}
	for _, mutate := range []func(*hooksv1alpha1.WebhookEvent){
		func(e *hooksv1alpha1.WebhookEvent) { e.Status.Operations[1].Outcome = hooksv1alpha1.OutcomeLinked },
		func(e *hooksv1alpha1.WebhookEvent) { e.Spec.PayloadHash = "sha256:00" },
		func(e *hooksv1alpha1.WebhookEvent) { s := int64(2); e.Spec.Sequence = &s },
		func(e *hooksv1alpha1.WebhookEvent) { e.UID = "other" },
	} {
		other := ev.DeepCopy()
		mutate(other)
		if err := s.ArchiveEvent(ctx, other); !archive.IsConflict(err) {
			t.Fatalf("other content under an archived receipt's name must be a conflict, got %v", err)
		}
	}
	f, err := s.Find(ctx, ev.Namespace, ev.Spec.EventID)
	if err != nil || len(f.Events) != 1 {
		t.Fatalf("find: %v %+v", err, f)
	}
	got := f.Events[0].Object
	if got.Name != ev.Name || got.UID != ev.UID || got.Spec.EventID != ev.Spec.EventID || got.Spec.PayloadHash != ev.Spec.PayloadHash ||
		got.Spec.EventType != ev.Spec.EventType || !got.Spec.ReceivedAt.Equal(&ev.Spec.ReceivedAt) || got.Status.Phase != ev.Status.Phase ||
		len(got.Status.Operations) != 2 || got.Status.Operations[1].Child != bs.Name || got.Spec.Sequence == nil || *got.Spec.Sequence != seq ||
		got.Spec.RawPayload != ev.Spec.RawPayload || got.Kind != "WebhookEvent" {
		t.Fatalf("the receipt as built from its columns: %+v", got)
	}

	// A job completion reads back as the object it was, built from its columns and rest.
	gotJob, err := s.LatestJob(ctx, jc.Namespace, jc.Spec.Provider, jc.Spec.JobID)
	if err != nil || gotJob == nil {
		t.Fatalf("latest job: %v %v", gotJob, err)
	}
	for _, pair := range [][2]any{{gotJob.Spec, jc.Spec}, {gotJob.Status, jc.Status}, {gotJob.Annotations, jc.Annotations},
		{gotJob.UID, jc.UID}, {gotJob.Name, jc.Name}, {gotJob.Namespace, jc.Namespace}, {gotJob.CreationTimestamp, jc.CreationTimestamp}} {
		g, _ := json.Marshal(pair[0])
		w, _ := json.Marshal(pair[1])
		if string(g) != string(w) {
			t.Errorf("the archived job completion reads back as\n%s\nwant\n%s", g, w)
		}
	}

	conn, err := pgx.Connect(ctx, server.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var jobObjectNull bool
	if err := conn.QueryRow(ctx, `SELECT object IS NULL FROM job_completions WHERE name = $1`, jc.Name).Scan(&jobObjectNull); err != nil || !jobObjectNull {
		t.Fatalf("a new job completion stores no object: %v %v", jobObjectNull, err)
	}
	var objectNull bool
	if err := conn.QueryRow(ctx, `SELECT object IS NULL FROM event_receipts WHERE name = $1`, ev.Name).Scan(&objectNull); err != nil || !objectNull {
		t.Fatalf("a new receipt stores no object: %v %v", objectNull, err)
	}
	// The objects keep what the archive holds nowhere else, and nothing of the cluster's
	// bookkeeping.
	var stored []byte
	var settlementObjectNull bool
	if err := conn.QueryRow(ctx, `SELECT settlement_object(t), t.object IS NULL FROM settlements t WHERE name = $1`, bs.Name).
		Scan(&stored, &settlementObjectNull); err != nil || !settlementObjectNull {
		t.Fatalf("a new settlement stores no object: %v %v", settlementObjectNull, err)
	}
	var m struct {
		Metadata map[string]any `json:"metadata"`
		Status   struct {
			Conditions []any `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(stored, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"resourceVersion", "managedFields"} {
		if _, ok := m.Metadata[k]; ok {
			t.Errorf("the stored settlement keeps metadata.%s", k)
		}
	}
	if l, _ := json.Marshal(m.Metadata["labels"]); string(l) != `{"team":"payments"}` {
		t.Errorf("the stored settlement's labels: %s (want only those not the operator's)", l)
	}
	if f, _ := json.Marshal(m.Metadata["finalizers"]); string(f) != `["example.com/hold"]` {
		t.Errorf("the stored settlement's finalizers: %s (want only those not the operator's)", f)
	}
	if m.Metadata["annotations"] == nil || m.Metadata["uid"] != string(bs.UID) || len(m.Status.Conditions) != 5 {
		t.Errorf("the stored settlement lost information: %s", stored)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT jsonb_array_length(conditions) FROM archived_settlements WHERE name = $1`, bs.Name).Scan(&n); err != nil || n != 5 {
		t.Fatalf("archived_settlements shows the conditions: %d %v", n, err)
	}
	var qty string
	if err := conn.QueryRow(ctx, `SELECT jsonb_array_length(conditions), object #>> '{spec,completion,usage,quantity}'
		FROM archived_job_completions WHERE name = $1`, jc.Name).Scan(&n, &qty); err != nil || n != 2 || qty != "0007.50" {
		t.Fatalf("archived_job_completions shows the conditions and the object: %d %q %v", n, qty, err)
	}
	var phase, provider string
	if err := conn.QueryRow(ctx, `SELECT phase, object->'spec'->>'provider' FROM archived_event_receipts WHERE name = $1`, ev.Name).
		Scan(&phase, &provider); err != nil || phase != "Complete" || provider != ev.Spec.Provider {
		t.Fatalf("archived_event_receipts: %q %q %v", phase, provider, err)
	}
}

// insert0001 inserts the three records as migration 0001's writer did: whole objects
// (without managedFields), conditions columns, the receipt's hash over its whole spec.
func insert0001(t testing.TB, conn *pgx.Conn, ev *hooksv1alpha1.WebhookEvent, jc *hooksv1alpha1.JobCompletion, bs *hooksv1alpha1.BillingSettlement) {
	t.Helper()
	ctx := context.Background()
	whole := func(obj any, kind string) []byte {
		b, _ := json.Marshal(obj)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		m["apiVersion"], m["kind"] = hooksv1alpha1.GroupVersion.String(), kind
		delete(m["metadata"].(map[string]any), "managedFields")
		b, _ = json.Marshal(m)
		return b
	}
	ops, _ := json.Marshal([]map[string]string{{"type": "JobCompletion", "key": jc.Spec.JobID, "child": jc.Name, "outcome": "Created"},
		{"type": "BillingSettlement", "key": bs.Spec.SettlementKey, "child": bs.Name, "outcome": "Created"}})
	conds, _ := json.Marshal(bs.Status.Conditions)
	jconds, _ := json.Marshal(jc.Status.Conditions)
	// As 0001's writer inserted them.
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO event_receipts (namespace, name, uid, provider, event_id, event_type, payload_hash, received_at, phase,
			operations, created_at, content_hash, object) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)`,
			[]any{ev.Namespace, ev.Name, string(ev.UID), ev.Spec.Provider, ev.Spec.EventID, ev.Spec.EventType, ev.Spec.PayloadHash,
				ev.Spec.ReceivedAt.UTC(), string(ev.Status.Phase), ops, ev.CreationTimestamp.UTC(), archive.EventContentHash(ev), whole(ev, "WebhookEvent")}},
		{`INSERT INTO job_completions (namespace, name, uid, provider, job_id, version, job_state, state, applied_version,
			completed_at, applied_at, usage_meter, usage_quantity, usage_unit, source_event, created_at, conditions, content_hash, object)
			VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13::numeric,$14,$15,$16,$17,$18,$19)`,
			[]any{jc.Namespace, jc.Name, string(jc.UID), jc.Spec.Provider, jc.Spec.JobID, jc.Spec.Completion.Version,
				string(jc.Spec.Completion.State), string(jc.Status.State), jc.Status.AppliedVersion, jc.Spec.Completion.CompletedAt.UTC(),
				jc.Status.AppliedAt.UTC(), jc.Spec.Completion.Usage.Meter, jc.Spec.Completion.Usage.Quantity, jc.Spec.Completion.Usage.Unit,
				jc.Spec.Completion.SourceEvent, jc.CreationTimestamp.UTC(), jconds, archive.JobContentHash(jc), whole(jc, "JobCompletion")}},
		{`INSERT INTO settlements (namespace, name, uid, billing_provider, settlement_key, idempotency_key, type, reverses,
			customer, job_id, webhook_provider, source_event, usage_meter, usage_quantity, usage_unit, charged_minor, charged_currency,
			state, exposure, attempts, provider_ref, provider_status, sent_to_endpoint, sent_to_provider_uid, dead_lettered, reconciled,
			first_submitted_at, settled_at, last_reconciled_at, created_at, conditions, content_hash, object)
			VALUES ($1,$2,$3,$4,$5,$6,'Charge','',$7,$8,$9,$10,$11,$12::numeric,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,false,true,
			$23,$24,$25,$26,$27,$28,$29)`,
			[]any{bs.Namespace, bs.Name, string(bs.UID), bs.Spec.BillingProviderRef, bs.Spec.SettlementKey, bs.Spec.IdempotencyKey,
				bs.Spec.Customer, bs.Spec.JobID, bs.Spec.WebhookProvider, bs.Spec.SourceEvent,
				bs.Spec.Usage.Meter, bs.Spec.Usage.Quantity, bs.Spec.Usage.Unit, bs.Status.ChargedAmount.Minor, bs.Status.ChargedAmount.Currency,
				string(bs.Status.State), string(bs.Status.Exposure), bs.Status.Attempts, bs.Status.ProviderRef, bs.Status.ProviderStatus,
				bs.Status.SentTo.Endpoint, bs.Status.SentTo.BillingProviderUID, bs.Status.FirstSubmittedAt.UTC(), bs.Status.SettledAt.UTC(),
				bs.Status.LastReconciledAt.UTC(), bs.CreationTimestamp.UTC(), conds, archive.SettlementContentHash(bs), whole(bs, "BillingSettlement")}},
	} {
		if _, err := conn.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
}
