package integration_test

import (
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers/webhookevent"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

// Keys: tenants never share a key, keys never collide, and a job's charge
// follows its newest completion.

// settlementOp is the outcome of an event's settlement operation, "" before dispatch.
func settlementOp(ns, id string) func() hooksv1alpha1.OperationStatus {
	return func() hooksv1alpha1.OperationStatus {
		ev := &hooksv1alpha1.WebhookEvent{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", id)}, ev); err != nil {
			return hooksv1alpha1.OperationStatus{}
		}
		for _, op := range ev.Status.Operations {
			if op.Type == hooksv1alpha1.OperationBillingSettlement {
				return op
			}
		}
		return hooksv1alpha1.OperationStatus{}
	}
}

func outcome(op hooksv1alpha1.OperationStatus) hooksv1alpha1.OperationOutcome { return op.Outcome }

// probeSettlement is a valid settlement with the given usage quantity, for dry runs.
func probeSettlement(ns, quantity string) *hooksv1alpha1.BillingSettlement {
	return &hooksv1alpha1.BillingSettlement{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"},
		Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: "probe",
			IdempotencyKey: identity.IdempotencyKey("probe"), Customer: "cus_probe",
			Usage: &hooksv1alpha1.Usage{Meter: "tokens", Quantity: quantity, Unit: "tokens"}},
	}
}

// refuseSettlements makes the API server refuse to create, in ns, any settlement
// charging quantity: a settlement create that fails for as long as the test wants. The
// returned function lifts the refusal. Both wait until the API server enforces the
// change (it loads policies asynchronously).
func refuseSettlements(ns, quantity string) (lift func()) {
	GinkgoHelper()
	return refuse(ns, fmt.Sprintf("refuse-%s-%s", ns, quantity), "billingsettlements",
		[]admissionv1.OperationType{admissionv1.Create},
		fmt.Sprintf("!has(object.spec.usage) || object.spec.usage.quantity != %q", quantity),
		"refused by the test: the create of this settlement fails",
		func() client.Object { return probeSettlement(ns, quantity) })
}

// refuseJobVersion makes the API server refuse, in ns, any JobCompletion create or
// update to the given completion version (as a failing write would), until lift.
func refuseJobVersion(ns string, version int64) (lift func()) {
	GinkgoHelper()
	return refuse(ns, fmt.Sprintf("refuse-job-%s-%d", ns, version), "jobcompletions",
		[]admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
		fmt.Sprintf("object.spec.completion.version != %d", version),
		"refused by the test: this job version cannot be written",
		func() client.Object {
			return &hooksv1alpha1.JobCompletion{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe-job"},
				Spec: hooksv1alpha1.JobCompletionSpec{Provider: "inference", JobID: "probe",
					Completion: hooksv1alpha1.Completion{Version: version, State: hooksv1alpha1.JobSucceeded, SourceEvent: "probe"}}}
		})
}

// refuse binds a ValidatingAdmissionPolicy to ns that denies ops on resource unless
// expression holds, and waits until a dry-run create of probe() is refused; lift
// removes it and waits until the probe is accepted again.
func refuse(ns, name, resource string, ops []admissionv1.OperationType, expression, message string,
	probe func() client.Object) (lift func()) {
	GinkgoHelper()
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: ops,
					Rule: admissionv1.Rule{APIGroups: []string{hooksv1alpha1.GroupVersion.Group},
						APIVersions: []string{hooksv1alpha1.GroupVersion.Version}, Resources: []string{resource}},
				}}}},
			Validations: []admissionv1.Validation{{Expression: expression, Message: message}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}},
	}
	Expect(k8s.Create(ctx, policy)).To(Succeed())
	Expect(k8s.Create(ctx, binding)).To(Succeed())
	refused := func() bool {
		err := k8s.Create(ctx, probe(), client.DryRunAll)
		Expect(err == nil || apierrors.IsInvalid(err) || apierrors.IsForbidden(err)).To(BeTrue(), "dry run: %v", err)
		return err != nil
	}
	Eventually(refused).Should(BeTrue())
	return func() {
		GinkgoHelper()
		Expect(k8s.Delete(ctx, binding)).To(Succeed())
		Expect(k8s.Delete(ctx, policy)).To(Succeed())
		Eventually(refused).Should(BeFalse())
	}
}

