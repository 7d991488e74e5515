package integration_test

import (
	"fmt"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// withSampleRoutes gives the tenant the routes of config/samples' inference provider,
// so that the sample itself is what is shown to complete a failed job without
// charging it (the sample once charged failed jobs).
func withSampleRoutes(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
	GinkgoHelper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_webhookprovider.yaml"))
	Expect(err).NotTo(HaveOccurred())
	var sample hooksv1alpha1.WebhookProvider
	Expect(yaml.UnmarshalStrict(b, &sample)).To(Succeed())
	Expect(sample.Name).To(Equal(wp.Name))
	secret := wp.Spec.Signature.SecretRef
	wp.Spec = sample.Spec
	wp.Spec.Signature.SecretRef = secret
}

// sampleJobEvent is a job.completed delivery in the shape the sample reads.
func sampleJobEvent(jobID, state string, tokens int) string {
	return fmt.Sprintf(`{"type":"job.completed","data":{"job_id":%q,"version":1,"state":%q,`+
		`"completed_at":"2026-11-30T12:00:00Z","customer":"cus_%s","usage":{"tokens":%d}}}`, jobID, state, jobID, tokens)
}

var _ = Describe("route conditions: charge only what should be charged", func() {
	It("completes a failed or cancelled job of the sample provider without charging it, and charges a succeeded one once", func() {
		ns := newTenant(withSampleRoutes)
		for _, tc := range []struct{ job, state string }{{"job-failed", "failed"}, {"job-cancelled", "canceled"}} {
			id := "msg_" + tc.job
			sendOK(ns, id, sampleJobEvent(tc.job, tc.state, 700))
			Eventually(eventPhase(ns, id)).Should(Equal(hooksv1alpha1.EventComplete))
			ev := event(ns, id)
			Expect(ev.Spec.Settlements).To(BeEmpty())
			Expect(ev.Status.Operations).To(HaveLen(1))
			Expect(ev.Status.Operations[0].Type).To(Equal(hooksv1alpha1.OperationJobCompletion))
			Expect(jobState(ns, tc.job)()).To(Equal(hooksv1alpha1.JobCompletionApplied))
			want := map[string]hooksv1alpha1.JobState{"failed": hooksv1alpha1.JobFailed, "canceled": hooksv1alpha1.JobCancelled}[tc.state]
			Expect(jobOf(ns, tc.job).Spec.Completion.State).To(Equal(want), "the job's state is recorded")
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns,
				Name: identity.SettlementName("inference", identity.DefaultSettlementKey("inference", tc.job))},
				&hooksv1alpha1.BillingSettlement{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no settlement for a %s job: %v", tc.state, err)
			Expect(billing.Charges(key(ns, tc.job))).To(Equal(0))
		}

		sendOK(ns, "msg_job-ok", sampleJobEvent("job-ok", "success", 1523))
		Eventually(eventPhase(ns, "msg_job-ok")).Should(Equal(hooksv1alpha1.EventComplete))
		Expect(settlementState(ns, "job-ok")()).To(Equal(hooksv1alpha1.SettlementSettled))
		Expect(jobOf(ns, "job-ok").Spec.Completion.State).To(Equal(hooksv1alpha1.JobSucceeded))
		Expect(billing.Charges(key(ns, "job-ok"))).To(Equal(1))
	})

	It("does the same for the shared test tenant (test/fixtures)", func() {
		ns := newTenant()
		sendOK(ns, "msg_f", fixtures.JobEvent("job-f", 1, "error", 10))
		Eventually(eventPhase(ns, "msg_f")).Should(Equal(hooksv1alpha1.EventComplete))
		Expect(jobOf(ns, "job-f").Spec.Completion.State).To(Equal(hooksv1alpha1.JobFailed))
		Expect(event(ns, "msg_f").Spec.Settlements).To(BeEmpty())
		Expect(billing.Charges(key(ns, "job-f"))).To(Equal(0))
	})
})
