package crd_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

var _ = Describe("a Metronome BillingProvider", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })
	metronome := func(name string) *hooksv1alpha1.BillingProvider {
		bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://api.metronome.com",
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "token"}}}
		bp.Spec.Type = hooksv1alpha1.BillingProviderMetronome
		bp.Spec.Metronome = &hooksv1alpha1.MetronomeSettings{Meters: []hooksv1alpha1.MetronomeMeter{{Meter: "tokens", EventType: "tokens_used"}}}
		return bp
	}

	It("needs its meters, keeps them to its type, and defaults the quantity property", func() {
		ok := metronome("metronome-ok")
		Expect(k8s.Create(ctx, ok)).To(Succeed())
		Expect(ok.Spec.Metronome.Meters[0].QuantityProperty).To(Equal("quantity"), "defaulted by the API server")

		bare := metronome("metronome-bare")
		bare.Spec.Metronome = nil
		expectInvalid(k8s.Create(ctx, bare), "a Metronome provider needs spec.metronome")
		onHTTP := metronome("http-metronome")
		onHTTP.Spec.Type = hooksv1alpha1.BillingProviderHTTP
		expectInvalid(k8s.Create(ctx, onHTTP), "spec.metronome applies to type Metronome only")
		empty := metronome("metronome-no-meters")
		empty.Spec.Metronome.Meters = nil
		expectInvalid(k8s.Create(ctx, empty), "meters")
		noType := metronome("metronome-no-event-type")
		noType.Spec.Metronome.Meters[0].EventType = ""
		expectInvalid(k8s.Create(ctx, noType), "eventType")
		reserved := metronome("metronome-reserved")
		reserved.Spec.Metronome.Meters[0].QuantityProperty = "settlement_key"
		expectInvalid(k8s.Create(ctx, reserved), "quantityProperty may not be settlement_key or settlement_unit")
		twice := metronome("metronome-meter-twice")
		twice.Spec.Metronome.Meters = append(twice.Spec.Metronome.Meters, hooksv1alpha1.MetronomeMeter{Meter: "tokens", EventType: "other"})
		expectInvalid(k8s.Create(ctx, twice), "Duplicate value")

		// billableMetricID: optional, a UUID, one usage meter per billable metric.
		const metric = "3f6c2a8e-9b1d-4e57-a0c4-7d2e8f1b5a93"
		withMetric := metronome("metronome-metric")
		withMetric.Spec.Metronome.Meters[0].BillableMetricID = metric
		Expect(k8s.Create(ctx, withMetric)).To(Succeed())
		notUUID := metronome("metronome-metric-not-uuid")
		notUUID.Spec.Metronome.Meters[0].BillableMetricID = "tokens-metric"
		expectInvalid(k8s.Create(ctx, notUUID), "billableMetricID")
		metricTwice := metronome("metronome-metric-twice")
		metricTwice.Spec.Metronome.Meters[0].BillableMetricID = metric
		metricTwice.Spec.Metronome.Meters = append(metricTwice.Spec.Metronome.Meters,
			hooksv1alpha1.MetronomeMeter{Meter: "gpu", EventType: "gpu_seconds", BillableMetricID: strings.ToUpper(metric)})
		expectInvalid(k8s.Create(ctx, metricTwice), "each Metronome billableMetricID is mapped from one usage meter only")
	})
})