// redispatch asks the event's controller to dispatch it again now, rather than after
// the backoff its failed attempts earned.
func redispatch(ns, id string) {
	GinkgoHelper()
	ev := event(ns, id)
	patch := client.MergeFrom(ev.DeepCopy())
	if ev.Annotations == nil {
		ev.Annotations = map[string]string{}
	}
	ev.Annotations[hooksv1alpha1.AnnotationReconcileRequest] = fmt.Sprintf("test-%d", time.Now().UnixNano())
	Expect(k8s.Patch(ctx, ev, patch)).To(Succeed())
}

// usageCharged is the usage quantities the provider recorded under settlementKey.
func usageCharged(settlementKey string) []string {
	var q []string
	for _, r := range billing.Records() {
		if r.SettlementKey == settlementKey && r.Usage != nil {
			q = append(q, r.Usage.Quantity)
		}
	}
	return q
}

var _ = Describe("keys", func() {
	It("keeps two tenants' charges apart when both call their webhook provider inference", func() {
		nsA, nsB := newTenant(), newTenant()
		body := jobEvent("job-tenants", 1, 33) // same job, customer and usage in both
		sendOK(nsA, "msg_tenants", body)
		sendOK(nsB, "msg_tenants", body)
		Eventually(settlementState(nsA, "job-tenants")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Eventually(settlementState(nsB, "job-tenants")).Should(Equal(hooksv1alpha1.SettlementSettled))
		a, b := settlementOf(nsA, "job-tenants"), settlementOf(nsB, "job-tenants")
		Expect(a.Spec.IdempotencyKey).NotTo(Equal(b.Spec.IdempotencyKey), "tenants present different keys to a shared billing account")
		Expect(a.Spec.SettlementKey).NotTo(Equal(b.Spec.SettlementKey))
		Expect(a.Status.ProviderRef).NotTo(Equal(b.Status.ProviderRef), "neither tenant adopts the other's charge")
		Expect(billing.Charges(a.Spec.SettlementKey)).To(Equal(1))
		Expect(billing.Charges(b.Spec.SettlementKey)).To(Equal(1))
	})

	It("gives each tenant its own job sink key", func() {
		withSink := func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes[0].Operations[0].JobCompletion.Sink = &hooksv1alpha1.JobSink{
				Type: hooksv1alpha1.JobSinkHTTP, URL: sink.URL(), AllowInsecureHTTP: true, DeferDeadline: &metav1.Duration{Duration: time.Minute}}
		}
		nsA, nsB := newTenant(withSink), newTenant(withSink)
		sink.Register("job-sink-tenants")
		body := jobEvent("job-sink-tenants", 1, 3)
		sendOK(nsA, "msg_sink_tenants", body)
		Eventually(jobState(nsA, "job-sink-tenants")).Should(Equal(hooksv1alpha1.JobCompletionApplied))
		sendOK(nsB, "msg_sink_tenants", body)
		Eventually(jobState(nsB, "job-sink-tenants")).Should(Equal(hooksv1alpha1.JobCompletionApplied))
		Expect(sink.Keys("job-sink-tenants")).To(HaveLen(2), "one key per tenant for the same job and version")
	})

	Context("a route whose keys come from keyFrom", func() {
		invoice := func(customer string, lines ...[2]string) string {
			s := ""
			for i, l := range lines {
				if i > 0 {
					s += ","
				}
				s += fmt.Sprintf(`{"a":%q,"b":%q,"cents":100}`, l[0], l[1])
			}
			return fmt.Sprintf(`{"type":"invoice.paid","data":{"customer":%q,"lines":[%s]}}`, customer, s)
		}

		It("charges parts that only differ in where a slash falls as two charges", func() {
			ns := newTenant(withLines)
			sendOK(ns, "msg_slash", invoice("cus_slash", [2]string{"s/t", "u"}, [2]string{"s", "t/u"}))
			Eventually(eventPhase(ns, "msg_slash")).Should(Equal(hooksv1alpha1.EventComplete))
			ev := event(ns, "msg_slash")
			Expect(ev.Spec.Settlements).To(HaveLen(2))
			k0, k1 := ev.Spec.Settlements[0].SettlementKey, ev.Spec.Settlements[1].SettlementKey
			Expect(k0).NotTo(Equal(k1))
			for _, op := range ev.Status.Operations {
				Expect(op.Outcome).To(Equal(hooksv1alpha1.OutcomeCreated), "%s", op.Key)
			}
			Expect(billing.Charges(k0)).To(Equal(1))
			Expect(billing.Charges(k1)).To(Equal(1))
		})

		It("refuses with 400 an event two of whose items yield the same key, and stores nothing", func() {
			ns := newTenant(withLines)
			var r sender.Response
			Eventually(func() int {
				r = send(ns, "msg_dupitems", invoice("cus_dupitems", [2]string{"x", "1"}, [2]string{"x", "1"}))
				return r.Status
			}).ShouldNot(Equal(http.StatusNotFound)) // the receiver's cache has the provider
			Expect(r.Status).To(Equal(http.StatusBadRequest), r.Body)
			Expect(r.Body).To(ContainSubstring("same settlement key"))
			Expect(r.Body).To(ContainSubstring("items 0 and 1"))
			Expect(r.Body).To(ContainSubstring(".data.lines"))
			Expect(r.Body).NotTo(ContainSubstring("cus_dupitems"), "the message never echoes the payload")
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", "msg_dupitems")},
				&hooksv1alpha1.WebhookEvent{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "nothing is stored: %v", err)
		})
	})

	Context("the job's charge follows its highest version", func() {
		It("never lets an older completion create the charge while the newer one's create fails", func() {
			ns := newTenant()
			lift := refuseSettlements(ns, "20") // v2's charge cannot be created for now
			sendOK(ns, "msg_race_v2", jobEvent("job-race", 2, 20))
			Eventually(func() int64 {
				jc := &hooksv1alpha1.JobCompletion{}
				if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.JobCompletionName("inference", "job-race")}, jc); err != nil {
					return 0
				}
				return jc.Spec.Completion.Version
			}).Should(Equal(int64(2)))
			Eventually(func() string { return settlementOp(ns, "msg_race_v2")().Message }).
				Should(ContainSubstring("not dispatched yet"))

			sendOK(ns, "msg_race_v1", jobEvent("job-race", 1, 10))
			Eventually(settlementOp(ns, "msg_race_v1")).WithTimeout(10 * time.Second).
				Should(WithTransform(outcome, Equal(hooksv1alpha1.OutcomeSuperseded)))
			Consistently(settlementState(ns, "job-race")).WithTimeout(2*time.Second).Should(BeEmpty(),
				"an older completion never creates the job's settlement")

			lift()
			redispatch(ns, "msg_race_v2")
			Eventually(settlementState(ns, "job-race")).Should(Equal(hooksv1alpha1.SettlementSettled))
			bs := settlementOf(ns, "job-race")
			Expect(bs.Spec.Usage.Quantity).To(Equal("20"), "the newest completion's usage is charged")
			Expect(bs.Spec.SourceEvent).To(Equal(event(ns, "msg_race_v2").Name))
			Expect(usageCharged(bs.Spec.SettlementKey)).To(Equal([]string{"20"}), "charged once, with v2's usage")
			Eventually(settlementOp(ns, "msg_race_v2")).Should(WithTransform(outcome, Equal(hooksv1alpha1.OutcomeCreated)))
			Eventually(eventPhase(ns, "msg_race_v2")).Should(Equal(hooksv1alpha1.EventComplete))
			Eventually(eventPhase(ns, "msg_race_v1")).Should(Equal(hooksv1alpha1.EventComplete))
		})

		// receivedTogether stores v2 then v1 of job with the event controller off (as when
		// both arrive within one reconcile of each other and the leader's workers pick them
		// up together: the e2e failed so on a fresh clone, v1 charged with its usage and
		// v2's settlement a Conflict although v2 was received first), then works on v1
		// first with the controller's own reconciler. It returns that reconciler; the
		// manager runs without the event controller until restart is called.
		receivedTogether := func(ns, job string) (rec *webhookevent.Reconciler, restart func()) {
			GinkgoHelper()
			mgr.stop()
			mgr = startManager(managerOptions{noEventController: true})
			restored := false
			restart = func() {
				if !restored {
					mgr.stop()
					mgr, restored = startManager(), true
				}
			}
			DeferCleanup(restart)
			sendOK(ns, "msg_"+job+"_v2", jobEvent(job, 2, 20))
			sendOK(ns, "msg_"+job+"_v1", jobEvent(job, 1, 10))
			Eventually(func() int {
				var l hooksv1alpha1.WebhookEventList
				Expect(mgr.m.GetClient().List(ctx, &l, client.InNamespace(ns))).To(Succeed())
				return len(l.Items)
			}).Should(Equal(2), "both are in the manager's cache")
			rec = &webhookevent.Reconciler{Client: mgr.m.GetClient(), APIReader: mgr.m.GetAPIReader(),
				Recorder: mgr.m.GetEventRecorder("webhookevent")}
			res, err := rec.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(event(ns, "msg_"+job+"_v1"))})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.RequeueAfter).To(BeNumerically(">", 0), "it looks again even if nothing it watches changes")
			op := settlementOp(ns, "msg_"+job+"_v1")()
			Expect(op.Outcome).To(Equal(hooksv1alpha1.OutcomePending))
			Expect(op.Message).To(ContainSubstring(fmt.Sprintf("version 2 of job %q was received in %s", job, event(ns, "msg_"+job+"_v2").Name)))
			Expect(settlementState(ns, job)()).To(BeEmpty(), "v1 makes no charge while v2 waits")
			return rec, restart
		}

		It("never lets a completion received after a newer one create the charge, whatever order they are worked on", func() {
			ns := newTenant()
			_, restart := receivedTogether(ns, "job-order")
			restart() // the event controller works on v2, then v1 again
			Eventually(eventPhase(ns, "msg_job-order_v2")).Should(Equal(hooksv1alpha1.EventComplete))
			Eventually(settlementOp(ns, "msg_job-order_v1")).Should(WithTransform(outcome, Equal(hooksv1alpha1.OutcomeSuperseded)))
			Eventually(eventPhase(ns, "msg_job-order_v1")).Should(Equal(hooksv1alpha1.EventComplete))
			Eventually(settlementState(ns, "job-order")).Should(Equal(hooksv1alpha1.SettlementSettled))
			bs := settlementOf(ns, "job-order")
			Expect(bs.Spec.SourceEvent).To(Equal(event(ns, "msg_job-order_v2").Name))
			Expect(usageCharged(bs.Spec.SettlementKey)).To(Equal([]string{"20"}), "charged once, with v2's usage")
			Expect(jobOf(ns, "job-order").Spec.Completion.Version).To(Equal(int64(2)))
		})

		It("keeps the older completion waiting while the newer one's proposal to the job fails", func() {
			ns := newTenant()
			rec, restart := receivedTogether(ns, "job-stuck") // v1 made the JobCompletion (v1) and waits
			lift := refuseJobVersion(ns, 2)
			key := func(id string) reconcile.Request {
				return reconcile.Request{NamespacedName: client.ObjectKeyFromObject(event(ns, id))}
			}
			_, err := rec.Reconcile(ctx, key("msg_job-stuck_v2"))
			Expect(err).To(HaveOccurred(), "v2's proposal of version 2 is refused")
			Expect(event(ns, "msg_job-stuck_v2").Status.Operations).NotTo(BeEmpty(), "v2's attempt is recorded, undecided")
			_, err = rec.Reconcile(ctx, key("msg_job-stuck_v1"))
			Expect(err).NotTo(HaveOccurred())
			Expect(settlementOp(ns, "msg_job-stuck_v1")().Outcome).To(Equal(hooksv1alpha1.OutcomePending),
				"an event that tried and failed to propose its version is not dispatched")
			Expect(settlementState(ns, "job-stuck")()).To(BeEmpty())
			lift()
			restart()
			Eventually(settlementState(ns, "job-stuck")).Should(Equal(hooksv1alpha1.SettlementSettled))
			Expect(usageCharged(settlementOf(ns, "job-stuck").Spec.SettlementKey)).To(Equal([]string{"20"}))
			Eventually(settlementOp(ns, "msg_job-stuck_v1")).Should(WithTransform(outcome, Equal(hooksv1alpha1.OutcomeSuperseded)))
		})

		It("lets the older completion charge after all when the newer one is deleted before it was dispatched", func() {
			ns := newTenant()
			rec, restart := receivedTogether(ns, "job-gone")
			Expect(k8s.Delete(ctx, event(ns, "msg_job-gone_v2"))).To(Succeed())
			Eventually(func() int {
				var l hooksv1alpha1.WebhookEventList
				Expect(mgr.m.GetClient().List(ctx, &l, client.InNamespace(ns))).To(Succeed())
				return len(l.Items)
			}).Should(Equal(1))
			_, err := rec.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(event(ns, "msg_job-gone_v1"))})
			Expect(err).NotTo(HaveOccurred())
			Expect(settlementOp(ns, "msg_job-gone_v1")().Outcome).To(Equal(hooksv1alpha1.OutcomeCreated),
				"with v2 gone, v1's own reconcile makes the charge")
			restart()
			Eventually(settlementState(ns, "job-gone")).Should(Equal(hooksv1alpha1.SettlementSettled))
			Expect(usageCharged(settlementOf(ns, "job-gone").Spec.SettlementKey)).To(Equal([]string{"10"}), "v1 is the job's only report now")
			Eventually(eventPhase(ns, "msg_job-gone_v1")).Should(Equal(hooksv1alpha1.EventComplete))
		})

		It("supersedes, not conflicts, an older completion whose charge was still pending when a newer one was charged", func() {
			ns := newTenant()
			lift := refuseSettlements(ns, "10") // v1's charge cannot be created for now
			sendOK(ns, "msg_late_v1", jobEvent("job-late", 1, 10))
			Eventually(func() string { return settlementOp(ns, "msg_late_v1")().Message }).
				Should(ContainSubstring("not dispatched yet"))

			sendOK(ns, "msg_late_v2", jobEvent("job-late", 2, 20))
			Eventually(settlementState(ns, "job-late")).Should(Equal(hooksv1alpha1.SettlementSettled))
			lift()
			redispatch(ns, "msg_late_v1")
			Eventually(settlementOp(ns, "msg_late_v1")).
				Should(WithTransform(outcome, Equal(hooksv1alpha1.OutcomeSuperseded)))
			Eventually(eventPhase(ns, "msg_late_v1")).Should(Equal(hooksv1alpha1.EventComplete))
			bs := settlementOf(ns, "job-late")
			Expect(usageCharged(bs.Spec.SettlementKey)).To(Equal([]string{"20"}))
		})
	})
})

// withLines adds a route charging each line of an invoice.paid event under the key of
// its .a and .b fields (keyFrom).
func withLines(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
	wp.Spec.Routes = append(wp.Spec.Routes, hooksv1alpha1.Route{EventType: "invoice.paid",
		Operations: []hooksv1alpha1.RouteOperation{{Type: hooksv1alpha1.OperationBillingSettlement,
			ForEach: ".data.lines", Settlement: &hooksv1alpha1.SettlementMapping{
				BillingProviderRef: "billing", KeyFrom: []string{".a", ".b"}, Customer: "$.data.customer",
				Amount: &hooksv1alpha1.AmountMapping{Minor: ".cents", Currency: "USD"}}}}})
}
