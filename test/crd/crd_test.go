package crd_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

var nsCounter int

// newNamespace gives each spec its own namespace so specs never see each other's objects.
func newNamespace() string {
	nsCounter++
	name := fmt.Sprintf("crd-%d", nsCounter)
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}

// expectInvalid asserts the API server refused err as Invalid and that the message a
// user sees contains want.
func expectInvalid(err error, want string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the API server accepted what it must refuse (%s)", want)
	Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want an Invalid error, got %v", err)
	Expect(err.Error()).To(ContainSubstring(want))
}

func runKubectl(args ...string) (string, string, error) {
	k, err := kubectl.Kubectl()
	Expect(err).NotTo(HaveOccurred())
	stdout, stderr, err := k.Run(args...)
	out, _ := io.ReadAll(stdout)
	errOut, _ := io.ReadAll(stderr)
	return string(out), string(errOut), err
}

func sampleSettlement(ns, name string) *hooksv1alpha1.BillingSettlement {
	return &hooksv1alpha1.BillingSettlement{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: hooksv1alpha1.BillingSettlementSpec{
			BillingProviderRef: "billing",
			SettlementKey:      "inference/" + name,
			IdempotencyKey:     "stl_0123456789abcdef0123456789abcdef",
			Type:               hooksv1alpha1.SettlementCharge,
			Customer:           "cus_42",
			Amount:             &hooksv1alpha1.Amount{Minor: 1250, Currency: "USD"},
			Usage:              &hooksv1alpha1.Usage{Meter: "tokens", Quantity: "1523", Unit: "tokens"},
		},
	}
}

func sampleProvider(ns, name string) *hooksv1alpha1.WebhookProvider {
	return &hooksv1alpha1.WebhookProvider{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: hooksv1alpha1.WebhookProviderSpec{
			Signature: hooksv1alpha1.SignatureSpec{
				Scheme:    hooksv1alpha1.SchemeStandardWebhooks,
				SecretRef: hooksv1alpha1.SigningSecretReference{Name: "s"},
			},
			EventID:   hooksv1alpha1.EventIDSource{Header: "webhook-id"},
			EventType: hooksv1alpha1.FieldSource{JSONPath: ".type"},
		},
	}
}

var _ = Describe("samples", func() {
	It("applies every sample in config/samples", func() {
		ns := newNamespace()
		dir := filepath.Join(testenv.RepoRoot(), "config", "samples")
		files, err := filepath.Glob(filepath.Join(dir, "hooks_*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(files).NotTo(BeEmpty())
		kinds := map[string]bool{}
		for _, f := range files {
			data, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
			for {
				u := &unstructured.Unstructured{}
				if err := dec.Decode(&u.Object); err == io.EOF {
					break
				} else {
					Expect(err).NotTo(HaveOccurred(), f)
				}
				if len(u.Object) == 0 {
					continue
				}
				u.SetNamespace(ns)
				Expect(k8s.Create(ctx, u)).To(Succeed(), "sample %s", filepath.Base(f))
				kinds[u.GetKind()] = true
			}
		}
		Expect(kinds).To(HaveLen(6), "a sample for every kind: %v", kinds)
	})
})

var _ = Describe("BillingSettlement validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("refuses any edit of the spec, naming the way to correct it", func() {
		bs := sampleSettlement(ns, "edit-me")
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		bs.Spec.Amount.Minor = 99
		expectInvalid(k8s.Update(ctx, bs), "financial records are never edited")
	})

	It("keeps the spec intact while status and metadata change", func() {
		bs := sampleSettlement(ns, "status-ok")
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		bs.Status.State = hooksv1alpha1.SettlementSubmitted
		bs.Status.Attempts = 1
		Expect(k8s.Status().Update(ctx, bs)).To(Succeed())
		bs.Annotations = map[string]string{hooksv1alpha1.AnnotationReplay: "1"}
		Expect(k8s.Update(ctx, bs)).To(Succeed())
	})

	It("requires a Refund to name what it reverses", func() {
		bs := sampleSettlement(ns, "refund")
		bs.Spec.Type = hooksv1alpha1.SettlementRefund
		expectInvalid(k8s.Create(ctx, bs), "must name the settlement it reverses")
	})

	It("refuses a Charge that claims to reverse something", func() {
		bs := sampleSettlement(ns, "charge")
		bs.Spec.Reverses = "other"
		expectInvalid(k8s.Create(ctx, bs), "a Charge must not")
	})

	It("needs usage or amount", func() {
		bs := sampleSettlement(ns, "empty")
		bs.Spec.Amount, bs.Spec.Usage = nil, nil
		expectInvalid(k8s.Create(ctx, bs), "needs usage, amount or both")
	})

	It("only accepts derived idempotency keys", func() {
		bs := sampleSettlement(ns, "badkey")
		bs.Spec.IdempotencyKey = "random-uuid"
		expectInvalid(k8s.Create(ctx, bs), "spec.idempotencyKey")
	})

	It("refuses a lower-case or misshapen currency and a negative amount", func() {
		bs := sampleSettlement(ns, "money")
		bs.Spec.Amount = &hooksv1alpha1.Amount{Minor: -1, Currency: "usd"}
		err := k8s.Create(ctx, bs)
		expectInvalid(err, "spec.amount.currency")
		Expect(err.Error()).To(ContainSubstring("spec.amount.minor"))
	})

	It("defaults type to Charge", func() {
		bs := sampleSettlement(ns, "default-type")
		bs.Spec.Type = ""
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		Expect(bs.Spec.Type).To(Equal(hooksv1alpha1.SettlementCharge))
	})
})

