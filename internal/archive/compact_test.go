package archive_test

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
)

// The compact forms of migration 0004 — a settlement as its columns, rest and compact
// conditions; a job completion's compact conditions; a receipt's compact operations —
// read back, through the functions every reader uses, as exactly the record archived
// (the whole object, conditions and fields no content hash covers included). Where a
// record's columns cannot say it exactly (a field a column holds with a default), the
// row keeps the whole object, and reads back as exactly as well.
func TestCompactFormsReadBackExactly(t *testing.T) {
	ctx := context.Background()
	s, db := newStoreDB(t)
	conn, err := pgx.Connect(ctx, server.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	at := func(sec int64) metav1.Time { return metav1.NewTime(time.Unix(1796131680+sec, 0).UTC()) }
	cond := func(typ string, status metav1.ConditionStatus, gen int64, ltt metav1.Time, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, ObservedGeneration: gen, LastTransitionTime: ltt, Reason: reason, Message: msg}
	}
	settlements := map[string]struct {
		mutate  func(*hooksv1alpha1.BillingSettlement)
		compact bool
	}{
		"settled": {func(*hooksv1alpha1.BillingSettlement) {}, true},
		"refund, failed, nothing sent": {func(bs *hooksv1alpha1.BillingSettlement) {
			bs.Spec.Type, bs.Spec.Reverses, bs.Spec.Usage = hooksv1alpha1.SettlementRefund, "inference-stl-original", nil
			bs.Spec.Amount = &hooksv1alpha1.Amount{Minor: 1250, Currency: "EUR"}
			bs.Spec.JobID, bs.Spec.WebhookProvider, bs.Spec.SourceEvent = "", "", ""
			bs.Status = hooksv1alpha1.BillingSettlementStatus{ObservedGeneration: 1, State: hooksv1alpha1.SettlementFailed, Exposure: hooksv1alpha1.ExposureNone,
				LastError: &hooksv1alpha1.SettlementError{Class: "Permanent", Code: "card_declined"}}
		}, true},
		"odd values": {func(bs *hooksv1alpha1.BillingSettlement) {
			bs.Spec.Usage.Unit, bs.Spec.Usage.Quantity = "", "0007.50"
			bs.Spec.Metadata = map[string]string{"order": "A-1"}
			occurred := at(-3600)
			bs.Spec.OccurredAt, bs.Status.UsageDatedAt = &occurred, &occurred
			bs.Labels["team"] = "payments"
			bs.Annotations["example.com/ticket"] = "OPS-1 \"quoted\" ünïcode"
			bs.Finalizers = append(bs.Finalizers, "example.com/hold")
			bs.Status.ReversedBy = []string{"inference-stl-refund"}
			bs.Status.ChargedAmount.Currency = ""
			bs.Status.SentTo.Endpoint = ""
			bs.Status.Conditions = []metav1.Condition{
				cond("Settled", metav1.ConditionTrue, 0, at(1), "ProviderSettled", "line\nbreak, tab\t, quote \""),
				cond("Ready", metav1.ConditionTrue, 0, at(1), "ProviderSettled", "line\nbreak, tab\t, quote \""),
				cond("Reconciled", metav1.ConditionFalse, 3, at(-5), "", ""),
				cond("Ready2", metav1.ConditionTrue, 0, at(1), "ProviderSettled", "line\nbreak, tab\t, quote \""),
			}
		}, true},
		"a condition without a time": {func(bs *hooksv1alpha1.BillingSettlement) {
			bs.Status.Conditions = append(bs.Status.Conditions, metav1.Condition{Type: "Odd", Status: metav1.ConditionUnknown, Reason: "R"})
		}, true},
		"UIDs not in uuid's text form": {func(bs *hooksv1alpha1.BillingSettlement) {
			bs.UID = "uid-not-a-uuid"
			bs.Status.SentTo.BillingProviderUID = "0000000A-0009-4003-8009-000000005CCD"
		}, true},
		"no type (the column says Charge)":     {func(bs *hooksv1alpha1.BillingSettlement) { bs.Spec.Type = "" }, false},
		"never observed (the functions say 1)": {func(bs *hooksv1alpha1.BillingSettlement) { bs.Status.ObservedGeneration = 0 }, false},
		"generation 0 (the functions say 1)":   {func(bs *hooksv1alpha1.BillingSettlement) { bs.Generation = 0 }, false},
		"generation 3": {func(bs *hooksv1alpha1.BillingSettlement) {
			bs.Generation, bs.Status.ObservedGeneration = 3, 2
		}, true},
		"no exposure (the column says None)": {func(bs *hooksv1alpha1.BillingSettlement) { bs.Status.Exposure = "" }, false},
		"sentTo with nothing in it": {func(bs *hooksv1alpha1.BillingSettlement) {
			bs.Status.SentTo = &hooksv1alpha1.ProviderTarget{CredentialsSecret: "token"}
		}, true},
		"empty sentTo (rest says it)": {func(bs *hooksv1alpha1.BillingSettlement) { bs.Status.SentTo = &hooksv1alpha1.ProviderTarget{} }, true},
	}
	i := 100
	for name, tc := range settlements {
		i++
		_, jc, bs := happyPath(i)
		tc.mutate(bs)
		if err := s.ArchiveSettlement(ctx, bs); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var raw []byte
		var objectStored bool
		if err := conn.QueryRow(ctx, `SELECT settlement_object(t), t.object IS NOT NULL FROM settlements t WHERE name = $1`, bs.Name).
			Scan(&raw, &objectStored); err != nil {
			t.Fatal(err)
		}
		if objectStored == tc.compact {
			t.Errorf("%s: the row stores the whole object: %v, want %v", name, objectStored, !tc.compact)
		}
		want, _ := archive.ObjectJSONForTest(bs, "BillingSettlement")
		sameObject(t, name, raw, want)
		got, err := s.Settlement(ctx, bs.Namespace, bs.Name)
		if err != nil || got == nil {
			t.Fatalf("%s: %v %v", name, got, err)
		}
		gotConds, _ := json.Marshal(got.Status.Conditions)
		wantConds, _ := json.Marshal(bs.Status.Conditions)
		if !bytes.Equal(gotConds, wantConds) {
			t.Errorf("%s: conditions read back as %s, want %s", name, gotConds, wantConds)
		}

		// A job completion of each shape of conditions.
		jc.Status.Conditions = bs.Status.Conditions
		if err := s.ArchiveJobCompletion(ctx, jc); err != nil {
			t.Fatalf("%s: job completion: %v", name, err)
		}
		if err := conn.QueryRow(ctx, `SELECT job_completion_object(t) FROM job_completions t WHERE name = $1`, jc.Name).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		want, _ = archive.ObjectJSONForTest(jc, "JobCompletion")
		sameObject(t, name+" (job completion)", raw, want)
	}

	// Job completions of every shape; quantities numeric writes otherwise.
	jobs := map[string]func(*hooksv1alpha1.JobCompletion){
		"applied":       func(*hooksv1alpha1.JobCompletion) {},
		"leading zeros": func(jc *hooksv1alpha1.JobCompletion) { jc.Spec.Completion.Usage.Quantity = "000" },
		"scale kept":    func(jc *hooksv1alpha1.JobCompletion) { jc.Spec.Completion.Usage.Quantity = "12.000" },
		"past int64":    func(jc *hooksv1alpha1.JobCompletion) { jc.Spec.Completion.Usage.Quantity = "100000000000000000000.5" },
		"a fraction":    func(jc *hooksv1alpha1.JobCompletion) { jc.Spec.Completion.Usage.Quantity = "0.5" },
		"no unit":       func(jc *hooksv1alpha1.JobCompletion) { jc.Spec.Completion.Usage.Unit = "" },
		"no usage":      func(jc *hooksv1alpha1.JobCompletion) { jc.Spec.Completion.Usage = nil },
		"two events": func(jc *hooksv1alpha1.JobCompletion) {
			jc.Status.SourceEvents = append(jc.Status.SourceEvents, "inference-other")
		},
		"no events":       func(jc *hooksv1alpha1.JobCompletion) { jc.Status.SourceEvents = nil },
		"no source event": func(jc *hooksv1alpha1.JobCompletion) { jc.Spec.Completion.SourceEvent = "" },
		"generation 2":    func(jc *hooksv1alpha1.JobCompletion) { jc.Generation, jc.Status.ObservedGeneration = 2, 2 },
		"never observed":  func(jc *hooksv1alpha1.JobCompletion) { jc.Status.ObservedGeneration = 0 },
		"failed, nothing applied": func(jc *hooksv1alpha1.JobCompletion) {
			jc.Status.State, jc.Status.AppliedVersion, jc.Status.AppliedAt = hooksv1alpha1.JobCompletionFailed, nil, nil
			jc.Status.LastError, jc.Status.Attempts = "sink answered 500", 3
			jc.Spec.Sink = &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP, URL: "https://jobs.example.com"}
			jc.Annotations = map[string]string{"example.com/ticket": "OPS-1"}
		},
	}
	for name, mutate := range jobs {
		i++
		_, jc, _ := happyPath(i)
		mutate(jc)
		if err := s.ArchiveJobCompletion(ctx, jc); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var raw []byte
		var objectStored bool
		if err := conn.QueryRow(ctx, `SELECT job_completion_object(t), t.object IS NOT NULL FROM job_completions t WHERE name = $1`, jc.Name).
			Scan(&raw, &objectStored); err != nil {
			t.Fatal(err)
		}
		// Without status.sourceEvents the columns would say one (source_event), without
		// status.observedGeneration 1: the row keeps the whole object.
		if wantObject := name == "no events" || name == "never observed"; objectStored != wantObject {
			t.Errorf("%s: the job completion's row stores the whole object: %v, want %v", name, objectStored, wantObject)
		}
		want, _ := archive.ObjectJSONForTest(jc, "JobCompletion")
		sameObject(t, name+" (job completion)", raw, want)
	}

	// Receipts: operations of every shape, an empty child among them.
	ev, _, _ := happyPath(200)
	ev.Status.Operations = append(ev.Status.Operations, hooksv1alpha1.OperationStatus{Type: hooksv1alpha1.OperationBillingSettlement,
		Key: `["odd","key"]`, Outcome: hooksv1alpha1.OutcomeLinked})
	if err := s.ArchiveEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	// UIDs and payload hashes of every form read back as received.
	for i, odd := range []struct{ uid, payload string }{
		{"00000000-0000-4000-8000-00000000000A", "sha256:" + strings.Repeat("AB", 32)},
		{"uid-1", "sha256:" + strings.Repeat("ab", 31)},
		{"", "md5:0123"},
		{"0a0a0a0a-0000-4000-8000-0000000000ff", "sha256:" + strings.Repeat("0f", 32)},
	} {
		e, _, _ := happyPath(300 + i)
		e.UID, e.Spec.PayloadHash = types.UID(odd.uid), odd.payload
		if err := s.ArchiveEvent(ctx, e); err != nil {
			t.Fatalf("event with UID %q, payload hash %q: %v", odd.uid, odd.payload, err)
		}
		got, err := s.Event(ctx, e.Namespace, e.Spec.Provider, e.Spec.EventID)
		if err != nil || got == nil || got.UID != odd.uid || got.PayloadHash != odd.payload {
			t.Fatalf("event with UID %q, payload hash %q reads back as %+v, %v", odd.uid, odd.payload, got, err)
		}
	}

	var ops []byte
	if err := conn.QueryRow(ctx, `SELECT event_receipt_object(t) -> 'status' -> 'operations' FROM event_receipts t WHERE name = $1`, ev.Name).
		Scan(&ops); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal([]map[string]string{
		{"type": "JobCompletion", "key": ev.Status.Operations[0].Key, "child": ev.Status.Operations[0].Child, "outcome": "Created"},
		{"type": "BillingSettlement", "key": ev.Status.Operations[1].Key, "child": ev.Status.Operations[1].Child, "outcome": "Created"},
		{"type": "BillingSettlement", "key": `["odd","key"]`, "outcome": "Linked"}})
	sameObject(t, "operations", ops, want)
}

