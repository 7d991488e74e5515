package receiver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/signature"
)

// hmacHex is HMAC-SHA256 as the senders' documentation computes it, independent of
// internal/signature.
func hmacHex(key, content string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(content))
	return hex.EncodeToString(m.Sum(nil))
}

// presetProvider is inferenceProvider with a sender preset instead of an explicit
// signature scheme, event ID and type.
func presetProvider(ns, name string, sender hooksv1alpha1.Sender, secretName string) *hooksv1alpha1.WebhookProvider {
	p := inferenceProvider(ns)
	p.Name = name
	p.Spec.Sender = sender
	p.Spec.Signature = hooksv1alpha1.SignatureSpec{SecretRef: hooksv1alpha1.SigningSecretReference{Name: secretName}}
	p.Spec.EventID = hooksv1alpha1.EventIDSource{}
	p.Spec.EventType = hooksv1alpha1.FieldSource{}
	return p
}

// dataPaths makes the inference routes read the payload's top level (a CloudEvent's
// data, an EventBridge event's detail...) under prefix.
func dataPaths(p *hooksv1alpha1.WebhookProvider, prefix string) {
	for i := range p.Spec.Routes[0].Operations {
		op := &p.Spec.Routes[0].Operations[i]
		if m := op.JobCompletion; m != nil {
			m.JobID, m.CompletionVersion, m.State, m.CompletedAt, m.Usage.Quantity = prefix+".job_id", prefix+".version", prefix+".state", prefix+".completed_at", prefix+".usage.tokens"
		}
		if m := op.Settlement; m != nil {
			m.JobID, m.Customer, m.Usage.Quantity = prefix+".job_id", prefix+".customer", prefix+".usage.tokens"
		}
	}
}

