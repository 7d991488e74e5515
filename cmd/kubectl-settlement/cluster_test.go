package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers/billingsettlement"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The cluster commands are tested against a real API server (envtest), started once
// for the tests that need it and stopped by TestMain.
var (
	clusterOnce sync.Once
	clusterEnv  *envtest.Environment
	clusterCfg  *rest.Config
	clusterErr  error
)

func stopCluster() {
	if clusterEnv != nil {
		_ = clusterEnv.Stop()
	}
}

// cluster starts the API server (once) and returns an admin client, a fresh namespace
// and the environment for cli with a kubeconfig acting as user (admin when "").
func cluster(t *testing.T) (client.Client, string, *rest.Config) {
	t.Helper()
	clusterOnce.Do(func() {
		env, err := testenv.New()
		if err != nil {
			clusterErr = err
			return
		}
		clusterEnv = env
		clusterCfg, clusterErr = env.Start()
	})
	if clusterErr != nil {
		t.Fatalf("start the API server: %v", clusterErr)
	}
	cl, err := client.New(clusterCfg, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "plugin-"}}
	if err := cl.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return cl, ns.Name, clusterCfg
}

// kubeEnv is a cli environment whose kubeconfig reaches the test API server as user
// (the admin when user is "").
func kubeEnv(t *testing.T, cfg *rest.Config, user string) map[string]string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testenv.WriteKubeconfig(path, cfg, "envtest", user); err != nil {
		t.Fatal(err)
	}
	return map[string]string{"KUBECONFIG": path}
}

// The formulas of docs/design.md §3, written out again here so that a change to
// internal/identity that breaks them fails this test.
func h(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(sum[:])[:32]
}

// jcsArray is the RFC 8785 form of an array of strings without characters JSON
// escapes differently (the test's values are plain ASCII).
func jcsArray(parts ...string) string {
	b, _ := json.Marshal(parts)
	return string(b)
}

func hJCS(parts ...string) string {
	sum := sha256.Sum256([]byte(jcsArray(parts...)))
	return hex.EncodeToString(sum[:])[:32]
}

func TestKeys(t *testing.T) {
	ns, wp, job := "tenant-a", "inference", "job-7781"
	r := cli(t, nil, "keys", job, "-n", ns, "--provider", wp, "-o", "json")
	if r.code != 0 {
		t.Fatalf("keys: %d %s", r.code, r.stderr)
	}
	var got []map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 {
		t.Fatalf("keys -o json: %v\n%s", err, r.stdout)
	}
	jobKey := `["job","tenant-a","inference","job-7781"]`
	want := map[string]string{
		"namespace": ns, "provider": wp, "reference": job,
		"eventName":               wp + "-" + h(ns+"/"+wp, job),
		"jobCompletionName":       wp + "-job-" + h(job),
		"jobSettlementKey":        jobKey,
		"jobSettlementName":       wp + "-stl-" + h(wp+"/"+job),
		"jobIdempotencyKey":       "stl_" + hJCS("settlement", ns, jobKey),
		"legacyJobSettlementKey":  wp + "/" + job,
		"legacyJobIdempotencyKey": "stl_" + h(wp+"/"+job),
		"settlementName":          wp + "-stl-" + h(job),
		"idempotencyKey":          "stl_" + hJCS("settlement", ns, job),
		"legacyIdempotencyKey":    "stl_" + h(job),
	}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("%s = %q, want %q", k, got[0][k], v)
		}
	}
	// The text output carries the same values under each reading.
	r = cli(t, nil, "keys", job, "-n", ns, "--provider", wp)
	for _, v := range []string{"As an event ID:", want["eventName"], "As a job ID:", want["jobCompletionName"], jobKey,
		want["jobSettlementName"], want["jobIdempotencyKey"], "As a settlement key:", want["settlementName"], want["idempotencyKey"]} {
		if !strings.Contains(r.stdout, v) {
			t.Errorf("keys text lacks %q:\n%s", v, r.stdout)
		}
	}
	// A structured key: the job's settlement name, whatever the provider flag says, and a note.
	r = cli(t, nil, "keys", jobKey, "-n", ns, "--provider", "other", "-o", "json")
	_ = json.Unmarshal([]byte(r.stdout), &got)
	if got[0]["settlementName"] != wp+"-stl-"+h(wp+"/"+job) || !strings.Contains(got[0]["note"], `webhook provider "inference"'s`) {
		t.Fatalf("structured key: %v", got[0])
	}
	r = cli(t, nil, "keys", jobKey, "-n", "tenant-b", "--provider", wp)
	if !strings.Contains(r.stdout, `belongs to namespace "tenant-a"`) {
		t.Fatalf("another namespace's key: %s", r.stdout)
	}
	// Without --provider, the namespace's WebhookProviders (read from the cluster).
	cl, ns2, cfg := cluster(t)
	for _, name := range []string{"alpha", "beta"} {
		createProvider(t, cl, ns2, name)
	}
	r = cli(t, kubeEnv(t, cfg, ""), "keys", job, "-n", ns2, "-o", "json")
	got = nil
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 2 || got[0]["provider"] != "alpha" || got[1]["provider"] != "beta" ||
		got[1]["jobCompletionName"] != "beta-job-"+h(job) {
		t.Fatalf("keys without --provider: %v %s %s", err, r.stdout, r.stderr)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"keys"}, "give an event ID"},
		{[]string{"keys", "a", "b", "--provider", "p"}, "give one reference"},
		{[]string{"keys", "a", "--provider="}, "--provider needs"},
		{[]string{"keys", "a", "--provider", "p", "-o", "yaml"}, `--output "yaml"`},
	} {
		if r := cli(t, nil, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("%v: %d %q", tc.args, r.code, r.stderr)
		}
	}
}