var _ = Describe("WebhookEvent validation", func() {
	It("refuses any edit of the receipt", func() {
		ns := newNamespace()
		ev := &hooksv1alpha1.WebhookEvent{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-abc"},
			Spec: hooksv1alpha1.WebhookEventSpec{
				Provider: "inference", EventID: "evt_1", EventType: "job.completed",
				PayloadHash: "sha256:" + strings.Repeat("ab", 32),
				ReceivedAt:  metav1.Now(),
			},
		}
		Expect(k8s.Create(ctx, ev)).To(Succeed())
		ev.Spec.EventType = "job.failed"
		expectInvalid(k8s.Update(ctx, ev), "WebhookEvent spec is immutable")
	})

	It("refuses a payload hash that is not sha256 hex", func() {
		ns := newNamespace()
		ev := &hooksv1alpha1.WebhookEvent{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-bad"},
			Spec: hooksv1alpha1.WebhookEventSpec{
				Provider: "inference", EventID: "evt_1", EventType: "job.completed",
				PayloadHash: "md5:abc", ReceivedAt: metav1.Now(),
			},
		}
		expectInvalid(k8s.Create(ctx, ev), "spec.payloadHash")
	})
})

var _ = Describe("JobCompletion validation", func() {
	var (
		ns string
		jc *hooksv1alpha1.JobCompletion
	)
	BeforeEach(func() {
		ns = newNamespace()
		jc = &hooksv1alpha1.JobCompletion{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-job-x"},
			Spec: hooksv1alpha1.JobCompletionSpec{
				Provider: "inference", JobID: "job-1",
				Completion: hooksv1alpha1.Completion{Version: 2, State: hooksv1alpha1.JobSucceeded},
			},
		}
		Expect(k8s.Create(ctx, jc)).To(Succeed())
	})

	It("keeps the job's identity immutable", func() {
		jc.Spec.JobID = "job-2"
		expectInvalid(k8s.Update(ctx, jc), "provider and jobID are immutable")
	})

	It("never moves a job backward to an older completion version", func() {
		jc.Spec.Completion.Version = 1
		expectInvalid(k8s.Update(ctx, jc), "completion.version may only grow")
	})

	It("refuses other content under the same version", func() {
		jc.Spec.Completion.State = hooksv1alpha1.JobFailed
		expectInvalid(k8s.Update(ctx, jc), "same version with different content is a conflict")
	})

	It("accepts a newer version", func() {
		jc.Spec.Completion = hooksv1alpha1.Completion{Version: 3, State: hooksv1alpha1.JobFailed}
		Expect(k8s.Update(ctx, jc)).To(Succeed())
	})

	It("requires a url for an HTTP sink", func() {
		jc.Spec.Sink = &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP}
		expectInvalid(k8s.Update(ctx, jc), "url is required when type is HTTP")
	})
})

