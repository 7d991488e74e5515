package receiver

import (
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/settlement-operator/settlement-operator/internal/signature"
)

// post sends body with exactly the headers h (plus Content-Type) over real HTTP.
func post(u, contentType string, h http.Header, body string) (int, string) {
	GinkgoHelper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header = h.Clone()
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// asSvix renames Standard Webhooks headers the way a sender on Svix sends them.
func asSvix(h http.Header) http.Header {
	out := http.Header{}
	out.Set(signature.HeaderSvixID, h.Get(signature.HeaderWebhookID))
	out.Set(signature.HeaderSvixTimestamp, h.Get(signature.HeaderWebhookTimestamp))
	out.Set(signature.HeaderSvixSignature, h.Get(signature.HeaderWebhookSignature))
	return out
}

var _ = Describe("real senders", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("accepts a Svix delivery under svix-* headers, takes svix-id as the event ID and answers its redelivery as a duplicate", func() {
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})
		h, err := signature.Sign(swh, []byte(swhSecret), "msg_svix_1", time.Now(), []byte(completedV2))
		Expect(err).NotTo(HaveOccurred())
		code, body := post(url(ns, "inference"), "application/json", asSvix(h), completedV2)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(decode(body)).To(HaveKeyWithValue("status", OutcomeAccepted))
		evs := listEvents(ns)
		Expect(evs).To(HaveLen(1))
		Expect(evs[0].Spec.EventID).To(Equal("msg_svix_1"))

		// Svix resends with the same svix-id and a new timestamp and signature.
		h, err = signature.Sign(swh, []byte(swhSecret), "msg_svix_1", time.Now().Add(time.Second), []byte(completedV2))
		Expect(err).NotTo(HaveOccurred())
		code, body = post(url(ns, "inference"), "application/json", asSvix(h), completedV2)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(decode(body)).To(HaveKeyWithValue("status", OutcomeDuplicate))
		Expect(listEvents(ns)).To(HaveLen(1))
	})
})