func createProvider(t *testing.T, cl client.Client, ns, name string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_webhookprovider.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var wp hooksv1alpha1.WebhookProvider
	if err := yaml.Unmarshal(b, &wp); err != nil {
		t.Fatal(err)
	}
	wp.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: name}
	if err := cl.Create(context.Background(), &wp); err != nil {
		t.Fatal(err)
	}
}

// story creates, in ns, what the operator would have made for job "job-7781" of
// webhook provider "inference": the event, the job's completion, its charge (Settled)
// and a refund of it, with the names and keys of docs/design.md §3 written out.
type storyNames struct{ event, job, charge, chargeKey, chargeIdem, refund, refundKey string }

func story(t *testing.T, cl client.Client, ns string, withEvent bool) storyNames {
	t.Helper()
	ctx := context.Background()
	wp, jobID, eventID := "inference", "job-7781", "evt_1"
	n := storyNames{event: wp + "-" + h(ns+"/"+wp, eventID), job: wp + "-job-" + h(jobID),
		chargeKey: jcsArray("job", ns, wp, jobID), charge: wp + "-stl-" + h(wp+"/"+jobID),
		refundKey: "refund/inference/job-7781"}
	n.chargeIdem = "stl_" + hJCS("settlement", ns, n.chargeKey)
	n.refund = wp + "-stl-" + h(n.refundKey)
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cond := func(typ, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: now}
	}
	ev := &hooksv1alpha1.WebhookEvent{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n.event},
		Spec: hooksv1alpha1.WebhookEventSpec{Provider: wp, EventID: eventID, EventType: "job.completed",
			PayloadHash: "sha256:" + strings.Repeat("ab", 32), ReceivedAt: now},
	}
	if withEvent {
		if err := cl.Create(ctx, ev); err != nil {
			t.Fatal(err)
		}
		ev.Status = hooksv1alpha1.WebhookEventStatus{Phase: hooksv1alpha1.EventComplete, Operations: []hooksv1alpha1.OperationStatus{
			{Type: hooksv1alpha1.OperationJobCompletion, Key: jobID, Child: n.job, Outcome: hooksv1alpha1.OutcomeCreated, State: "Applied"},
			{Type: hooksv1alpha1.OperationBillingSettlement, Key: n.chargeKey, Child: n.charge, Outcome: hooksv1alpha1.OutcomeCreated, State: "Settled"}},
			Conditions: []metav1.Condition{cond("Dispatched", "AllOperationsDone", "every operation is done")}}
		if err := cl.Status().Update(ctx, ev); err != nil {
			t.Fatal(err)
		}
	} else {
		// Archived and gone from the cluster: the operations are in the archived copy.
		ev.Status.Phase = hooksv1alpha1.EventComplete
		ev.UID = "ev-uid"
		ev.CreationTimestamp = now
		ev.Status.Operations = []hooksv1alpha1.OperationStatus{
			{Type: hooksv1alpha1.OperationJobCompletion, Key: jobID, Child: n.job, Outcome: hooksv1alpha1.OutcomeCreated}}
		archiveEvent(t, ns, ev)
	}
	jc := &hooksv1alpha1.JobCompletion{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n.job},
		Spec: hooksv1alpha1.JobCompletionSpec{Provider: wp, JobID: jobID,
			Completion: hooksv1alpha1.Completion{Version: 1, State: hooksv1alpha1.JobSucceeded, SourceEvent: n.event}}}
	// No sink: applied by its creation, no status written (as the operator makes it).
	if err := cl.Create(ctx, jc); err != nil {
		t.Fatal(err)
	}
	charge := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n.charge},
		Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: n.chargeKey, IdempotencyKey: n.chargeIdem,
			Type: hooksv1alpha1.SettlementCharge, Customer: "cus_Q2x9", Amount: &hooksv1alpha1.Amount{Minor: 1250, Currency: "USD"},
			JobID: jobID, WebhookProvider: wp, SourceEvent: n.event}}
	refund := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n.refund},
		Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: n.refundKey,
			IdempotencyKey: "stl_" + hJCS("settlement", ns, n.refundKey), Type: hooksv1alpha1.SettlementRefund, Reverses: n.charge,
			Customer: "cus_Q2x9", Amount: &hooksv1alpha1.Amount{Minor: 500, Currency: "USD"}}}
	for _, bs := range []*hooksv1alpha1.BillingSettlement{charge, refund} {
		if err := cl.Create(ctx, bs); err != nil {
			t.Fatal(err)
		}
	}
	charge.Status = hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSettled, Exposure: hooksv1alpha1.ExposureConfirmed,
		Attempts: 1, ProviderRef: "ch_123", FirstSubmittedAt: &now, SettledAt: &now, ReversedBy: []string{n.refund},
		Conditions: []metav1.Condition{cond("Settled", "ProviderSettled", "the provider settled it as ch_123")}}
	refund.Status = hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementPending, Exposure: hooksv1alpha1.ExposurePossible,
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "CompensationNotAllowed",
			Message: "refunds would exceed the charge", LastTransitionTime: now}}}
	for _, bs := range []*hooksv1alpha1.BillingSettlement{charge, refund} {
		if err := cl.Status().Update(ctx, bs); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

var archiveURL string

func archiveEvent(t *testing.T, ns string, ev *hooksv1alpha1.WebhookEvent) {
	t.Helper()
	s, err := archive.Open(archive.Config{URL: strings.Replace(archiveURL, ":"+password, "", 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CheckSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.ArchiveEvent(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
}

func TestTrace(t *testing.T) {
	cl, ns, cfg := cluster(t)
	createProvider(t, cl, ns, "inference")
	n := story(t, cl, ns, true)
	env := kubeEnv(t, cfg, "")
	blocks := []string{"WebhookEvent " + n.event + " (from the cluster)", "JobCompletion " + n.job + " (from the cluster)",
		"BillingSettlement " + n.charge + ": Charge (from the cluster)", "BillingSettlement " + n.refund + ": Refund (from the cluster)",
		"provider ref: ch_123", "reversed by: " + n.refund, "reverses: " + n.charge, "event ID: evt_1",
		"condition  Settled=True  ProviderSettled  the provider settled it as ch_123  (since ",
		"condition  Ready=False  CompensationNotAllowed  refunds would exceed the charge",
		"condition  Dispatched=True  AllOperationsDone", "state: Applied", "applied: version 1 at ",
		"condition  Applied=True  VersionApplied  version 1 applied at creation: no sink", "state: Settled   exposure: Confirmed"}
	for ref, reading := range map[string]string{
		"job-7781":   "job ID of webhook provider inference → JobCompletion " + n.job,
		"evt_1":      "event ID of webhook provider inference → WebhookEvent " + n.event,
		n.chargeKey:  "settlement key → BillingSettlement " + n.charge,
		n.chargeIdem: "settlement or idempotency key → BillingSettlement " + n.charge,
		n.refund:     "object name → BillingSettlement " + n.refund,
		n.refundKey:  "settlement key, named for webhook provider inference → BillingSettlement " + n.refund,
		n.event:      "object name → WebhookEvent " + n.event,
	} {
		r := cli(t, env, "trace", ref, "-n", ns)
		if r.code != 0 {
			t.Fatalf("trace %s: %d %s", ref, r.code, r.stderr)
		}
		if !strings.Contains(lines(r.stdout)[0], reading) {
			t.Errorf("trace %s: first line %q lacks %q", ref, lines(r.stdout)[0], reading)
		}
		for _, b := range blocks {
			if !strings.Contains(r.stdout, b) {
				t.Errorf("trace %s lacks %q:\n%s", ref, b, r.stdout)
			}
		}
		// The charge comes before its refund.
		if strings.Index(r.stdout, ": Charge (") > strings.Index(r.stdout, ": Refund (") {
			t.Errorf("trace %s: the refund is printed before its charge", ref)
		}
	}
	// Nothing matches: exit 1, and the message lists what was tried.
	r := cli(t, env, "trace", "job-nope", "-n", ns)
	if r.code != 1 || r.stdout != "" {
		t.Fatalf("no match: %d %s", r.code, r.stdout)
	}
	for _, s := range []string{`nothing in namespace "` + ns + `" matches "job-nope"`, "no archive configured",
		"JobCompletion inference-job-" + h("job-nope") + " (job ID of webhook provider inference)",
		"WebhookEvent inference-" + h(ns+"/inference", "job-nope") + " (event ID of webhook provider inference)",
		"every BillingSettlement of the namespace"} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("no-match message lacks %q:\n%s", s, r.stderr)
		}
	}
	if r := cli(t, env, "trace", "job-7781", "-n", ns, "--provider", "other"); r.code != 1 || !strings.Contains(r.stderr, "webhook provider other") {
		t.Errorf("another provider derives other names: %d %s", r.code, r.stderr)
	}
}

func TestTraceWithArchive(t *testing.T) {
	archiveURL = archived(t)
	cl, ns, cfg := cluster(t)
	n := story(t, cl, ns, false) // the event is only in the archive
	env := kubeEnv(t, cfg, "")
	env[archivedb.EnvArchiveURL] = archiveURL
	for _, ref := range []string{"job-7781", "evt_1"} {
		r := cli(t, env, "trace", ref, "-n", ns, "--provider", "inference")
		if r.code != 0 {
			t.Fatalf("trace %s: %d %s", ref, r.code, r.stderr)
		}
		for _, b := range []string{"WebhookEvent " + n.event + " (from the archive, archived ", "JobCompletion " + n.job + " (from the cluster)",
			"BillingSettlement " + n.charge + ": Charge (from the cluster)"} {
			if !strings.Contains(r.stdout, b) {
				t.Errorf("trace %s lacks %q:\n%s", ref, b, r.stdout)
			}
		}
	}
	// Without the archive the event is named as linked but not found.
	delete(env, archivedb.EnvArchiveURL)
	r := cli(t, env, "trace", "job-7781", "-n", ns, "--provider", "inference")
	if r.code != 0 || !strings.Contains(r.stdout, "Linked but not found in the cluster (no archive configured):\n  WebhookEvent "+n.event) {
		t.Fatalf("without the archive: %d %s %s", r.code, r.stdout, r.stderr)
	}
}

// TestReplay runs the settlement controller against the API server and replays as a
// user who holds only the settlement-replayer ClusterRole.
func TestReplay(t *testing.T) {
	cl, ns, cfg := cluster(t)
	ctx := context.Background()
	n := story(t, cl, ns, true)
	// A dead-lettered charge of another job, derived as the operator derives it.
	wp, jobID := "inference", "job-42"
	key := jcsArray("job", ns, wp, jobID)
	failed := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: wp + "-stl-" + h(wp+"/"+jobID)},
		Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: key, IdempotencyKey: "stl_" + hJCS("settlement", ns, key),
			Type: hooksv1alpha1.SettlementCharge, Customer: "cus_1", Amount: &hooksv1alpha1.Amount{Minor: 100, Currency: "USD"}, JobID: jobID, WebhookProvider: wp}}
	if err := cl.Create(ctx, failed); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	failed.Status = hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementFailed, Exposure: hooksv1alpha1.ExposureNone, Attempts: 10,
		Conditions: []metav1.Condition{{Type: hooksv1alpha1.ConditionDeadLettered, Status: metav1.ConditionTrue, Reason: "RetriesExhausted",
			Message: "10 attempts", LastTransitionTime: now}}}
	if err := cl.Status().Update(ctx, failed); err != nil {
		t.Fatal(err)
	}

	// The replayer role as shipped, bound to a user.
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "settlement_replayer_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	role.Name = "settlement-replayer-" + ns
	if err := cl.Create(ctx, &role); err != nil {
		t.Fatal(err)
	}
	user := "oncall-" + ns
	if err := cl.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "oncall"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}); err != nil {
		t.Fatal(err)
	}
	env := kubeEnv(t, cfg, user)

	// The controller, as the manager runs it.
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: kube.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&billingsettlement.Reconciler{Client: m.GetClient(), APIReader: m.GetAPIReader(),
		Recorder: m.GetEventRecorder("billingsettlement")}).SetupWithManager(m); err != nil {
		t.Fatal(err)
	}
	go func() { _ = m.Start(mctx) }()

	// Settled: refused, nothing annotated.
	r := cli(t, env, "replay", n.charge, "-n", ns)
	if r.code != 1 || !strings.Contains(r.stderr, "it is Settled, not Failed or RequiresReconciliation") || !strings.Contains(r.stderr, "a correction is a Refund") {
		t.Fatalf("replay of a settled charge: %d %s", r.code, r.stderr)
	}
	var got hooksv1alpha1.BillingSettlement
	_ = cl.Get(ctx, client.ObjectKeyFromObject(failed), &got)
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: n.charge}, &got); err != nil || got.Annotations[hooksv1alpha1.AnnotationReplay] != "" {
		t.Fatalf("a refused replay annotated: %v %v", err, got.Annotations)
	}
	if r := cli(t, env, "replay", "nope", "-n", ns); r.code != 1 || !strings.Contains(r.stderr, `no BillingSettlement in namespace "`+ns+`" matches "nope"; tried: BillingSettlement nope (object name)`) {
		t.Fatalf("replay of nothing: %d %s", r.code, r.stderr)
	}

	// Dead-lettered, by its settlement key: annotated, and the controller resumes it.
	r = cli(t, env, "replay", key, "-n", ns)
	if r.code != 0 {
		t.Fatalf("replay: %d %s", r.code, r.stderr)
	}
	for _, s := range []string{"billingsettlement " + ns + "/" + failed.Name + " annotated " + hooksv1alpha1.AnnotationReplay + "=kubectl-settlement-",
		"resumes it from Failed with the same idempotency key " + failed.Spec.IdempotencyKey, "Exposure is None", "kubectl settlement trace " + failed.Name} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("replay output lacks %q:\n%s", s, r.stdout)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(failed), &got); err != nil {
			t.Fatal(err)
		}
		token := got.Annotations[hooksv1alpha1.AnnotationReplay]
		if got.Status.Replay != nil && got.Status.Replay.LastToken == token && token != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the controller did not take the replay: annotations %v, status %+v", got.Annotations, got.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got.Status.Replay.Count != 1 || got.Status.State == hooksv1alpha1.SettlementFailed ||
		!meta.IsStatusConditionFalse(got.Status.Conditions, hooksv1alpha1.ConditionDeadLettered) {
		t.Fatalf("after the replay: %+v", got.Status)
	}
	// Now Pending (waiting for its BillingProvider): a second replay is refused.
	if r := cli(t, env, "replay", failed.Name, "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "not Failed or RequiresReconciliation") {
		t.Fatalf("replay of a resumed settlement: %d %s", r.code, r.stderr)
	}
	// A user without the role is told which one is needed.
	outsider := kubeEnv(t, cfg, "nobody")
	if r := cli(t, outsider, "replay", failed.Name, "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "not allowed to read BillingSettlement") {
		t.Fatalf("replay without the role: %d %s", r.code, r.stderr)
	}
}

