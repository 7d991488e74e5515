package archive_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
)

var nov = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// charge is a settlement of customer made at created, in state.
func charge(ns, name, customer string, created time.Time, state hooksv1alpha1.SettlementState) *hooksv1alpha1.BillingSettlement {
	bs := settled(name)
	bs.Namespace, bs.UID = ns, types.UID("uid-"+ns+"-"+name)
	bs.CreationTimestamp = metav1.NewTime(created)
	bs.Spec.SettlementKey = `["settlement","` + ns + `","` + name + `"]`
	bs.Spec.Customer = customer
	bs.Status.State = state
	if state != hooksv1alpha1.SettlementSettled {
		bs.Status.SettledAt, bs.Status.ProviderRef, bs.Status.ChargedAmount = nil, "", nil
	} else {
		at := metav1.NewTime(created.Add(time.Minute))
		bs.Status.SettledAt = &at
	}
	return bs
}

func job(ns, provider, jobID string, version int64) *hooksv1alpha1.JobCompletion {
	return &hooksv1alpha1.JobCompletion{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: provider + "-job-" + jobID, UID: types.UID(fmt.Sprintf("u-%s-%s-%d", ns, jobID, version)),
			CreationTimestamp: metav1.NewTime(nov)},
		Spec: hooksv1alpha1.JobCompletionSpec{Provider: provider, JobID: jobID,
			Completion: hooksv1alpha1.Completion{Version: version, State: hooksv1alpha1.JobSucceeded, SourceEvent: fmt.Sprintf("%s-e%d", provider, version)}},
		Status: hooksv1alpha1.JobCompletionStatus{State: hooksv1alpha1.JobCompletionApplied, AppliedVersion: &version},
	}
}

func event(ns, name, eventID string) *hooksv1alpha1.WebhookEvent {
	return &hooksv1alpha1.WebhookEvent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("u-" + ns + "-" + name), CreationTimestamp: metav1.NewTime(nov)},
		Spec: hooksv1alpha1.WebhookEventSpec{Provider: "acme", EventID: eventID, EventType: "job.completed",
			PayloadHash: "sha256:00", ReceivedAt: metav1.NewTime(nov)},
		Status: hooksv1alpha1.WebhookEventStatus{Phase: hooksv1alpha1.EventComplete},
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func names(f archive.Found) (s, j, e []string) {
	for _, x := range f.Settlements {
		s = append(s, x.Object.Namespace+"/"+x.Object.Name)
	}
	for _, x := range f.Jobs {
		j = append(j, fmt.Sprintf("%s/%s@%d", x.Object.Namespace, x.Object.Name, x.Object.Spec.Completion.Version))
	}
	for _, x := range f.Events {
		e = append(e, x.Object.Namespace+"/"+x.Object.Name)
	}
	return
}

