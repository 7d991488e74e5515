package crd_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// requestTimeout is at most a minute (docs/design.md §5.4). Objects written before the
// bound with a longer one stay usable: the operator keeps writing their status, and
// other spec edits go through (CRD validation ratcheting), while the value itself can
// only be lowered to the bound (docs/decisions.md "Outbound isolation").
var _ = Describe("BillingProvider requestTimeout", Ordered, func() {
	var ns string
	BeforeAll(func() { ns = newNamespace() })

	provider := func(name string, timeout time.Duration) *hooksv1alpha1.BillingProvider {
		return &hooksv1alpha1.BillingProvider{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://billing.example.com",
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "token"},
				RequestTimeout:       &metav1.Duration{Duration: timeout}},
		}
	}

	It("is at most a minute, for every type", func() {
		expectInvalid(k8s.Create(ctx, provider("day", 24*time.Hour)), "requestTimeout is at most 1m")
		expectInvalid(k8s.Create(ctx, provider("just-over", time.Minute+time.Second)), "requestTimeout is at most 1m")
		Expect(k8s.Create(ctx, provider("minute", time.Minute))).To(Succeed())
	})

	It("keeps an object written before the bound usable, and lets its value only come down", func() {
		// An object of the CRD before the bound: the rule is taken out, the object
		// written, and the rule put back, as an upgrade finds it.
		scheme := testenv.Scheme()
		Expect(apiextensionsv1.AddToScheme(scheme)).To(Succeed())
		crds, err := client.New(cfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		crd := &apiextensionsv1.CustomResourceDefinition{}
		Expect(crds.Get(ctx, client.ObjectKey{Name: "billingproviders.hooks.settlement.dev"}, crd)).To(Succeed())
		original := crd.DeepCopy()
		timeout := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["requestTimeout"]
		Expect(timeout.XValidations).NotTo(BeEmpty())
		timeout.XValidations = nil
		crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["requestTimeout"] = timeout
		Expect(crds.Update(ctx, crd)).To(Succeed())
		old := provider("before-the-bound", 24*time.Hour)
		Eventually(func() error { return k8s.Create(ctx, old.DeepCopy()) }).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(old), old)).To(Succeed())

		Expect(crds.Get(ctx, client.ObjectKey{Name: crd.Name}, crd)).To(Succeed())
		crd.Spec = original.Spec
		Expect(crds.Update(ctx, crd)).To(Succeed())
		Eventually(func() error { return k8s.Create(ctx, provider("after-the-bound", 24*time.Hour)) }).
			WithTimeout(30 * time.Second).Should(HaveOccurred())

		// The operator writes its status: a condition saying it does not answer.
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(old), old)).To(Succeed())
		old.Status.Conditions = []metav1.Condition{{Type: hooksv1alpha1.ConditionReady, Status: metav1.ConditionFalse,
			Reason: hooksv1alpha1.ReasonProviderNotAnswering, Message: "no answer within 1m0s", LastTransitionTime: metav1.Now()}}
		Expect(k8s.Status().Update(ctx, old)).To(Succeed())
		// Another edit of its spec goes through while requestTimeout is left as it is.
		old.Spec.Endpoint = "https://billing-2.example.com"
		Expect(k8s.Update(ctx, old)).To(Succeed())
		// A change of the value itself must meet the bound.
		old.Spec.RequestTimeout = &metav1.Duration{Duration: 12 * time.Hour}
		expectInvalid(k8s.Update(ctx, old), "requestTimeout is at most 1m")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(old), old)).To(Succeed())
		old.Spec.RequestTimeout = &metav1.Duration{Duration: 30 * time.Second}
		Expect(k8s.Update(ctx, old)).To(Succeed())
	})
})
