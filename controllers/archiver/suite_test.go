package archiver

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The archiver's tests run against a real API server (envtest) and a real PostgreSQL
// (pgtest), shared by the tests of the package; each test has namespaces and a
// database of its own. The kill -9 test runs this test binary again as the archiving
// process (childEnv).

var (
	env *envtest.Environment
	cfg *rest.Config
	k8s client.Client
	pg  *pgtest.Server
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zapLevel()))
	code, err := func() (int, error) {
		var err error
		if env, err = testenv.New(); err != nil {
			return 1, err
		}
		if cfg, err = env.Start(); err != nil {
			return 1, err
		}
		defer func() { _ = env.Stop() }()
		if k8s, err = client.New(cfg, client.Options{Scheme: testenv.Scheme()}); err != nil {
			return 1, err
		}
		if pg, err = pgtest.Start(); err != nil {
			return 1, err
		}
		defer pg.Close()
		return m.Run(), nil
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// zapLevel keeps the controllers' logs quiet unless ARCHIVER_TEST_VERBOSE is set.
func zapLevel() zap.Opts {
	return func(o *zap.Options) {
		o.Development = true
		if os.Getenv("ARCHIVER_TEST_VERBOSE") == "" {
			o.DestWriter = bytes.NewBuffer(nil)
		}
	}
}

var counter atomic.Int32

// newNamespace creates a namespace of the test's own.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d", prefix, counter.Add(1))
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	return name
}

