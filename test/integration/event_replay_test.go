package integration_test

import (
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// mapState adds one entry to the tenant's WebhookProvider spec.states.
func mapState(ns, state string, as hooksv1alpha1.JobStateMeaning) {
	GinkgoHelper()
	Eventually(func() error {
		var wp hooksv1alpha1.WebhookProvider
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, &wp); err != nil {
			return err
		}
		wp.Spec.States = append(wp.Spec.States, hooksv1alpha1.JobStateMapping{State: state, As: as})
		return k8s.Update(ctx, &wp)
	}).Should(Succeed())
}

// replayEvent sets the replay annotation of the event of delivery id to token, as
// `kubectl annotate ... hooks.settlement.dev/replay=<token> --overwrite` does.
func replayEvent(ns, id, token string) {
	GinkgoHelper()
	ev := event(ns, id)
	patch := client.MergeFrom(ev.DeepCopy())
	if ev.Annotations == nil {
		ev.Annotations = map[string]string{}
	}
	ev.Annotations[hooksv1alpha1.AnnotationReplay] = token
	Expect(k8s.Patch(ctx, ev, patch)).To(Succeed())
}

// readyOfEvent is the Ready condition of the event of delivery id.
func readyOfEvent(ns, id string) func() metav1.Condition {
	return func() metav1.Condition {
		c := meta.FindStatusCondition(event(ns, id).Status.Conditions, hooksv1alpha1.ConditionReady)
		if c == nil {
			return metav1.Condition{}
		}
		return *c
	}
}

var _ = Describe("replay of a stored event whose job state was unmapped", func() {
	It("dispatches what the state now maps to, once, however often it is replayed or redelivered", func() {
		ns := newTenant()
		body := fixtures.JobEvent("job-late-map", 1, "FINISHED", 700)
		sendOK(ns, "msg_late_map", body)
		Eventually(eventPhase(ns, "msg_late_map")).Should(Equal(hooksv1alpha1.EventPartiallyFailed))
		Expect(noJob(ns, "job-late-map")).To(BeTrue())
		// What an unmapped event stores beyond a mapped one is its held facts, one set per
		// meaning; measured as the API server returns it.
		size := len(storedJSON(ns, "webhookevents", identity.EventName(ns, "inference", "msg_late_map")))
		AddReportEntry("stored bytes of an event with one unmapped job", size)
		GinkgoWriter.Printf("stored bytes of an event with one unmapped job: %d\n", size)
		Expect(size).To(BeNumerically("<=", 4096), "an unmapped event with its held facts fits in 4 KiB")

		By("a replay before the state is mapped leaves the event as it is, and says so")
		replayEvent(ns, "msg_late_map", "early")
		Eventually(func() string { return readyOfEvent(ns, "msg_late_map")().Message }).
			Should(ContainSubstring(`replay "early"`))
		Expect(readyOfEvent(ns, "msg_late_map")().Message).To(ContainSubstring(`"FINISHED" is still not mapped`))
		Expect(readyOfEvent(ns, "msg_late_map")().Reason).To(Equal(hooksv1alpha1.ReasonUnmappedState))
		Consistently(func() bool { return noJob(ns, "job-late-map") }, "2s").Should(BeTrue())
		Expect(billing.Charges(key(ns, "job-late-map"))).To(Equal(0))

		By("mapped and replayed, the job is completed and charged exactly as a delivery would have been")
		mapState(ns, "FINISHED", hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded))
		replayEvent(ns, "msg_late_map", "mapped")
		Eventually(eventPhase(ns, "msg_late_map")).Should(Equal(hooksv1alpha1.EventComplete))
		Eventually(settlementState(ns, "job-late-map")).Should(Equal(hooksv1alpha1.SettlementSettled))
		jc := jobOf(ns, "job-late-map")
		Expect(jc.Spec.Completion.State).To(Equal(hooksv1alpha1.JobSucceeded))
		Expect(jc.Spec.Completion.SourceEvent).To(Equal(identity.EventName(ns, "inference", "msg_late_map")))
		bs := settlementOf(ns, "job-late-map")
		Expect(bs.Spec.SettlementKey).To(Equal(key(ns, "job-late-map")), "the key a delivery would have derived")
		Expect(bs.Spec.Usage.Quantity).To(Equal("700"))

		By("replayed again and redelivered, nothing more happens")
		replayEvent(ns, "msg_late_map", "again")
		r := send(ns, "msg_late_map", body)
		Expect(r.Status).To(Equal(http.StatusOK))
		Expect(string(r.Body)).To(ContainSubstring(`"duplicate"`))
		Consistently(func() int { return posts(billing.CallsFor(bs.Spec.IdempotencyKey)) }, "3s").Should(Equal(1))
		Expect(billing.Charges(key(ns, "job-late-map"))).To(Equal(1))
		Expect(eventPhase(ns, "msg_late_map")()).To(Equal(hooksv1alpha1.EventComplete))
		rp := event(ns, "msg_late_map").Status.Replay
		Expect(rp).NotTo(BeNil())
		Expect(rp.Count).To(Equal(int32(3)), "every replay is recorded")
		Expect(rp.MappedAs).To(Equal(hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded)))
		Expect(rp.Message).To(ContainSubstring("already mapped"))
	})

	It("maps a state that is not an end to Ignored: nothing is created, the event is Ignored", func() {
		ns := newTenant()
		sendOK(ns, "msg_paused", fixtures.JobEvent("job-paused", 1, "PAUSED", 50))
		Eventually(eventPhase(ns, "msg_paused")).Should(Equal(hooksv1alpha1.EventPartiallyFailed))
		mapState(ns, "PAUSED", hooksv1alpha1.JobStateIgnored)
		replayEvent(ns, "msg_paused", "1")
		Eventually(eventPhase(ns, "msg_paused")).Should(Equal(hooksv1alpha1.EventIgnored))
		Expect(event(ns, "msg_paused").Status.Operations).To(BeEmpty(), "no Unmapped operation is left")
		Consistently(func() bool { return noJob(ns, "job-paused") }, "2s").Should(BeTrue())
		Expect(billing.Charges(key(ns, "job-paused"))).To(Equal(0))
	})
})

