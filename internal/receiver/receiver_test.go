package receiver

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/extract"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

const (
	swhSecret   = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swhSecret2  = "whsec_dGhlLW5ldy1rZXktYWZ0ZXItcm90YXRpb24="
	completedV2 = `{"type":"job.completed","data":{"job_id":"job-1","version":2,"state":"succeeded","customer":"cus_1","completed_at":"2026-11-30T12:00:00Z","usage":{"tokens":1523}}}`
)

var swh = signature.Config{Scheme: signature.SchemeStandardWebhooks}

func inferenceProvider(ns string) *hooksv1alpha1.WebhookProvider {
	return &hooksv1alpha1.WebhookProvider{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference"},
		Spec: hooksv1alpha1.WebhookProviderSpec{
			Signature: hooksv1alpha1.SignatureSpec{
				Scheme:    hooksv1alpha1.SchemeStandardWebhooks,
				SecretRef: hooksv1alpha1.SigningSecretReference{Name: "inference-secret", Keys: []string{"current"}},
			},
			EventID:   hooksv1alpha1.EventIDSource{Header: "webhook-id"},
			EventType: hooksv1alpha1.FieldSource{JSONPath: ".type"},
			Routes: []hooksv1alpha1.Route{{
				EventType: "job.completed",
				Operations: []hooksv1alpha1.RouteOperation{
					{Type: hooksv1alpha1.OperationJobCompletion, JobCompletion: &hooksv1alpha1.JobCompletionMapping{
						JobID: ".data.job_id", CompletionVersion: ".data.version", State: ".data.state",
						CompletedAt: ".data.completed_at",
						Usage:       &hooksv1alpha1.UsageMapping{Quantity: ".data.usage.tokens", Meter: "tokens", Unit: "tokens"},
					}},
					{Type: hooksv1alpha1.OperationBillingSettlement, Settlement: &hooksv1alpha1.SettlementMapping{
						BillingProviderRef: "billing", JobID: ".data.job_id", Customer: ".data.customer",
						Usage: &hooksv1alpha1.UsageMapping{Quantity: ".data.usage.tokens", Meter: "tokens", Unit: "tokens"},
					}},
				},
			}},
		},
	}
}

// install creates the provider's Secret and the provider, and waits until the
// receiver's cache knows the provider.
func install(p *hooksv1alpha1.WebhookProvider, secretData map[string]string) {
	GinkgoHelper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Spec.Signature.SecretRef.Name},
		StringData: secretData}
	Expect(k8s.Create(ctx, s)).To(Succeed())
	Expect(k8s.Create(ctx, p)).To(Succeed())
	Eventually(func() error {
		return mgrCache.Get(ctx, client.ObjectKeyFromObject(p), &hooksv1alpha1.WebhookProvider{})
	}).Should(Succeed())
}

func send(ns, provider, id, body string, mods ...func(*sender.Delivery)) sender.Response {
	GinkgoHelper()
	d := sender.Delivery{URL: url(ns, provider), Signature: swh, Secret: []byte(swhSecret), ID: id, Body: []byte(body)}
	for _, m := range mods {
		m(&d)
	}
	resp, err := sender.Send(ctx, nil, d)
	Expect(err).NotTo(HaveOccurred())
	return resp
}

func decode(body string) map[string]string {
	GinkgoHelper()
	m := map[string]string{}
	Expect(json.Unmarshal([]byte(body), &m)).To(Succeed(), body)
	return m
}

