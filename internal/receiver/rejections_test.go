package receiver

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// Refused deliveries on the provider (decisions.md "Rejections").
var _ = Describe("rejected deliveries", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})
	})

	lastRejection := func(g Gomega) *hooksv1alpha1.DeliveryRejection {
		var p hooksv1alpha1.WebhookProvider
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, &p)).To(Succeed())
		return p.Status.LastRejection
	}
	rejectionEvents := func(g Gomega) []eventsv1.Event {
		var l eventsv1.EventList
		g.Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
		var out []eventsv1.Event
		for _, e := range l.Items {
			if e.Reason == hooksv1alpha1.ReasonDeliveriesRejected && e.Regarding.Name == "inference" {
				out = append(out, e)
			}
		}
		return out
	}
	patches := func() int64 {
		n, ok := statusPatches.Load(ns + "/inference")
		if !ok {
			return 0
		}
		return n.(*atomic.Int64).Load()
	}
	// The value that is missing elsewhere: it must never show up in status, Event or log.
	const secretish = "cus_secret_value_42"
	noCustomer := strings.Replace(completedV2, `"customer":"cus_1",`, "", 1)

	It("records a missing field's path and count on the provider, with one Event and one log line, and no write per delivery", func() {
		start := time.Now()
		for i := range 12 {
			// The value of another field is unique to this spec, to be looked for.
			body := strings.Replace(noCustomer, `"job-1"`, fmt.Sprintf(`"%s-%d"`, secretish, i), 1)
			r := send(ns, "inference", fmt.Sprintf("msg_missing_%d", i), body)
			Expect(r.Status).To(Equal(http.StatusBadRequest), r.Body)
			Expect(r.Body).To(ContainSubstring("customer is missing"))
		}
		Eventually(func(g Gomega) {
			lr := lastRejection(g)
			g.Expect(lr).NotTo(BeNil())
			g.Expect(lr.Reason).To(Equal(hooksv1alpha1.RejectionMissingField))
			g.Expect(lr.Path).To(Equal(".data.customer"))
			g.Expect(lr.Signed).To(BeTrue())
			g.Expect(lr.Count).To(BeEquivalentTo(12))
		}).WithTimeout(4 * rejectionFlush).Should(Succeed())
		Expect(testutil.ToFloat64(rejectionsTotal.WithLabelValues(ns, "inference", hooksv1alpha1.RejectionMissingField))).To(BeEquivalentTo(12))

		// More of them: the count grows, still no Event beyond the first.
		for i := range 5 {
			r := send(ns, "inference", fmt.Sprintf("msg_more_%d", i), noCustomer)
			Expect(r.Status).To(Equal(http.StatusBadRequest), r.Body)
		}
		Eventually(func(g Gomega) {
			g.Expect(lastRejection(g).Count).To(BeEquivalentTo(17))
		}).WithTimeout(4 * rejectionFlush).Should(Succeed())
		elapsed := time.Since(start)
		// At most one write per flush interval (plus the first, which is immediate).
		Expect(patches()).To(BeNumerically("<=", int64(elapsed/rejectionFlush)+1))
		Expect(patches()).To(BeNumerically("<", 17), "not one write per delivery")

		Eventually(func(g Gomega) {
			g.Expect(rejectionEvents(g)).To(HaveLen(1))
		}).Should(Succeed())
		Consistently(func(g Gomega) {
			g.Expect(rejectionEvents(g)).To(HaveLen(1))
		}).WithTimeout(2 * rejectionFlush).Should(Succeed())
		ev := rejectionEvents(Default)[0]
		Expect(ev.Type).To(Equal("Warning"))
		Expect(ev.Note).To(ContainSubstring("MissingField at .data.customer"))

		lr := lastRejection(Default)
		for _, text := range []string{lr.Message, lr.Path, ev.Note} {
			Expect(text).NotTo(ContainSubstring(secretish))
			Expect(text).NotTo(ContainSubstring("cus_1"))
		}
		Expect(logs.String()).To(ContainSubstring("deliveries refused"))
		Expect(logs.String()).To(MatchRegexp(`deliveries refused.*"provider": "inference".*"reason": "MissingField".*"path": ".data.customer"`))
		Expect(logs.String()).NotTo(ContainSubstring(secretish))
	})

	It("keeps a signed refusal against unsigned garbage for the precedence window", func() {
		r := send(ns, "inference", "msg_signed", noCustomer)
		Expect(r.Status).To(Equal(http.StatusBadRequest), r.Body)
		Eventually(func(g Gomega) {
			g.Expect(lastRejection(g)).NotTo(BeNil())
			g.Expect(lastRejection(g).Reason).To(Equal(hooksv1alpha1.RejectionMissingField))
		}).WithTimeout(4 * rejectionFlush).Should(Succeed())

		for range 5 {
			resp := plainPost(url(ns, "inference"), "application/json", `{"type":"job.completed"}`)
			Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
			resp.Body.Close()
			resp = plainPost(url(ns, "inference"), "text/plain", `garbage`)
			Expect(resp.StatusCode).To(Equal(http.StatusUnsupportedMediaType))
			resp.Body.Close()
		}
		// Counted in the metric, not allowed to hide the signed refusal.
		Eventually(func() float64 {
			return testutil.ToFloat64(rejectionsTotal.WithLabelValues(ns, "inference", hooksv1alpha1.RejectionInvalidSignature))
		}).Should(BeEquivalentTo(5))
		Expect(testutil.ToFloat64(rejectionsTotal.WithLabelValues(ns, "inference", hooksv1alpha1.RejectionUnsupportedMediaType))).To(BeEquivalentTo(5))
		Consistently(func(g Gomega) {
			lr := lastRejection(g)
			g.Expect(lr.Reason).To(Equal(hooksv1alpha1.RejectionMissingField))
			g.Expect(lr.Count).To(BeEquivalentTo(1))
		}).WithTimeout(3 * rejectionFlush).Should(Succeed())
	})

	It("records unsigned refusals when there is no signed one, and nothing for an unknown provider", func() {
		resp := plainPost(url(ns, "inference"), "application/json", `{}`)
		Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
		resp.Body.Close()
		Eventually(func(g Gomega) {
			lr := lastRejection(g)
			g.Expect(lr).NotTo(BeNil())
			g.Expect(lr.Reason).To(Equal(hooksv1alpha1.RejectionInvalidSignature))
			g.Expect(lr.Signed).To(BeFalse())
		}).WithTimeout(4 * rejectionFlush).Should(Succeed())

		resp = plainPost(url(ns, "nosuch"), "application/json", `{}`)
		Expect(resp.StatusCode).To(Equal(http.StatusNotFound))
		resp.Body.Close()
		Expect(testutil.ToFloat64(rejectionsTotal.WithLabelValues(ns, "nosuch", hooksv1alpha1.RejectionInvalidSignature))).To(BeZero())
	})
})
