package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/printers"
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
	stopCluster()
	s.Close()
	os.Exit(code)
}

var dbs atomic.Int32

// password is in every test URL: it must never show in any output. pgtest trusts
// every connection, so any password is accepted.
const password = "pw-Sup3rSecret-Zq"

// withPassword is server.URL(db) with a password.
func withPassword(db string) string {
	return strings.Replace(server.URL(db), "postgres@", "postgres:"+password+"@", 1)
}

var nov = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// archived creates a database, archives the fixture through archive.Store (as the
// operator would), and returns the database's URL (with a password).
//
//	tenant-a: stl-a  Charge cus_1 usage 1523 token, job 42, Settled, created Nov 2
//	          stl-r  Refund of stl-a, cus_1, 500 USD, Settled, created Nov 3
//	          stl-f  Charge cus_2, 900 EUR, Failed, created Oct 31
//	          jobs acme/42 v1 and v2 (acme-job-42); event acme-e1 (evt_1)
//	tenant-b: stl-a  Charge cus_1, 100 USD, Settled, created Nov 5
func archived(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("c%d", dbs.Add(1))
	if err := server.CreateDatabase(name); err != nil {
		t.Fatal(err)
	}
	s, err := archive.Open(archive.Config{URL: server.URL(name)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, bs := range fixtureSettlements() {
		if err := s.ArchiveSettlement(ctx, bs); err != nil {
			t.Fatal(err)
		}
	}
	for v := int64(1); v <= 2; v++ {
		applied := v
		jc := &hooksv1alpha1.JobCompletion{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "acme-job-42", UID: types.UID(fmt.Sprint("jc-", v)), CreationTimestamp: metav1.NewTime(nov)},
			Spec: hooksv1alpha1.JobCompletionSpec{Provider: "acme", JobID: "42",
				Completion: hooksv1alpha1.Completion{Version: v, State: hooksv1alpha1.JobSucceeded, SourceEvent: "acme-e1"}},
			Status: hooksv1alpha1.JobCompletionStatus{State: hooksv1alpha1.JobCompletionApplied, AppliedVersion: &applied},
		}
		if err := s.ArchiveJobCompletion(ctx, jc); err != nil {
			t.Fatal(err)
		}
	}
	ev := &hooksv1alpha1.WebhookEvent{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "acme-e1", UID: "ev-1", CreationTimestamp: metav1.NewTime(nov)},
		Spec: hooksv1alpha1.WebhookEventSpec{Provider: "acme", EventID: "evt_1", EventType: "job.completed",
			PayloadHash: "sha256:00", ReceivedAt: metav1.NewTime(nov)},
		Status: hooksv1alpha1.WebhookEventStatus{Phase: hooksv1alpha1.EventComplete},
	}
	if err := s.ArchiveEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	return withPassword(name)
}

func fixtureSettlements() []*hooksv1alpha1.BillingSettlement {
	mk := func(ns, name, customer string, created time.Time, state hooksv1alpha1.SettlementState) *hooksv1alpha1.BillingSettlement {
		c := metav1.NewTime(created)
		settledAt := metav1.NewTime(created.Add(time.Minute))
		bs := &hooksv1alpha1.BillingSettlement{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name), CreationTimestamp: c},
			Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: `["settlement","` + ns + `","` + name + `"]`,
				IdempotencyKey: "stl_" + ns + "_" + name, Type: hooksv1alpha1.SettlementCharge, Customer: customer, WebhookProvider: "acme"},
			Status: hooksv1alpha1.BillingSettlementStatus{State: state, Attempts: 1, Exposure: hooksv1alpha1.ExposureConfirmed,
				SentTo: &hooksv1alpha1.ProviderTarget{Endpoint: "https://billing.example", BillingProviderUID: "bp-1", CredentialsSecret: "token"}, FirstSubmittedAt: &c},
		}
		if state == hooksv1alpha1.SettlementSettled {
			bs.Status.SettledAt, bs.Status.ProviderRef = &settledAt, "ch_"+ns+"_"+name
		}
		return bs
	}
	a := mk("tenant-a", "stl-a", "cus_1", nov.Add(24*time.Hour), hooksv1alpha1.SettlementSettled)
	a.Spec.SettlementKey = `["job","tenant-a","acme","42"]`
	a.Spec.JobID = "42"
	a.Spec.Usage = &hooksv1alpha1.Usage{Meter: "tokens", Quantity: "1523", Unit: "token"}
	a.Status.ChargedAmount = &hooksv1alpha1.Amount{Minor: 1523, Currency: "USD"}
	r := mk("tenant-a", "stl-r", "cus_1", nov.Add(48*time.Hour), hooksv1alpha1.SettlementSettled)
	r.Spec.Type, r.Spec.Reverses = hooksv1alpha1.SettlementRefund, "stl-a"
	r.Spec.Amount = &hooksv1alpha1.Amount{Minor: 500, Currency: "USD"}
	f := mk("tenant-a", "stl-f", "cus_2", nov.Add(-24*time.Hour), hooksv1alpha1.SettlementFailed)
	f.Spec.Amount = &hooksv1alpha1.Amount{Minor: 900, Currency: "EUR"}
	b := mk("tenant-b", "stl-a", "cus_1", nov.Add(96*time.Hour), hooksv1alpha1.SettlementSettled)
	b.Spec.Amount = &hooksv1alpha1.Amount{Minor: 100, Currency: "USD"}
	return []*hooksv1alpha1.BillingSettlement{a, r, f, b}
}