var _ = Describe("WebhookProvider validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("takes one or two signing key names, each a Secret data key, none twice", func() {
		for i, keys := range [][]string{{"current"}, {"current", "next"}, {"whsec.v2_key-1"}} {
			p := sampleProvider(ns, fmt.Sprintf("keys-%d", i))
			p.Spec.Signature.SecretRef.Keys = keys
			Expect(k8s.Create(ctx, p)).To(Succeed(), "keys %v", keys)
		}
		for want, keys := range map[string][]string{
			"must have at most 2 items":  {"a", "b", "c"},
			"should be at least 1 chars": {""},
			"should match":               {"a/b"},
			"Duplicate value":            {"a", "a"},
		} {
			p := sampleProvider(ns, "bad-keys")
			p.Spec.Signature.SecretRef.Keys = keys
			expectInvalid(k8s.Create(ctx, p), want)
		}
	})

	It("accepts a minimal provider and fills in the defaults", func() {
		p := sampleProvider(ns, "minimal")
		Expect(k8s.Create(ctx, p)).To(Succeed())
		Expect(p.Spec.Signature.Tolerance).NotTo(BeNil())
		Expect(p.Spec.Signature.Tolerance.Duration.String()).To(Equal("5m0s"))
		Expect(p.Spec.Retention.Events.Duration.String()).To(Equal("168h0m0s"))
	})

	It("requires a secret for the signature scheme", func() {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "hooks.settlement.dev/v1alpha1", "kind": "WebhookProvider",
			"metadata": map[string]any{"name": "nosecret", "namespace": ns},
			"spec": map[string]any{
				"signature": map[string]any{"scheme": "Stripe"},
				"eventID":   map[string]any{"jsonPath": ".id"},
				"eventType": map[string]any{"jsonPath": ".type"},
			},
		}}
		expectInvalid(k8s.Create(ctx, u), "spec.signature.secretRef: Required value")
	})

	It("requires a header for a generic HMAC and refuses one for fixed-header schemes", func() {
		p := sampleProvider(ns, "hmac")
		p.Spec.Signature.Scheme = hooksv1alpha1.SchemeHMACSHA256
		expectInvalid(k8s.Create(ctx, p), "header is required for scheme HMACSHA256")

		p = sampleProvider(ns, "swh")
		p.Spec.Signature.Header = "X-Sig"
		expectInvalid(k8s.Create(ctx, p), "not allowed for other schemes")

		p = sampleProvider(ns, "swh2")
		p.Spec.Signature.Encoding = hooksv1alpha1.EncodingHex
		expectInvalid(k8s.Create(ctx, p), "only apply to scheme HMACSHA256")
	})

	Describe("fields that decide effects come from signed bytes", func() {
		hmac := func(name string) *hooksv1alpha1.WebhookProvider {
			p := sampleProvider(ns, name)
			p.Spec.Signature = hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeHMACSHA256,
				SecretRef: hooksv1alpha1.SigningSecretReference{Name: "s"}, Header: "X-Signature", TimestampHeader: "X-Timestamp"}
			p.Spec.EventID = hooksv1alpha1.EventIDSource{JSONPath: ".id"}
			return p
		}

		It("refuses an event type or ID taken from a header the scheme does not sign", func() {
			// A captured body re-typed by an unsigned header: impossible to configure.
			p := hmac("retype")
			p.Spec.EventType = hooksv1alpha1.FieldSource{Header: "X-Event-Type"}
			expectInvalid(k8s.Create(ctx, p), "eventType.header is outside the signature")

			p = hmac("reid")
			p.Spec.EventID = hooksv1alpha1.EventIDSource{Header: "X-Event-Id"}
			expectInvalid(k8s.Create(ctx, p), "eventID.header is outside the signature")

			// The timestamp is signed, but it is no identity: every retry would be new.
			p = hmac("tsid")
			p.Spec.EventID = hooksv1alpha1.EventIDSource{Header: "X-Timestamp"}
			expectInvalid(k8s.Create(ctx, p), "eventID.header is outside the signature")

			p = sampleProvider(ns, "stripe-id")
			p.Spec.Signature.Scheme = hooksv1alpha1.SchemeStripe
			expectInvalid(k8s.Create(ctx, p), "eventID.header is outside the signature")

			p = sampleProvider(ns, "swh-other")
			p.Spec.EventID = hooksv1alpha1.EventIDSource{Header: "X-Message-Id"}
			expectInvalid(k8s.Create(ctx, p), "only webhook-id with scheme StandardWebhooks, or a header listed in signature.signedHeaders")

			p = sampleProvider(ns, "swh-type")
			p.Spec.EventType = hooksv1alpha1.FieldSource{Header: "X-Event-Type"}
			expectInvalid(k8s.Create(ctx, p), "eventType.header is outside the signature")

			// Standard Webhooks signs webhook-id ("id.timestamp.body"), in any case.
			p = sampleProvider(ns, "swh-id")
			p.Spec.EventID = hooksv1alpha1.EventIDSource{Header: "Webhook-Id"}
			Expect(k8s.Create(ctx, p)).To(Succeed())
			Expect(k8s.Create(ctx, hmac("hmac-ok"))).To(Succeed())
		})

		It("takes an event ID and type from headers the HMACSHA256 signature lists (CloudEvents binary mode)", func() {
			p := hmac("ce-binary")
			p.Spec.Signature.SignedHeaders = []string{"ce-id", "ce-type"}
			p.Spec.EventID = hooksv1alpha1.EventIDSource{Header: "ce-id"}
			p.Spec.EventType = hooksv1alpha1.FieldSource{Header: "Ce-Type"}
			Expect(k8s.Create(ctx, p)).To(Succeed())

			p = hmac("ce-type-unsigned")
			p.Spec.Signature.SignedHeaders = []string{"ce-id"}
			p.Spec.EventID = hooksv1alpha1.EventIDSource{Header: "ce-id"}
			p.Spec.EventType = hooksv1alpha1.FieldSource{Header: "ce-type"}
			expectInvalid(k8s.Create(ctx, p), "eventType.header is outside the signature")

			p = sampleProvider(ns, "swh-signed-headers")
			p.Spec.Signature.SignedHeaders = []string{"ce-id"}
			expectInvalid(k8s.Create(ctx, p), "signedHeaders only apply to scheme HMACSHA256")

			p = hmac("signs-twice")
			p.Spec.Signature.SignedHeaders = []string{"ce-id", "CE-ID"}
			expectInvalid(k8s.Create(ctx, p), "signedHeaders lists a header twice")

			p = hmac("signs-its-signature")
			p.Spec.Signature.SignedHeaders = []string{"x-signature"}
			expectInvalid(k8s.Create(ctx, p), "signedHeaders must not list the signature header or the timestamp header")
		})

		It("requires a signed timestamp for HMACSHA256, or an explicit opt-out that kubectl get shows", func() {
			p := hmac("nots")
			p.Spec.Signature.TimestampHeader = ""
			expectInvalid(k8s.Create(ctx, p), "scheme HMACSHA256 needs timestampHeader")

			p = hmac("both")
			p.Spec.Signature.InsecureAllowReplay = true
			expectInvalid(k8s.Create(ctx, p), "insecureAllowReplay only applies to scheme HMACSHA256 without timestampHeader")

			p = sampleProvider(ns, "swh-replay")
			p.Spec.Signature.InsecureAllowReplay = true
			expectInvalid(k8s.Create(ctx, p), "insecureAllowReplay only applies")

			p = hmac("replayable")
			p.Spec.Signature.TimestampHeader = ""
			p.Spec.Signature.InsecureAllowReplay = true
			Expect(k8s.Create(ctx, p)).To(Succeed())
			Expect(k8s.Create(ctx, hmac("hmac-ok"))).To(Succeed())

			out, errOut, err := runKubectl("get", "whp", "-n", ns, "replayable", "hmac-ok")
			Expect(err).NotTo(HaveOccurred(), errOut)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			Expect(lines).To(HaveLen(3), out)
			Expect(strings.Fields(lines[0])[:3]).To(Equal([]string{"NAME", "SCHEME", "REPLAYABLE"}))
			Expect(strings.Fields(lines[1])[:3]).To(Equal([]string{"replayable", "HMACSHA256", "true"}))
			Expect(strings.Fields(lines[2])[:3]).To(Equal([]string{"hmac-ok", "HMACSHA256", "false"}))
		})
	})

	It("needs exactly one source of the event ID", func() {
		p := sampleProvider(ns, "twoids")
		p.Spec.EventID.JSONPath = ".id"
		expectInvalid(k8s.Create(ctx, p), "set exactly one of header, jsonPath or derivedFrom")

		p = sampleProvider(ns, "noid")
		p.Spec.EventID = hooksv1alpha1.EventIDSource{}
		expectInvalid(k8s.Create(ctx, p), "set exactly one of header, jsonPath or derivedFrom")
	})

	It("refuses retention shorter than the sender's retry window", func() {
		p := sampleProvider(ns, "short")
		p.Spec.Retention = &hooksv1alpha1.RetentionSpec{
			Events:              &metav1.Duration{Duration: 24 * time.Hour},
			ProviderRetryWindow: &metav1.Duration{Duration: 72 * time.Hour},
		}
		expectInvalid(k8s.Create(ctx, p), "events retention must be longer than providerRetryWindow")
	})

	It("matches each route operation's type with its mapping", func() {
		p := sampleProvider(ns, "routes")
		p.Spec.Routes = []hooksv1alpha1.Route{{
			EventType: "job.completed",
			Operations: []hooksv1alpha1.RouteOperation{{
				Type:          hooksv1alpha1.OperationBillingSettlement,
				JobCompletion: &hooksv1alpha1.JobCompletionMapping{JobID: ".id"},
			}},
		}}
		expectInvalid(k8s.Create(ctx, p), "type BillingSettlement needs settlement")
	})

	It("needs a key source and something to charge in a settlement route", func() {
		p := sampleProvider(ns, "settle")
		p.Spec.Routes = []hooksv1alpha1.Route{{
			EventType: "job.completed",
			Operations: []hooksv1alpha1.RouteOperation{{
				Type: hooksv1alpha1.OperationBillingSettlement,
				Settlement: &hooksv1alpha1.SettlementMapping{
					BillingProviderRef: "billing", Customer: ".customer",
				},
			}},
		}}
		err := k8s.Create(ctx, p)
		expectInvalid(err, "a settlement needs usage, amount or both")
		Expect(err.Error()).To(ContainSubstring("set keyFrom, or jobID"))
	})

	It("accepts route and operation conditions up to 1024 characters, and refuses longer or empty ones", func() {
		withWhen := func(name, routeWhen, opWhen string) *hooksv1alpha1.WebhookProvider {
			p := sampleProvider(ns, name)
			p.Spec.Routes = []hooksv1alpha1.Route{{
				EventType: "job.completed", When: routeWhen,
				Operations: []hooksv1alpha1.RouteOperation{{
					Type: hooksv1alpha1.OperationJobCompletion, When: opWhen,
					JobCompletion: &hooksv1alpha1.JobCompletionMapping{JobID: ".id"},
				}},
			}}
			return p
		}
		// A valid expression padded to the limit: the API server only bounds the
		// length; the expression is compiled in the provider's Ready condition.
		long := `payload.type == "` + strings.Repeat("x", 1024-len(`payload.type == ""`)) + `"`
		Expect(long).To(HaveLen(1024))
		Expect(k8s.Create(ctx, withWhen("when-ok", long, `jobState(payload.state) == "Succeeded"`))).To(Succeed())
		expectInvalid(k8s.Create(ctx, withWhen("when-long", long+" ", "")), "spec.routes[0].when: Too long")
		expectInvalid(k8s.Create(ctx, withWhen("when-op-long", "", long+" ")), "spec.routes[0].operations[0].when: Too long")
		err := k8s.Create(ctx, withWhen("when-empty", "", ""))
		Expect(err).NotTo(HaveOccurred(), "an unset condition is omitted, not empty")
	})

	It("limits names to what fits a label value", func() {
		p := sampleProvider(ns, strings.Repeat("p", 64))
		expectInvalid(k8s.Create(ctx, p), "limited to 63 characters")
	})
})