func TestFindEveryKindOfReference(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	a := charge("tenant-a", "stl-a", "cus_1", nov, hooksv1alpha1.SettlementSettled)
	a.Spec.JobID = "42"
	b := charge("tenant-b", "stl-a", "cus_2", nov, hooksv1alpha1.SettlementSettled) // same name, another namespace
	b.Spec.IdempotencyKey = "stl_b"
	must(t, s.ArchiveSettlement(ctx, a))
	must(t, s.ArchiveSettlement(ctx, b))
	must(t, s.ArchiveJobCompletion(ctx, job("tenant-a", "acme", "42", 1)))
	must(t, s.ArchiveJobCompletion(ctx, job("tenant-a", "acme", "42", 2)))
	must(t, s.ArchiveJobCompletion(ctx, job("tenant-a", "acme", "43", 1)))
	must(t, s.ArchiveEvent(ctx, event("tenant-a", "acme-e1", "evt_1")))

	for _, tc := range []struct {
		ns, ref       string
		settlements   int
		jobs, events  int
		wantFirstName string
	}{
		{"tenant-a", a.Spec.SettlementKey, 1, 0, 0, "stl-a"},
		{"tenant-a", a.Spec.IdempotencyKey, 1, 0, 0, "stl-a"},
		{"tenant-a", "stl-a", 1, 0, 0, "stl-a"},
		{"", "stl-a", 2, 0, 0, "stl-a"},          // every namespace
		{"tenant-b", "stl_a", 0, 0, 0, ""},       // another namespace's key
		{"tenant-a", "42", 1, 2, 0, "stl-a"},     // a job ID: its settlement and every archived version
		{"tenant-a", "acme-job-42", 0, 2, 0, ""}, // a JobCompletion name: every version
		{"tenant-a", "evt_1", 0, 0, 1, ""},
		{"tenant-a", "acme-e1", 0, 0, 1, ""},
		{"tenant-a", "nothing", 0, 0, 0, ""},
		{"", `' OR '1'='1`, 0, 0, 0, ""},
	} {
		f, err := s.Find(ctx, tc.ns, tc.ref)
		if err != nil {
			t.Fatalf("Find(%q, %q): %v", tc.ns, tc.ref, err)
		}
		sn, jn, en := names(f)
		if len(sn) != tc.settlements || len(jn) != tc.jobs || len(en) != tc.events {
			t.Errorf("Find(%q, %q) = settlements %v, jobs %v, events %v", tc.ns, tc.ref, sn, jn, en)
			continue
		}
		if f.Len() != tc.settlements+tc.jobs+tc.events {
			t.Errorf("Len %d", f.Len())
		}
		if tc.wantFirstName != "" && f.Settlements[0].Object.Name != tc.wantFirstName {
			t.Errorf("Find(%q, %q): first settlement %s", tc.ns, tc.ref, f.Settlements[0].Object.Name)
		}
	}

	f, err := s.Find(ctx, "tenant-a", "42")
	must(t, err)
	if v1, v2 := f.Jobs[0].Object.Spec.Completion.Version, f.Jobs[1].Object.Spec.Completion.Version; v1 != 1 || v2 != 2 {
		t.Fatalf("job versions in order: %d, %d", v1, v2)
	}
	got := f.Settlements[0]
	if got.ArchivedAt.IsZero() || got.ArchivedAt.Location() != time.UTC || got.Object.Status.ProviderRef != "ch_1" || got.Object.Kind != "BillingSettlement" {
		t.Fatalf("decoded settlement: %+v", got)
	}
	var raw map[string]any
	if err := json.Unmarshal(got.Raw, &raw); err != nil || raw["apiVersion"] != "hooks.settlement.dev/v1alpha1" {
		t.Fatalf("raw object: %s %v", got.Raw, err)
	}
	if _, err := s.Find(ctx, "tenant-a", ""); !errors.Is(err, archive.ErrEmptyReference) {
		t.Fatalf("an empty reference: %v", err)
	}
}