type result struct {
	code           int
	stdout, stderr string
}

// cli runs the command with only the given environment (no HOME, so no kubeconfig
// unless the test gives one) and checks that neither the password nor a URL ever
// shows in its output.
func cli(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut, func(k string) string { return env[k] })
	r := result{code: code, stdout: out.String(), stderr: errOut.String()}
	for _, s := range []string{r.stdout, r.stderr} {
		if strings.Contains(s, password) || strings.Contains(s, "postgres://") {
			t.Fatalf("%v printed the archive URL or its password:\n%s", args, s)
		}
	}
	return r
}

func dbEnv(url string) map[string]string { return map[string]string{archivedb.EnvArchiveURL: url} }

func lines(s string) []string { return strings.Split(strings.TrimRight(s, "\n"), "\n") }

func fields(line string) []string { return strings.Fields(line) }

func TestGetByEveryKindOfReference(t *testing.T) {
	env := dbEnv(archived(t))
	for _, tc := range []struct {
		ref  string
		want []string // the first field of each output line, headers included; "" a blank line
	}{
		{`["job","tenant-a","acme","42"]`, []string{"NAME", "stl-a"}},
		{"stl_tenant-a_stl-r", []string{"NAME", "stl-r"}},
		{"stl-f", []string{"NAME", "stl-f"}},
		// A job ID: the settlement of the job, and every archived version.
		{"42", []string{"NAME", "stl-a", "", "NAME", "acme-job-42", "acme-job-42"}},
		{"acme-job-42", []string{"NAME", "acme-job-42", "acme-job-42"}},
		{"evt_1", []string{"NAME", "acme-e1"}},
		{"acme-e1", []string{"NAME", "acme-e1"}},
	} {
		r := cli(t, env, "archive", "get", tc.ref, "-n", "tenant-a")
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("get %s: %d %s", tc.ref, r.code, r.stderr)
		}
		var first []string
		for _, l := range lines(r.stdout) {
			f := fields(l)
			if len(f) == 0 {
				first = append(first, "")
			} else {
				first = append(first, f[0])
			}
		}
		if fmt.Sprint(first) != fmt.Sprint(tc.want) {
			t.Errorf("get %s:\n%s", tc.ref, r.stdout)
		}
	}

	// The tables' columns.
	r := cli(t, env, "archive", "get", "42", "-n", "tenant-a")
	l := lines(r.stdout)
	if got := fmt.Sprint(fields(l[0])); got != "[NAME CUSTOMER TYPE AMOUNT/USAGE STATE ATTEMPTS PROVIDER-REF ARCHIVED]" {
		t.Fatalf("settlement header %s", got)
	}
	if f := fields(l[1]); len(f) != 9 || f[1] != "cus_1" || f[2] != "Charge" || f[3] != "1523" || f[4] != "token" || f[5] != "Settled" ||
		f[6] != "1" || f[7] != "ch_tenant-a_stl-a" {
		t.Fatalf("settlement row %q", l[1])
	} else if _, err := time.Parse(time.RFC3339, f[8]); err != nil {
		t.Fatalf("ARCHIVED %q: %v", f[8], err)
	}
	if got := fmt.Sprint(fields(l[3])); got != "[NAME JOB VERSION RESULT STATE ARCHIVED]" {
		t.Fatalf("job header %s", got)
	}
	if f := fields(l[5]); f[1] != "42" || f[2] != "2" || f[3] != "Succeeded" || f[4] != "Applied" {
		t.Fatalf("job row %q", l[5])
	}
	r = cli(t, env, "archive", "get", "evt_1", "-n", "tenant-a")
	if l := lines(r.stdout); fmt.Sprint(fields(l[0])) != "[NAME EVENT-ID TYPE PHASE ARCHIVED]" || fmt.Sprint(fields(l[1])[:4]) != "[acme-e1 evt_1 job.completed Complete]" {
		t.Fatalf("event table:\n%s", r.stdout)
	}
	r = cli(t, env, "archive", "get", "stl-r", "-n", "tenant-a")
	if f := fields(lines(r.stdout)[1]); f[2] != "Refund" || f[3] != "500" || f[4] != "USD" {
		t.Fatalf("refund row %v", f)
	}
	r = cli(t, env, "archive", "get", "stl-f", "-n", "tenant-a")
	if f := fields(lines(r.stdout)[1]); f[5] != "Failed" || f[7] != printers.None {
		t.Fatalf("an empty PROVIDER-REF is <none>: %v", f)
	}

	// Flags may come before the reference too; another namespace does not answer.
	if r := cli(t, env, "archive", "get", "-n", "tenant-b", "stl_tenant-a_stl-a"); r.code != 1 {
		t.Fatalf("another namespace's key: %d %s", r.code, r.stdout)
	}
	// -A: every namespace, with a NAMESPACE column.
	r = cli(t, env, "archive", "get", "stl-a", "-A")
	if l := lines(r.stdout); r.code != 0 || len(l) != 3 || fields(l[0])[0] != "NAMESPACE" || fields(l[1])[0] != "tenant-a" || fields(l[2])[0] != "tenant-b" {
		t.Fatalf("get -A:\n%s%s", r.stdout, r.stderr)
	}
	// "--" ends the flags.
	if r := cli(t, env, "archive", "get", "-n", "tenant-a", "--", "-x"); r.code != 1 || !strings.Contains(r.stderr, `"-x"`) {
		t.Fatalf("a reference after --: %d %s", r.code, r.stderr)
	}
}