var _ = Describe("the receiver", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})
	})

	Describe("refusals before anything is read", func() {
		It("answers 405 to anything but POST", func() {
			resp, err := http.Get(url(ns, "inference"))
			Expect(err).NotTo(HaveOccurred())
			Expect(resp.StatusCode).To(Equal(http.StatusMethodNotAllowed))
			Expect(resp.Header.Get("Allow")).To(Equal("POST"))
			b, _ := io.ReadAll(resp.Body)
			Expect(decode(string(b))).To(HaveKeyWithValue("error", OutcomeMethodNotAllowed))
		})

		It("answers 415 to a body that is not JSON", func() {
			resp := plainPost(url(ns, "inference"), "text/plain", completedV2)
			Expect(resp.StatusCode).To(Equal(http.StatusUnsupportedMediaType))
		})

		It("accepts JSON media types with parameters and +json suffixes", func() {
			Expect(isJSON("application/json; charset=utf-8")).To(BeTrue())
			Expect(isJSON("application/cloudevents+json")).To(BeTrue())
			Expect(isJSON("application/x-www-form-urlencoded")).To(BeFalse())
			Expect(isJSON("")).To(BeFalse())
		})

		It("answers 413 to a body over the limit", func() {
			big := `{"type":"job.completed","pad":"` + strings.Repeat("x", 70<<10) + `"}`
			r := send(ns, "inference", "msg_big", big)
			Expect(r.Status).To(Equal(http.StatusRequestEntityTooLarge))
			Expect(listEvents(ns)).To(BeEmpty())
		})

		It("answers 404 for an unknown provider, without storing anything", func() {
			r := send(ns, "nobody", "msg_1", completedV2)
			Expect(r.Status).To(Equal(http.StatusNotFound))
			Expect(decode(r.Body)).To(HaveKeyWithValue("error", OutcomeUnknownProvider))
		})
	})

	Describe("authentication", func() {
		It("answers 401 to a missing or wrong signature and stores nothing", func() {
			resp := plainPost(url(ns, "inference"), "application/json", completedV2)
			Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))

			r := send(ns, "inference", "msg_1", completedV2, func(d *sender.Delivery) {
				d.Secret = []byte("whsec_" + "d3Jvbmcgc2VjcmV0IGZvciB0ZXN0cw==")
			})
			Expect(r.Status).To(Equal(http.StatusUnauthorized))
			Expect(r.Body).NotTo(ContainSubstring("MfKQ9r8"), "a secret must never appear in an answer")
			Expect(listEvents(ns)).To(BeEmpty())
		})

		It("refuses a timestamp 6 minutes old or 6 minutes in the future, and accepts 4 minutes", func() {
			for _, skew := range []time.Duration{-6 * time.Minute, 6 * time.Minute} {
				r := send(ns, "inference", "msg_skew", completedV2, func(d *sender.Delivery) {
					d.Timestamp = time.Now().Add(skew)
				})
				Expect(r.Status).To(Equal(http.StatusUnauthorized), "skew %s", skew)
				Expect(r.Body).To(ContainSubstring("tolerance"))
			}
			r := send(ns, "inference", "msg_skew", completedV2, func(d *sender.Delivery) {
				d.Timestamp = time.Now().Add(-4 * time.Minute)
			})
			Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		})

		It("tries both named keys during a rotation, so it loses no delivery, and never an unnamed one", func() {
			withNewKey := func(d *sender.Delivery) { d.Secret = []byte(swhSecret2) }
			Expect(k8s.Patch(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-secret"},
				StringData: map[string]string{"next": swhSecret2}}, client.Merge)).To(Succeed())
			// In the Secret but not named: it signs nothing.
			Expect(send(ns, "inference", "msg_rotated", completedV2, withNewKey).Status).To(Equal(http.StatusUnauthorized))

			// A merge patch, not an update: the provider's status is written meanwhile,
			// and an update from a stale read would conflict.
			Expect(k8s.Patch(ctx, &hooksv1alpha1.WebhookProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference"}},
				client.RawPatch(types.MergePatchType, []byte(`{"spec":{"signature":{"secretRef":{"keys":["current","next"]}}}}`)))).To(Succeed())
			// Signed with the new key: accepted once the receiver sees the named key.
			Eventually(func() int {
				return send(ns, "inference", "msg_rotated", completedV2, withNewKey).Status
			}).WithTimeout(15 * time.Second).WithPolling(time.Second).Should(Equal(http.StatusOK))
			// The old key still works during the rotation.
			Expect(send(ns, "inference", "msg_old_key", completedV2).Status).To(Equal(http.StatusOK))
		})

		It("answers 503 (our failure, never 4xx) while the signing Secret is missing", func() {
			p := inferenceProvider(ns)
			p.Name = "nosecret"
			p.Spec.Signature.SecretRef.Name = "does-not-exist"
			Expect(k8s.Create(ctx, p)).To(Succeed())
			Eventually(func() error {
				return mgrCache.Get(ctx, client.ObjectKeyFromObject(p), &hooksv1alpha1.WebhookProvider{})
			}).Should(Succeed())
			r := send(ns, "nosecret", "msg_1", completedV2)
			Expect(r.Status).To(Equal(http.StatusServiceUnavailable))
			Expect(r.RetryAfter).NotTo(BeEmpty())
		})
	})

	Describe("storing events", func() {
		It("stores one WebhookEvent with the extracted facts and answers 200 accepted", func() {
			r := send(ns, "inference", "msg_first", completedV2)
			Expect(r.Status).To(Equal(http.StatusOK), r.Body)
			ans := decode(r.Body)
			Expect(ans).To(HaveKeyWithValue("status", OutcomeAccepted))
			Expect(ans["event"]).To(Equal(identity.EventName(ns, "inference", "msg_first")))

			var ev hooksv1alpha1.WebhookEvent
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ans["event"]}, &ev)).To(Succeed())
			Expect(ev.Labels).To(HaveKeyWithValue(hooksv1alpha1.LabelProvider, "inference"))
			Expect(ev.Spec.EventID).To(Equal("msg_first"))
			Expect(ev.Spec.EventType).To(Equal("job.completed"))
			wantHash, err := identity.CanonicalHash([]byte(completedV2))
			Expect(err).NotTo(HaveOccurred())
			Expect(ev.Spec.PayloadHash).To(Equal(wantHash))
			Expect(ev.Spec.RawPayload).To(BeEmpty(), "raw payload storage is opt-in")
			Expect(ev.Spec.JobCompletions).To(HaveLen(1))
			jc := ev.Spec.JobCompletions[0]
			Expect(jc.JobID).To(Equal("job-1"))
			Expect(jc.Version).To(Equal(int64(2)))
			Expect(jc.State).To(Equal(hooksv1alpha1.JobSucceeded))
			Expect(jc.CompletedAt.UTC().Format(time.RFC3339)).To(Equal("2026-11-30T12:00:00Z"))
			Expect(*jc.Usage).To(Equal(hooksv1alpha1.Usage{Meter: "tokens", Quantity: "1523", Unit: "tokens"}))
			Expect(ev.Spec.Settlements).To(HaveLen(1))
			st := ev.Spec.Settlements[0]
			Expect(st.SettlementKey).To(Equal(identity.JobSettlementKey(ns, "inference", "job-1")))
			Expect(st.Customer).To(Equal("cus_1"))
			Expect(st.BillingProviderRef).To(Equal("billing"))
		})

		It("answers a duplicate 200 duplicate from a read, with no write", func() {
			Expect(send(ns, "inference", "msg_dup", completedV2).Status).To(Equal(http.StatusOK))
			before := creates.Load()
			// Give the cache time to see the event, as it would in production.
			name := identity.EventName(ns, "inference", "msg_dup")
			Eventually(func() error {
				return mgrCache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &hooksv1alpha1.WebhookEvent{})
			}).Should(Succeed())
			for i := 0; i < 5; i++ {
				r := send(ns, "inference", "msg_dup", completedV2)
				Expect(r.Status).To(Equal(http.StatusOK))
				Expect(decode(r.Body)).To(HaveKeyWithValue("status", OutcomeDuplicate))
			}
			Expect(creates.Load()).To(Equal(before), "duplicates must not write")
			Expect(listEvents(ns)).To(HaveLen(1))
		})

		It("treats JSON that differs only in key order and whitespace as a duplicate", func() {
			Expect(send(ns, "inference", "msg_jcs", completedV2).Status).To(Equal(http.StatusOK))
			reordered := `{ "data" : { "usage":{"tokens":1523}, "completed_at":"2026-11-30T12:00:00Z", "customer":"cus_1",
				"state":"succeeded","version":2.0e0,"job_id":"job-1"},
				"type":"job.completed" }`
			r := send(ns, "inference", "msg_jcs", reordered)
			Expect(r.Status).To(Equal(http.StatusOK), r.Body)
			Expect(decode(r.Body)).To(HaveKeyWithValue("status", OutcomeDuplicate))
		})

		It("answers 50 concurrent identical deliveries 200 with exactly one WebhookEvent", func() {
			var wg sync.WaitGroup
			statuses := make([]int, 50)
			bodies := make([]string, 50)
			for i := range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer GinkgoRecover()
					r := send(ns, "inference", "msg_storm", completedV2)
					statuses[i], bodies[i] = r.Status, r.Body
				}()
			}
			wg.Wait()
			accepted := 0
			for i, s := range statuses {
				Expect(s).To(Equal(http.StatusOK), bodies[i])
				if decode(bodies[i])["status"] == OutcomeAccepted {
					accepted++
				}
			}
			Expect(accepted).To(Equal(1), "exactly one delivery stores the event")
			Expect(listEvents(ns)).To(HaveLen(1))
		})

		It("answers 409 to the same ID with another payload, quarantines it once and warns", func() {
			Expect(send(ns, "inference", "msg_reuse", completedV2).Status).To(Equal(http.StatusOK))
			other := strings.Replace(completedV2, `"tokens":1523`, `"tokens":9999`, 1)
			original := identity.EventName(ns, "inference", "msg_reuse")
			for i := 0; i < 3; i++ {
				r := send(ns, "inference", "msg_reuse", other)
				Expect(r.Status).To(Equal(http.StatusConflict), r.Body)
				Expect(decode(r.Body)).To(HaveKeyWithValue("error", OutcomeConflict))
			}
			events := listEvents(ns)
			Expect(events).To(HaveLen(2), "the original and one quarantine record")
			hash, _ := identity.CanonicalHash([]byte(other))
			var q hooksv1alpha1.WebhookEvent
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.QuarantineName(original, hash)}, &q)).To(Succeed())
			Expect(q.Spec.Quarantine).NotTo(BeNil())
			Expect(q.Spec.Quarantine.OriginalEvent).To(Equal(original))
			Expect(q.Spec.JobCompletions).To(BeEmpty(), "a quarantined delivery has no effect")
			Expect(q.Spec.Settlements).To(BeEmpty())

			Eventually(func() int {
				var l eventsv1.EventList
				Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
				n := 0
				for _, e := range l.Items {
					if e.Reason == hooksv1alpha1.ReasonConflictingEventReuse && e.Type == corev1.EventTypeWarning {
						n++
						Expect(e.Note).NotTo(ContainSubstring("9999"), "no payload in events")
					}
				}
				return n
			}).Should(Equal(1))
		})

		It("answers 200 ignored for an event type without a route and stores nothing", func() {
			r := send(ns, "inference", "msg_other", `{"type":"job.started","data":{}}`)
			Expect(r.Status).To(Equal(http.StatusOK))
			Expect(decode(r.Body)).To(HaveKeyWithValue("status", OutcomeIgnored))
			Expect(listEvents(ns)).To(BeEmpty())
		})

		It("answers 400 with a clear message for malformed JSON, a missing type or a missing field", func() {
			r := send(ns, "inference", "msg_bad", `{"type":`)
			Expect(r.Status).To(Equal(http.StatusBadRequest))
			Expect(decode(r.Body)["message"]).To(ContainSubstring("malformed JSON"))

			r = send(ns, "inference", "msg_bad", `{"data":{}}`)
			Expect(r.Status).To(Equal(http.StatusBadRequest))
			Expect(decode(r.Body)["message"]).To(ContainSubstring("event type is missing"))

			r = send(ns, "inference", "msg_bad", `{"type":"job.completed","data":{"version":1,"customer":"c","usage":{"tokens":1}}}`)
			Expect(r.Status).To(Equal(http.StatusBadRequest))
			Expect(decode(r.Body)["message"]).To(ContainSubstring("job ID is missing (JSON path .data.job_id)"))

			r = send(ns, "inference", "msg_bad", strings.Replace(completedV2, `"tokens":1523`, `"tokens":-5`, 1))
			Expect(r.Status).To(Equal(http.StatusBadRequest))
			Expect(decode(r.Body)["message"]).To(ContainSubstring("not a non-negative decimal"))
			Expect(listEvents(ns)).To(BeEmpty())
		})

		It("keeps the raw payload only when the provider opts in, capped", func() {
			p := &hooksv1alpha1.WebhookProvider{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, p)).To(Succeed())
			// A merge patch: the provider's controller writes its status concurrently.
			patch := client.MergeFrom(p.DeepCopy())
			p.Spec.RawPayload = &hooksv1alpha1.RawPayloadStorage{Enabled: true, MaxBytes: 256}
			Expect(k8s.Patch(ctx, p, patch)).To(Succeed())
			Eventually(func() int64 {
				got := &hooksv1alpha1.WebhookProvider{}
				Expect(mgrCache.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
				return got.Generation
			}).Should(Equal(p.Generation))

			long := strings.Replace(completedV2, `"customer":"cus_1"`, `"customer":"cus_1","note":"`+strings.Repeat("n", 400)+`"`, 1)
			r := send(ns, "inference", "msg_raw", long)
			Expect(r.Status).To(Equal(http.StatusOK), r.Body)
			var ev hooksv1alpha1.WebhookEvent
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: decode(r.Body)["event"]}, &ev)).To(Succeed())
			Expect(ev.Spec.RawPayload).To(HaveLen(256))
			Expect(ev.Spec.RawPayloadTruncated).To(BeTrue())
		})

		It("counts answers by namespace, provider and outcome", func() {
			before := testutil.ToFloat64(requestsTotal.WithLabelValues(ns, "inference", OutcomeAccepted))
			Expect(send(ns, "inference", "msg_metric", completedV2).Status).To(Equal(http.StatusOK))
			Expect(testutil.ToFloat64(requestsTotal.WithLabelValues(ns, "inference", OutcomeAccepted))).To(Equal(before + 1))
			unknownBefore := testutil.ToFloat64(requestsTotal.WithLabelValues(outcomeLabelUnknownValue, outcomeLabelUnknownValue, OutcomeUnknownProvider))
			Expect(send(ns, "no-such-provider", "msg_metric", completedV2).Status).To(Equal(http.StatusNotFound))
			Expect(testutil.ToFloat64(requestsTotal.WithLabelValues(outcomeLabelUnknownValue, outcomeLabelUnknownValue, OutcomeUnknownProvider))).
				To(Equal(unknownBefore+1), "unknown providers share one label value, so senders cannot grow the metric")
		})
	})

	Describe("the API server's failure is never acknowledged", func() {
		It("answers 503 with Retry-After while the API server is stopped, and 200 once it is back", func() {
			// A receiver of its own whose signing Secret stays cached (30 s; the suite's
			// receiver keeps it 1 s, which a loaded machine outlives between the warm-up
			// and the outage): the outage is met at the event's create.
			_, addr := startReceiver(Options{APITimeout: 2 * time.Second, RetryAfter: 3 * time.Second}, k8s, k8s)
			deliver := deliverer(addr, ns)
			// The warm-up reads the Secret; its create may outlast the 2 s API timeout on
			// a loaded machine, and is then answered 503 and retried like any sender would.
			Eventually(func() int { return deliver("msg_warm").Status }).
				WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Equal(http.StatusOK))
			Expect(signalAPIServer(syscall.SIGSTOP)).To(Succeed())
			stopped := true
			defer func() {
				if stopped {
					_ = signalAPIServer(syscall.SIGCONT)
				}
			}()
			r := deliver("msg_outage")
			Expect(r.Status).To(Equal(http.StatusServiceUnavailable), r.Body)
			Expect(r.RetryAfter).To(Equal("3"))
			Expect(decode(r.Body)["message"]).To(ContainSubstring("the event could not be stored; nothing was acknowledged"))

			Expect(signalAPIServer(syscall.SIGCONT)).To(Succeed())
			stopped = false
			Eventually(func() int {
				return deliver("msg_outage").Status
			}).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Equal(http.StatusOK))
			var ev hooksv1alpha1.WebhookEvent
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", "msg_outage")}, &ev)).To(Succeed())
		})
	})

	Describe("the provider's status", func() {
		It("is Ready with its endpoint when the secret is usable, and says why not otherwise", func() {
			// Its routes charge through BillingProvider "billing": Ready needs it to exist.
			Expect(k8s.Create(ctx, &hooksv1alpha1.BillingProvider{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing"},
				Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: "https://billing.example.com",
					CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "billing-token"}},
			})).To(Succeed())
			Eventually(func(g Gomega) {
				p := &hooksv1alpha1.WebhookProvider{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, p)).To(Succeed())
				g.Expect(p.Status.EndpointPath).To(Equal("/webhooks/" + ns + "/inference"))
				c := apimeta.FindStatusCondition(p.Status.Conditions, hooksv1alpha1.ConditionReady)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
				g.Expect(c.ObservedGeneration).To(Equal(p.Generation))
				g.Expect(p.Status.SecretKeys).To(Equal(int32(1)))
			}).Should(Succeed())

			p := inferenceProvider(ns)
			p.Name = "broken"
			p.Spec.Signature.SecretRef.Name = "broken-secret"
			Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "broken-secret"},
				StringData: map[string]string{"k": "whsec_!!!not-base64"}})).To(Succeed())
			Expect(k8s.Create(ctx, p)).To(Succeed())
			Eventually(func(g Gomega) {
				got := &hooksv1alpha1.WebhookProvider{}
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
				c := apimeta.FindStatusCondition(got.Status.Conditions, hooksv1alpha1.ConditionReady)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
				g.Expect(c.Reason).To(Equal(hooksv1alpha1.ReasonSecretInvalid))
				g.Expect(c.Message).NotTo(ContainSubstring("!!!"), "no secret material in status")
			}).Should(Succeed())
		})
	})
})

