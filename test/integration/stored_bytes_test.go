package integration_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
)

// storedJSON is the object as the API server returns it (what it keeps in etcd, as
// JSON), by kind's resource and name.
func storedJSON(ns, resource, name string) []byte {
	GinkgoHelper()
	rc, err := rest.RESTClientFor(restConfigFor(hooksv1alpha1.GroupVersion))
	Expect(err).NotTo(HaveOccurred())
	raw, err := rc.Get().Namespace(ns).Resource(resource).Name(name).SetHeader("Accept", "application/json").DoRaw(ctx)
	Expect(err).NotTo(HaveOccurred())
	return raw
}

func restConfigFor(gv schema.GroupVersion) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(env.Scheme).WithoutConversion()
	return c
}

var _ = Describe("the stored bytes of one event", func() {
	// Measured as the API server returns each record (compact JSON, what etcd holds),
	// for a job without a sink charged once, once the event is Complete. Before these
	// changes: 4,030 (settlement) + 2,353 (job) + 2,664 (event) = 9,047 bytes.
	It("carry no label no reader selects on, and no status for a job applied by its creation", func() {
		ns := newTenant()
		settleTenant(ns)
		sendOK(ns, "msg_bytes", jobEvent("job-bytes", 1, 700))
		Eventually(eventPhase(ns, "msg_bytes")).Should(Equal(hooksv1alpha1.EventComplete))
		Eventually(func() bool {
			return meta.IsStatusConditionTrue(settlementOf(ns, "job-bytes").Status.Conditions, hooksv1alpha1.ConditionReady)
		}).Should(BeTrue())
		names := map[string]string{
			"webhookevents":      identity.EventName(ns, "inference", "msg_bytes"),
			"jobcompletions":     identity.JobCompletionName("inference", "job-bytes"),
			"billingsettlements": identity.SettlementName("inference", identity.DefaultSettlementKey("inference", "job-bytes")),
		}
		sizes, total := map[string]int{}, 0
		labels := map[string]map[string]any{}
		for resource, name := range names {
			raw := storedJSON(ns, resource, name)
			sizes[resource] = len(raw)
			total += len(raw)
			var obj map[string]any
			Expect(json.Unmarshal(raw, &obj)).To(Succeed())
			md := obj["metadata"].(map[string]any)
			mf, err := json.Marshal(md["managedFields"])
			Expect(err).NotTo(HaveOccurred())
			sizes[resource+" managedFields"] = len(mf)
			labels[resource], _ = md["labels"].(map[string]any)
			if resource == "jobcompletions" {
				Expect(obj).NotTo(HaveKey("status"), "a job applied by its creation has no status written")
			}
		}
		AddReportEntry("stored bytes", sizes)
		GinkgoWriter.Printf("stored bytes per event: %d %v\n", total, sizes)

		// Labels are for selectors (informers, the plugin, a person's kubectl -l): a
		// hash of a spec field that nothing selects on is stored for nothing.
		Expect(labels["jobcompletions"]).To(Equal(map[string]any{hooksv1alpha1.LabelProvider: "inference"}))
		Expect(labels["billingsettlements"]).To(SatisfyAll(
			HaveKey(hooksv1alpha1.LabelProvider), HaveKey(hooksv1alpha1.LabelBillingProvider), HaveKey(hooksv1alpha1.LabelJob),
			Not(HaveKey(hooksv1alpha1.LabelEvent)), Not(HaveKey(hooksv1alpha1.LabelSettlement))))
		Expect(labels["webhookevents"]).To(Equal(map[string]any{hooksv1alpha1.LabelProvider: "inference"}))
		// 2,353 bytes before (a status and its writer's managedFields entry, two more
		// labels); 991 measured since.
		Expect(sizes["jobcompletions"]).To(BeNumerically("<=", 1024), "a sink-less job's record fits in 1 KiB")
		// 3,824 bytes measured before a settlement wrote kstatus's Stalled (Failed and
		// RequiresReconciliation only) and its CRD defaulted observedGeneration; 3,817
		// since: nothing of either is left on a settled settlement.
		Expect(sizes["billingsettlements"]).To(BeNumerically("<=", 3824), "a settled settlement costs no more bytes than before")
	})
})
