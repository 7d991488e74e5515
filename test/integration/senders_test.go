package integration_test

import (
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// A CloudEvents sender (Knative, Argo Events, an event router) configured with the
// CloudEvents preset only: one event, sent in binary mode and redelivered in
// structured mode, completes its job once and is charged once.
var _ = Describe("sender presets end to end", func() {
	It("settles a CloudEvent once, whichever mode it is delivered in", func() {
		ns := newTenant(func(_ *hooksv1alpha1.BillingProvider, wp *hooksv1alpha1.WebhookProvider) {
			wp.Spec.Sender = hooksv1alpha1.SenderCloudEvents
			wp.Spec.Signature = hooksv1alpha1.SignatureSpec{Header: "X-Api-Key", SecretRef: wp.Spec.Signature.SecretRef}
			wp.Spec.EventID, wp.Spec.EventType = hooksv1alpha1.EventIDSource{}, hooksv1alpha1.FieldSource{}
		})
		// The event's data is the payload the tenant's routes read.
		data := fixtures.JobCompletedEvent("job-ce", 1, 700)
		url := mgr.baseURL + identity.EndpointPath(ns, "inference")
		post := func(contentType string, h http.Header, body string) (int, string) {
			req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			Expect(err).NotTo(HaveOccurred())
			req.Header = h
			req.Header.Set("Content-Type", contentType)
			req.Header.Set("X-Api-Key", fixtures.StandardWebhooksSecret)
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		binary := http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"ce-1"}, "Ce-Source": {"/inference"}, "Ce-Type": {"job.completed"}}
		Eventually(func() int { code, _ := post("application/json", binary.Clone(), data); return code }).
			WithTimeout(20 * time.Second).Should(Equal(http.StatusOK))

		id := `["/inference","ce-1"]`
		Eventually(eventPhase(ns, id)).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.EventComplete))
		Eventually(jobState(ns, "job-ce")).WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.JobCompletionApplied))
		Eventually(func() hooksv1alpha1.SettlementState { return settlementOf(ns, "job-ce").Status.State }).
			WithTimeout(30 * time.Second).Should(Equal(hooksv1alpha1.SettlementSettled))

		structured := `{"specversion":"1.0","id":"ce-1","source":"/inference","type":"job.completed","data":` + data + `}`
		code, body := post("application/cloudevents+json", http.Header{}, structured)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(body).To(ContainSubstring(`"duplicate"`))
		Consistently(func() int { return billing.Charges(key(ns, "job-ce")) }).WithTimeout(3 * time.Second).Should(Equal(1))
	})
})