var _ = Describe("other signature schemes", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("accepts a Stripe-format header with several v1 values when one matches", func() {
		p := inferenceProvider(ns)
		p.Spec.Signature = hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeStripe,
			SecretRef: hooksv1alpha1.SigningSecretReference{Name: "stripe-secret"}}
		p.Spec.EventID = hooksv1alpha1.EventIDSource{JSONPath: ".id"}
		install(p, map[string]string{"key": "whsec_stripe_test_secret"})
		body := strings.Replace(completedV2, `{"type"`, `{"id":"evt_1","type"`, 1)
		ts := time.Now()
		h, err := signature.Sign(signature.Config{Scheme: signature.SchemeStripe}, []byte("whsec_stripe_test_secret"), "", ts, []byte(body))
		Expect(err).NotTo(HaveOccurred())
		good := h.Get(signature.HeaderStripeSignature)
		// A wrong v1 first, the right one second, plus a v0 that must be ignored.
		parts := strings.Split(good, ",")
		header := parts[0] + ",v1=" + strings.Repeat("0", 64) + "," + parts[1] + ",v0=deadbeef"
		req, _ := http.NewRequest(http.MethodPost, url(ns, "inference"), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(signature.HeaderStripeSignature, header)
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		b, _ := io.ReadAll(resp.Body)
		Expect(resp.StatusCode).To(Equal(http.StatusOK), string(b))
		Expect(listEvents(ns)).To(HaveLen(1))
	})

	It("verifies a generic HMAC, derives the event ID from business fields and hashes only hashFields", func() {
		p := inferenceProvider(ns)
		p.Spec.Signature = hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeHMACSHA256,
			SecretRef: hooksv1alpha1.SigningSecretReference{Name: "hmac-secret"}, Header: "X-Signature", Prefix: "sha256=",
			Encoding: hooksv1alpha1.EncodingHex, TimestampHeader: "X-Timestamp"}
		p.Spec.EventID = hooksv1alpha1.EventIDSource{DerivedFrom: []string{".data.job_id", ".data.version"}}
		p.Spec.HashFields = []string{".data"}
		install(p, map[string]string{"key": "plain-hmac-secret\n"})
		cfg := signature.Config{Scheme: signature.SchemeHMACSHA256, Header: "X-Signature", Prefix: "sha256=",
			Encoding: signature.EncodingHex, TimestampHeader: "X-Timestamp"}
		post := func(body string) sender.Response {
			r, err := sender.Send(ctx, nil, sender.Delivery{URL: url(ns, "inference"), Signature: cfg,
				Secret: []byte("plain-hmac-secret"), Body: []byte(body)})
			Expect(err).NotTo(HaveOccurred())
			return r
		}
		r := post(`{"type":"job.completed","attempt":1,"data":{"job_id":"job-9","version":3,"state":"failed","customer":"c","usage":{"tokens":"12.5"}}}`)
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		// A retry with a volatile field changed is still a duplicate: only .data is hashed.
		r2 := post(`{"type":"job.completed","attempt":2,"data":{"job_id":"job-9","version":3,"state":"failed","customer":"c","usage":{"tokens":"12.5"}}}`)
		Expect(decode(r2.Body)).To(HaveKeyWithValue("status", OutcomeDuplicate))
		evs := listEvents(ns)
		Expect(evs).To(HaveLen(1))
		Expect(evs[0].Spec.EventID).To(Equal("drv_" + identity.Hash32("job-9", "3")))
		Expect(evs[0].Spec.JobCompletions[0].State).To(Equal(hooksv1alpha1.JobFailed))
		Expect(evs[0].Spec.JobCompletions[0].Usage.Quantity).To(Equal("12.5"))
	})

	It("answers 401 to a captured HMAC delivery replayed past the tolerance, and its timestamp cannot be refreshed", func() {
		p := inferenceProvider(ns)
		p.Spec.Signature = hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeHMACSHA256,
			SecretRef: hooksv1alpha1.SigningSecretReference{Name: "hmac-secret"}, Header: "X-Signature", TimestampHeader: "X-Timestamp"}
		p.Spec.EventID = hooksv1alpha1.EventIDSource{JSONPath: ".id"}
		install(p, map[string]string{"key": "plain-hmac-secret"})
		cfg := signature.Config{Scheme: signature.SchemeHMACSHA256, Header: "X-Signature", TimestampHeader: "X-Timestamp"}
		body := strings.Replace(completedV2, `{"type"`, `{"id":"evt_captured","type"`, 1)
		// Captured six minutes ago, as sent then.
		captured, err := signature.Sign(cfg, []byte("plain-hmac-secret"), "", time.Now().Add(-6*time.Minute), []byte(body))
		Expect(err).NotTo(HaveOccurred())
		replay := func(h http.Header) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, url(ns, "inference"), strings.NewReader(body))
			req.Header = h.Clone()
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		code, answer := replay(captured)
		Expect(code).To(Equal(http.StatusUnauthorized), answer)
		Expect(answer).To(ContainSubstring("tolerance"))
		// The timestamp is signed with the body: setting a fresh one breaks the signature.
		refreshed := captured.Clone()
		refreshed.Set("X-Timestamp", strconv.FormatInt(time.Now().Unix(), 10))
		code, answer = replay(refreshed)
		Expect(code).To(Equal(http.StatusUnauthorized), answer)
		Expect(answer).To(ContainSubstring("signature mismatch"))
		Expect(listEvents(ns)).To(BeEmpty())
	})

	It("serves an HMAC sender without a timestamp only with the explicit opt-out", func() {
		p := inferenceProvider(ns)
		p.Spec.Signature = hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeHMACSHA256,
			SecretRef: hooksv1alpha1.SigningSecretReference{Name: "hmac-secret"}, Header: "X-Signature"}
		p.Spec.EventID = hooksv1alpha1.EventIDSource{JSONPath: ".id"}
		err := k8s.Create(ctx, p)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("scheme HMACSHA256 needs timestampHeader"))

		p.Spec.Signature.InsecureAllowReplay = true
		install(p, map[string]string{"key": "plain-hmac-secret"})
		body := strings.Replace(completedV2, `{"type"`, `{"id":"evt_unstamped","type"`, 1)
		r, err := sender.Send(ctx, nil, sender.Delivery{URL: url(ns, "inference"), Body: []byte(body), Secret: []byte("plain-hmac-secret"),
			Signature: signature.Config{Scheme: signature.SchemeHMACSHA256, Header: "X-Signature"}})
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
	})

	It("takes a CloudEvents binary-mode delivery's ID and type from its signed ce-id and ce-type headers", func() {
		p := inferenceProvider(ns)
		p.Spec.Signature = hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeHMACSHA256,
			SecretRef: hooksv1alpha1.SigningSecretReference{Name: "ce-secret"}, Header: "X-Signature", TimestampHeader: "X-Timestamp",
			SignedHeaders: []string{"ce-id", "ce-type"}}
		p.Spec.EventID = hooksv1alpha1.EventIDSource{Header: "ce-id"}
		p.Spec.EventType = hooksv1alpha1.FieldSource{Header: "ce-type"}
		// In binary mode the body is the event's data itself.
		for i := range p.Spec.Routes[0].Operations {
			op := &p.Spec.Routes[0].Operations[i]
			if m := op.JobCompletion; m != nil {
				m.JobID, m.CompletionVersion, m.State, m.CompletedAt, m.Usage.Quantity = ".job_id", ".version", ".state", ".completed_at", ".usage.tokens"
			}
			if m := op.Settlement; m != nil {
				m.JobID, m.Customer, m.Usage.Quantity = ".job_id", ".customer", ".usage.tokens"
			}
		}
		install(p, map[string]string{"key": "ce-hmac-secret"})
		cfg := extract.SignatureConfig(&p.Spec.Signature)
		body := `{"job_id":"job-ce","version":1,"state":"succeeded","customer":"cus_1","completed_at":"2026-11-30T12:00:00Z","usage":{"tokens":42}}`
		signed := http.Header{}
		signed.Set("ce-id", "ce-evt-1")
		signed.Set("ce-type", "job.completed")
		d := sender.Delivery{URL: url(ns, "inference"), Signature: cfg, Secret: []byte("ce-hmac-secret"), Body: []byte(body),
			Signed: signed, Header: http.Header{"ce-specversion": {"1.0"}, "ce-source": {"/inference"}}}
		r, err := sender.Send(ctx, nil, d)
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		evs := listEvents(ns)
		Expect(evs).To(HaveLen(1))
		Expect(evs[0].Spec.EventID).To(Equal("ce-evt-1"))
		Expect(evs[0].Spec.EventType).To(Equal("job.completed"))
		Expect(evs[0].Spec.JobCompletions[0].JobID).To(Equal("job-ce"))

		// ce-type is signed: the captured delivery re-typed by its header is refused.
		h, err := signature.SignWithHeaders(cfg, []byte("ce-hmac-secret"), "", time.Now(), []byte(body), signed)
		Expect(err).NotTo(HaveOccurred())
		h.Set("ce-id", "ce-evt-2")
		h.Set("ce-type", "job.refunded")
		req, _ := http.NewRequest(http.MethodPost, url(ns, "inference"), strings.NewReader(body))
		req.Header = h
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		b, _ := io.ReadAll(resp.Body)
		Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), string(b))
		Expect(string(b)).To(ContainSubstring("signature mismatch"))
		// And a sender that leaves ce-type out is told it is missing.
		h.Del("ce-type")
		req, _ = http.NewRequest(http.MethodPost, url(ns, "inference"), strings.NewReader(body))
		req.Header = h
		req.Header.Set("Content-Type", "application/json")
		resp, err = http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		b, _ = io.ReadAll(resp.Body)
		Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), string(b))
		Expect(string(b)).To(ContainSubstring("ce-type"))
		Expect(listEvents(ns)).To(HaveLen(1))
	})

	It("takes a CloudEvents structured-mode delivery as configured JSON paths", func() {
		p := inferenceProvider(ns)
		p.Name = "inference-ce"
		p.Spec.Signature.SecretRef.Name = "inference-ce-secret"
		p.Spec.EventID = hooksv1alpha1.EventIDSource{JSONPath: ".id"}
		install(p, map[string]string{"current": swhSecret})
		body := `{"specversion":"1.0","id":"ce-evt-9","source":"/inference","type":"job.completed","datacontenttype":"application/json",` +
			`"data":{"job_id":"job-ce9","version":1,"state":"succeeded","customer":"cus_1","completed_at":"2026-11-30T12:00:00Z","usage":{"tokens":7}}}`
		r := send(ns, "inference-ce", "msg_ce_9", body, func(d *sender.Delivery) { d.ContentType = "application/cloudevents+json" })
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		var evs hooksv1alpha1.WebhookEventList
		Expect(k8s.List(ctx, &evs, client.InNamespace(ns), client.MatchingLabels{hooksv1alpha1.LabelProvider: "inference-ce"})).To(Succeed())
		Expect(evs.Items).To(HaveLen(1))
		Expect(evs.Items[0].Spec.EventID).To(Equal("ce-evt-9"))
		Expect(evs.Items[0].Spec.JobCompletions[0].JobID).To(Equal("job-ce9"))
	})

	It("fans a forEach route out to one settlement per item", func() {
		p := inferenceProvider(ns)
		p.Spec.Routes = []hooksv1alpha1.Route{{EventType: "invoice.lines", Operations: []hooksv1alpha1.RouteOperation{{
			Type: hooksv1alpha1.OperationBillingSettlement, ForEach: ".data.lines",
			Settlement: &hooksv1alpha1.SettlementMapping{BillingProviderRef: "billing",
				KeyFrom: []string{"$.data.invoice", ".id"}, Customer: "$.data.customer",
				Amount: &hooksv1alpha1.AmountMapping{Minor: ".cents", CurrencyPath: "$.data.currency"}},
		}}}}
		install(p, map[string]string{"current": swhSecret})
		r := send(ns, "inference", "msg_lines", `{"type":"invoice.lines","data":{"invoice":"inv_7","customer":"cus_3","currency":"eur",
			"lines":[{"id":"l1","cents":100},{"id":"l2","cents":250}]}}`)
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		evs := listEvents(ns)
		Expect(evs).To(HaveLen(1))
		Expect(evs[0].Spec.Settlements).To(HaveLen(2))
		Expect(evs[0].Spec.Settlements[1].SettlementKey).To(Equal(identity.FieldsSettlementKey(ns, "inference", "inv_7", "l2")))
		Expect(*evs[0].Spec.Settlements[1].Amount).To(Equal(hooksv1alpha1.Amount{Minor: 250, Currency: "EUR"}))
		Expect(evs[0].Spec.Settlements[1].Customer).To(Equal("cus_3"))
	})
})