func TestListSettlementsFilters(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	day := 24 * time.Hour
	must(t, s.ArchiveSettlement(ctx, charge("tenant-a", "oct", "cus_1", nov.Add(-day), hooksv1alpha1.SettlementSettled)))
	must(t, s.ArchiveSettlement(ctx, charge("tenant-a", "nov-2", "cus_1", nov.Add(2*day), hooksv1alpha1.SettlementSettled)))
	must(t, s.ArchiveSettlement(ctx, charge("tenant-a", "nov-1", "cus_1", nov.Add(day), hooksv1alpha1.SettlementFailed)))
	must(t, s.ArchiveSettlement(ctx, charge("tenant-a", "nov-3", "cus_2", nov.Add(3*day), hooksv1alpha1.SettlementSettled)))
	must(t, s.ArchiveSettlement(ctx, charge("tenant-b", "nov-1", "cus_1", nov.Add(day), hooksv1alpha1.SettlementSettled)))
	dec := nov.AddDate(0, 1, 0)

	list := func(f archive.Filter) []string {
		t.Helper()
		got, err := s.ListSettlements(ctx, f)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		out := []string{}
		for _, g := range got {
			out = append(out, g.Object.Namespace+"/"+g.Object.Name)
		}
		return out
	}
	for _, tc := range []struct {
		f    archive.Filter
		want string
	}{
		{archive.Filter{Namespace: "tenant-a"}, "[tenant-a/oct tenant-a/nov-1 tenant-a/nov-2 tenant-a/nov-3]"},
		{archive.Filter{}, "[tenant-a/oct tenant-a/nov-1 tenant-b/nov-1 tenant-a/nov-2 tenant-a/nov-3]"},
		{archive.Filter{Since: nov, Until: dec}, "[tenant-a/nov-1 tenant-b/nov-1 tenant-a/nov-2 tenant-a/nov-3]"},
		{archive.Filter{Until: nov.Add(day)}, "[tenant-a/oct]"}, // half-open
		{archive.Filter{Namespace: "tenant-a", Customer: "cus_1", Since: nov}, "[tenant-a/nov-1 tenant-a/nov-2]"},
		{archive.Filter{State: hooksv1alpha1.SettlementFailed}, "[tenant-a/nov-1]"},
		{archive.Filter{Namespace: "tenant-a", Limit: 2}, "[tenant-a/oct tenant-a/nov-1]"},
		// By settled: the failed one has no settled_at and drops out of a window.
		{archive.Filter{Namespace: "tenant-a", By: archive.BySettled, Since: nov}, "[tenant-a/nov-2 tenant-a/nov-3]"},
		// ... and comes last without one.
		{archive.Filter{Namespace: "tenant-a", By: archive.BySettled}, "[tenant-a/oct tenant-a/nov-2 tenant-a/nov-3 tenant-a/nov-1]"},
		// By archived: every row was archived moments ago, whatever its creation time.
		{archive.Filter{Namespace: "tenant-b", By: archive.ByArchived, Since: time.Now().Add(-time.Hour)}, "[tenant-b/nov-1]"},
		{archive.Filter{By: archive.ByArchived, Until: time.Now().Add(-time.Hour)}, "[]"},
		{archive.Filter{Customer: "'; DROP TABLE settlements; --"}, "[]"},
	} {
		if got := fmt.Sprint(list(tc.f)); got != tc.want {
			t.Errorf("%+v:\n got %s\nwant %s", tc.f, got, tc.want)
		}
	}
	for _, bad := range []archive.Filter{{By: "modified"}, {Limit: -1}, {Since: dec, Until: nov}, {Since: nov, Until: nov}} {
		if _, err := s.ListSettlements(ctx, bad); err == nil {
			t.Errorf("%+v must be refused", bad)
		}
	}
}

