package integration_test

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	billingapi "github.com/settlement-operator/settlement-operator/internal/billing"
)

// settlementKstatus is what kstatus (Flux's wait and healthChecks) computes for the
// settlement as the API server returns it.
func settlementKstatus(bs *hooksv1alpha1.BillingSettlement) func() kstatus.Status {
	return func() kstatus.Status {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(hooksv1alpha1.GroupVersion.WithKind("BillingSettlement"))
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(bs), u); err != nil {
			return kstatus.NotFoundStatus
		}
		res, err := kstatus.Compute(u)
		Expect(err).NotTo(HaveOccurred())
		return res.Status
	}
}

var _ = Describe("GitOps health of a settlement kept in Git (kstatus)", func() {
	It("is InProgress while in flight, Current once settled, and Failed when it needs a human", func() {
		ns := newTenant()

		By("as the API server returns it on creation, before the operator has looked at it, it is in progress")
		fresh := handMade(ns, "kstatus/fresh", "cus_1", 100, "USD")
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(fresh)
		Expect(err).NotTo(HaveOccurred())
		u := &unstructured.Unstructured{Object: obj}
		u.SetGroupVersionKind(hooksv1alpha1.GroupVersion.WithKind("BillingSettlement"))
		Expect(k8s.Create(ctx, u)).To(Succeed())
		res, err := kstatus.Compute(u)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(kstatus.InProgressStatus), "not Current before the operator has looked at it")
		Eventually(stateOf(fresh)).Should(Equal(hooksv1alpha1.SettlementSettled))

		By("a settlement the provider answers 503 for is in progress, then current once settled")
		billing.RejectNext(2, http.StatusServiceUnavailable, "unavailable")
		retried := handMade(ns, "kstatus/retried", "cus_1", 100, "USD")
		Expect(k8s.Create(ctx, retried)).To(Succeed())
		Eventually(settlementKstatus(retried)).WithPolling(20 * time.Millisecond).Should(Equal(kstatus.InProgressStatus))
		Eventually(stateOf(retried)).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(settlementKstatus(retried)()).To(Equal(kstatus.CurrentStatus))
		raw := string(storedJSON(ns, "billingsettlements", retried.Name))
		Expect(raw).NotTo(Or(ContainSubstring(`"Reconciling"`), ContainSubstring(`"Stalled"`)),
			"nothing of the in-flight conditions is left on a settled settlement")

		By("a dead-lettered settlement is Failed, so a wait on it ends saying so")
		billing.RejectNext(1, http.StatusBadRequest, "card_declined")
		declined := handMade(ns, "kstatus/declined", "cus_1", 100, "USD")
		Expect(k8s.Create(ctx, declined)).To(Succeed())
		Eventually(stateOf(declined)).Should(Equal(hooksv1alpha1.SettlementFailed))
		Eventually(settlementKstatus(declined)).Should(Equal(kstatus.FailedStatus))

		By("a settlement that requires reconciliation is Failed too")
		disputed := handMade(ns, "kstatus/disputed", "cus_1", 100, "USD")
		Expect(billing.Import(billingapi.Record{IdempotencyKey: disputed.Spec.IdempotencyKey, SettlementKey: disputed.Spec.SettlementKey,
			Customer: "cus_other", Type: billingapi.TypeCharge, Status: billingapi.StatusSettled,
			Amount: &billingapi.Amount{Minor: 99999900, Currency: "USD"}})).To(Succeed())
		Expect(k8s.Create(ctx, disputed)).To(Succeed())
		Eventually(stateOf(disputed)).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		Eventually(settlementKstatus(disputed)).Should(Equal(kstatus.FailedStatus))

		By("replayed, the dead letter is in progress again and current once settled")
		patch := client.MergeFrom(get(declined).DeepCopy())
		d := get(declined)
		d.Annotations = map[string]string{hooksv1alpha1.AnnotationReplay: "1"}
		Expect(k8s.Patch(ctx, d, patch)).To(Succeed())
		Eventually(stateOf(declined)).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(settlementKstatus(declined)()).To(Equal(kstatus.CurrentStatus))
		Expect(strings.Contains(string(storedJSON(ns, "billingsettlements", declined.Name)), `"Stalled"`)).To(BeFalse())
	})
})