func TestRefund(t *testing.T) {
	cl, ns, cfg := cluster(t)
	ctx := context.Background()
	n := story(t, cl, ns, true) // a settled charge of 12.50 USD, and a refund of 5.00 USD made by hand
	env := kubeEnv(t, cfg, "")
	count := func() int {
		var l hooksv1alpha1.BillingSettlementList
		if err := cl.List(ctx, &l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	before := count()

	// Nothing is created for a refusal or a dry run.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{n.charge}, 2, "give --amount DECIMAL or --full"},
		{[]string{n.charge, "--amount", "1", "--full"}, 2, "not both"},
		{[]string{n.charge, "--amount", "12.345"}, 2, "USD has 2 decimals"},
		{[]string{n.charge, "--amount", "-1"}, 2, "not a plain decimal"},
		{[]string{n.charge, "--amount", "7.51"}, 1, "7.51 USD is more than is left to refund: it charged 12.50 USD, of which 5.00 USD is refunded already (" + n.refund + ")"},
		{[]string{n.charge, "--amount", "1", "--refund-id", "a/b"}, 2, "--refund-id"},
		{[]string{n.charge, "--amount", "1", "--refund-id", "A"}, 2, "lowercase"},
		{[]string{n.charge, "--amount", "1", "--refund-id", "01"}, 2, "without leading zeros"},
		{[]string{n.refund, "--amount", "1"}, 1, "it is a Refund, not a Charge"},
		{[]string{"nope", "--amount", "1"}, 1, `no BillingSettlement in namespace "` + ns + `" matches "nope"`},
		{[]string{n.charge, "--amount", "5", "--dry-run"}, 0, "would create refund " + ns + "/"},
	} {
		r := cli(t, env, append([]string{"refund", "-n", ns}, c.args...)...)
		out := r.stdout + r.stderr
		if r.code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("refund %v: %d %s; want %d and %q", c.args, r.code, out, c.code, c.want)
		}
	}
	if got := count(); got != before {
		t.Fatalf("refusals and a dry run created %d settlements", got-before)
	}

	// A partial refund, by the charge's settlement key: created with the names and keys
	// the operator derives (it would refuse any other), reversing the charge.
	r := cli(t, env, "refund", n.chargeKey, "--amount", "5", "-n", ns)
	if r.code != 0 || !strings.Contains(r.stdout, "created refund "+ns+"/") || !strings.Contains(r.stdout, "for 5.00 USD (customer cus_Q2x9") {
		t.Fatalf("refund: %d %s %s", r.code, r.stdout, r.stderr)
	}
	key := jcsArray("key", ns, "inference", "refund", n.charge, "1")
	var refund hooksv1alpha1.BillingSettlement
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference-stl-" + h(key)}, &refund); err != nil {
		t.Fatalf("the refund under its derived name: %v", err)
	}
	want := hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: key, IdempotencyKey: "stl_" + hJCS("settlement", ns, key),
		Type: hooksv1alpha1.SettlementRefund, Reverses: n.charge, Customer: "cus_Q2x9", JobID: "job-7781", WebhookProvider: "inference",
		Amount: &hooksv1alpha1.Amount{Minor: 500, Currency: "USD"}}
	if !equality.Semantic.DeepEqual(refund.Spec, want) {
		t.Fatalf("refund spec\n got %+v\nwant %+v", refund.Spec, want)
	}
	if err := settlement.ValidateIdentity(&refund); err != nil {
		t.Fatalf("the operator would refuse it: %v", err)
	}

	// The same command again (a retried script): nothing new, and it says so.
	r = cli(t, env, "refund", n.charge, "--amount", "5.00", "-n", ns)
	if r.code != 0 || !strings.Contains(r.stdout, "already exists") || !strings.Contains(r.stdout, "nothing was created") {
		t.Fatalf("the same refund again: %d %s %s", r.code, r.stdout, r.stderr)
	}
	// The same refund ID with another amount: refused, pointing at --refund-id.
	r = cli(t, env, "refund", n.charge, "--amount", "6", "-n", ns)
	if r.code != 1 || !strings.Contains(r.stderr, `refund ID "1" of billingsettlement `+ns+"/"+n.charge+" already exists") ||
		!strings.Contains(r.stderr, "with 5.00 USD") || !strings.Contains(r.stderr, "Look at it first") {
		t.Fatalf("another amount under the same refund ID: %d %s", r.code, r.stderr)
	}
	if got := count(); got != before+1 {
		t.Fatalf("%d settlements created, want 1", got-before)
	}
	// A second refund of the same charge needs its own ID; --full takes what is left
	// (12.50 less the 5.00 by hand and the 5.00 above), and then nothing is.
	r = cli(t, env, "refund", n.chargeIdem, "--full", "--refund-id", "2", "-n", ns)
	if r.code != 0 || !strings.Contains(r.stdout, "for 2.50 USD") {
		t.Fatalf("second refund: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := cli(t, env, "refund", n.charge, "--full", "--refund-id", "3", "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "already add up to what it charged (12.50 USD)") {
		t.Fatalf("a refund of a fully refunded charge: %d %s", r.code, r.stderr)
	}
	if got := count(); got != before+2 {
		t.Fatalf("%d settlements created, want 2", got-before)
	}

	// An unsettled charge is not refunded (it is voided).
	pending := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-stl-" + h("inference/job-9")},
		Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: "inference/job-9",
			IdempotencyKey: "stl_" + hJCS("settlement", ns, "inference/job-9"), Type: hooksv1alpha1.SettlementCharge, Customer: "cus_1",
			Amount: &hooksv1alpha1.Amount{Minor: 100, Currency: "USD"}, WebhookProvider: "inference"}}
	if err := cl.Create(ctx, pending); err != nil {
		t.Fatal(err)
	}
	if r := cli(t, env, "refund", pending.Name, "--full", "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "not Settled") || !strings.Contains(r.stderr, "Void") {
		t.Fatalf("refund of an unsettled charge: %d %s", r.code, r.stderr)
	}
	// A charge with a Void beside it is not refunded: the Void may cancel it whole.
	void := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-stl-" + h("inference/void-1")},
		Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: "inference/void-1",
			IdempotencyKey: "stl_" + hJCS("settlement", ns, "inference/void-1"), Type: hooksv1alpha1.SettlementVoid, Reverses: n.charge,
			Customer: "cus_Q2x9", Amount: &hooksv1alpha1.Amount{Minor: 1250, Currency: "USD"}}}
	if err := cl.Create(ctx, void); err != nil {
		t.Fatal(err)
	}
	// Held by its guard, never sent: it blocks nothing, as in the operator.
	if r := cli(t, env, "refund", n.charge, "--amount", "0.01", "--refund-id", "4", "-n", ns, "--dry-run"); r.code != 1 || strings.Contains(r.stderr, "voids it") {
		t.Fatalf("refund beside a Void never sent: %d %s", r.code, r.stderr)
	}
	sent := metav1.Now()
	void.Status = hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSubmitted, Exposure: hooksv1alpha1.ExposurePossible,
		Attempts: 1, FirstSubmittedAt: &sent}
	if err := cl.Status().Update(ctx, void); err != nil {
		t.Fatal(err)
	}
	if r := cli(t, env, "refund", n.charge, "--amount", "0.01", "--refund-id", "4", "-n", ns); r.code != 1 || !strings.Contains(r.stderr, void.Name+" voids it") {
		t.Fatalf("refund of a voided charge: %d %s", r.code, r.stderr)
	}
	// A user who may not create settlements is told what is missing.
	reader := kubeEnv(t, cfg, "nobody")
	if r := cli(t, reader, "refund", n.charge, "--full", "--refund-id", "3", "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "not allowed") {
		t.Fatalf("refund without rights: %d %s", r.code, r.stderr)
	}
}