var _ = Describe("BillingProvider validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	provider := func(name, endpoint string) *hooksv1alpha1.BillingProvider {
		return &hooksv1alpha1.BillingProvider{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: hooksv1alpha1.BillingProviderSpec{
				Endpoint:             endpoint,
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "token"},
			},
		}
	}

	It("defaults type, key window and retry policy", func() {
		bp := provider("defaults", "https://billing.example.com")
		Expect(k8s.Create(ctx, bp)).To(Succeed())
		Expect(bp.Spec.Type).To(Equal(hooksv1alpha1.BillingProviderHTTP))
		// Attempts and the budget are left unset: the operator derives them from the
		// provider's key window (settlement.PolicyOf).
		Expect(bp.Spec.Retry.MaxAttempts).To(BeZero())
		Expect(bp.Spec.Retry.MaxElapsed).To(BeNil())
		Expect(bp.Spec.Retry.InitialBackoff.Duration.String()).To(Equal("1s"))
		Expect(bp.Spec.IdempotencyWindow.Duration.String()).To(Equal("24h0m0s"))
		Expect(bp.Spec.CredentialsSecretRef.Key).To(Equal("token"))
	})

	It("refuses plain http unless explicitly allowed", func() {
		expectInvalid(k8s.Create(ctx, provider("plain", "http://billing.local")),
			"endpoint must use https:// unless allowInsecureHTTP is true")
		bp := provider("plain-ok", "http://billing.local")
		bp.Spec.AllowInsecureHTTP = true
		Expect(k8s.Create(ctx, bp)).To(Succeed())
	})

	It("caps a Stripe provider's key window at Stripe's 24h, and keeps stripe settings to that type", func() {
		stripe := func(name string, window time.Duration) *hooksv1alpha1.BillingProvider {
			bp := provider(name, "https://api.stripe.com")
			bp.Spec.Type = hooksv1alpha1.BillingProviderStripe
			bp.Spec.IdempotencyWindow = &metav1.Duration{Duration: window}
			bp.Spec.Stripe = &hooksv1alpha1.StripeSettings{Meters: []hooksv1alpha1.StripeMeter{{Meter: "tokens", EventName: "inference_tokens"}}}
			return bp
		}
		expectInvalid(k8s.Create(ctx, stripe("stripe-long", 25*time.Hour)), "idempotencyWindow is at most 24h")
		Expect(k8s.Create(ctx, stripe("stripe-ok", 24*time.Hour))).To(Succeed())
		httpWithStripe := stripe("http-stripe", time.Hour)
		httpWithStripe.Spec.Type = hooksv1alpha1.BillingProviderHTTP
		expectInvalid(k8s.Create(ctx, httpWithStripe), "stripe settings apply to type Stripe only")
		long := provider("http-long", "https://billing.example.com")
		long.Spec.IdempotencyWindow = &metav1.Duration{Duration: 72 * time.Hour}
		Expect(k8s.Create(ctx, long)).To(Succeed(), "the cap is Stripe's, not every provider's")
		slow := stripe("stripe-slow", time.Hour)
		slow.Spec.RequestTimeout = &metav1.Duration{Duration: 2 * time.Minute}
		expectInvalid(k8s.Create(ctx, slow), "requestTimeout is at most 1m")
		noEvent := stripe("stripe-no-event", time.Hour)
		noEvent.Spec.Stripe.Meters[0].EventName = ""
		expectInvalid(k8s.Create(ctx, noEvent), "eventName")
		// One usage meter per Stripe meter: reconciliation compares each with its totals.
		twice := stripe("stripe-event-twice", time.Hour)
		twice.Spec.Stripe.Meters = append(twice.Spec.Stripe.Meters, hooksv1alpha1.StripeMeter{Meter: "tokens-alias", EventName: "inference_tokens"})
		expectInvalid(k8s.Create(ctx, twice), "each Stripe eventName is mapped from one usage meter only")
		sameID := stripe("stripe-id-twice", time.Hour)
		sameID.Spec.Stripe.Meters = []hooksv1alpha1.StripeMeter{{Meter: "a", EventName: "a_used", ID: "mtr_1"}, {Meter: "b", EventName: "b_used", ID: "mtr_1"}}
		expectInvalid(k8s.Create(ctx, sameID), "each Stripe meter id is mapped from one usage meter only")
		many := stripe("stripe-many-meters", time.Hour)
		many.Spec.Stripe.Meters = []hooksv1alpha1.StripeMeter{{Meter: "a", EventName: "a_used", ID: "mtr_1"},
			{Meter: "b", EventName: "b_used", ID: "mtr_2"}, {Meter: "c", EventName: "c_used"}, {Meter: "d", EventName: "d_used"}}
		Expect(k8s.Create(ctx, many)).To(Succeed(), "distinct meters, two without an id")
		// Dated at completion: the grace period only with it, and within Stripe's range.
		graceAlone := stripe("stripe-grace-alone", time.Hour)
		graceAlone.Spec.Stripe.Meters[0].GracePeriod = &metav1.Duration{Duration: time.Hour}
		expectInvalid(k8s.Create(ctx, graceAlone), "gracePeriod applies only with timestamp: Completion")
		graceLong := stripe("stripe-grace-long", time.Hour)
		graceLong.Spec.Stripe.Meters[0].Timestamp = hooksv1alpha1.StripeTimestampCompletion
		graceLong.Spec.Stripe.Meters[0].GracePeriod = &metav1.Duration{Duration: 73 * time.Hour}
		expectInvalid(k8s.Create(ctx, graceLong), "between 15m and 72h")
		dated := stripe("stripe-dated", time.Hour)
		dated.Spec.Stripe.Meters[0].Timestamp = hooksv1alpha1.StripeTimestampCompletion
		dated.Spec.Stripe.Meters[0].GracePeriod = &metav1.Duration{Duration: 72 * time.Hour}
		Expect(k8s.Create(ctx, dated)).To(Succeed())
		badTimestamp := stripe("stripe-bad-timestamp", time.Hour)
		badTimestamp.Spec.Stripe.Meters[0].Timestamp = "Job"
		expectInvalid(k8s.Create(ctx, badTimestamp), "Unsupported value")
	})

	It("refuses a backoff that starts above its cap", func() {
		bp := provider("backoff", "https://billing.example.com")
		bp.Spec.Retry = &hooksv1alpha1.RetryPolicy{
			InitialBackoff: &metav1.Duration{Duration: 10 * time.Minute},
			MaxBackoff:     &metav1.Duration{Duration: time.Minute},
		}
		expectInvalid(k8s.Create(ctx, bp), "initialBackoff must not exceed maxBackoff")
	})

	It("refuses an unknown provider type", func() {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "hooks.settlement.dev/v1alpha1", "kind": "BillingProvider",
			"metadata": map[string]any{"name": "paypal", "namespace": ns},
			"spec": map[string]any{
				"type": "PayPal", "endpoint": "https://x",
				"credentialsSecretRef": map[string]any{"name": "t"},
			},
		}}
		expectInvalid(k8s.Create(ctx, u), `Unsupported value: "PayPal"`)
	})
})

