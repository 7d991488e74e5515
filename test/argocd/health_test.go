package argocd

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

func cond(t, status, reason, msg string, gen int64) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg,
		ObservedGeneration: gen, LastTransitionTime: metav1.Now()}
}

func TestHealthChecks(t *testing.T) {
	s := Scripts(t)
	for _, kind := range []string{"WebhookProvider", "BillingProvider", "BillingSettlement", "JobCompletion", "WebhookEvent", "ReconciliationReport"} {
		if s[kind] == "" {
			t.Fatalf("no health check for %s", kind)
		}
	}
	if len(s) != 6 {
		t.Fatalf("%d health checks, want one per kind (6)", len(s))
	}

	type tc struct {
		name, kind string
		obj        any
		want       string
		msg        string // a substring of the message
	}
	meta := func(gen int64) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: "x", Namespace: "ns", Generation: gen}
	}
	wp := func(gen int64, c ...metav1.Condition) *hooksv1alpha1.WebhookProvider {
		return &hooksv1alpha1.WebhookProvider{ObjectMeta: meta(gen), Status: hooksv1alpha1.WebhookProviderStatus{Conditions: c}}
	}
	bp := func(gen int64, c ...metav1.Condition) *hooksv1alpha1.BillingProvider {
		return &hooksv1alpha1.BillingProvider{ObjectMeta: meta(gen), Status: hooksv1alpha1.BillingProviderStatus{Conditions: c}}
	}
	bs := func(state hooksv1alpha1.SettlementState, c ...metav1.Condition) *hooksv1alpha1.BillingSettlement {
		return &hooksv1alpha1.BillingSettlement{ObjectMeta: meta(1), Status: hooksv1alpha1.BillingSettlementStatus{State: state, Conditions: c}}
	}
	jc := func(state hooksv1alpha1.JobCompletionState) *hooksv1alpha1.JobCompletion {
		return &hooksv1alpha1.JobCompletion{ObjectMeta: meta(1), Status: hooksv1alpha1.JobCompletionStatus{State: state}}
	}
	// A job with a sink is Pending until its controller writes; one without is applied
	// by its creation (JobCompletion.Progress), unless a newer version was proposed.
	httpJob := func(gen int64) *hooksv1alpha1.JobCompletion {
		return &hooksv1alpha1.JobCompletion{ObjectMeta: meta(gen), Spec: hooksv1alpha1.JobCompletionSpec{
			Sink: &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP, URL: "https://jobs.example"}}}
	}
	noSinkJob := func(gen int64) *hooksv1alpha1.JobCompletion {
		return &hooksv1alpha1.JobCompletion{ObjectMeta: meta(gen), Spec: hooksv1alpha1.JobCompletionSpec{
			Sink: &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkNone}}}
	}
	ev := func(phase hooksv1alpha1.EventPhase) *hooksv1alpha1.WebhookEvent {
		return &hooksv1alpha1.WebhookEvent{ObjectMeta: meta(1), Status: hooksv1alpha1.WebhookEventStatus{Phase: phase}}
	}
	rr := func(phase hooksv1alpha1.ReportPhase, review int32) *hooksv1alpha1.ReconciliationReport {
		return &hooksv1alpha1.ReconciliationReport{ObjectMeta: meta(1),
			Status: hooksv1alpha1.ReconciliationReportStatus{Phase: phase, NeedsReview: review, Discrepancies: review + 1}}
	}
	cases := []tc{
		{"provider new", "WebhookProvider", wp(1), "Progressing", "waiting"},
		{"provider ready", "WebhookProvider", wp(2, cond("Ready", "True", "Valid", "all routes valid", 2)), "Healthy", "all routes valid"},
		{"provider not ready", "WebhookProvider", wp(2, cond("Ready", "False", "BillingProviderNotFound", `route 0 names "billing-typo"`, 2)), "Degraded", "BillingProviderNotFound"},
		{"provider edited, not seen yet", "WebhookProvider", wp(3, cond("Ready", "True", "Valid", "", 2)), "Progressing", "generation 3"},
		{"provider stalled", "WebhookProvider", wp(2, cond("Ready", "False", "SigningKeyRefused", "tls.key holds PEM", 2), cond("Stalled", "True", "SigningKeyRefused", "tls.key holds PEM", 2)), "Degraded", "SigningKeyRefused: tls.key"},
		{"provider waiting", "WebhookProvider", wp(2, cond("Ready", "False", "SecretNotFound", "Secret \"s\" not found", 2), cond("Reconciling", "True", "SecretNotFound", "Secret \"s\" not found", 2)), "Progressing", "SecretNotFound"},
		{"provider not looked at, observedGeneration defaulted", "BillingProvider", map[string]any{
			"metadata": map[string]any{"generation": 1}, "status": map[string]any{"observedGeneration": 0}}, "Progressing", "generation 1"},
		{"billing ready", "BillingProvider", bp(1, cond("Ready", "True", "Valid", "credentials accepted", 1)), "Healthy", "credentials"},
		{"billing refused", "BillingProvider", bp(1, cond("Ready", "False", "CredentialsRejected", "401", 1)), "Degraded", "CredentialsRejected"},
		{"settlement new", "BillingSettlement", &hooksv1alpha1.BillingSettlement{ObjectMeta: meta(1)}, "Progressing", ""},
		{"settlement submitted", "BillingSettlement", bs(hooksv1alpha1.SettlementSubmitted, cond("Ready", "False", "SubmittedToProvider", "attempt 1 in flight", 1)), "Progressing", "attempt 1"},
		{"settlement settled", "BillingSettlement", bs(hooksv1alpha1.SettlementSettled, cond("Ready", "True", "ProviderSettled", "settled by billing as set_1", 1)), "Healthy", "set_1"},
		{"settlement ambiguous", "BillingSettlement", bs(hooksv1alpha1.SettlementRequiresReconciliation), "Degraded", "RequiresReconciliation"},
		{"settlement failed", "BillingSettlement", bs(hooksv1alpha1.SettlementFailed), "Degraded", "Failed"},
		{"settlement dead-lettered", "BillingSettlement", bs(hooksv1alpha1.SettlementPending, cond("DeadLettered", "True", "RetriesExhausted", "replay with kubectl settlement replay", 1)), "Degraded", "replay"},
		{"job pending", "JobCompletion", httpJob(1), "Progressing", "Pending"},
		{"job without a sink, as created", "JobCompletion", jc(""), "Healthy", "Applied"},
		{"job without a sink, newer version not taken up", "JobCompletion", noSinkJob(2), "Progressing", "Pending"},
		{"job applied", "JobCompletion", jc(hooksv1alpha1.JobCompletionApplied), "Healthy", "Applied"},
		{"job superseded", "JobCompletion", jc(hooksv1alpha1.JobCompletionSuperseded), "Healthy", ""},
		{"job deferred", "JobCompletion", jc(hooksv1alpha1.JobCompletionDeferred), "Progressing", "Deferred"},
		{"job failed", "JobCompletion", jc(hooksv1alpha1.JobCompletionFailed), "Degraded", ""},
		{"event received", "WebhookEvent", ev(""), "Progressing", "Received"},
		{"event complete", "WebhookEvent", ev(hooksv1alpha1.EventComplete), "Healthy", ""},
		{"event ignored", "WebhookEvent", ev(hooksv1alpha1.EventIgnored), "Healthy", ""},
		{"event partially failed", "WebhookEvent", ev(hooksv1alpha1.EventPartiallyFailed), "Degraded", ""},
		{"event quarantined", "WebhookEvent", ev(hooksv1alpha1.EventQuarantined), "Degraded", ""},
		{"report running", "ReconciliationReport", rr(hooksv1alpha1.ReportRunning, 0), "Progressing", ""},
		{"report clean", "ReconciliationReport", rr(hooksv1alpha1.ReportCompleted, 0), "Healthy", "1 discrepancies"},
		{"report needs review", "ReconciliationReport", rr(hooksv1alpha1.ReportCompleted, 2), "Degraded", "2 findings need review"},
		{"report failed", "ReconciliationReport", rr(hooksv1alpha1.ReportFailed, 0), "Degraded", "failed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, msg := Health(t, s[c.kind], c.obj)
			if got != c.want || !strings.Contains(msg, c.msg) {
				t.Fatalf("%s: got %s %q, want %s containing %q", c.kind, got, msg, c.want, c.msg)
			}
		})
	}
}