// TestReplayEvent replays, as a user who holds only the settlement-replayer
// ClusterRole, an event whose job state was unmapped, and is refused for events a
// replay would not change.
func TestReplayEvent(t *testing.T) {
	cl, ns, cfg := cluster(t)
	ctx := context.Background()
	newEvent := func(id string, unmapped []hooksv1alpha1.UnmappedJobState) *hooksv1alpha1.WebhookEvent {
		t.Helper()
		ev := &hooksv1alpha1.WebhookEvent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.EventName(ns, "inference", id)},
			Spec: hooksv1alpha1.WebhookEventSpec{Provider: "inference", EventID: id, EventType: "job.completed",
				PayloadHash: "sha256:" + strings.Repeat("0", 64), ReceivedAt: metav1.Now(), UnmappedJobStates: unmapped}}
		if err := cl.Create(ctx, ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	unmapped := newEvent("msg_unmapped", []hooksv1alpha1.UnmappedJobState{{JobID: "job-1", State: "FINISHED"}})
	plain := newEvent("msg_plain", nil)

	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "settlement_replayer_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	role.Name = "settlement-replayer-" + ns
	if err := cl.Create(ctx, &role); err != nil {
		t.Fatal(err)
	}
	user := "oncall-" + ns
	if err := cl.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "oncall"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}); err != nil {
		t.Fatal(err)
	}
	env := kubeEnv(t, cfg, user)

	if r := cli(t, env, "replay", "event", plain.Name, "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "has no unmapped job states") {
		t.Fatalf("replay of an event without unmapped states: %d %s", r.code, r.stderr)
	}
	if r := cli(t, env, "replay", "event", "nope", "-n", ns); r.code != 1 || !strings.Contains(r.stderr, `no WebhookEvent in namespace "`+ns+`" named nope`) {
		t.Fatalf("replay of nothing: %d %s", r.code, r.stderr)
	}
	// By event ID and provider, as the sender's dashboard names it.
	r := cli(t, env, "replay", "event", "msg_unmapped", "--provider", "inference", "-n", ns)
	if r.code != 0 {
		t.Fatalf("replay: %d %s", r.code, r.stderr)
	}
	for _, s := range []string{"annotated " + hooksv1alpha1.AnnotationReplay + "=kubectl-settlement-", `job state(s) "FINISHED"`, "kubectl describe whe " + unmapped.Name} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("replay output lacks %q:\n%s", s, r.stdout)
		}
	}
	var got hooksv1alpha1.WebhookEvent
	if err := cl.Get(ctx, client.ObjectKeyFromObject(unmapped), &got); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got.Annotations[hooksv1alpha1.AnnotationReplay], "kubectl-settlement-") {
		t.Fatalf("the event was not annotated: %v", got.Annotations)
	}
	// Once a replay has mapped the states, another changes nothing and is refused.
	got.Status.Replay = &hooksv1alpha1.EventReplayStatus{LastToken: got.Annotations[hooksv1alpha1.AnnotationReplay], Count: 1,
		MappedAs: hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded)}
	if err := cl.Status().Update(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if r := cli(t, env, "replay", "event", unmapped.Name, "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "already mapped its job states as Succeeded") {
		t.Fatalf("replay of a mapped event: %d %s", r.code, r.stderr)
	}
}
