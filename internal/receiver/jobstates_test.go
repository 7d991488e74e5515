package receiver

import (
	"fmt"
	"net/http"

	"sigs.k8s.io/controller-runtime/pkg/client"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/senders"
)

// githubWorkflowJob is a workflow_job "completed" delivery as GitHub sends it (the
// fields the provider reads), ending in conclusion.
func githubWorkflowJob(id int, conclusion string) string {
	return fmt.Sprintf(`{"action":"completed","workflow_job":{"id":%d,"run_id":5,"run_attempt":1,"status":"completed",`+
		`"conclusion":%q,"completed_at":"2026-11-30T12:00:00Z","steps":[]},"repository":{"id":1,"full_name":"acme/app",`+
		`"owner":{"login":"acme"}},"sender":{"login":"octocat"}}`, id, conclusion)
}

// githubJobsProvider completes each workflow job and charges it (one run) only when it
// succeeded: the settlement's condition reads the conclusion with jobState().
func githubJobsProvider(ns string) *hooksv1alpha1.WebhookProvider {
	p := presetProvider(ns, "github-jobs", hooksv1alpha1.SenderGitHub, "github-jobs-secret")
	p.Spec.Signature.InsecureAllowReplay = true
	p.Spec.EventID = hooksv1alpha1.EventIDSource{DerivedFrom: []string{".workflow_job.id", ".workflow_job.run_attempt", ".action"}}
	p.Spec.EventType = hooksv1alpha1.FieldSource{JSONPath: ".action"}
	p.Spec.Routes = []hooksv1alpha1.Route{{EventType: "completed", Operations: []hooksv1alpha1.RouteOperation{
		{Type: hooksv1alpha1.OperationJobCompletion, JobCompletion: &hooksv1alpha1.JobCompletionMapping{
			JobID: ".workflow_job.id", CompletionVersion: ".workflow_job.run_attempt", State: ".workflow_job.conclusion",
			CompletedAt: ".workflow_job.completed_at"}},
		{Type: hooksv1alpha1.OperationBillingSettlement, When: `jobState(payload.workflow_job.conclusion) == "Succeeded"`,
			Settlement: &hooksv1alpha1.SettlementMapping{BillingProviderRef: "billing", JobID: ".workflow_job.id",
				Customer: ".repository.owner.login",
				Usage:    &hooksv1alpha1.UsageMapping{Quantity: ".workflow_job.run_attempt", Meter: "workflow-runs"}}},
	}}}
	return p
}

// runpodJob is a RunPod serverless job's status object (as its webhook posts it),
// under the envelope the suite's provider routes on.
func runpodJob(id, status string) string {
	return fmt.Sprintf(`{"type":"job.completed","data":{"id":%q,"status":%q,"delayTime":120,"executionTime":600000,`+
		`"workerId":"w-1","customer":"cus_1","output":null}}`, id, status)
}

func runpodProvider(ns string) *hooksv1alpha1.WebhookProvider {
	p := inferenceProvider(ns)
	p.Name = "runpod"
	p.Spec.Routes[0].Operations = []hooksv1alpha1.RouteOperation{
		{Type: hooksv1alpha1.OperationJobCompletion, JobCompletion: &hooksv1alpha1.JobCompletionMapping{
			JobID: ".data.id", State: ".data.status"}},
		{Type: hooksv1alpha1.OperationBillingSettlement, Settlement: &hooksv1alpha1.SettlementMapping{
			BillingProviderRef: "billing", JobID: ".data.id", Customer: ".data.customer",
			Usage: &hooksv1alpha1.UsageMapping{Quantity: ".data.executionTime", Meter: "gpu-ms"}}},
	}
	return p
}

func postGitHub(ns, provider, secret, body string) (int, string) {
	GinkgoHelper()
	return post(url(ns, provider), "application/json", http.Header{"X-Hub-Signature-256": {"sha256=" + hmacHex(secret, body)},
		"X-GitHub-Event": {"workflow_job"}}, body)
}