var _ = Describe("ReconciliationReport validation", func() {
	It("refuses edits of what a pass covered", func() {
		ns := newNamespace()
		rr := &hooksv1alpha1.ReconciliationReport{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing-1"},
			Spec: hooksv1alpha1.ReconciliationReportSpec{
				BillingProviderRef: "billing",
				WindowStart:        metav1.Unix(1000, 0), WindowEnd: metav1.Unix(2000, 0),
			},
		}
		Expect(k8s.Create(ctx, rr)).To(Succeed())
		rr.Spec.WindowEnd = metav1.Unix(3000, 0)
		expectInvalid(k8s.Update(ctx, rr), "ReconciliationReport spec is immutable")
	})

	It("holds a full pass's confirmations well under the object size limit, and refuses an unknown reason", func() {
		ns := newNamespace()
		rr := &hooksv1alpha1.ReconciliationReport{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing-2"},
			Spec: hooksv1alpha1.ReconciliationReportSpec{BillingProviderRef: "billing",
				WindowStart: metav1.Unix(1000, 0), WindowEnd: metav1.Unix(2000, 0)},
		}
		Expect(k8s.Create(ctx, rr)).To(Succeed())
		base := rr.DeepCopy()
		versions := make([]string, hooksv1alpha1.MaxConfirmedSettlements)
		for i := range versions {
			// A real UID and a resourceVersion as long as a busy etcd's.
			versions[i] = hooksv1alpha1.ConfirmedVersion(fmt.Sprintf("0b5e7c1e-%04x-4000-8000-%012x", i%65536, i), fmt.Sprint(1_000_000_000+i))
		}
		rr.Status.Confirmed = &hooksv1alpha1.SettlementConfirmations{BillingProviderUID: "6f1d2c3b-0000-4000-8000-000000000001",
			ByReason: []hooksv1alpha1.ConfirmationGroup{{Reason: hooksv1alpha1.ReasonConfirmedByProvider, Settlements: versions}}}
		Expect(k8s.Status().Patch(ctx, rr, client.MergeFrom(base))).To(Succeed())
		raw, err := json.Marshal(rr)
		Expect(err).NotTo(HaveOccurred())
		Expect(len(raw)).To(BeNumerically("<", 300*1024), "a full report is well under 1 MiB")

		bad := rr.DeepCopy()
		bad.Status.Confirmed.ByReason = []hooksv1alpha1.ConfirmationGroup{{Reason: "Trusted", Settlements: versions[:1]}}
		expectInvalid(k8s.Status().Patch(ctx, bad, client.MergeFrom(rr)), "Unsupported value")
	})
})