var _ = Describe("load and lifecycle", func() {
	// A receiver of its own, so its limits and shutdown don't affect other specs.
	var (
		ns     string
		r      *Receiver
		stop   context.CancelFunc
		done   chan error
		target string
	)
	var holding *holdingClient
	BeforeEach(func() {
		ns = newNamespace()
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})
		holding = newHoldingClient()
		r = New(Options{BindAddress: "127.0.0.1:0", MaxInFlightPerProvider: 1, ShutdownTimeout: 10 * time.Second},
			mgrCache, holding, holding, recv.recorder)
		var rctx context.Context
		rctx, stop = context.WithCancel(ctx)
		done = make(chan error, 1)
		go func() { done <- r.Start(rctx) }()
		addr, err := r.Addr(ctx)
		Expect(err).NotTo(HaveOccurred())
		target = "http://" + addr.String() + EndpointPath(ns, "inference")
	})
	AfterEach(func() { stop() })

	// slowDelivery starts a signed delivery whose body is held back until release is
	// called: it is in flight (its address's slot, no shared one) the whole time.
	slowDelivery := func(id string) (release func(), result chan *http.Response) {
		h, err := signature.Sign(swh, []byte(swhSecret), id, time.Now(), []byte(completedV2))
		Expect(err).NotTo(HaveOccurred())
		pr, pw := io.Pipe()
		req, _ := http.NewRequest(http.MethodPost, target, pr)
		req.Header = h
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = int64(len(completedV2))
		result = make(chan *http.Response, 1)
		go func() {
			defer GinkgoRecover()
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			result <- resp
		}()
		_, _ = pw.Write([]byte(completedV2[:10]))
		return func() { _, _ = pw.Write([]byte(completedV2[10:])); _ = pw.Close() }, result
	}

	It("answers 429 with Retry-After, naming the limit, above the provider's in-flight limit", func() {
		delivery := func(id string) sender.Delivery {
			return sender.Delivery{URL: target, Signature: swh, Secret: []byte(swhSecret), ID: id, Body: []byte(completedV2)}
		}
		// A verified delivery waiting in its create holds the provider's one slot.
		release := holding.hold("msg_slow")
		DeferCleanup(release)
		result := sendAsync(delivery("msg_slow"))
		Eventually(holding.entered).WithTimeout(10 * time.Second).Should(Receive(Equal("msg_slow")))
		before := testutil.ToFloat64(throttled.WithLabelValues(LimitProvider))
		resp, err := sender.Send(ctx, nil, delivery("msg_next"))
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(http.StatusTooManyRequests))
		Expect(resp.RetryAfter).To(Equal("1"))
		Expect(decode(resp.Body)).To(HaveKeyWithValue("error", OutcomeBusyProvider))
		Expect(testutil.ToFloat64(throttled.WithLabelValues(LimitProvider))).To(Equal(before + 1))
		release()
		Expect((<-result).Status).To(Equal(http.StatusOK))
	})

	It("holds no shared slot for a body still arriving: the provider's one slot serves another delivery meanwhile", func() {
		release, result := slowDelivery("msg_body_pending")
		Eventually(func() float64 { return testutil.ToFloat64(inFlight) }).Should(BeNumerically(">=", 1))
		resp, err := sender.Send(ctx, nil, sender.Delivery{URL: target, Signature: swh, Secret: []byte(swhSecret),
			ID: "msg_meanwhile", Body: []byte(completedV2)})
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(http.StatusOK), resp.Body)
		release()
		Expect((<-result).StatusCode).To(Equal(http.StatusOK))
	})

	It("finishes an in-flight delivery when shut down, then stops", func() {
		release, result := slowDelivery("msg_shutdown")
		Eventually(func() float64 { return testutil.ToFloat64(inFlight) }).Should(BeNumerically(">=", 1))
		stop()
		// New connections are refused once shutdown started...
		Eventually(func() error {
			c, err := net.DialTimeout("tcp", strings.TrimPrefix(strings.Split(target, "/webhooks")[0], "http://"), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}).ShouldNot(Succeed())
		// ...but the delivery in flight is stored and answered.
		release()
		resp := <-result
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		Expect(<-done).To(Succeed())
		Expect(listEvents(ns)).To(HaveLen(1))
	})
})