// eventOf is the one stored event whose job ID (or unmapped job ID) is jobID.
func eventOf(ns, jobID string) hooksv1alpha1.WebhookEvent {
	GinkgoHelper()
	var found []hooksv1alpha1.WebhookEvent
	for _, ev := range listEvents(ns) {
		ids := []string{}
		for _, f := range ev.Spec.JobCompletions {
			ids = append(ids, f.JobID)
		}
		for _, u := range ev.Spec.UnmappedJobStates {
			ids = append(ids, u.JobID)
		}
		for _, f := range ev.Spec.Settlements {
			ids = append(ids, f.JobID)
		}
		if len(ids) > 0 && ids[0] == jobID {
			found = append(found, ev)
		}
	}
	Expect(found).To(HaveLen(1), "events of job %s", jobID)
	return found[0]
}

var _ = Describe("job states of real senders", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("accepts a GitHub workflow job that timed out and a RunPod job that timed out: never a 400", func() {
		const secret = "github-jobs-secret-value"
		install(githubJobsProvider(ns), map[string]string{"key": secret})
		code, answer := postGitHub(ns, "github-jobs", secret, githubWorkflowJob(101, "timed_out"))
		Expect(code).To(Equal(http.StatusOK), answer)

		install(runpodProvider(ns), map[string]string{"current": swhSecret})
		resp := send(ns, "runpod", "msg_runpod_1", runpodJob("sync-1", "TIMED_OUT"))
		Expect(resp.Status).To(Equal(http.StatusOK), resp.Body)
		Expect(listEvents(ns)).To(HaveLen(2))

		By("GitHub's timed_out is Failed by the preset's default states: completed, not charged")
		gh := eventOf(ns, "101")
		Expect(gh.Spec.JobCompletions).To(HaveLen(1))
		Expect(gh.Spec.JobCompletions[0].State).To(Equal(hooksv1alpha1.JobFailed))
		Expect(gh.Spec.Settlements).To(BeEmpty())
		Expect(gh.Spec.UnmappedJobStates).To(BeEmpty())

		By("RunPod's TIMED_OUT, with no spec.states, is stored as unmapped: no job completion, no charge")
		rp := eventOf(ns, "sync-1")
		Expect(rp.Spec.JobCompletions).To(BeEmpty())
		Expect(rp.Spec.Settlements).To(BeEmpty(), "the job's settlement is not charged while its state is unmapped")
		Expect(rp.Spec.UnmappedJobStates).To(Equal([]hooksv1alpha1.UnmappedJobState{{JobID: "sync-1", State: "TIMED_OUT"}}))
	})

	It("maps or reports every GitHub conclusion, and charges only success", func() {
		const secret = "github-jobs-secret-value"
		install(githubJobsProvider(ns), map[string]string{"key": secret})
		want := map[string]hooksv1alpha1.JobStateMeaning{}
		for _, m := range senders.GitHubStates() {
			want[m.State] = m.As
		}
		// Every conclusion GitHub documents for workflow runs, jobs and check runs.
		for _, c := range []string{"success", "failure", "neutral", "cancelled", "skipped", "timed_out",
			"action_required", "stale", "startup_failure"} {
			Expect(want).To(HaveKey(c), "GitHub's default states lack %s", c)
		}
		id := 200
		for conclusion, as := range want {
			id++
			code, answer := postGitHub(ns, "github-jobs", secret, githubWorkflowJob(id, conclusion))
			Expect(code).To(Equal(http.StatusOK), "%s: %s", conclusion, answer)
			var ev *hooksv1alpha1.WebhookEvent
			for _, e := range listEvents(ns) {
				if len(e.Spec.JobCompletions) > 0 && e.Spec.JobCompletions[0].JobID == fmt.Sprint(id) {
					ev = &e
				}
			}
			if as == hooksv1alpha1.JobStateIgnored {
				Expect(ev).To(BeNil(), "%s is Ignored: no job completion", conclusion)
				continue
			}
			Expect(ev).NotTo(BeNil(), conclusion)
			Expect(string(ev.Spec.JobCompletions[0].State)).To(Equal(string(as)), conclusion)
			if as == hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded) {
				Expect(ev.Spec.Settlements).To(HaveLen(1), conclusion)
			} else {
				Expect(ev.Spec.Settlements).To(BeEmpty(), "%s must not be charged", conclusion)
			}
		}
		By("an Ignored conclusion is acknowledged and stored with nothing to do")
		var ignored int
		for _, e := range listEvents(ns) {
			if len(e.Spec.JobCompletions) == 0 && len(e.Spec.Settlements) == 0 && len(e.Spec.UnmappedJobStates) == 0 {
				ignored++
			}
		}
		Expect(ignored).To(Equal(1), "action_required")

		By("a conclusion GitHub may add later is stored as unmapped, named, and not charged")
		code, answer := postGitHub(ns, "github-jobs", secret, githubWorkflowJob(999, "brand_new"))
		Expect(code).To(Equal(http.StatusOK), answer)
		ev := eventOf(ns, "999")
		Expect(ev.Spec.JobCompletions).To(BeEmpty())
		Expect(ev.Spec.Settlements).To(BeEmpty())
		Expect(ev.Spec.UnmappedJobStates).To(Equal([]hooksv1alpha1.UnmappedJobState{{JobID: "999", State: "brand_new"}}))
	})

	It("maps every RunPod status with its table: only COMPLETED is charged, unfinished ones are Ignored", func() {
		p := runpodProvider(ns)
		p.Spec.States = senders.RunPodStates()
		p.Spec.Routes[0].Operations[1].When = `jobState(payload.data.status) == "Succeeded"`
		install(p, map[string]string{"current": swhSecret})
		for i, status := range []string{"COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED", "IN_QUEUE", "IN_PROGRESS"} {
			resp := send(ns, "runpod", fmt.Sprintf("msg_rp_%d", i), runpodJob("job-"+status, status))
			Expect(resp.Status).To(Equal(http.StatusOK), "%s: %s", status, resp.Body)
		}
		evs := listEvents(ns)
		Expect(evs).To(HaveLen(6))
		states, charged := map[string]hooksv1alpha1.JobState{}, []string{}
		for _, e := range evs {
			Expect(e.Spec.UnmappedJobStates).To(BeEmpty())
			for _, f := range e.Spec.JobCompletions {
				states[f.JobID] = f.State
			}
			for _, f := range e.Spec.Settlements {
				charged = append(charged, f.JobID)
			}
		}
		Expect(states).To(Equal(map[string]hooksv1alpha1.JobState{"job-COMPLETED": hooksv1alpha1.JobSucceeded,
			"job-FAILED": hooksv1alpha1.JobFailed, "job-TIMED_OUT": hooksv1alpha1.JobFailed, "job-CANCELLED": hooksv1alpha1.JobCancelled}))
		Expect(charged).To(ConsistOf("job-COMPLETED"))
	})

	It("refuses a states table that lists a state twice, ignoring case", func() {
		p := runpodProvider(ns)
		p.Spec.States = []hooksv1alpha1.JobStateMapping{{State: "TIMED_OUT", As: "Failed"}, {State: "timed_out", As: "Cancelled"}}
		err := k8s.Create(ctx, p)
		Expect(err).To(MatchError(ContainSubstring("states lists a state twice")))
		p.Spec.States = []hooksv1alpha1.JobStateMapping{{State: "TIMED_OUT", As: "Maybe"}}
		Expect(k8s.Create(ctx, p)).To(MatchError(ContainSubstring("spec.states[0].as")))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), &hooksv1alpha1.WebhookProvider{})).NotTo(Succeed())
	})
})
