package integration_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/tombstone"
)

// deleteNamespace deletes ns the way a cluster does, and waits until it is gone so a
// namespace of the same name can be created again. envtest runs no namespace
// controller: deleting the namespace only marks it Terminating (its spec finalizer
// "kubernetes" keeps it), so the spec does the controller's work by hand — every
// object in the namespace is deleted (the admission policy is not installed here;
// test/deploy checks that it lets the namespace controller do this), the operator
// releases what its finalizers hold — and then finalizes the namespace, as the
// controller does once the namespace is empty.
func deleteNamespace(ns string) {
	GinkgoHelper()
	namespace := &corev1.Namespace{}
	Expect(k8s.Get(ctx, client.ObjectKey{Name: ns}, namespace)).To(Succeed())
	Expect(k8s.Delete(ctx, namespace)).To(Succeed())
	kinds := []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}, &eventsv1.Event{},
		&hooksv1alpha1.WebhookProvider{}, &hooksv1alpha1.WebhookEvent{}, &hooksv1alpha1.JobCompletion{},
		&hooksv1alpha1.BillingSettlement{}, &hooksv1alpha1.BillingProvider{}, &hooksv1alpha1.ReconciliationReport{}}
	lists := []client.ObjectList{&corev1.SecretList{}, &corev1.ConfigMapList{}, &eventsv1.EventList{},
		&hooksv1alpha1.WebhookProviderList{}, &hooksv1alpha1.WebhookEventList{}, &hooksv1alpha1.JobCompletionList{},
		&hooksv1alpha1.BillingSettlementList{}, &hooksv1alpha1.BillingProviderList{}, &hooksv1alpha1.ReconciliationReportList{}}
	Eventually(func(g Gomega) {
		for i, obj := range kinds {
			g.Expect(k8s.DeleteAllOf(ctx, obj, client.InNamespace(ns))).To(Succeed())
			g.Expect(k8s.List(ctx, lists[i], client.InNamespace(ns))).To(Succeed())
			items, err := apimeta.ExtractList(lists[i])
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(items).To(BeEmpty(), "%T left in namespace %s", obj, ns)
		}
	}).WithTimeout(time.Minute).Should(Succeed())
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Get(ctx, client.ObjectKey{Name: ns}, namespace)).To(Succeed())
	namespace.Spec.Finalizers = nil
	_, err = cs.CoreV1().Namespaces().Finalize(ctx, namespace, metav1.UpdateOptions{})
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}))
	}).Should(BeTrue())
}

