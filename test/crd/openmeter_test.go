package crd_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// spec.openMeter: refused with a message that says what to fix, on the real API server.
var _ = Describe("OpenMeter BillingProvider validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })
	openMeter := func(name string) *hooksv1alpha1.BillingProvider {
		return &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderOpenMeter, Endpoint: hooksv1alpha1.OpenMeterCloudEndpoint,
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "token"},
				OpenMeter:            &hooksv1alpha1.OpenMeterSettings{Meters: []hooksv1alpha1.OpenMeterMeter{{Meter: "tokens", EventType: "prompt.tokens"}}}}}
	}

	It("takes a provider with its event types, and defaults the source", func() {
		bp := openMeter("om")
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		Expect(bp.Spec.OpenMeter.Source).To(Equal(hooksv1alpha1.DefaultOpenMeterSource))
		dedup := openMeter("om-dedup")
		dedup.Spec.OpenMeter.Deduplication = &hooksv1alpha1.OpenMeterDeduplication{Window: metav1.Duration{Duration: time.Hour}}
		Expect(k8s.Create(ctx, dedup)).To(Succeed())
	})

	It("refuses settings without their type, a type without its settings, and bad meters", func() {
		none := openMeter("om-none")
		none.Spec.OpenMeter = nil
		expectInvalid(k8s.Create(ctx, none), "openMeter is required for type OpenMeter and applies to it only")
		http := openMeter("om-http")
		http.Spec.Type = hooksv1alpha1.BillingProviderHTTP
		expectInvalid(k8s.Create(ctx, http), "openMeter is required for type OpenMeter and applies to it only")
		noMeters := openMeter("om-no-meters")
		noMeters.Spec.OpenMeter.Meters = nil
		expectInvalid(k8s.Create(ctx, noMeters), "meters")
		noType := openMeter("om-no-type")
		noType.Spec.OpenMeter.Meters[0].EventType = ""
		expectInvalid(k8s.Create(ctx, noType), "eventType")
		twice := openMeter("om-twice")
		twice.Spec.OpenMeter.Meters = append(twice.Spec.OpenMeter.Meters, hooksv1alpha1.OpenMeterMeter{Meter: "tokens", EventType: "other"})
		expectInvalid(k8s.Create(ctx, twice), "Duplicate value")
		badValue := openMeter("om-bad-value")
		badValue.Spec.OpenMeter.Meters[0].ValueProperty = "$.tokens"
		expectInvalid(k8s.Create(ctx, badValue), "valueProperty")
		reserved := openMeter("om-reserved-value")
		reserved.Spec.OpenMeter.Meters[0].ValueProperty = "settlement_key"
		expectInvalid(k8s.Create(ctx, reserved), "valueProperty may not be settlement_key or unit")
		short := openMeter("om-short")
		short.Spec.OpenMeter.Deduplication = &hooksv1alpha1.OpenMeterDeduplication{Window: metav1.Duration{Duration: time.Second}}
		expectInvalid(k8s.Create(ctx, short), "deduplication.window is at least 1m")
	})

	It("keeps the source: events are found again by it", func() {
		bp := openMeter("om-source")
		bp.Spec.OpenMeter.Source = "billing/a"
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		bp.Spec.OpenMeter.Source = "billing/b"
		expectInvalid(k8s.Update(ctx, bp), "source is immutable")
	})
})
