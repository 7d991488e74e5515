package crd_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// What a provider's answers prove is declared in its spec (docs/design.md §14). An
// edit that makes them prove more than they did for charges already sent — a lookup
// that finds nothing trusted where it was not, a resend deduplicated where it was
// counted — could turn an earlier attempt into a second charge, so it is refused in
// place; an edit that makes them prove less is taken.
var _ = Describe("BillingProvider edits that would make earlier charges' answers prove more", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("refuses a Lago provider's eventPipeline going from ClickHouse to Postgres, and takes the other way", func() {
		bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lago"},
			Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderLago, Endpoint: "https://api.getlago.com",
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "lago", Key: "key"},
				Lago: &hooksv1alpha1.LagoSettings{EventPipeline: hooksv1alpha1.LagoPipelineClickHouse,
					Metrics: []hooksv1alpha1.LagoMetric{{Meter: "tokens", Code: "llm_tokens", FieldName: "tokens"}}}}}
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		bp.Spec.Lago.EventPipeline = hooksv1alpha1.LagoPipelinePostgres
		expectInvalid(k8s.Update(ctx, bp), "eventPipeline cannot go from ClickHouse to Postgres in place")
		bp.Spec.Lago.EventPipeline = ""
		expectInvalid(k8s.Update(ctx, bp), "eventPipeline cannot go from ClickHouse to Postgres in place")

		pg := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lago-pg"}, Spec: *bp.Spec.DeepCopy()}
		pg.Spec.Lago.EventPipeline = ""
		Expect(k8s.Create(ctx, pg)).To(Succeed())
		Expect(pg.Spec.Lago.EventPipeline).To(Equal(hooksv1alpha1.LagoPipelinePostgres), "the default")
		pg.Spec.Lago.EventPipeline = hooksv1alpha1.LagoPipelineClickHouse
		Expect(k8s.Update(ctx, pg)).To(Succeed(), "proving less is always safe")
	})

	It("refuses an OpenMeter provider's deduplication added or lengthened, and takes it shortened or removed", func() {
		bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "om"},
			Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderOpenMeter, Endpoint: hooksv1alpha1.OpenMeterCloudEndpoint,
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "token"},
				OpenMeter:            &hooksv1alpha1.OpenMeterSettings{Meters: []hooksv1alpha1.OpenMeterMeter{{Meter: "tokens", EventType: "prompt.tokens"}}}}}
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		bp.Spec.OpenMeter.Deduplication = &hooksv1alpha1.OpenMeterDeduplication{Window: metav1.Duration{Duration: time.Hour}}
		expectInvalid(k8s.Update(ctx, bp), "deduplication cannot be added or its window lengthened in place")

		dedup := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "om-dedup"}, Spec: *bp.Spec.DeepCopy()}
		Expect(k8s.Create(ctx, dedup)).To(Succeed())
		dedup.Spec.OpenMeter.Deduplication.Window = metav1.Duration{Duration: 2 * time.Hour}
		expectInvalid(k8s.Update(ctx, dedup), "deduplication cannot be added or its window lengthened in place")
		dedup.Spec.OpenMeter.Deduplication.Window = metav1.Duration{Duration: 30 * time.Minute}
		Expect(k8s.Update(ctx, dedup)).To(Succeed(), "a shorter window proves less")
		dedup.Spec.OpenMeter.Deduplication = nil
		Expect(k8s.Update(ctx, dedup)).To(Succeed(), "no deduplication proves nothing by a resend")
	})

	It("refuses a provider's idempotencyWindow lengthened in place, and takes it shortened", func() {
		bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "windowed"},
			Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://billing.example.com",
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "token"},
				IdempotencyWindow:    &metav1.Duration{Duration: time.Hour}}}
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		bp.Spec.IdempotencyWindow = &metav1.Duration{Duration: 2 * time.Hour}
		expectInvalid(k8s.Update(ctx, bp), "idempotencyWindow cannot be lengthened in place")
		bp.Spec.IdempotencyWindow = nil
		expectInvalid(k8s.Update(ctx, bp), "idempotencyWindow cannot be lengthened in place") // the default, 24h
		bp.Spec.IdempotencyWindow = &metav1.Duration{Duration: 30 * time.Minute}
		Expect(k8s.Update(ctx, bp)).To(Succeed(), "a shorter window resends less")
	})

	It("refuses a provider's type changed in place", func() {
		bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "typed"},
			Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://billing.example.com",
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "token"}}}
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		Expect(bp.Spec.Type).To(Equal(hooksv1alpha1.BillingProviderHTTP), "the default")
		bp.Spec.Type = hooksv1alpha1.BillingProviderStripe
		expectInvalid(k8s.Update(ctx, bp), "type is immutable")
		bp.Spec.Type = ""
		Expect(k8s.Update(ctx, bp)).To(Succeed(), "left out, it is the default it was")
	})
})
