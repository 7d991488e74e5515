package integration_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/argocd"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// gitopsView is what the GitOps tools make of an object as the API server has it:
// kstatus's status (Flux's wait and healthChecks, kstatus-based tools) and Argo CD's
// health from config/argocd's script for the kind.
type gitopsView struct {
	Status      kstatus.Status
	Message     string
	ArgoHealth  string
	ArgoMessage string
	Conditions  []metav1.Condition
}

// gitopsViewOf reads obj (a WebhookProvider or BillingProvider, by name) from the API
// server as unstructured, as those tools do, and computes their view of it.
func gitopsViewOf(ns string, obj client.Object) func() gitopsView {
	gvk, err := apiutil.GVKForObject(obj, env.Scheme)
	Expect(err).NotTo(HaveOccurred())
	scripts := argocd.Scripts(GinkgoT())
	return func() gitopsView {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: obj.GetName()}, u); err != nil {
			return gitopsView{Status: kstatus.NotFoundStatus, Message: err.Error()}
		}
		res, err := kstatus.Compute(u)
		Expect(err).NotTo(HaveOccurred())
		health, msg := argocd.Health(GinkgoT(), scripts[gvk.Kind], u.Object)
		typed := obj.DeepCopyObject().(client.Object)
		Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, typed)).To(Succeed())
		var conds []metav1.Condition
		switch t := typed.(type) {
		case *hooksv1alpha1.WebhookProvider:
			conds = t.Status.Conditions
		case *hooksv1alpha1.BillingProvider:
			conds = t.Status.Conditions
		}
		return gitopsView{Status: res.Status, Message: res.Message, ArgoHealth: health, ArgoMessage: msg, Conditions: conds}
	}
}

