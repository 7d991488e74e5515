package integration_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/senders"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// noJob reports whether the tenant has no JobCompletion for jobID.
func noJob(ns, jobID string) bool {
	GinkgoHelper()
	err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.JobCompletionName("inference", jobID)}, &hooksv1alpha1.JobCompletion{})
	return apierrors.IsNotFound(err)
}

var _ = Describe("job states a sender writes (spec.states)", func() {
	It("shows an unmapped state on the event, creates and charges nothing, and maps it once it is in spec.states", func() {
		ns := newTenant()
		sendOK(ns, "msg_timeout", fixtures.JobEvent("job-timeout", 1, "TIMED_OUT", 900))
		Eventually(eventPhase(ns, "msg_timeout")).Should(Equal(hooksv1alpha1.EventPartiallyFailed))
		ev := event(ns, "msg_timeout")
		Expect(ev.Status.Operations).To(HaveLen(1))
		op := ev.Status.Operations[0]
		Expect(op.Type).To(Equal(hooksv1alpha1.OperationJobCompletion))
		Expect(op.Key).To(Equal("job-timeout"))
		Expect(op.Outcome).To(Equal(hooksv1alpha1.OutcomeUnmapped))
		Expect(op.Message).To(ContainSubstring(`job state "TIMED_OUT" is not in WebhookProvider inference's spec.states`))
		ready := meta.FindStatusCondition(ev.Status.Conditions, hooksv1alpha1.ConditionReady)
		Expect(ready).NotTo(BeNil())
		Expect(ready.Status).To(Equal(metav1.ConditionFalse))
		Expect(ready.Reason).To(Equal(hooksv1alpha1.ReasonUnmappedState))
		Expect(ready.Message).To(ContainSubstring(`"TIMED_OUT"`))
		Expect(ready.Message).NotTo(ContainSubstring("cus_job-timeout"), "the payload is never quoted")
		Consistently(func() bool { return noJob(ns, "job-timeout") }, "2s").Should(BeTrue(), "no job completion for an unmapped state")
		Expect(billing.Charges(key(ns, "job-timeout"))).To(Equal(0))

		By("mapped in spec.states, the next such job is completed as Failed and not charged")
		var wp hooksv1alpha1.WebhookProvider
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, &wp)).To(Succeed())
		wp.Spec.States = senders.RunPodStates()
		Expect(k8s.Update(ctx, &wp)).To(Succeed())
		// The receiver serves the new spec once its cache has it: until then a delivery
		// is stored unmapped, so each try is a new job.
		var job, id string
		try := 0
		Eventually(func() []hooksv1alpha1.JobCompletionFacts {
			try++
			job, id = fmt.Sprintf("job-timeout-%d", try), fmt.Sprintf("msg_timeout_%d", try)
			sendOK(ns, id, fixtures.JobEvent(job, 1, "TIMED_OUT", 900))
			return event(ns, id).Spec.JobCompletions
		}, "30s", "500ms").Should(HaveLen(1))
		Eventually(eventPhase(ns, id), "30s").Should(Equal(hooksv1alpha1.EventComplete))
		Expect(jobOf(ns, job).Spec.Completion.State).To(Equal(hooksv1alpha1.JobFailed))
		Expect(event(ns, id).Spec.Settlements).To(BeEmpty())
		Expect(billing.Charges(key(ns, job))).To(Equal(0))

		By("an Ignored state is acknowledged and stored with nothing created")
		sendOK(ns, "msg_running", fixtures.JobEvent("job-running", 1, "IN_PROGRESS", 900))
		Eventually(eventPhase(ns, "msg_running")).Should(Equal(hooksv1alpha1.EventIgnored))
		Expect(noJob(ns, "job-running")).To(BeTrue())
		Expect(billing.Charges(key(ns, "job-running"))).To(Equal(0))
	})
})