// A namespace deleted without an archive takes its records; the provider's books do
// not forget what was charged there. Created again under the same name, the namespace
// derives the same settlement names and keys (docs/design.md §3), so a delivery of
// the old life — the old event again, or a new completion version of a job charged
// then — must not be taken for a job never seen: once the provider's key window has
// passed, a charge sent as never presented (exposure None, one POST, no lookup) is a
// second charge.
var _ = Describe("a namespace deleted without an archive and created again", func() {
	It("never charges a job of its earlier life twice: not for the old event again, nor for a new completion version", func() {
		ns := newTenant()
		sendOK(ns, "msg_nsdel_old", jobEvent("job-nsdel-old", 1, 300))
		sendOK(ns, "msg_nsdel_v1", jobEvent("job-nsdel-v2", 1, 200))
		Eventually(settlementState(ns, "job-nsdel-old")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Eventually(settlementState(ns, "job-nsdel-v2")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(billing.Charges(key(ns, "job-nsdel-old"))).To(Equal(1))
		Expect(billing.Charges(key(ns, "job-nsdel-v2"))).To(Equal(1))

		oldName, v2Name := settlementOf(ns, "job-nsdel-old").Name, settlementOf(ns, "job-nsdel-v2").Name
		deleteNamespace(ns)
		// What left with the namespace left its name and key in the operator's namespace.
		var cms corev1.ConfigMapList
		Expect(k8s.List(ctx, &cms, client.InNamespace(operatorNamespace),
			client.MatchingLabels{hooksv1alpha1.LabelTombstonesOf: ns})).To(Succeed())
		recorded := map[string]string{}
		for _, cm := range cms.Items {
			for name, v := range cm.Data {
				recorded[name] = v
			}
		}
		Expect(recorded).To(HaveLen(2))
		Expect(recorded).To(HaveKeyWithValue(oldName, ContainSubstring(identity.NamespacedIdempotencyKey(ns, key(ns, "job-nsdel-old")))))
		Expect(recorded).To(HaveKeyWithValue(v2Name, ContainSubstring(`"state":"Settled"`)))

		billing.ForgetKeys() // the provider's idempotency window passes
		tenantIn(ns, billingToken)

		// The sender delivers the old event again (its receipt went with the
		// namespace), and a job of the earlier life reports a new completion version.
		sendOK(ns, "msg_nsdel_old", jobEvent("job-nsdel-old", 1, 300))
		sendOK(ns, "msg_nsdel_v2", jobEvent("job-nsdel-v2", 2, 250))
		for _, job := range []string{"job-nsdel-old", "job-nsdel-v2"} {
			Eventually(settlementState(ns, job)).ShouldNot(Or(BeEmpty(), Equal(hooksv1alpha1.SettlementPending)))
		}
		// Charges at the provider: the old event's job, the job with a new version.
		Consistently(func() []int {
			return []int{billing.Charges(key(ns, "job-nsdel-old")), billing.Charges(key(ns, "job-nsdel-v2"))}
		}).WithTimeout(5*time.Second).Should(Equal([]int{1, 1}), "charged again in the namespace's second life")

		// Neither was taken for never presented: each asked the provider by key first.
		// The old event's charge is the provider's record, adopted without a POST; the
		// new version's usage is not what the provider holds under the job's key, so a
		// human decides (a charge is never edited).
		old := settlementOf(ns, "job-nsdel-old")
		Expect(old.Status.State).To(Equal(hooksv1alpha1.SettlementSettled))
		Expect(old.Status.Attempts).To(BeZero(), "nothing was sent")
		Expect(old.Status.Exposure).To(Equal(hooksv1alpha1.ExposureConfirmed))
		v2 := settlementOf(ns, "job-nsdel-v2")
		Expect(v2.Status.State).To(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		Expect(v2.Status.Attempts).To(BeZero(), "nothing was sent")
		Expect(v2.Status.Disagreement).NotTo(BeNil())
		for _, bs := range []*hooksv1alpha1.BillingSettlement{old, v2} {
			for _, c := range billing.CallsFor(bs.Spec.IdempotencyKey)[1:] {
				Expect(c.Method).To(Equal(http.MethodGet), "the second life only asked")
			}
		}
		Eventually(func() []string { return recordEventReasons(ns) }).Should(
			ContainElements(hooksv1alpha1.ReasonPresentedBeforeNamespaceDeletion, hooksv1alpha1.ReasonPresentedBeforeNamespaceDeletion),
			"a Warning on each says why it asked first")
	})

	It("sends nothing to a provider that cannot be asked (Stripe meter events) for a charge of its earlier life", func() {
		fake := startFakeStripe()
		ns := stripeTenantOn(fake, withUsageItems)
		usage := `{"type":"usage.reported","data":{"customer":"cus_nsdel","items":[{"id":"u-nsdel","n":40}]}}`
		itemSettlement := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns,
			Name: identity.SettlementNameFor("inference", identity.FieldsSettlementKey(ns, "inference", "u-nsdel"))}}
		itemState := func() hooksv1alpha1.SettlementState {
			got := &hooksv1alpha1.BillingSettlement{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(itemSettlement), got); err != nil {
				return ""
			}
			return got.Status.State
		}
		// A job's charge (created with its job: fresh) and a keyFrom charge (fresh by
		// the facts: nothing holds its name or keys).
		sendOK(ns, "msg_nsdel_meter", jobEvent("job-nsdel-meter", 1, 70))
		sendOK(ns, "msg_nsdel_usage", usage)
		Eventually(settlementState(ns, "job-nsdel-meter")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Eventually(itemState).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(fake.MeterEvents()).To(HaveLen(2))

		deleteNamespace(ns)
		fake.ForgetKeys() // Stripe's 24 hours pass: a duplicate identifier is a new meter event
		tenantIn(ns, stripeAPIKey, stripeBilling(fake), withLines, withUsageItems)
		sendOK(ns, "msg_nsdel_meter", jobEvent("job-nsdel-meter", 1, 70))
		sendOK(ns, "msg_nsdel_usage", usage)

		// Their facts would say "never presented" (nothing in the cluster or an archive
		// holds them): the tombstones say otherwise, and Stripe cannot be asked whether
		// it holds a meter event, so a human checks the dashboard.
		Eventually(settlementState(ns, "job-nsdel-meter")).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		Eventually(itemState).Should(Equal(hooksv1alpha1.SettlementRequiresReconciliation))
		for _, bs := range []*hooksv1alpha1.BillingSettlement{settlementOf(ns, "job-nsdel-meter"), get(itemSettlement)} {
			Expect(bs.Status.Attempts).To(BeZero(), "%s: nothing was sent", bs.Name)
			Expect(condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady).Reason).To(Equal(hooksv1alpha1.ReasonProviderCannotAnswer))
		}
		Consistently(fake.MeterEvents).WithTimeout(3*time.Second).Should(HaveLen(2), "charged again in the namespace's second life")
		Eventually(func() []string { return recordEventReasons(ns) }).Should(
			ContainElements(hooksv1alpha1.ReasonPresentedBeforeNamespaceDeletion, hooksv1alpha1.ReasonPresentedBeforeNamespaceDeletion),
			"a Warning on each says why it was not sent as new")
	})

	It("keeps tombstones where another deployment serving the namespace later finds them", func() {
		ns := newTenant()
		bs := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-stl-0123456789abcdef0123456789abcdef"},
			Spec:   hooksv1alpha1.BillingSettlementSpec{IdempotencyKey: "stl_0123456789abcdef0123456789abcdef"},
			Status: hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSettled}}
		Expect(tombstones.Record(ctx, bs)).To(Succeed())
		// The namespace, created again, is served by another deployment (another leader
		// election ID) in the same operator namespace: it must find the earlier life's keys.
		other := &tombstone.Keeper{Client: k8s, Namespace: operatorNamespace}
		found, _, err := other.Find(ctx, ns, bs.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(found).NotTo(BeNil(), "a tombstone only the deployment that wrote it can find: the namespace's next deployment charges the key again")
		Expect(found.IdempotencyKey).To(Equal(bs.Spec.IdempotencyKey))
	})

	It("holds a settlement whose tombstone cannot be written, says why, and lets it go once it can", func() {
		ns := newTenant()
		sendOK(ns, "msg_nsdel_full", jobEvent("job-nsdel-full", 1, 90))
		Eventually(settlementState(ns, "job-nsdel-full")).Should(Equal(hooksv1alpha1.SettlementSettled))
		bs := settlementOf(ns, "job-nsdel-full")
		// The namespace's tombstone ConfigMap that would take it is full.
		full := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace,
			Name:   tombstone.ConfigMapName(ns, bs.Name),
			Labels: map[string]string{hooksv1alpha1.LabelTombstonesOf: ns}},
			Data: map[string]string{"filler": strings.Repeat("x", tombstone.MaxBytes)}}
		Expect(k8s.Create(ctx, full)).To(Succeed())

		namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		Expect(k8s.Delete(ctx, namespace)).To(Succeed())
		Expect(k8s.DeleteAllOf(ctx, &hooksv1alpha1.BillingSettlement{}, client.InNamespace(ns))).To(Succeed())
		Eventually(func(g Gomega) {
			got := &hooksv1alpha1.BillingSettlement{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)).To(Succeed())
			ready := condition(got.Status.Conditions, hooksv1alpha1.ConditionReady)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Reason).To(Equal(hooksv1alpha1.ReasonTombstoneNotWritten))
			g.Expect(ready.Message).To(And(ContainSubstring("tombstones are full"), ContainSubstring("configure an archive")))
		}).Should(Succeed())
		Consistently(func() []string {
			got := &hooksv1alpha1.BillingSettlement{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)).To(Succeed())
			return got.Finalizers
		}).WithTimeout(3*time.Second).Should(ContainElement(hooksv1alpha1.FinalizerSettlementProtection),
			"a settled charge never leaves without a record of its key")

		// Once there is room, a reconcile request (allowed in a namespace being deleted)
		// retries at once rather than at the next recheck.
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(full), full)).To(Succeed())
		delete(full.Data, "filler")
		Expect(k8s.Update(ctx, full)).To(Succeed())
		got := &hooksv1alpha1.BillingSettlement{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)).To(Succeed())
		patch := client.MergeFrom(got.DeepCopy())
		metav1.SetMetaDataAnnotation(&got.ObjectMeta, hooksv1alpha1.AnnotationReconcileRequest, "room-made")
		Expect(k8s.Patch(ctx, got, patch)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(bs), &hooksv1alpha1.BillingSettlement{}))
		}).Should(BeTrue())
		t, name, err := tombstones.Find(ctx, ns, bs.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(name).To(Equal(bs.Name))
		Expect(t.IdempotencyKey).To(Equal(bs.Spec.IdempotencyKey))
		Expect(t.State).To(Equal(hooksv1alpha1.SettlementSettled))
		Expect(t.ProviderRef).To(Equal(bs.Status.ProviderRef))
	})

	It("keeps every tombstone when a namespace's settlements leave at once", func() {
		// A namespace's deletion releases all its settlements together, and they share
		// its 16 tombstone ConfigMaps: no writer may lose another's entry.
		const ns, n = "nsdel-many", 64
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				bs := &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("inference-stl-%03d", i)},
					Spec:   hooksv1alpha1.BillingSettlementSpec{IdempotencyKey: fmt.Sprintf("stl_%03d", i)},
					Status: hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSettled}}
				errs[i] = tombstones.Record(ctx, bs)
			}()
		}
		wg.Wait()
		for i := range n {
			Expect(errs[i]).NotTo(HaveOccurred(), "settlement %d", i)
			t, _, err := tombstones.Find(ctx, ns, fmt.Sprintf("inference-stl-%03d", i))
			Expect(err).NotTo(HaveOccurred())
			Expect(t).NotTo(BeNil(), "settlement %d", i)
			Expect(t.IdempotencyKey).To(Equal(fmt.Sprintf("stl_%03d", i)))
		}
	})
})
