package controllers_test

import (
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

// Keys (issue 10): tenants never share a key, keys never collide, and a job's charge
// follows its newest completion.

var _ = Describe("keys (issue 10)", func() {
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
				Type: hooksv1alpha1.JobSinkHTTP, URL: sink.URL(), DeferDeadline: &metav1.Duration{Duration: time.Minute}}
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
		withLines := func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Routes = append(wp.Spec.Routes, hooksv1alpha1.Route{EventType: "invoice.paid",
				Operations: []hooksv1alpha1.RouteOperation{{Type: hooksv1alpha1.OperationBillingSettlement,
					ForEach: ".data.lines", Settlement: &hooksv1alpha1.SettlementMapping{
						BillingProviderRef: "billing", KeyFrom: []string{".a", ".b"}, Customer: "$.data.customer",
						Amount: &hooksv1alpha1.AmountMapping{Minor: ".cents", Currency: "USD"}}}}})
		}
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
})