func TestGetOutputFormats(t *testing.T) {
	env := dbEnv(archived(t))
	// One match: the object itself.
	r := cli(t, env, "archive", "get", "stl_tenant-a_stl-a", "-n", "tenant-a", "-o", "json")
	var bs hooksv1alpha1.BillingSettlement
	if err := json.Unmarshal([]byte(r.stdout), &bs); err != nil || r.code != 0 {
		t.Fatalf("-o json: %v %d\n%s", err, r.code, r.stdout)
	}
	if bs.Kind != "BillingSettlement" || bs.APIVersion != "hooks.settlement.dev/v1alpha1" || bs.Name != "stl-a" || bs.Status.ChargedAmount.Minor != 1523 {
		t.Fatalf("-o json object: %+v", bs)
	}
	if !strings.HasPrefix(r.stdout, "{\n    \"apiVersion\"") {
		t.Fatalf("kubectl's layout (sorted keys, 4-space indent):\n%s", r.stdout)
	}
	// Several: a v1 List, settlements first.
	r = cli(t, env, "archive", "get", "42", "-n", "tenant-a", "--output=yaml")
	var list struct {
		APIVersion, Kind string
		Items            []map[string]any
	}
	if err := yaml.Unmarshal([]byte(r.stdout), &list); err != nil || r.code != 0 {
		t.Fatalf("-o yaml: %v\n%s", err, r.stdout)
	}
	var kinds []string
	for _, it := range list.Items {
		kinds = append(kinds, it["kind"].(string))
	}
	if list.Kind != "List" || list.APIVersion != "v1" || fmt.Sprint(kinds) != "[BillingSettlement JobCompletion JobCompletion]" {
		t.Fatalf("-o yaml list: %s %s %v", list.APIVersion, list.Kind, kinds)
	}
}