// sameObject compares two JSON documents as values (key order and spacing aside).
func sameObject(t *testing.T, what string, got, want []byte) {
	t.Helper()
	decode := func(b []byte) any {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	if g, w := decode(got), decode(want); !reflect.DeepEqual(g, w) {
		gj, _ := json.Marshal(g)
		wj, _ := json.Marshal(w)
		t.Errorf("%s reads back as\n%s\nwant\n%s", what, gj, wj)
	}
}

// A job completion applied by its creation (no sink, its status never written) is
// archived as every reader sees it: applied, at its creation, with its conditions —
// in the compact form, and read back as exactly that.
func TestJobAppliedOnCreationArchivedAsApplied(t *testing.T) {
	ctx := context.Background()
	s, db := newStoreDB(t)
	conn, err := pgx.Connect(ctx, server.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, jc, _ := happyPath(1)
	jc.Spec.Sink, jc.Generation, jc.Status = nil, 1, hooksv1alpha1.JobCompletionStatus{}
	if !jc.AppliedOnCreation() {
		t.Fatal("the job is not applied by its creation; the test's premise is wrong")
	}
	if err := s.ArchiveJobCompletion(ctx, jc); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	var objectStored bool
	var state string
	if err := conn.QueryRow(ctx, `SELECT job_completion_object(t), t.object IS NOT NULL, t.state FROM job_completions t WHERE name = $1`, jc.Name).
		Scan(&raw, &objectStored, &state); err != nil {
		t.Fatal(err)
	}
	if objectStored || state != string(hooksv1alpha1.JobCompletionApplied) {
		t.Errorf("row: whole object stored %v, state %q; want the compact form, Applied", objectStored, state)
	}
	applied := jc.DeepCopy()
	applied.Status = jc.Progress()
	want, _ := archive.ObjectJSONForTest(applied, "JobCompletion")
	sameObject(t, "job applied by its creation", raw, want)
	// Archived again as it is in the cluster (status still empty): the same record.
	if err := s.ArchiveJobCompletion(ctx, jc); err != nil {
		t.Errorf("archiving it again: %v", err)
	}
}