var _ = Describe("what an operator sees", func() {
	It("shows a settlement's story in `kubectl get billingsettlements`", func() {
		ns := newNamespace()
		bs := sampleSettlement(ns, "visible")
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		bs.Status = hooksv1alpha1.BillingSettlementStatus{
			State: hooksv1alpha1.SettlementSettled, Attempts: 3, ProviderRef: "pay_77", Charge: "12.50 USD (1523 tokens)",
			Conditions: []metav1.Condition{{Type: hooksv1alpha1.ConditionReady, Status: metav1.ConditionTrue,
				Reason: hooksv1alpha1.ReasonProviderSettled, Message: "settled", LastTransitionTime: metav1.Now()}},
		}
		Expect(k8s.Status().Update(ctx, bs)).To(Succeed())

		out, errOut, err := runKubectl("get", "billingsettlements", "-n", ns)
		Expect(err).NotTo(HaveOccurred(), errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(2), out)
		Expect(strings.Fields(lines[0])).To(Equal([]string{
			"NAME", "CUSTOMER", "TYPE", "CHARGE", "STATE", "ATTEMPTS", "PROVIDER-REF", "REASON", "AGE",
		}))
		// One CHARGE column reads the same for usage and amounts: never a blank
		// AMOUNT and CURRENCY for a usage charge.
		Expect(lines[1]).To(MatchRegexp(`^visible\s+cus_42\s+Charge\s+12\.50 USD \(1523 tokens\)\s+Settled\s+3\s+pay_77\s+ProviderSettled\s`))
		out, errOut, err = runKubectl("get", "billingsettlements", "-n", ns, "-o", "wide")
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(strings.Fields(strings.SplitN(out, "\n", 2)[0])).To(ContainElements("AMOUNT", "CURRENCY", "USAGE", "EXPOSURE", "KEY"))

		// The short name and the category reach the same objects.
		out, errOut, err = runKubectl("get", "bs", "-n", ns, "-o", "name")
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(strings.TrimSpace(out)).To(Equal("billingsettlement.hooks.settlement.dev/visible"))
		Expect(k8s.Create(ctx, sampleProvider(ns, "inference"))).To(Succeed())
		out, errOut, err = runKubectl("get", "settlement", "-n", ns, "-o", "name")
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(out).To(ContainSubstring("billingsettlement.hooks.settlement.dev/visible"))
		Expect(out).To(ContainSubstring("webhookprovider.hooks.settlement.dev/inference"))
	})

	It("resolves every kind's printer columns through the API server's Table output", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, sampleProvider(ns, "tbl"))).To(Succeed())
		Expect(k8s.Create(ctx, &hooksv1alpha1.BillingProvider{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tbl"},
			Spec: hooksv1alpha1.BillingProviderSpec{
				Endpoint: "https://billing.example.com", CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "token"},
			},
		})).To(Succeed())
		for _, resource := range []string{
			"webhookproviders", "billingproviders", "webhookevents",
			"jobcompletions", "billingsettlements", "reconciliationreports",
		} {
			out, errOut, err := runKubectl("get", resource, "-n", ns, "-o", "wide")
			Expect(err).NotTo(HaveOccurred(), "%s: %s", resource, errOut)
			Expect(out+errOut).NotTo(ContainSubstring("error"), resource)
		}
		out, errOut, err := runKubectl("get", "webhookproviders", "-n", ns)
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(out).To(MatchRegexp(`tbl\s+StandardWebhooks`))
		// Why a provider is not ready is one glance away (the REASON column).
		for _, resource := range []string{"webhookproviders", "billingproviders"} {
			out, errOut, err := runKubectl("get", resource, "-n", ns)
			Expect(err).NotTo(HaveOccurred(), errOut)
			Expect(strings.Fields(strings.SplitN(out+"\n", "\n", 2)[0])).To(ContainElement("REASON"), resource)
		}
	})

	It("shows a report with nothing found as 0, not blank", func() {
		ns := newNamespace()
		rr := &hooksv1alpha1.ReconciliationReport{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing-quiet"},
			Spec: hooksv1alpha1.ReconciliationReportSpec{
				BillingProviderRef: "billing",
				WindowStart:        metav1.Unix(1000, 0), WindowEnd: metav1.Unix(2000, 0),
			},
		}
		Expect(k8s.Create(ctx, rr)).To(Succeed())
		// As the controller writes it: a merge patch carries only what changed, so the
		// zero counts are never sent; the CRD's defaults fill them in.
		base := rr.DeepCopy()
		rr.Status.Phase = hooksv1alpha1.ReportCompleted
		Expect(k8s.Status().Patch(ctx, rr, client.MergeFrom(base))).To(Succeed())
		out, errOut, err := runKubectl("get", "reconciliationreports", "-n", ns)
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(out).To(MatchRegexp(`(?m)^billing-quiet\s+billing\s+\S+\s+Completed\s+0\s+0\s+0\s`))
	})

	It("documents the API in `kubectl explain`", func() {
		out, errOut, err := runKubectl("explain", "billingsettlement.spec")
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(out).To(ContainSubstring("financial operation"))
		Expect(out).To(ContainSubstring("idempotencyKey"))
		Expect(out).To(ContainSubstring("sent with every attempt and replay"))

		out, errOut, err = runKubectl("explain", "webhookprovider.spec.signature.secretRef.keys")
		Expect(err).NotTo(HaveOccurred(), errOut)
		text := strings.Join(strings.Fields(out), " ")
		for _, want := range []string{"name two only while rotating", "No other key of the Secret is ever used",
			"kubernetes.io/tls is refused", "SigningKeyRefused", "SigningKeysUnnamed"} {
			Expect(text).To(ContainSubstring(want))
		}

		// The expression environment of route conditions.
		for _, field := range []string{"webhookprovider.spec.routes.when", "webhookprovider.spec.routes.operations.when"} {
			out, errOut, err = runKubectl("explain", field)
			Expect(err).NotTo(HaveOccurred(), errOut)
			// kubectl wraps the text itself: compare with the line breaks as spaces.
			text = strings.Join(strings.Fields(out), " ")
			for _, want := range []string{"- payload:", "jobState(string) -> string", "1,000,000 CEL cost units",
				"must have type bool", "Ready=False (InvalidSpec)", "answered 400", "Examples:"} {
				Expect(text).To(ContainSubstring(want), field)
			}
		}
		Expect(out).To(ContainSubstring("- item:"))
		Expect(out).To(ContainSubstring(`jobState(payload.data.state) == "Succeeded"`))
	})

	It("never breaks a sentence of `kubectl explain` in the middle of its line", func() {
		// kubectl wraps descriptions itself: a newline inside a paragraph (a Go doc
		// comment's wrap) shows as a ragged break. Every installed CRD is checked.
		scheme := testenv.Scheme()
		Expect(apiextensionsv1.AddToScheme(scheme)).To(Succeed())
		reader, err := client.New(cfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		var crds apiextensionsv1.CustomResourceDefinitionList
		Expect(reader.List(ctx, &crds)).To(Succeed())
		var broken []string
		for _, crd := range crds.Items {
			if crd.Spec.Group != hooksv1alpha1.GroupVersion.Group {
				continue
			}
			for _, v := range crd.Spec.Versions {
				walkDescriptions(v.Schema.OpenAPIV3Schema, crd.Spec.Names.Kind, func(path, d string) {
					if line, ok := midParagraphBreak(d); ok {
						broken = append(broken, path+": "+line)
					}
				})
			}
		}
		Expect(broken).To(BeEmpty())
	})
})