func TestGetNothingFound(t *testing.T) {
	env := dbEnv(archived(t))
	r := cli(t, env, "archive", "get", "stl_nope", "-n", "tenant-a")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, `matches "stl_nope" in namespace "tenant-a"`) {
		t.Fatalf("not found: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = cli(t, env, "archive", "get", "stl_nope", "-A", "-o", "json")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "in any namespace") {
		t.Fatalf("not found -A: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestList(t *testing.T) {
	env := dbEnv(archived(t))
	names := func(r result) string {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("list: %d %s", r.code, r.stderr)
		}
		var out []string
		for i, l := range lines(r.stdout) {
			if i > 0 && l != "" {
				f := fields(l)
				if f[0] == "tenant-a" || f[0] == "tenant-b" {
					out = append(out, f[0]+"/"+f[1])
				} else {
					out = append(out, f[0])
				}
			}
		}
		return fmt.Sprint(out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "tenant-a"}, "[stl-f stl-a stl-r]"},
		{[]string{"-A"}, "[tenant-a/stl-f tenant-a/stl-a tenant-a/stl-r tenant-b/stl-a]"},
		{[]string{"-n", "tenant-a", "--customer", "cus_1"}, "[stl-a stl-r]"},
		{[]string{"-n", "tenant-a", "--state", "failed"}, "[stl-f]"},
		{[]string{"-A", "--since", "2026-11-01", "--until", "2026-11-03"}, "[tenant-a/stl-a]"},
		{[]string{"-A", "--since", "2026-11-03T00:00:00Z"}, "[tenant-a/stl-r tenant-b/stl-a]"},
		{[]string{"-A", "--by", "settled", "--since", "2026-10-01"}, "[tenant-a/stl-a tenant-a/stl-r tenant-b/stl-a]"},
		{[]string{"-A", "--by", "archived", "--since", "1h"}, "[tenant-a/stl-a tenant-a/stl-r tenant-a/stl-f tenant-b/stl-a]"}, // as archived
		{[]string{"-A", "--by", "archived", "--until", "1d"}, "[]"},
	} {
		if got := names(cli(t, env, append([]string{"archive", "list"}, tc.args...)...)); got != tc.want {
			t.Errorf("list %v: %s, want %s", tc.args, got, tc.want)
		}
	}
	// A limit says when there are more.
	r := cli(t, env, "archive", "list", "-A", "--limit", "2")
	if names(r) != "[tenant-a/stl-f tenant-a/stl-a]" || !strings.Contains(r.stderr, "showing the first 2") {
		t.Fatalf("limit: %s %s", r.stdout, r.stderr)
	}
	if r := cli(t, env, "archive", "list", "-A", "--limit", "4"); r.stderr != "" {
		t.Fatalf("exactly the limit is not more: %s", r.stderr)
	}
	// Nothing: a note, exit 0, as kubectl get.
	r = cli(t, env, "archive", "list", "-n", "tenant-c")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "No archived settlements found in tenant-c namespace.") {
		t.Fatalf("empty list: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// -o json is always a List.
	r = cli(t, env, "archive", "list", "-n", "tenant-b", "-o", "json")
	var list struct {
		Kind  string
		Items []hooksv1alpha1.BillingSettlement
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || list.Kind != "List" || len(list.Items) != 1 || list.Items[0].Spec.Amount.Minor != 100 {
		t.Fatalf("list -o json: %v %s", err, r.stdout)
	}
}

func TestExport(t *testing.T) {
	env := dbEnv(archived(t))
	r := cli(t, env, "archive", "export", "-A", "--since", "2026-10-01", "--until", "2026-12-01", "--format", "csv")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("export csv: %d %s", r.code, r.stderr)
	}
	recs, err := csv.NewReader(strings.NewReader(r.stdout)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := "namespace name settlement_key idempotency_key type reverses customer job_id usage_meter usage_quantity usage_unit " +
		"amount_minor amount_currency charged_minor charged_currency state provider_ref billing_provider sent_to_endpoint " +
		"first_submitted_at settled_at archived_at created_at"
	if got := strings.Join(recs[0], " "); got != want {
		t.Fatalf("CSV header:\n got %s\nwant %s", got, want)
	}
	if len(recs) != 5 {
		t.Fatalf("CSV rows: %d\n%s", len(recs)-1, r.stdout)
	}
	col := map[string]int{}
	for i, c := range recs[0] {
		col[c] = i
	}
	get := func(row int, c string) string { return recs[row][col[c]] }
	// Rows by creation: stl-f (Oct 31), tenant-a/stl-a, stl-r, tenant-b/stl-a.
	if get(1, "name") != "stl-f" || get(2, "name") != "stl-a" || get(3, "name") != "stl-r" || get(4, "namespace") != "tenant-b" {
		t.Fatalf("CSV order:\n%s", r.stdout)
	}
	a := map[string]string{}
	for c := range col {
		a[c] = get(2, c)
	}
	for c, v := range map[string]string{"namespace": "tenant-a", "settlement_key": `["job","tenant-a","acme","42"]`, "idempotency_key": "stl_tenant-a_stl-a",
		"type": "Charge", "reverses": "", "customer": "cus_1", "job_id": "42", "usage_meter": "tokens", "usage_quantity": "1523", "usage_unit": "token",
		"amount_minor": "", "amount_currency": "", "charged_minor": "1523", "charged_currency": "USD", "state": "Settled",
		"provider_ref": "ch_tenant-a_stl-a", "billing_provider": "billing", "sent_to_endpoint": "https://billing.example",
		"first_submitted_at": "2026-11-02T00:00:00Z", "settled_at": "2026-11-02T00:01:00Z", "created_at": "2026-11-02T00:00:00Z"} {
		if a[c] != v {
			t.Errorf("CSV %s = %q, want %q", c, a[c], v)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, a["archived_at"]); err != nil {
		t.Errorf("archived_at %q: %v", a["archived_at"], err)
	}
	if get(3, "reverses") != "stl-a" || get(3, "amount_minor") != "500" || get(3, "type") != "Refund" || get(1, "settled_at") != "" {
		t.Errorf("refund and failed rows: %v %v", recs[3], recs[1])
	}

	// JSON Lines: one archived object per line, filters apply.
	r = cli(t, env, "archive", "export", "-n", "tenant-a", "--customer", "cus_1", "--since", "2026-11-01", "--format", "jsonl")
	if r.code != 0 {
		t.Fatalf("export jsonl: %d %s", r.code, r.stderr)
	}
	var got []string
	for _, l := range lines(r.stdout) {
		var bs hooksv1alpha1.BillingSettlement
		if err := json.Unmarshal([]byte(l), &bs); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		got = append(got, bs.Name+":"+string(bs.Spec.Type))
	}
	if fmt.Sprint(got) != "[stl-a:Charge stl-r:Refund]" {
		t.Fatalf("jsonl: %v", got)
	}
	// An empty window is a header only.
	r = cli(t, env, "archive", "export", "-A", "--since", "2030-01-01", "--format", "csv")
	if r.code != 0 || len(lines(r.stdout)) != 1 {
		t.Fatalf("empty export: %d %q", r.code, r.stdout)
	}
}

func TestBadCommandLines(t *testing.T) {
	env := dbEnv(withPassword("nowhere"))
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"archive"}, "no archive command"},
		{[]string{"archive", "delete"}, "unknown archive command"},
		{[]string{"archive", "get"}, "give the reference"},
		{[]string{"archive", "get", "a", "b"}, "give one reference"},
		{[]string{"archive", "get", "a", "--bogus"}, "unknown flag -bogus"},
		{[]string{"archive", "get", "a", "-o", "wide"}, `--output "wide"`},
		{[]string{"archive", "get", "a", "-n", "x", "-A"}, "not both"},
		{[]string{"archive", "get", "a", "-n"}, "flag needs an argument"},
		{[]string{"archive", "get", "a", "--database-url", "postgres://x", "--from-secret", "ns/s"}, "not both"},
		{[]string{"archive", "get", "a", "--from-secret", "just-a-name"}, "<namespace>/<name>"},
		{[]string{"archive", "get", "a", "--from-secret", "ns//key"}, "none of them empty"},
		{[]string{"archive", "get", "a", "--timeout", "0s"}, "--timeout"},
		{[]string{"archive", "list", "extra"}, "unexpected argument"},
		{[]string{"archive", "list", "--since", "yesterday"}, "want an RFC 3339 time"},
		{[]string{"archive", "list", "--since", "-5h"}, "must be positive"},
		{[]string{"archive", "list", "--since", "2026-11-02", "--until", "2026-11-01"}, "must be after"},
		{[]string{"archive", "list", "--state", "Done"}, `--state "Done"`},
		{[]string{"archive", "list", "--by", "updated"}, `--by "updated"`},
		{[]string{"archive", "list", "--limit", "-1"}, "--limit"},
		{[]string{"archive", "list", "--limit", "many"}, "invalid value"},
		{[]string{"archive", "list", "--customer="}, "--customer is empty"},
		{[]string{"archive", "export", "--format", "csv"}, "--since is required"},
		{[]string{"archive", "export", "--since", "24h"}, "--format is required"},
		{[]string{"archive", "export", "--since", "24h", "--format", "xlsx"}, `--format "xlsx"`},
	} {
		r := cli(t, env, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.msg) || !strings.Contains(r.stderr, "--help' for usage") || r.stdout != "" {
			t.Errorf("%v: exit %d, stderr %q (want 2 and %q)", tc.args, r.code, r.stderr, tc.msg)
		}
	}
	// No database configured at all.
	if r := cli(t, nil, "archive", "list", "-A"); r.code != 2 || !strings.Contains(r.stderr, archivedb.EnvArchiveURL) {
		t.Fatalf("no database: %d %s", r.code, r.stderr)
	}
	// Help is not an error.
	for _, args := range [][]string{{"-h"}, {"archive", "--help"}, {"archive", "get", "-h"}, {"archive", "list", "--help"}, {"archive", "export", "-h"}} {
		if r := cli(t, env, args...); r.code != 0 || !strings.Contains(r.stdout, "kubectl settlement") || r.stderr != "" {
			t.Errorf("%v: %d %q", args, r.code, r.stderr)
		}
	}
}