const ceData = `{"job_id":"job-ce","version":1,"state":"succeeded","customer":"cus_1","completed_at":"2026-11-30T12:00:00Z","usage":{"tokens":42}}`

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

	It("serves sender Svix with no scheme, event ID or type configured", func() {
		install(presetProvider(ns, "svix", hooksv1alpha1.SenderSvix, "svix-secret"), map[string]string{"key": swhSecret})
		h, err := signature.Sign(swh, []byte(swhSecret), "msg_preset_1", time.Now(), []byte(completedV2))
		Expect(err).NotTo(HaveOccurred())
		code, body := post(url(ns, "svix"), "application/json", asSvix(h), completedV2)
		Expect(code).To(Equal(http.StatusOK), body)
		evs := listEvents(ns)
		Expect(evs).To(HaveLen(1))
		Expect(evs[0].Spec.EventID).To(Equal("msg_preset_1"))
		Expect(evs[0].Spec.EventType).To(Equal("job.completed"))
	})

	It("serves sender Stripe: the key is the whole whsec_ string, the event ID the body's id", func() {
		const secret = "whsec_stripe_preset_secret"
		install(presetProvider(ns, "stripe", hooksv1alpha1.SenderStripe, "stripe-secret"), map[string]string{"key": secret})
		body := strings.Replace(completedV2, `{"type"`, `{"id":"evt_1Nq","object":"event","type"`, 1)
		// As Stripe documents it: signed_payload = t + "." + body, HMAC-SHA256 keyed
		// with the endpoint's signing secret, hex, in Stripe-Signature "t=…,v1=…".
		t := strconv.FormatInt(time.Now().Unix(), 10)
		h := http.Header{"Stripe-Signature": {"t=" + t + ",v1=" + hmacHex(secret, t+"."+body)}}
		code, answer := post(url(ns, "stripe"), "application/json; charset=utf-8", h, body)
		Expect(code).To(Equal(http.StatusOK), answer)
		Expect(listEvents(ns)[0].Spec.EventID).To(Equal("evt_1Nq"))
		// Keyed with the base64 decoding of the secret instead, it is refused.
		h = http.Header{"Stripe-Signature": {"t=" + t + ",v1=" + hmacHex("\xb2\xda", t+"."+body)}}
		code, answer = post(url(ns, "stripe"), "application/json", h, body)
		Expect(code).To(Equal(http.StatusUnauthorized), answer)
	})

	It("serves sender GitHub: X-Hub-Signature-256 over the body, and a redelivery with the same body is a duplicate", func() {
		const secret = "It's a Secret to Everybody"
		p := presetProvider(ns, "github", hooksv1alpha1.SenderGitHub, "github-secret")
		p.Spec.Signature.InsecureAllowReplay = true
		p.Spec.EventID = hooksv1alpha1.EventIDSource{DerivedFrom: []string{".data.job_id", ".data.version"}}
		p.Spec.EventType = hooksv1alpha1.FieldSource{JSONPath: ".type"}
		install(p, map[string]string{"key": secret})
		h := http.Header{"X-Hub-Signature-256": {"sha256=" + hmacHex(secret, completedV2)},
			"X-GitHub-Delivery": {"72d3162e-cc78-11e3-81ab-4c9367dc0958"}, "X-GitHub-Event": {"workflow_job"}}
		code, body := post(url(ns, "github"), "application/json", h, completedV2)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(decode(body)).To(HaveKeyWithValue("status", OutcomeAccepted))
		// A replay under a new (unsigned) delivery ID is still the same event.
		h.Set("X-GitHub-Delivery", "00000000-0000-0000-0000-000000000000")
		code, body = post(url(ns, "github"), "application/json", h, completedV2)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(decode(body)).To(HaveKeyWithValue("status", OutcomeDuplicate))
		h.Set("X-Hub-Signature-256", "sha256="+hmacHex("another secret", completedV2))
		code, _ = post(url(ns, "github"), "application/json", h, completedV2)
		Expect(code).To(Equal(http.StatusUnauthorized))
		Expect(listEvents(ns)).To(HaveLen(1))
	})

	It("serves sender EventBridge with the connection's API key, and refuses a wrong or missing one", func() {
		p := presetProvider(ns, "eventbridge", hooksv1alpha1.SenderEventBridge, "eb-secret")
		p.Spec.Signature.Header = "x-api-key"
		p.Spec.Routes[0].EventType = "Job Completed"
		dataPaths(p, ".detail")
		install(p, map[string]string{"key": "eb-api-key-value\n"})
		// An EventBridge event as an API destination posts it (no input transformer).
		body := `{"version":"0","id":"6a7e8feb-b491-4cf7-a9f1-bf3703467718","detail-type":"Job Completed","source":"inference",` +
			`"account":"111122223333","time":"2026-11-30T12:00:00Z","region":"eu-west-1","resources":[],"detail":` + ceData + `}`
		code, answer := post(url(ns, "eventbridge"), "application/json; charset=utf-8", http.Header{"X-Api-Key": {"eb-api-key-value"}}, body)
		Expect(code).To(Equal(http.StatusOK), answer)
		evs := listEvents(ns)
		Expect(evs).To(HaveLen(1))
		Expect(evs[0].Spec.EventID).To(Equal("6a7e8feb-b491-4cf7-a9f1-bf3703467718"))
		Expect(evs[0].Spec.JobCompletions[0].JobID).To(Equal("job-ce"))
		for _, h := range []http.Header{{"X-Api-Key": {"eb-api-key-valuX"}}, {}} {
			code, answer = post(url(ns, "eventbridge"), "application/json", h, body)
			Expect(code).To(Equal(http.StatusUnauthorized), answer)
		}
	})

	Describe("CloudEvents", func() {
		install := func(ns string) {
			p := presetProvider(ns, "ce", hooksv1alpha1.SenderCloudEvents, "ce-secret")
			p.Spec.Signature.Header = "Authorization"
			dataPaths(p, "")
			install(p, map[string]string{"token": "Bearer ce-token"})
		}
		auth := func(h http.Header) http.Header { h.Set("Authorization", "Bearer ce-token"); return h }
		binary := func(id string) http.Header {
			return auth(http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {id}, "Ce-Source": {"/inference/eu"}, "Ce-Type": {"job.completed"}})
		}
		structured := func(source, id string) string {
			return `{"specversion":"1.0","id":"` + id + `","source":"` + source + `","type":"job.completed","datacontenttype":"application/json","data":` + ceData + `}`
		}

		It("accepts binary mode, takes ce-id within ce-source as the event ID and routes on the data", func() {
			install(ns)
			code, body := post(url(ns, "ce"), "application/json", binary("ce-1"), ceData)
			Expect(code).To(Equal(http.StatusOK), body)
			evs := listEvents(ns)
			Expect(evs).To(HaveLen(1))
			Expect(evs[0].Spec.EventID).To(Equal(`["/inference/eu","ce-1"]`))
			Expect(evs[0].Spec.EventType).To(Equal("job.completed"))
			Expect(evs[0].Spec.JobCompletions[0].JobID).To(Equal("job-ce"))
			code, body = post(url(ns, "ce"), "application/json", binary("ce-1"), ceData)
			Expect(decode(body)).To(HaveKeyWithValue("status", OutcomeDuplicate), body)
			Expect(code).To(Equal(http.StatusOK))
		})

		It("accepts structured mode; the same source and id in either mode is one event, another source another", func() {
			install(ns)
			code, body := post(url(ns, "ce"), "application/cloudevents+json; charset=utf-8", auth(http.Header{}), structured("/inference/eu", "ce-2"))
			Expect(code).To(Equal(http.StatusOK), body)
			Expect(decode(body)).To(HaveKeyWithValue("status", OutcomeAccepted))
			// The same event redelivered in binary mode: a duplicate (same ID, same data).
			code, body = post(url(ns, "ce"), "application/json", binary("ce-2"), ceData)
			Expect(code).To(Equal(http.StatusOK), body)
			Expect(decode(body)).To(HaveKeyWithValue("status", OutcomeDuplicate))
			// The same ce-id from another source is another event.
			code, body = post(url(ns, "ce"), "application/cloudevents+json", auth(http.Header{}), structured("/inference/us", "ce-2"))
			Expect(code).To(Equal(http.StatusOK), body)
			Expect(decode(body)).To(HaveKeyWithValue("status", OutcomeAccepted))
			Expect(listEvents(ns)).To(HaveLen(2))
		})

		It("refuses batched mode with 415 saying what to send instead, and a malformed event with 400 naming what is wrong", func() {
			install(ns)
			code, body := post(url(ns, "ce"), "application/cloudevents-batch+json", auth(http.Header{}), "["+structured("/s", "b-1")+"]")
			Expect(code).To(Equal(http.StatusUnsupportedMediaType), body)
			Expect(decode(body)["message"]).To(ContainSubstring("send each event in its own request"))
			// Recorded on the provider like any 415, so on-call sees what the sender does.
			Eventually(func() string {
				var p hooksv1alpha1.WebhookProvider
				Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "ce"}, &p)).To(Succeed())
				if p.Status.LastRejection == nil {
					return ""
				}
				return p.Status.LastRejection.Reason
			}).WithTimeout(20 * time.Second).Should(Equal(hooksv1alpha1.RejectionUnsupportedMediaType))

			h := binary("ce-3")
			h.Del("Ce-Source")
			code, body = post(url(ns, "ce"), "application/json", h, ceData)
			Expect(code).To(Equal(http.StatusBadRequest), body)
			Expect(decode(body)["message"]).To(ContainSubstring("ce-source is missing"))

			code, body = post(url(ns, "ce"), "application/json", auth(http.Header{}), ceData)
			Expect(code).To(Equal(http.StatusBadRequest), body)
			Expect(decode(body)["message"]).To(ContainSubstring("not a CloudEvent"))

			b64 := `{"specversion":"1.0","id":"x","source":"/s","type":"job.completed","data_base64":"e30="}`
			code, body = post(url(ns, "ce"), "application/cloudevents+json", auth(http.Header{}), b64)
			Expect(code).To(Equal(http.StatusBadRequest), body)
			Expect(decode(body)["message"]).To(ContainSubstring("data_base64"))

			// Without the credential, nothing is read at all.
			code, _ = post(url(ns, "ce"), "application/json", http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"x"}, "Ce-Source": {"/s"}, "Ce-Type": {"job.completed"}}, ceData)
			Expect(code).To(Equal(http.StatusUnauthorized))
			Expect(listEvents(ns)).To(BeEmpty())
		})
	})

	It("refuses preset configurations that cannot work, saying what to set, and keeps explicit ones valid", func() {
		try := func(mutate func(p *hooksv1alpha1.WebhookProvider)) error {
			p := presetProvider(ns, "bad", hooksv1alpha1.SenderEventBridge, "s")
			p.Spec.Signature.Header = "x-api-key"
			mutate(p)
			p.ObjectMeta = metav1.ObjectMeta{Namespace: ns, GenerateName: "bad-"}
			return k8s.Create(ctx, p)
		}
		Expect(try(func(p *hooksv1alpha1.WebhookProvider) {})).To(Succeed())
		for msg, m := range map[string]func(p *hooksv1alpha1.WebhookProvider){
			"set signature.header to the header carrying the shared credential": func(p *hooksv1alpha1.WebhookProvider) { p.Spec.Signature.Header = "" },
			"spec.sender sets signature.scheme": func(p *hooksv1alpha1.WebhookProvider) {
				p.Spec.Signature.Scheme = hooksv1alpha1.SchemeAPIKey
			},
			"signature.scheme is required unless spec.sender names a preset": func(p *hooksv1alpha1.WebhookProvider) {
				p.Spec.Sender = ""
			},
			"leave signature.header, prefix, encoding, timestampHeader and signedHeaders unset": func(p *hooksv1alpha1.WebhookProvider) {
				p.Spec.Sender = hooksv1alpha1.SenderSvix
			},
			"set signature.insecureAllowReplay: true": func(p *hooksv1alpha1.WebhookProvider) {
				p.Spec.Sender, p.Spec.Signature.Header = hooksv1alpha1.SenderGitHub, ""
				p.Spec.EventID, p.Spec.EventType = hooksv1alpha1.EventIDSource{JSONPath: ".id"}, hooksv1alpha1.FieldSource{JSONPath: ".action"}
			},
			"X-GitHub-Delivery and X-GitHub-Event headers are not signed": func(p *hooksv1alpha1.WebhookProvider) {
				p.Spec.Sender, p.Spec.Signature.Header, p.Spec.Signature.InsecureAllowReplay = hooksv1alpha1.SenderGitHub, "", true
			},
			"leave eventID and eventType unset": func(p *hooksv1alpha1.WebhookProvider) {
				p.Spec.Sender, p.Spec.EventID = hooksv1alpha1.SenderCloudEvents, hooksv1alpha1.EventIDSource{JSONPath: ".id"}
			},
			"shorter than this sender's documented retry window": func(p *hooksv1alpha1.WebhookProvider) {
				p.Spec.Retention = &hooksv1alpha1.RetentionSpec{Events: &metav1.Duration{Duration: 48 * time.Hour},
					ProviderRetryWindow: &metav1.Duration{Duration: 12 * time.Hour}}
			},
		} {
			err := try(m)
			Expect(err).To(HaveOccurred(), msg)
			Expect(err.Error()).To(ContainSubstring(msg))
		}
	})
})