// fluxWait waits on an object as Flux's wait does with kstatus: until it is Current
// or Failed (fail-fast), polling, and never longer than limit. It returns the last
// view, so a caller tells "failed" from "still waiting when the limit came".
func fluxWait(ns string, obj client.Object, limit time.Duration) gitopsView {
	view := gitopsViewOf(ns, obj)
	deadline := time.Now().Add(limit)
	for {
		v := view()
		if v.Status == kstatus.CurrentStatus || v.Status == kstatus.FailedStatus || time.Now().After(deadline) {
			return v
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// noAbnormalConditions: kstatus's Reconciling and Stalled are present only while True.
func noAbnormalConditions() OmegaMatcher {
	return HaveField("Conditions", Not(ContainElement(HaveField("Type",
		BeElementOf(hooksv1alpha1.ConditionReconciling, hooksv1alpha1.ConditionStalled)))))
}

func abnormal(typ, reason string) OmegaMatcher {
	return HaveField("Conditions", ContainElement(And(HaveField("Type", typ),
		HaveField("Status", metav1.ConditionTrue), HaveField("Reason", reason))))
}

var _ = Describe("GitOps health of the provider kinds (kstatus and Argo CD)", func() {
	It("reports working providers Current and Healthy, with neither Reconciling nor Stalled", func() {
		ns := newTenant()
		for _, obj := range []client.Object{fixtures.WebhookProvider(ns), fixtures.BillingProvider(ns, "")} {
			Eventually(gitopsViewOf(ns, obj)).WithTimeout(30*time.Second).Should(And(
				HaveField("Status", kstatus.CurrentStatus), HaveField("ArgoHealth", "Healthy"), noAbnormalConditions()),
				obj.GetObjectKind().GroupVersionKind().Kind)
		}
	})

	It("fails a wait on a BillingProvider whose Secret does not opt in, instead of waiting for ever", func() {
		ns := fmt.Sprintf("ops-%d", nsCounter.Add(1))
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		// The token Secret does not opt in to billing: nothing may be sent, only a change helps.
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fixtures.BillingSecretName},
			StringData: map[string]string{"token": billingToken}})).To(Succeed())
		bp := fixtures.BillingProvider(ns, billing.URL())
		Expect(k8s.Create(ctx, bp)).To(Succeed())

		v := fluxWait(ns, bp, time.Minute)
		Expect(v.Status).To(Equal(kstatus.FailedStatus), "a Flux wait on it ends failed: %+v", v)
		Expect(v).To(abnormal(hooksv1alpha1.ConditionStalled, hooksv1alpha1.ReasonCredentialsNotAllowed))
		Expect(v.Message).To(ContainSubstring(hooksv1alpha1.LabelCredentialFor), "the message says what to add")
		Expect(v.ArgoHealth).To(Equal("Degraded"))
		Expect(v.ArgoMessage).To(ContainSubstring(hooksv1alpha1.ReasonCredentialsNotAllowed))
	})

	It("reports a provider the operator has not looked at yet in progress, not Current", func() {
		ns := fmt.Sprintf("ops-%d", nsCounter.Add(1))
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		// What the API server answers to the create, before any controller wrote a
		// status, read as GitOps tools read it (unstructured).
		for _, obj := range []client.Object{fixtures.BillingProvider(ns, billing.URL()), fixtures.WebhookProvider(ns)} {
			gvk, err := apiutil.GVKForObject(obj, env.Scheme)
			Expect(err).NotTo(HaveOccurred())
			content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
			Expect(err).NotTo(HaveOccurred())
			u := &unstructured.Unstructured{Object: content}
			u.SetGroupVersionKind(gvk)
			Expect(k8s.Create(ctx, u)).To(Succeed())
			res, err := kstatus.Compute(u)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Status).To(Equal(kstatus.InProgressStatus), "%s as created: %s", gvk.Kind, res.Message)
		}
	})

	It("fails a wait on a WebhookProvider whose Secret lacks the key it names", func() {
		ns := newTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Signature.SecretRef.Keys = []string{"absent"}
		})
		v := fluxWait(ns, fixtures.WebhookProvider(ns), time.Minute)
		Expect(v.Status).To(Equal(kstatus.FailedStatus), "%+v", v)
		Expect(v).To(abnormal(hooksv1alpha1.ConditionStalled, hooksv1alpha1.ReasonSecretInvalid))
		Expect(v).NotTo(abnormal(hooksv1alpha1.ConditionReconciling, hooksv1alpha1.ReasonSecretInvalid))
		Expect(v.ArgoHealth).To(Equal("Degraded"))
	})

	It("reports a provider waiting for its Secret in progress, Stalled once the grace is over, and Current once it comes", func() {
		const later = "created-later"
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Signature.SecretRef.Name = later
			bp.Spec.CredentialsSecretRef.Name = later
		})
		wp, bp := fixtures.WebhookProvider(ns), fixtures.BillingProvider(ns, "")
		for _, obj := range []client.Object{wp, bp} {
			Eventually(gitopsViewOf(ns, obj)).WithTimeout(30 * time.Second).Should(And(
				HaveField("Status", kstatus.InProgressStatus), HaveField("ArgoHealth", "Progressing"),
				abnormal(hooksv1alpha1.ConditionReconciling, readyReasonWaitingFor(obj))))
		}
		// The suite's waiting grace is 15s: then a wait stops, failed, naming the cause.
		for _, obj := range []client.Object{wp, bp} {
			Eventually(gitopsViewOf(ns, obj)).WithTimeout(time.Minute).Should(And(
				HaveField("Status", kstatus.FailedStatus), HaveField("ArgoHealth", "Degraded"),
				abnormal(hooksv1alpha1.ConditionStalled, readyReasonWaitingFor(obj)),
				HaveField("Conditions", Not(ContainElement(HaveField("Type", hooksv1alpha1.ConditionReconciling))))))
		}

		// The Secret comes (the signing key and the opted-in token in one Secret).
		sec := &corev1.Secret{ObjectMeta: fixtures.CredentialMeta(ns, later, hooksv1alpha1.CredentialForBilling, billing.URL()),
			StringData: map[string]string{fixtures.SigningSecretKey: fixtures.StandardWebhooksSecret, "token": billingToken}}
		Expect(k8s.Create(ctx, sec)).To(Succeed())
		for _, obj := range []client.Object{wp, bp} {
			Eventually(gitopsViewOf(ns, obj)).WithTimeout(time.Minute).Should(And(
				HaveField("Status", kstatus.CurrentStatus), HaveField("ArgoHealth", "Healthy"), noAbnormalConditions()))
		}
	})

	It("ends the Flux example's health checks failed on a broken tenant, well inside its timeout", func() {
		example := fluxExample()
		// Both providers cannot work: the token Secret lacks the key the BillingProvider
		// names, and the signing Secret lacks the key the WebhookProvider names.
		ns := newTenant(func(bp *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			bp.Spec.CredentialsSecretRef.Key = "absent"
			wp.Spec.Signature.SecretRef.Keys = []string{"absent"}
		})
		Expect(example.Spec.HealthChecks).To(HaveLen(2))
		for _, hc := range example.Spec.HealthChecks {
			gvk := schema.FromAPIVersionAndKind(hc.APIVersion, hc.Kind)
			typed, err := env.Scheme.New(gvk)
			Expect(err).NotTo(HaveOccurred(), "the example checks a kind of ours")
			obj := typed.(client.Object)
			obj.SetName(hc.Name)
			start := time.Now()
			v := fluxWait(ns, obj, example.Spec.Timeout.Duration)
			Expect(v.Status).To(Equal(kstatus.FailedStatus), "%s %s: %+v", hc.Kind, hc.Name, v)
			Expect(time.Since(start)).To(BeNumerically("<", waitingGrace), "Stalled at once, not after a wait")
			Expect(v).To(HaveField("Conditions", ContainElement(And(
				HaveField("Type", hooksv1alpha1.ConditionStalled), HaveField("Message", ContainSubstring("absent"))))))
		}
	})
})

// readyReasonWaitingFor is the Ready reason of a provider whose Secret is missing.
func readyReasonWaitingFor(obj client.Object) string {
	if _, ok := obj.(*hooksv1alpha1.WebhookProvider); ok {
		return hooksv1alpha1.ReasonSecretNotFound
	}
	return hooksv1alpha1.ReasonBillingProviderNotReady
}

// fluxKustomization is the part of Flux's Kustomization the example is read for.
type fluxKustomization struct {
	Spec struct {
		Timeout      metav1.Duration `json:"timeout"`
		HealthChecks []struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"healthChecks"`
	} `json:"spec"`
}

// fluxExample reads config/flux/kustomization.yaml.
func fluxExample() fluxKustomization {
	GinkgoHelper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "flux", "kustomization.yaml"))
	Expect(err).NotTo(HaveOccurred())
	var k fluxKustomization
	Expect(yaml.Unmarshal(raw, &k)).To(Succeed())
	return k
}