func TestTheURLIsNeverPrinted(t *testing.T) {
	// cli fails the test on any output holding the password or a postgres:// URL.
	closed := fmt.Sprintf("postgres://postgres:%s@127.0.0.1:1/x?sslmode=disable&connect_timeout=2", password)
	for _, tc := range []struct {
		name, url string
		code      int
	}{
		{"unreachable", closed, 1},
		{"no such database", withPassword("no_such_db"), 1},
		{"not migrated", withPassword("postgres"), 1},
		{"not a URL", "postgres://postgres:" + password + "@%zz", 2},
		{"a DSN", "host=127.0.0.1 port=1 user=postgres password=" + password + " connect_timeout=2", 1},
	} {
		for _, how := range []string{"env", "flag"} {
			env, args := dbEnv(tc.url), []string{"archive", "get", "x", "-A"}
			if how == "flag" {
				env, args = nil, append(args, "--database-url", tc.url)
			}
			r := cli(t, env, args...)
			if r.code != tc.code || r.stderr == "" {
				t.Errorf("%s (%s): exit %d, %q", tc.name, how, r.code, r.stderr)
			}
			if strings.Contains(r.stderr, "[REDACTED]") {
				t.Logf("%s (%s): redacted: %s", tc.name, how, r.stderr)
			}
		}
	}
	r := cli(t, dbEnv(withPassword("postgres")), "archive", "list", "-A")
	if !strings.Contains(r.stderr, "not migrated") {
		t.Fatalf("an unmigrated database says so: %s", r.stderr)
	}
	// The redactor itself, for a message that would carry them.
	red := &archivedb.Redactor{}
	red.Add(closed)
	if got := red.Clean("dial " + closed + " as postgres:" + password); strings.Contains(got, password) || strings.Contains(got, "127.0.0.1:1/x") {
		t.Fatalf("redactor: %s", got)
	}
}