var _ = Describe("status subresource", func() {
	It("ignores status in a spec write and spec in a status write", func() {
		ns := newNamespace()
		bs := sampleSettlement(ns, "sub")
		bs.Status.State = hooksv1alpha1.SettlementSettled
		Expect(k8s.Create(ctx, bs)).To(Succeed())
		got := &hooksv1alpha1.BillingSettlement{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bs), got)).To(Succeed())
		Expect(got.Status.State).To(BeEmpty(), "status must only be written through the status subresource")
		Expect(got.Generation).To(Equal(int64(1)))
	})
})

// walkDescriptions calls fn with every description in a schema and its path.
func walkDescriptions(p *apiextensionsv1.JSONSchemaProps, path string, fn func(path, d string)) {
	if p == nil {
		return
	}
	if p.Description != "" {
		fn(path, p.Description)
	}
	for name, prop := range p.Properties {
		walkDescriptions(&prop, path+"."+name, fn)
	}
	if p.Items != nil {
		walkDescriptions(p.Items.Schema, path+"[]", fn)
	}
	if p.AdditionalProperties != nil {
		walkDescriptions(p.AdditionalProperties.Schema, path+"{}", fn)
	}
}

// midParagraphBreak finds a line of a description that ends inside a paragraph: the
// next line is neither blank, nor a list item, nor indented (an example).
func midParagraphBreak(d string) (string, bool) {
	lines := strings.Split(d, "\n")
	for i := 0; i+1 < len(lines); i++ {
		next := lines[i+1]
		if strings.TrimSpace(lines[i]) == "" || strings.TrimSpace(next) == "" ||
			strings.HasPrefix(next, " ") || listMarker.MatchString(next) {
			continue
		}
		return lines[i], true
	}
	return "", false
}

