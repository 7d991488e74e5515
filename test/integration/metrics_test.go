package integration_test

import (
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
)

// sampleOf is the value of the series name{labels} gathered from g (false when absent).
func sampleOf(g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	GinkgoHelper()
	families, err := g.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

var _ = Describe("metrics an SRE alerts on (docs/decisions.md \"Metrics\")", func() {
	It("reports the oldest unsettled settlement's age per namespace and billing provider, 0 when idle", func() {
		ns := newTenant() // BillingProvider "billing", nothing sent: idle
		key := "manual/" + ns
		bs := &hooksv1alpha1.BillingSettlement{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: identity.SettlementName("manual", key)},
			Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "ghost", SettlementKey: key,
				IdempotencyKey: identity.IdempotencyKey(key), Type: hooksv1alpha1.SettlementCharge,
				Customer: "cus_o", Amount: &hooksv1alpha1.Amount{Minor: 100, Currency: "USD"}},
		}
		Expect(k8s.Create(ctx, bs)).To(Succeed()) // its provider does not exist: it stays unsettled

		collector := metrics.NewObjectsCollector(k8s)
		collector.Now = func() time.Time { return bs.CreationTimestamp.Add(90 * time.Minute) }
		reg := prometheus.NewPedanticRegistry()
		Expect(reg.Register(collector)).To(Succeed())

		age, ok := sampleOf(reg, "settlement_oldest_unsettled_seconds", map[string]string{"namespace": ns, "billing_provider": "ghost"})
		Expect(ok).To(BeTrue())
		Expect(age).To(Equal(5400.0))
		idle, ok := sampleOf(reg, "settlement_oldest_unsettled_seconds", map[string]string{"namespace": ns, "billing_provider": "billing"})
		Expect(ok).To(BeTrue(), "an idle provider reports 0 rather than no series")
		Expect(idle).To(Equal(0.0))

		// A younger unsettled settlement of the same provider does not lower the age.
		later := bs.DeepCopy()
		later.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: identity.SettlementName("manual", key+"-2")}
		later.Spec.SettlementKey = key + "-2"
		later.Spec.IdempotencyKey = identity.IdempotencyKey(key + "-2")
		Expect(k8s.Create(ctx, later)).To(Succeed())
		Expect(later.CreationTimestamp.Time).NotTo(BeTemporally("<", bs.CreationTimestamp.Time))
		age, _ = sampleOf(reg, "settlement_oldest_unsettled_seconds", map[string]string{"namespace": ns, "billing_provider": "ghost"})
		Expect(age).To(Equal(5400.0))
	})

	It("counts a reconciliation finding once, not on every pass that sees it again", func() {
		ns := reconcilingTenant()
		sendOK(ns, "msg_q", jobEvent("job-q", 1, 1))
		Expect(send(ns, "msg_q", jobEvent("job-q", 1, 2)).Status).To(Equal(http.StatusConflict)) // quarantined: stays

		// Three completed passes that each report the quarantined event.
		Eventually(func() int {
			var l hooksv1alpha1.ReconciliationReportList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
			n := 0
			for _, rr := range l.Items {
				for _, d := range rr.Status.Items {
					if d.Type == hooksv1alpha1.DiscrepancyEventQuarantined && rr.Status.Phase == hooksv1alpha1.ReportCompleted {
						n++
					}
				}
			}
			return n
		}).WithTimeout(45 * time.Second).Should(BeNumerically(">=", 3))

		n, ok := sampleOf(crmetrics.Registry, "settlement_reconciliation_discrepancies_total",
			map[string]string{"namespace": ns, "billing_provider": "billing", "type": string(hooksv1alpha1.DiscrepancyEventQuarantined)})
		Expect(ok).To(BeTrue())
		Expect(n).To(Equal(1.0), "the same finding seen by several passes is one new finding")
	})
})