// fakeAPI serves Secrets the way kube-apiserver does, enough for client-go (over TLS:
// client-go sends credentials only to an https server).
func fakeAPI(t *testing.T, secrets map[string]map[string][]byte) string {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var ns, name string
		if _, err := fmt.Sscanf(strings.ReplaceAll(r.URL.Path, "/", " "), " api v1 namespaces %s secrets %s", &ns, &name); err != nil || r.Method != http.MethodGet {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if r.Header.Get("Authorization") != "Bearer test-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if ns == "forbidden" {
			w.WriteHeader(http.StatusForbidden)
			_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"secrets %q is forbidden"}`, name)
			return
		}
		data, ok := secrets[ns+"/"+name]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"secrets %q not found","details":{"name":%q,"kind":"secrets"}}`, name, name)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"apiVersion": "v1", "kind": "Secret",
			"metadata": map[string]any{"namespace": ns, "name": name}, "data": data})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func kubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: test
  user: {token: test-token}
contexts:
- name: a
  context: {cluster: test, user: test, namespace: tenant-a}
- name: b
  context: {cluster: test, user: test, namespace: tenant-b}
- name: plain
  context: {cluster: test, user: test}
current-context: a
`, server)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFromSecret(t *testing.T) {
	url := archived(t)
	api := fakeAPI(t, map[string]map[string][]byte{
		"ops/archive-db":   {"url": []byte(url + "\n")},
		"ops/custom-key":   {"dsn": []byte(url)},
		"ops/empty":        {"url": []byte(" ")},
		"ops/wrong-key":    {"password": []byte(password), "host": []byte("db")},
		"ops/wrong-server": {"url": []byte(fmt.Sprintf("postgres://postgres:%s@127.0.0.1:1/x?sslmode=disable&connect_timeout=2", password))},
	})
	env := map[string]string{"KUBECONFIG": kubeconfig(t, api)}
	r := cli(t, env, "archive", "get", "stl-a", "--from-secret", "ops/archive-db")
	if r.code != 0 || fields(lines(r.stdout)[1])[0] != "stl-a" {
		t.Fatalf("--from-secret: %d %s %s", r.code, r.stdout, r.stderr)
	}
	// The key is chosen; --kubeconfig replaces $KUBECONFIG.
	r = cli(t, map[string]string{"KUBECONFIG": "/nonexistent"}, "archive", "get", "stl-a", "-n", "tenant-a",
		"--from-secret", "ops/custom-key/dsn", "--kubeconfig", env["KUBECONFIG"])
	if r.code != 0 {
		t.Fatalf("--from-secret with a key: %d %s", r.code, r.stderr)
	}
	for _, tc := range []struct{ ref, msg string }{
		{"ops/missing", `secret "missing" not found in namespace "ops"`},
		{"forbidden/archive-db", "not allowed to read secret forbidden/archive-db"},
		{"ops/wrong-key", `has no key "url" (its keys: host, password)`},
		{"ops/empty", "is empty"},
		{"ops/wrong-server", "cannot read the archive"},
	} {
		r := cli(t, env, "archive", "get", "stl-a", "-A", "--from-secret", tc.ref)
		if r.code != 1 || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("--from-secret %s: %d %q, want %q", tc.ref, r.code, r.stderr, tc.msg)
		}
	}
	// --from-secret wins over the environment variable.
	env[archivedb.EnvArchiveURL] = "postgres://postgres:" + password + "@127.0.0.1:1/x"
	if r := cli(t, env, "archive", "get", "stl-a", "--from-secret", "ops/archive-db"); r.code != 0 {
		t.Fatalf("--from-secret over %s: %d %s", archivedb.EnvArchiveURL, r.code, r.stderr)
	}
}

func TestDefaultNamespace(t *testing.T) {
	url := archived(t)
	cfg := kubeconfig(t, "http://127.0.0.1:1") // the namespace needs no API server
	first := func(r result) string {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("%d %s", r.code, r.stderr)
		}
		return fields(lines(r.stdout)[1])[0] + " " + fields(lines(r.stdout)[1])[3]
	}
	env := map[string]string{archivedb.EnvArchiveURL: url, "KUBECONFIG": cfg}
	// The context's namespace (tenant-a's stl-a is usage-priced, tenant-b's 100 USD).
	if got := first(cli(t, env, "archive", "get", "stl-a")); got != "stl-a 1523" {
		t.Fatalf("current context: %s", got)
	}
	if got := first(cli(t, env, "archive", "get", "stl-a", "--context", "b")); got != "stl-a 100" {
		t.Fatalf("--context b: %s", got)
	}
	// A context without a namespace, and no kubeconfig at all, mean "default".
	if r := cli(t, env, "archive", "list", "--context", "plain"); !strings.Contains(r.stderr, "in default namespace") {
		t.Fatalf("a context without a namespace: %d %s", r.code, r.stderr)
	}
	if r := cli(t, map[string]string{archivedb.EnvArchiveURL: url, "HOME": t.TempDir()}, "archive", "list"); !strings.Contains(r.stderr, "in default namespace") {
		t.Fatalf("no kubeconfig: %d %s", r.code, r.stderr)
	}
	// An explicit kubeconfig that does not exist is an error, not "default".
	if r := cli(t, dbEnv(url), "archive", "list", "--kubeconfig", "/nonexistent/config"); r.code != 1 || !strings.Contains(r.stderr, "kubeconfig") {
		t.Fatalf("a missing --kubeconfig: %d %s", r.code, r.stderr)
	}
}

// archive gap: the watermark checked against the archive, where the archive ends, and
// the provider's keys the archive does not hold.
func TestGap(t *testing.T) {
	env := dbEnv(archived(t))
	r := cli(t, env, "archive", "gap", "-n", "tenant-a", "--watermark", `{"seq":4,"table":"settlements","namespace":"tenant-b","name":"stl-a"}`)
	if r.code != 0 || !strings.Contains(r.stdout, "The archive holds it") || !strings.Contains(r.stdout, "Archive insert counter:  7") ||
		!strings.Contains(r.stdout, "seq 7 (event_receipts tenant-a/acme-e1), archived ") {
		t.Fatalf("gap, archive current: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = cli(t, env, "archive", "gap", "-n", "tenant-a", "--watermark", `{"seq":9,"table":"settlements","namespace":"tenant-a","name":"stl-lost"}`)
	if r.code != 0 || !strings.Contains(r.stdout, "BEHIND: the archive lacks row seq 9 (settlements tenant-a/stl-lost)") {
		t.Fatalf("gap, archive behind: %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	dir := t.TempDir()
	jsonl := dir + "/records.jsonl"
	if err := os.WriteFile(jsonl, []byte(`{"id":"ch_1","idempotency_key":"stl_tenant-a_stl-a","amount":1523}
{"id":"ch_2","idempotency_key":"stl_tenant-a_stl-lost","amount":700}
{"id":"ch_1","idempotency_key":"stl_tenant-a_stl-a","amount":1523}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	r = cli(t, env, "archive", "gap", "-n", "tenant-a", "--provider-records", jsonl)
	if r.code != 0 || !strings.Contains(r.stdout, "2 keys read, 1 in the archive (namespace tenant-a), 1 not:\n  stl_tenant-a_stl-lost\n") ||
		!strings.Contains(r.stdout, "whether the archive is behind is not checked") {
		t.Fatalf("gap --provider-records (JSON Lines): %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	csvFile := dir + "/records.csv"
	if err := os.WriteFile(csvFile, []byte("id,Idempotency Key,amount\nch_1,stl_tenant-b_stl-a,100\nch_3,stl_tenant-b_stl-x,5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = cli(t, env, "archive", "gap", "-A", "--provider-records", csvFile, "--key-field", "Idempotency Key")
	if r.code != 0 || !strings.Contains(r.stdout, "2 keys read, 1 in the archive (any namespace), 1 not:\n  stl_tenant-b_stl-x\n") {
		t.Fatalf("gap --provider-records (CSV): %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := cli(t, env, "archive", "gap", "--provider-records", csvFile); r.code != 2 || !strings.Contains(r.stderr, "none of the columns") {
		t.Fatalf("a CSV without a key column: %d %s", r.code, r.stderr)
	}
	if r := cli(t, env, "archive", "gap", "--watermark", "{", "--watermark-from", "a/b"); r.code != 2 {
		t.Fatalf("both watermark flags: %d %s", r.code, r.stderr)
	}
}