// newDatabase creates a migrated archive database whose every statement PostgreSQL
// logs, and returns its URL, a store on it and a function counting the INSERTs (by
// table) and SELECTs executed there since the previous call: one statement is one
// round trip (the store sends no pipelines).
func newDatabase(t *testing.T) (string, *archive.Store, func() map[string]int) {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("archive%d", counter.Add(1))
	if err := pg.CreateDatabase(name); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER DATABASE `+name+` SET log_statement = 'all'`); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	store, err := archive.Open(archive.Config{URL: pg.URL(name), MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	seen := len(pg.Log())
	stmt := regexp.MustCompile(`(?m)LOG:  (?:execute [^:]*|statement): (INSERT INTO \w+|SELECT)`)
	return pg.URL(name), store, func() map[string]int {
		log := pg.Log()
		out := map[string]int{}
		for _, m := range stmt.FindAllStringSubmatch(log[seen:], -1) {
			out[m[1]]++
		}
		seen = len(log)
		return out
	}
}

// finishedRecords creates n records of each archived kind in ns, each finished as the
// pipeline leaves it (an event Complete, a job's version applied, a charge settled and
// confirmed by a reconciliation pass, carrying its protection finalizer), and returns
// them as the API server holds them.
func finishedRecords(t *testing.T, ns string, n int) ([]*hooksv1alpha1.WebhookEvent, []*hooksv1alpha1.JobCompletion, []*hooksv1alpha1.BillingSettlement) {
	t.Helper()
	ctx := context.Background()
	const provider, bp = "inference", "billing"
	past := metav1.NewTime(time.Now().Add(-time.Hour).UTC().Truncate(time.Second))
	cond := func(typ, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: past, Reason: reason, Message: "done"}
	}
	var evs []*hooksv1alpha1.WebhookEvent
	var jcs []*hooksv1alpha1.JobCompletion
	var bss []*hooksv1alpha1.BillingSettlement
	for i := range n {
		msgID, jobID := fmt.Sprintf("msg-%04d", i), fmt.Sprintf("job-%04d", i)
		usage := &hooksv1alpha1.Usage{Meter: "tokens", Quantity: strconv.Itoa(1000 + i), Unit: "token"}
		version := int64(1)
		ev := &hooksv1alpha1.WebhookEvent{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.EventName(ns, provider, msgID)},
			Spec: hooksv1alpha1.WebhookEventSpec{Provider: provider, EventID: msgID, EventType: "job.completed",
				PayloadHash: "sha256:" + identity.Hash32(msgID) + identity.Hash32("p", msgID), ReceivedAt: past}}
		jc := &hooksv1alpha1.JobCompletion{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.JobCompletionName(provider, jobID)},
			Spec: hooksv1alpha1.JobCompletionSpec{Provider: provider, JobID: jobID,
				Completion: hooksv1alpha1.Completion{Version: version, State: hooksv1alpha1.JobSucceeded, CompletedAt: &past,
					Usage: usage.DeepCopy(), SourceEvent: ev.Name}}}
		// A charge of its own (keyed by fields): no job waits for it, nor it for a job.
		skey := identity.FieldsSettlementKey(ns, provider, fmt.Sprintf("inv-%04d", i))
		ref := "ch_" + identity.Hash32("ref", skey)[:24]
		bs := &hooksv1alpha1.BillingSettlement{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.SettlementNameFor(provider, skey),
				Finalizers: []string{hooksv1alpha1.FinalizerSettlementProtection}},
			Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: bp, SettlementKey: skey,
				IdempotencyKey: identity.NamespacedIdempotencyKey(ns, skey), Type: hooksv1alpha1.SettlementCharge,
				Customer: "cus_1", Usage: usage.DeepCopy(), WebhookProvider: provider, SourceEvent: ev.Name}}
		for _, o := range []client.Object{ev, jc, bs} {
			if err := k8s.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		ev.Status = hooksv1alpha1.WebhookEventStatus{ObservedGeneration: ev.Generation, Phase: hooksv1alpha1.EventComplete,
			Operations: []hooksv1alpha1.OperationStatus{{Type: hooksv1alpha1.OperationJobCompletion, Key: jobID, Child: jc.Name,
				Outcome: hooksv1alpha1.OutcomeCreated, State: "Applied"}},
			Conditions: []metav1.Condition{cond(hooksv1alpha1.ConditionReady, hooksv1alpha1.ReasonAllOperationsDone)}}
		jc.Status = hooksv1alpha1.JobCompletionStatus{ObservedGeneration: jc.Generation, State: hooksv1alpha1.JobCompletionApplied,
			AppliedVersion: &version, AppliedAt: &past, SourceEvents: []string{ev.Name},
			Conditions: []metav1.Condition{cond(hooksv1alpha1.ConditionReady, hooksv1alpha1.ReasonVersionApplied)}}
		bs.Status = hooksv1alpha1.BillingSettlementStatus{ObservedGeneration: bs.Generation, State: hooksv1alpha1.SettlementSettled,
			Attempts: 1, ProviderRef: ref, ProviderStatus: "settled", FirstSubmittedAt: &past, Exposure: hooksv1alpha1.ExposureConfirmed,
			LastSubmission: hooksv1alpha1.SubmissionAccepted, LastAttemptAt: &past, Charge: "1000 tokens",
			SentTo:        &hooksv1alpha1.ProviderTarget{Endpoint: "https://billing.example.com/v1", BillingProviderUID: "bp-uid", CredentialsSecret: "billing-token"},
			ChargedAmount: &hooksv1alpha1.Amount{Minor: int64(1000 + i), Currency: "USD"}, SettledAt: &past, LastReconciledAt: &past,
			Conditions: []metav1.Condition{cond(hooksv1alpha1.ConditionSettled, hooksv1alpha1.ReasonProviderSettled),
				cond(hooksv1alpha1.ConditionReady, hooksv1alpha1.ReasonProviderSettled),
				cond(hooksv1alpha1.ConditionReconciled, hooksv1alpha1.ReasonConfirmedByProvider)}}
		for _, o := range []client.Object{ev, jc, bs} {
			if err := k8s.Status().Update(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		if done, _ := finished(ev); !done {
			t.Fatalf("fixture: event %s is not finished", ev.Name)
		}
		if done, _ := finished(jc); !done {
			t.Fatalf("fixture: job %s is not finished", jc.Name)
		}
		if done, _ := finished(bs); !done {
			t.Fatalf("fixture: settlement %s is not finished", bs.Name)
		}
		evs, jcs, bss = append(evs, ev), append(jcs, jc), append(bss, bs)
	}
	return evs, jcs, bss
}

// writeVerbs are the verbs of apiserver_request_total that write when they succeed.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true, "DELETE": true, "DELETECOLLECTION": true}

// apiWrites reads the API server's own count of write requests, by
// "resource[/subresource] VERB" (" refused" appended for a non-2xx answer).
func apiWrites(t *testing.T) map[string]float64 {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(strings.TrimSuffix(cfg.Host, "/") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	label := regexp.MustCompile(`(\w+)="([^"]*)"`)
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndex(line, "}")
		labels := map[string]string{}
		for _, m := range label.FindAllStringSubmatch(line[:end], -1) {
			labels[m[1]] = m[2]
		}
		if !writeVerbs[labels["verb"]] {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			t.Fatal(err)
		}
		key := labels["resource"]
		if labels["subresource"] != "" {
			key += "/" + labels["subresource"]
		}
		key += " " + labels["verb"]
		if !strings.HasPrefix(labels["code"], "2") {
			key += " refused"
		}
		out[key] += v
	}
	return out
}

// since is after minus before, without the zeros.
func since(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last error: %v)", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
