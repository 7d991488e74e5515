package archive_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
)

// Rows of every earlier form — 0001's whole objects, and 0002/0003's receipts by
// columns, job completions by columns and rest, settlements with their object — read
// the same after migration 0004 as before it: every column of the three views, row by
// row, and what the store's readers return is the views' object. Re-archiving them is a
// no-op; other content under their names is still refused.
func TestRowsOfEveryEarlierFormReadTheSameAfter0004(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("forms%d", dbs.Add(1))
	if err := server.CreateDatabase(name); err != nil {
		t.Fatal(err)
	}
	s, err := archive.Open(archive.Config{URL: server.URL(name)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := pgx.Connect(ctx, server.URL(name))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	if err := s.MigrateToForTest(ctx, 1); err != nil {
		t.Fatal(err)
	}
	ev1, jc1, bs1 := happyPath(1)
	insert0001(t, conn, ev1, jc1, bs1)
	if err := s.MigrateToForTest(ctx, 3); err != nil {
		t.Fatal(err)
	}
	ev2, jc2, bs2 := happyPath(2)
	ev2.Spec.RawPayload = `{"id":"x"}`
	jc2.Spec.Completion.Usage.Quantity = "0007.50"
	bs2.Labels["team"] = "payments"
	insert0002(t, conn, ev2, jc2, bs2)

	views := func() map[string][]string {
		out := map[string][]string{}
		for _, v := range []string{"archived_event_receipts", "archived_job_completions", "archived_settlements"} {
			rows, err := conn.Query(ctx, `SELECT to_jsonb(v)::text FROM `+v+` v ORDER BY name`)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(got) != 2 {
				t.Fatalf("%s: %d rows, %v", v, len(got), err)
			}
			out[v] = got
		}
		return out
	}
	before := views()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrating an archive with rows of 0001 and 0002/0003: %v", err)
	}
	after := views()
	for v := range before {
		for i := range before[v] {
			if before[v][i] != after[v][i] {
				t.Errorf("%s row %d reads differently after 0004:\nbefore %s\nafter  %s", v, i, before[v][i], after[v][i])
			}
		}
	}

	for _, rec := range []struct {
		ev *hooksv1alpha1.WebhookEvent
		jc *hooksv1alpha1.JobCompletion
		bs *hooksv1alpha1.BillingSettlement
	}{{ev1, jc1, bs1}, {ev2, jc2, bs2}} {
		// The readers return what the views show.
		var wantSettlement, wantJob, wantEvent []byte
		if err := conn.QueryRow(ctx, `SELECT (SELECT object FROM archived_settlements WHERE name = $1),
			(SELECT object FROM archived_job_completions WHERE name = $2), (SELECT object FROM archived_event_receipts WHERE name = $3)`,
			rec.bs.Name, rec.jc.Name, rec.ev.Name).Scan(&wantSettlement, &wantJob, &wantEvent); err != nil {
			t.Fatal(err)
		}
		got, err := s.Settlement(ctx, rec.bs.Namespace, rec.bs.Name)
		if err != nil || got == nil {
			t.Fatalf("settlement %s: %v", rec.bs.Name, err)
		}
		sameJSON(t, "settlement "+rec.bs.Name, got, wantSettlement)
		job, err := s.LatestJob(ctx, rec.jc.Namespace, rec.jc.Spec.Provider, rec.jc.Spec.JobID)
		if err != nil || job == nil {
			t.Fatalf("job %s: %v", rec.jc.Name, err)
		}
		sameJSON(t, "job completion "+rec.jc.Name, job, wantJob)
		f, err := s.Find(ctx, rec.ev.Namespace, rec.ev.Spec.EventID)
		if err != nil || len(f.Events) != 1 {
			t.Fatalf("find %s: %v %+v", rec.ev.Spec.EventID, err, f)
		}
		sameJSON(t, "event receipt "+rec.ev.Name, &f.Events[0].Object, wantEvent)
		if len(f.Events[0].Object.Status.Operations) != 2 {
			t.Errorf("the receipt's operations: %+v", f.Events[0].Object.Status.Operations)
		}

		// Archived again (an archival interrupted across the upgrade): no-ops.
		if err := s.ArchiveEvent(ctx, rec.ev); err != nil {
			t.Errorf("re-archiving receipt %s: %v", rec.ev.Name, err)
		}
		if err := s.ArchiveJobCompletion(ctx, rec.jc); err != nil {
			t.Errorf("re-archiving job completion %s: %v", rec.jc.Name, err)
		}
		if err := s.ArchiveSettlement(ctx, rec.bs); err != nil {
			t.Errorf("re-archiving settlement %s: %v", rec.bs.Name, err)
		}
		other := rec.bs.DeepCopy()
		other.Status.ProviderRef = "ch_other"
		if err := s.ArchiveSettlement(ctx, other); !archive.IsConflict(err) {
			t.Errorf("other content under settlement %s must be a conflict, got %v", rec.bs.Name, err)
		}
		otherJob := rec.jc.DeepCopy()
		otherJob.Spec.Completion.Usage.Quantity = "99"
		if err := s.ArchiveJobCompletion(ctx, otherJob); !archive.IsConflict(err) {
			t.Errorf("other content under job completion %s must be a conflict, got %v", rec.jc.Name, err)
		}
		otherEvent := rec.ev.DeepCopy()
		otherEvent.Status.Phase = hooksv1alpha1.EventPartiallyFailed
		if err := s.ArchiveEvent(ctx, otherEvent); !archive.IsConflict(err) {
			t.Errorf("other content under receipt %s must be a conflict, got %v", rec.ev.Name, err)
		}
	}
	// The usage totals read usageDatedAt and sentTo from rows of every form.
	var n int
	err = s.SettledUsage(ctx, bs1.Namespace, bs1.Spec.BillingProviderRef, bs1.Status.SettledAt.Add(-1e9), bs2.Status.SettledAt.Add(1e9),
		func(u archive.UsageRow) error {
			n++
			if u.SentTo.Endpoint == "" || u.SentTo.CredentialsSecret != "billing-token" {
				t.Errorf("usage row %s: sentTo %+v", u.Name, u.SentTo)
			}
			return nil
		})
	if err != nil || n != 2 {
		t.Fatalf("settled usage over rows of 0001 and 0002: %d rows, %v", n, err)
	}
}

// sameJSON compares what a reader returned with the object a view shows.
func sameJSON(t *testing.T, what string, got any, want []byte) {
	t.Helper()
	var g, w any
	b, _ := json.Marshal(got)
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	// The view's object decoded into the same type, so that both sides carry the same
	// fields of this build's API types.
	typed := reflect.New(reflect.TypeOf(got).Elem()).Interface()
	if err := json.Unmarshal(want, typed); err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(typed)
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		gj, _ := json.Marshal(g)
		wj, _ := json.Marshal(w)
		t.Errorf("%s: the reader returns\n%s\nthe view shows\n%s", what, gj, wj)
	}
}

