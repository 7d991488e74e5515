package receiver

import (
	"net/http"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// Route conditions (decisions.md "Route conditions"): the receiver
// evaluates a route's and its operations' `when` on every delivery.
var _ = Describe("route conditions (when)", func() {
	const (
		routeWhen  = `payload.data.customer != "cus_internal"`
		chargeWhen = `jobState(payload.data.state) == "Succeeded"`
	)
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		p := inferenceProvider(ns)
		p.Spec.Routes[0].When = routeWhen
		p.Spec.Routes[0].Operations[1].When = chargeWhen
		install(p, map[string]string{"current": swhSecret})
	})

	// waitForGeneration waits until the receiver's cache holds the provider's
	// current generation, so the next delivery is served by it.
	// setWhen changes the provider's conditions (retrying on conflicts with the
	// controller's status writes) and returns the updated provider.
	setWhen := func(change func(*hooksv1alpha1.WebhookProvider)) *hooksv1alpha1.WebhookProvider {
		GinkgoHelper()
		p := &hooksv1alpha1.WebhookProvider{}
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, p); err != nil {
				return err
			}
			change(p)
			return k8s.Update(ctx, p)
		}).Should(Succeed())
		return p
	}
	waitForGeneration := func(p *hooksv1alpha1.WebhookProvider) {
		GinkgoHelper()
		Eventually(func(g Gomega) {
			var got hooksv1alpha1.WebhookProvider
			g.Expect(mgrCache.Get(ctx, client.ObjectKeyFromObject(p), &got)).To(Succeed())
			g.Expect(got.Generation).To(Equal(p.Generation))
		}).Should(Succeed())
	}

	It("answers 200 ignored and stores nothing when the route's condition is false", func() {
		r := send(ns, "inference", "msg_internal", strings.Replace(completedV2, "cus_1", "cus_internal", 1))
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		Expect(decode(r.Body)).To(HaveKeyWithValue("status", OutcomeIgnored))
		Expect(listEvents(ns)).To(BeEmpty())
	})

	It("stores a failed job's completion without its settlement, and a succeeded job's with it", func() {
		r := send(ns, "inference", "msg_failed", strings.Replace(completedV2, `"succeeded"`, `"error"`, 1))
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		Expect(decode(r.Body)).To(HaveKeyWithValue("status", OutcomeAccepted))
		var ev hooksv1alpha1.WebhookEvent
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: decode(r.Body)["event"]}, &ev)).To(Succeed())
		Expect(ev.Spec.JobCompletions).To(HaveLen(1))
		Expect(ev.Spec.JobCompletions[0].State).To(Equal(hooksv1alpha1.JobFailed))
		Expect(ev.Spec.Settlements).To(BeEmpty(), "a failed job is not charged")

		r = send(ns, "inference", "msg_ok", strings.Replace(completedV2, "job-1", "job-2", 1))
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: decode(r.Body)["event"]}, &ev)).To(Succeed())
		Expect(ev.Spec.JobCompletions).To(HaveLen(1))
		Expect(ev.Spec.Settlements).To(HaveLen(1))
	})

	It("answers 400 naming the condition when the payload cannot be evaluated, and stores nothing", func() {
		r := send(ns, "inference", "msg_nocustomer", strings.Replace(completedV2, `"customer":"cus_1",`, "", 1))
		Expect(r.Status).To(Equal(http.StatusBadRequest), r.Body)
		Expect(decode(r.Body)["message"]).To(ContainSubstring("spec.routes[0].when could not be evaluated: no such key: customer"))

		Expect(listEvents(ns)).To(BeEmpty())
	})

	It("accepts and stores a job state no one mapped, with no job completion and no charge", func() {
		r := send(ns, "inference", "msg_weird", strings.Replace(completedV2, `"succeeded"`, `"weird"`, 1))
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		var ev hooksv1alpha1.WebhookEvent
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: decode(r.Body)["event"]}, &ev)).To(Succeed())
		Expect(ev.Spec.JobCompletions).To(BeEmpty())
		Expect(ev.Spec.Settlements).To(BeEmpty())
		Expect(ev.Spec.UnmappedJobStates).To(Equal([]hooksv1alpha1.UnmappedJobState{{JobID: "job-1", State: "weird"}}))
	})

	It("still answers duplicate for a stored event whose redelivery no longer evaluates", func() {
		r := send(ns, "inference", "msg_stored", completedV2)
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		Expect(decode(r.Body)).To(HaveKeyWithValue("status", OutcomeAccepted))
		name := identity.EventName(ns, "inference", "msg_stored")
		Eventually(func() error {
			return mgrCache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &hooksv1alpha1.WebhookEvent{})
		}).Should(Succeed())

		// The route's condition now reads a field this payload lacks.
		p := setWhen(func(p *hooksv1alpha1.WebhookProvider) { p.Spec.Routes[0].When = `payload.data.region == "eu"` })
		waitForGeneration(p)

		r = send(ns, "inference", "msg_new", completedV2)
		Expect(r.Status).To(Equal(http.StatusBadRequest), "a new event with this payload cannot be evaluated: "+r.Body)
		r = send(ns, "inference", "msg_stored", completedV2)
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		Expect(decode(r.Body)).To(HaveKeyWithValue("status", OutcomeDuplicate))
		Expect(listEvents(ns)).To(HaveLen(1))
	})

	It("makes the provider Ready=False InvalidSpec for a condition that does not compile, and answers 503", func() {
		p := setWhen(func(p *hooksv1alpha1.WebhookProvider) {
			p.Spec.Routes[0].Operations[1].When = `jobState(payload.data.state)` // a string, not a bool
		})
		Eventually(func(g Gomega) {
			got := &hooksv1alpha1.WebhookProvider{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
			c := apimeta.FindStatusCondition(got.Status.Conditions, hooksv1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.ObservedGeneration).To(Equal(p.Generation))
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(hooksv1alpha1.ReasonInvalidSpec))
			g.Expect(c.Message).To(ContainSubstring("spec.routes[0].operations[1].when: the expression's type is string, want bool"))
		}).Should(Succeed())
		waitForGeneration(p)

		r := send(ns, "inference", "msg_invalid", completedV2)
		Expect(r.Status).To(Equal(http.StatusServiceUnavailable), r.Body)
		Expect(decode(r.Body)).To(HaveKeyWithValue("error", OutcomeProviderNotReady))
		Expect(listEvents(ns)).To(BeEmpty())
	})
})