// withBatches adds a route completing and charging every job of a jobs.batch event.
func withBatches(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
	wp.Spec.Routes = append(wp.Spec.Routes, hooksv1alpha1.Route{EventType: "jobs.batch",
		Operations: []hooksv1alpha1.RouteOperation{
			{Type: hooksv1alpha1.OperationJobCompletion, ForEach: ".data.jobs", JobCompletion: &hooksv1alpha1.JobCompletionMapping{
				JobID: ".id", State: ".state"}},
			{Type: hooksv1alpha1.OperationBillingSettlement, ForEach: ".data.jobs", When: `jobState(item.state) == "Succeeded"`,
				Settlement: &hooksv1alpha1.SettlementMapping{BillingProviderRef: fixtures.BillingProviderName, JobID: ".id",
					Customer: "$.data.customer", Usage: &hooksv1alpha1.UsageMapping{Quantity: ".tokens", Meter: "tokens", Unit: "tokens"}}},
		}})
}

var _ = Describe("replay of an event whose jobs' states map to different meanings", func() {
	It("leaves the event as it is and says why: the facts held assume one meaning for all", func() {
		ns := newTenant(withBatches)
		sendOK(ns, "msg_batch", `{"type":"jobs.batch","data":{"customer":"cus_b","jobs":[`+
			`{"id":"job-b1","state":"FINISHED","tokens":5},{"id":"job-b2","state":"PAUSED","tokens":6}]}}`)
		Eventually(eventPhase(ns, "msg_batch")).Should(Equal(hooksv1alpha1.EventPartiallyFailed))
		mapState(ns, "FINISHED", hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded))
		mapState(ns, "PAUSED", hooksv1alpha1.JobStateIgnored)
		replayEvent(ns, "msg_batch", "1")
		Eventually(func() string { return readyOfEvent(ns, "msg_batch")().Message }).Should(ContainSubstring("map to different meanings"))
		Expect(eventPhase(ns, "msg_batch")()).To(Equal(hooksv1alpha1.EventPartiallyFailed))
		Consistently(func() bool { return noJob(ns, "job-b1") && noJob(ns, "job-b2") }, "2s").Should(BeTrue())
		Expect(billing.Charges(key(ns, "job-b1"))).To(Equal(0))
	})
})

var _ = Describe("an event with an unmapped job state and the archive on", Ordered, func() {
	var (
		pg    *pgtest.Server
		store *archive.Store
	)
	BeforeAll(func() {
		pg, store = startArchive()
		mgr.stop()
		mgr = startManager(managerOptions{store: store, archiveAfter: time.Second})
	})
	AfterAll(func() { backToTheManagerWithoutArchive(store, pg) })

	It("stays in the cluster until it is replayed, then is charged once and archived like any other", func() {
		ns := newTenant()
		body := fixtures.JobEvent("job-arc-map", 1, "TIMED_OUT", 300)
		sendOK(ns, "msg_arc_map", body)
		Eventually(eventPhase(ns, "msg_arc_map")).Should(Equal(hooksv1alpha1.EventPartiallyFailed))

		By("not archived while its state is unmapped: a redelivery finds it and is a duplicate")
		Consistently(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", "msg_arc_map")},
				&hooksv1alpha1.WebhookEvent{})
		}, "4s").Should(Succeed())
		got, err := store.Event(ctx, ns, "inference", "msg_arc_map")
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(BeNil(), "an event with an unmapped state is not finished, so not archived")
		mapState(ns, "TIMED_OUT", hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded))
		r := send(ns, "msg_arc_map", body)
		Expect(string(r.Body)).To(ContainSubstring(`"duplicate"`), "the stored event answers a redelivery: replay it instead")
		Consistently(func() bool { return noJob(ns, "job-arc-map") }, "2s").Should(BeTrue())

		By("replayed, it is dispatched, charged once, and then archived and removed")
		replayEvent(ns, "msg_arc_map", "1")
		Eventually(settlementState(ns, "job-arc-map")).Should(Equal(hooksv1alpha1.SettlementSettled))
		idem := settlementOf(ns, "job-arc-map").Spec.IdempotencyKey
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", "msg_arc_map")},
				&hooksv1alpha1.WebhookEvent{}))
		}).WithTimeout(45 * time.Second).Should(BeTrue())
		arch, err := store.Event(ctx, ns, "inference", "msg_arc_map")
		Expect(err).NotTo(HaveOccurred())
		Expect(arch).NotTo(BeNil())
		Expect(arch.Phase).To(Equal(string(hooksv1alpha1.EventComplete)))

		By("a redelivery after archival is a duplicate from the archive: still one charge")
		r = send(ns, "msg_arc_map", body)
		Expect(string(r.Body)).To(ContainSubstring(`"duplicate"`))
		Consistently(func() int { return posts(billing.CallsFor(idem)) }, "2s").Should(Equal(1))
	})
})