// insert0002 inserts the three records as the writer of migrations 0002 and 0003 did:
// a receipt's columns and operations (jsonb) with the hex hash EventReceiptHash, a job
// completion's columns and rest (the object without what they hold, conditions
// included), a settlement's columns and its object without the cluster's bookkeeping.
func insert0002(t testing.TB, conn *pgx.Conn, ev *hooksv1alpha1.WebhookEvent, jc *hooksv1alpha1.JobCompletion, bs *hooksv1alpha1.BillingSettlement) {
	t.Helper()
	ctx := context.Background()
	ops, _ := json.Marshal([]map[string]string{{"type": "JobCompletion", "key": jc.Spec.JobID, "child": jc.Name, "outcome": "Created"},
		{"type": "BillingSettlement", "key": bs.Spec.SettlementKey, "child": bs.Name, "outcome": "Created"}})
	var extra []byte
	if ev.Spec.RawPayload != "" {
		extra, _ = json.Marshal(map[string]string{"rawPayload": ev.Spec.RawPayload})
	}
	rest := map[string]any{
		"metadata": map[string]any{"generation": jc.Generation},
		"spec":     map[string]any{"completion": map[string]any{"usage": jc.Spec.Completion.Usage}},
		"status": map[string]any{"conditions": jc.Status.Conditions, "sourceEvents": jc.Status.SourceEvents,
			"observedGeneration": jc.Status.ObservedGeneration},
	}
	restJSON, _ := json.Marshal(rest)
	object := func() []byte {
		b, _ := json.Marshal(bs)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		m["apiVersion"], m["kind"] = hooksv1alpha1.GroupVersion.String(), "BillingSettlement"
		md := m["metadata"].(map[string]any)
		delete(md, "resourceVersion")
		delete(md, "finalizers")
		md["labels"] = map[string]string{"team": bs.Labels["team"]}
		if bs.Labels["team"] == "" {
			delete(md, "labels")
		}
		b, _ = json.Marshal(m)
		return b
	}()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO event_receipts (namespace, name, uid, provider, event_id, event_type, payload_hash, received_at, phase,
			operations, created_at, content_hash, spec_extra) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)`,
			[]any{ev.Namespace, ev.Name, string(ev.UID), ev.Spec.Provider, ev.Spec.EventID, ev.Spec.EventType, ev.Spec.PayloadHash,
				ev.Spec.ReceivedAt.UTC(), string(ev.Status.Phase), ops, ev.CreationTimestamp.UTC(), archive.EventReceiptHash(ev), extra}},
		{`INSERT INTO job_completions (namespace, name, uid, provider, job_id, version, job_state, state, applied_version,
			completed_at, applied_at, usage_meter, usage_quantity, usage_unit, source_event, created_at, content_hash, rest)
			VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13::numeric,$14,$15,$16,$17,$18)`,
			[]any{jc.Namespace, jc.Name, string(jc.UID), jc.Spec.Provider, jc.Spec.JobID, jc.Spec.Completion.Version,
				string(jc.Spec.Completion.State), string(jc.Status.State), jc.Status.AppliedVersion, jc.Spec.Completion.CompletedAt.UTC(),
				jc.Status.AppliedAt.UTC(), jc.Spec.Completion.Usage.Meter, jc.Spec.Completion.Usage.Quantity, jc.Spec.Completion.Usage.Unit,
				jc.Spec.Completion.SourceEvent, jc.CreationTimestamp.UTC(), archive.JobContentHash(jc), restJSON}},
		{`INSERT INTO settlements (namespace, name, uid, billing_provider, settlement_key, idempotency_key, type, reverses,
			customer, job_id, webhook_provider, source_event, usage_meter, usage_quantity, usage_unit, charged_minor, charged_currency,
			state, exposure, attempts, provider_ref, provider_status, sent_to_endpoint, sent_to_provider_uid, dead_lettered, reconciled,
			first_submitted_at, settled_at, last_reconciled_at, created_at, content_hash, object)
			VALUES ($1,$2,$3,$4,$5,$6,'Charge','',$7,$8,$9,$10,$11,$12::numeric,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,false,true,
			$23,$24,$25,$26,$27,$28)`,
			[]any{bs.Namespace, bs.Name, string(bs.UID), bs.Spec.BillingProviderRef, bs.Spec.SettlementKey, bs.Spec.IdempotencyKey,
				bs.Spec.Customer, bs.Spec.JobID, bs.Spec.WebhookProvider, bs.Spec.SourceEvent,
				bs.Spec.Usage.Meter, bs.Spec.Usage.Quantity, bs.Spec.Usage.Unit, bs.Status.ChargedAmount.Minor, bs.Status.ChargedAmount.Currency,
				string(bs.Status.State), string(bs.Status.Exposure), bs.Status.Attempts, bs.Status.ProviderRef, bs.Status.ProviderStatus,
				bs.Status.SentTo.Endpoint, bs.Status.SentTo.BillingProviderUID, bs.Status.FirstSubmittedAt.UTC(), bs.Status.SettledAt.UTC(),
				bs.Status.LastReconciledAt.UTC(), bs.CreationTimestamp.UTC(), archive.SettlementContentHash(bs), object}},
	} {
		if _, err := conn.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
}