func TestExportSettlementsStreamsInBatches(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	const n = 1203 // more than two cursor batches
	for i := range n {
		bs := charge("tenant-a", fmt.Sprintf("s-%04d", i), "cus_1", nov.Add(time.Duration(i)*time.Second), hooksv1alpha1.SettlementSettled)
		if i%2 == 1 { // a fixed amount, no usage, not reported back
			bs.Spec.Usage = nil
			bs.Spec.Amount = &hooksv1alpha1.Amount{Minor: int64(i), Currency: "EUR"}
			bs.Status.ChargedAmount = nil
		}
		must(t, s.ArchiveSettlement(ctx, bs))
	}
	var rows []archive.SettlementRow
	must(t, s.ExportSettlements(ctx, archive.Filter{Namespace: "tenant-a"}, func(r archive.SettlementRow) error {
		rows = append(rows, r)
		return nil
	}))
	if len(rows) != n {
		t.Fatalf("exported %d rows, want %d", len(rows), n)
	}
	for i, r := range rows {
		if want := fmt.Sprintf("s-%04d", i); r.Name != want {
			t.Fatalf("row %d is %s, want %s (ordered by creation)", i, r.Name, want)
		}
	}
	usage, fixed := rows[0], rows[1]
	if usage.UsageQuantity != "1523" || usage.UsageMeter != "tokens" || usage.UsageUnit != "token" || usage.AmountMinor != nil ||
		usage.ChargedMinor == nil || *usage.ChargedMinor != 152300 || usage.ChargedCurrency != "USD" || usage.Type != "Charge" ||
		usage.State != "Settled" || usage.ProviderRef != "ch_1" || usage.SentToEndpoint != "https://billing.example" ||
		usage.BillingProvider != "billing" || usage.SettledAt == nil || usage.FirstSubmittedAt == nil ||
		!usage.CreatedAt.Equal(nov) || usage.CreatedAt.Location() != time.UTC || usage.ArchivedAt.IsZero() {
		t.Fatalf("usage row: %+v", usage)
	}
	if fixed.UsageQuantity != "" || fixed.UsageMeter != "" || fixed.AmountMinor == nil || *fixed.AmountMinor != 1 ||
		fixed.AmountCurrency != "EUR" || fixed.ChargedMinor != nil || fixed.ChargedCurrency != "" {
		t.Fatalf("fixed-amount row: %+v", fixed)
	}
	var obj hooksv1alpha1.BillingSettlement
	if err := json.Unmarshal(usage.Object, &obj); err != nil || obj.Name != "s-0000" || obj.Status.ProviderRef != "ch_1" {
		t.Fatalf("row object: %v %+v", err, obj)
	}
	for _, c := range usage.Object {
		if c == '\n' {
			t.Fatal("the row's object must be one line")
		}
	}

	// An error from the callback stops the export and comes back as is.
	stop := errors.New("stop")
	seen := 0
	err := s.ExportSettlements(ctx, archive.Filter{}, func(archive.SettlementRow) error {
		seen++
		if seen == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || seen != 3 {
		t.Fatalf("stop: %v after %d rows", err, seen)
	}
	// The limit and the filter apply; an export is repeatable on the same store.
	seen = 0
	must(t, s.ExportSettlements(ctx, archive.Filter{Since: nov.Add(1000 * time.Second), Limit: 100}, func(archive.SettlementRow) error {
		seen++
		return nil
	}))
	if seen != 100 {
		t.Fatalf("limited export: %d rows", seen)
	}
	if err := s.ExportSettlements(ctx, archive.Filter{By: "x"}, func(archive.SettlementRow) error { return nil }); err == nil {
		t.Fatal("a bad filter must be refused")
	}
}

func TestCheckSchemaAndReadOnly(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("t%d", dbs.Add(1))
	must(t, server.CreateDatabase(name))
	reader, err := archive.Open(archive.Config{URL: server.URL(name), ReadOnly: true, ApplicationName: "kubectl-settlement"})
	must(t, err)
	defer reader.Close()
	if _, err := reader.Find(ctx, "", "x"); !errors.Is(err, archive.ErrNotReady) {
		t.Fatalf("before CheckSchema: %v", err)
	}
	if err := reader.CheckSchema(ctx); !errors.Is(err, archive.ErrNotReady) {
		t.Fatalf("an unmigrated database: %v", err)
	}
	// A read-only store cannot migrate (nor write anything).
	if err := reader.Migrate(ctx); err == nil {
		t.Fatal("a read-only store migrated")
	}

	writer, err := archive.Open(archive.Config{URL: server.URL(name)})
	must(t, err)
	defer writer.Close()
	must(t, writer.Migrate(ctx))
	must(t, writer.ArchiveSettlement(ctx, settled("a")))

	must(t, reader.CheckSchema(ctx))
	if !reader.Ready() {
		t.Fatal("ready after CheckSchema")
	}
	f, err := reader.Find(ctx, "tenant-a", "a")
	if err != nil || len(f.Settlements) != 1 {
		t.Fatalf("read through the reader: %v %+v", err, f)
	}
	if err := reader.ArchiveSettlement(ctx, settled("b")); err == nil {
		t.Fatal("a read-only store must not write")
	}
}

// SettledUsage is what reconciliation adds to the live settlements' usage when it
// compares totals with Stripe's meter event summaries: settled usage charges of one
// provider whose time at the provider may fall in the window, and whether something
// reverses them.
func TestSettledUsage(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	noon := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(name string, submitted, settledAt time.Time) *hooksv1alpha1.BillingSettlement {
		bs := settled(name)
		sub, set := metav1.NewTime(submitted), metav1.NewTime(settledAt)
		bs.Status.FirstSubmittedAt, bs.Status.SettledAt = &sub, &set
		return bs
	}
	in := at("in", noon, noon.Add(time.Second))
	in.Spec.Usage.Quantity = "12.50"
	must(t, s.ArchiveSettlement(ctx, in))
	must(t, s.ArchiveSettlement(ctx, at("straddles-start", noon.Add(-2*time.Minute), noon.Add(time.Minute))))
	must(t, s.ArchiveSettlement(ctx, at("settled-before", noon.Add(-2*time.Hour), noon.Add(-time.Hour-time.Second))))
	must(t, s.ArchiveSettlement(ctx, at("submitted-after", noon.Add(2*time.Hour), noon.Add(2*time.Hour))))
	// Sent after the window, but dated at its usage time inside it: Stripe totals it there.
	dated := at("dated-earlier", noon.Add(2*time.Hour), noon.Add(2*time.Hour))
	datedAt := metav1.NewTime(noon.Add(-30 * time.Minute))
	dated.Status.UsageDatedAt = &datedAt
	must(t, s.ArchiveSettlement(ctx, dated))
	failed := at("failed", noon, noon)
	failed.Status.State, failed.Status.SettledAt, failed.Status.Exposure = hooksv1alpha1.SettlementFailed, nil, hooksv1alpha1.ExposureNone
	must(t, s.ArchiveSettlement(ctx, failed))
	other := at("other-provider", noon, noon)
	other.Spec.BillingProviderRef = "other"
	must(t, s.ArchiveSettlement(ctx, other))
	otherNS := at("other-namespace", noon, noon)
	otherNS.Namespace, otherNS.UID = "tenant-b", "uid-b"
	must(t, s.ArchiveSettlement(ctx, otherNS))
	amount := at("amount", noon, noon)
	amount.Spec.Usage = nil
	amount.Spec.Amount = &hooksv1alpha1.Amount{Minor: 100, Currency: "USD"}
	must(t, s.ArchiveSettlement(ctx, amount))
	must(t, s.ArchiveSettlement(ctx, at("reversed", noon, noon)))
	void := at("void-of-reversed", noon.Add(time.Minute), noon.Add(time.Minute))
	void.Spec.Type, void.Spec.Reverses = hooksv1alpha1.SettlementVoid, "reversed"
	must(t, s.ArchiveSettlement(ctx, void))
	// A refund of an amount is a credit of its own: the usage stays.
	must(t, s.ArchiveSettlement(ctx, at("credited", noon, noon)))
	credit := at("credit-of-credited", noon.Add(time.Minute), noon.Add(time.Minute))
	credit.Spec.Type, credit.Spec.Reverses, credit.Spec.Usage = hooksv1alpha1.SettlementRefund, "credited", nil
	credit.Spec.Amount = &hooksv1alpha1.Amount{Minor: 100, Currency: "USD"}
	must(t, s.ArchiveSettlement(ctx, credit))

	var got []string
	must(t, s.SettledUsage(ctx, "tenant-a", "billing", noon.Add(-time.Hour), noon.Add(time.Hour), func(u archive.UsageRow) error {
		got = append(got, fmt.Sprintf("%s %s %s %s %s %s-%s %v %s", u.Name, u.UID, u.Customer, u.Meter, u.Quantity,
			u.FirstSubmittedAt.UTC().Format("15:04:05"), u.SettledAt.UTC().Format("15:04:05"), u.Reversed, u.SentTo.BillingProviderUID))
		return nil
	}))
	want := "[credited uid-credited cus_1 tokens 1523 12:00:00-12:00:00 false bp-1 dated-earlier uid-dated-earlier cus_1 tokens 1523 11:30:00-14:00:00 false bp-1 in uid-in cus_1 tokens 12.50 12:00:00-12:00:01 false bp-1 " +
		"reversed uid-reversed cus_1 tokens 1523 12:00:00-12:00:00 true bp-1 straddles-start uid-straddles-start cus_1 tokens 1523 11:58:00-12:01:00 false bp-1]"
	if fmt.Sprint(got) != want {
		t.Fatalf("got  %v\nwant %s", got, want)
	}
	cancelled, err := s.CancelledAmong(ctx, "tenant-a", []string{"reversed", "credited", "in", "live-only"})
	must(t, err)
	if fmt.Sprint(cancelled) != "map[reversed:true]" {
		t.Fatalf("cancelled among: %v (a credit is not a cancellation)", cancelled)
	}
	stop := errors.New("stop")
	if err := s.SettledUsage(ctx, "tenant-a", "billing", noon.Add(-time.Hour), noon.Add(time.Hour), func(archive.UsageRow) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("an error from fn: %v", err)
	}
}