var listMarker = regexp.MustCompile(`^(?:[-*+] |[0-9]+[.)] )`)

var _ = Describe("BillingProvider validation of type Lago", func() {
	lago := func(ns string, mutate func(*hooksv1alpha1.BillingProviderSpec)) error {
		bp := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "lago-"},
			Spec: hooksv1alpha1.BillingProviderSpec{Type: hooksv1alpha1.BillingProviderLago, Endpoint: "https://api.getlago.com",
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "lago", Key: "key"},
				Lago:                 &hooksv1alpha1.LagoSettings{Metrics: []hooksv1alpha1.LagoMetric{{Meter: "tokens", Code: "llm_tokens", FieldName: "tokens"}}}}}
		mutate(&bp.Spec)
		return k8s.Create(ctx, bp)
	}
	It("accepts a metric mapping and a grace period", func() {
		Expect(lago(newNamespace(), func(s *hooksv1alpha1.BillingProviderSpec) {
			s.Lago.GracePeriod = &metav1.Duration{Duration: 72 * time.Hour}
		})).To(Succeed())
	})
	It("requires spec.lago for type Lago and refuses it for another type", func() {
		ns := newNamespace()
		expectInvalid(lago(ns, func(s *hooksv1alpha1.BillingProviderSpec) { s.Lago = nil }), "lago settings are required for type Lago")
		expectInvalid(lago(ns, func(s *hooksv1alpha1.BillingProviderSpec) { s.Type = hooksv1alpha1.BillingProviderHTTP }),
			"apply to type Lago only")
	})
	It("refuses a billable metric mapped from two meters, a reserved field name and a grace period out of range", func() {
		ns := newNamespace()
		expectInvalid(lago(ns, func(s *hooksv1alpha1.BillingProviderSpec) {
			s.Lago.Metrics = append(s.Lago.Metrics, hooksv1alpha1.LagoMetric{Meter: "gpu", Code: "llm_tokens", FieldName: "seconds"})
		}), "each Lago billable metric code is mapped from one usage meter only")
		expectInvalid(lago(ns, func(s *hooksv1alpha1.BillingProviderSpec) { s.Lago.Metrics[0].FieldName = "settlement_key" }),
			"properties the operator writes")
		expectInvalid(lago(ns, func(s *hooksv1alpha1.BillingProviderSpec) { s.Lago.Metrics = nil }), "spec.lago.metrics")
		expectInvalid(lago(ns, func(s *hooksv1alpha1.BillingProviderSpec) {
			s.Lago.GracePeriod = &metav1.Duration{Duration: time.Minute}
		}),
			"between 1h and 90 days")
	})
})
