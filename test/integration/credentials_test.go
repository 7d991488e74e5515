package integration_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fakejobsink"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// recorder is a real HTTP server "of the user's choosing": it records every request it
// receives, whole, and passes it on to a real billing provider or job sink behind it,
// so that the same server also shows that an allowed Secret works.
type recorder struct {
	*httptest.Server
	mu       sync.Mutex
	requests []string // each request's line, headers and body
}

func newRecorder(backend string) *recorder {
	GinkgoHelper()
	u, err := url.Parse(backend)
	Expect(err).NotTo(HaveOccurred())
	proxy := httputil.NewSingleHostReverseProxy(u)
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		dump, _ := httputil.DumpRequest(r, false)
		rec.mu.Lock()
		rec.requests = append(rec.requests, string(dump)+string(body))
		rec.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	return rec
}

// received describes every request so far: its first line, and whether it carried
// the value anywhere (headers or body). The value itself is never printed.
func (r *recorder) received(value string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.requests))
	for _, req := range r.requests {
		line, _, _ := strings.Cut(req, "\r\n")
		if strings.Contains(req, value) {
			line += " [carries the Secret's value]"
		}
		out = append(out, line)
	}
	return out
}

func (r *recorder) carried(value string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, req := range r.requests {
		if strings.Contains(req, "Authorization: Bearer "+value) {
			return true
		}
	}
	return false
}

var _ = Describe("credentials go only where they are meant to", func() {
	const (
		user       = "provider-author"
		dbPassword = "db-password-c0rrect-h0rse"
		dbSecret   = "database"
		labelFor   = "hooks.settlement.dev/credential-for"
		annotDest  = "hooks.settlement.dev/credential-destinations"
		refused    = "CredentialsNotAllowed"
	)

	It("never sends a Secret its user could not read, until the Secret opts in to that use and destination", func() {
		ns := fmt.Sprintf("creds-%d", nsCounter.Add(1))
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		// The namespace's own Secrets, made by someone who may: the sender's signing
		// secret, and a database password that has nothing to do with billing.
		Expect(k8s.Create(ctx, fixtures.Secrets(ns, "unused", "")[0])).To(Succeed())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: dbSecret},
			StringData: map[string]string{"password": dbPassword}})).To(Succeed())

		// A user who may write providers, and nothing else: no access to Secrets.
		Expect(k8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "provider-author"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{hooksv1alpha1.GroupVersion.Group},
				Resources: []string{"billingproviders", "webhookproviders"},
				Verbs:     []string{"get", "list", "watch", "create", "update", "patch"}}}})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "provider-author"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "provider-author"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}})).To(Succeed())
		asUser := rest.CopyConfig(cfg)
		asUser.Impersonate = rest.ImpersonationConfig{UserName: user}
		author, err := client.New(asUser, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() error {
			return author.List(ctx, &hooksv1alpha1.BillingProviderList{}, client.InNamespace(ns))
		}).Should(Succeed())
		err = author.Get(ctx, client.ObjectKey{Namespace: ns, Name: dbSecret}, &corev1.Secret{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the user must not be able to read the Secret: %v", err)

		// Servers of the user's choosing, each recording everything it receives, in
		// front of a real billing provider and job sink that accept the password as
		// their token (so the opted-in case below can work end to end).
		fake, err := fakebilling.Start(fakebilling.Options{Token: dbPassword, UsagePrice: 100})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(fake.Close)
		jobs, err := fakejobsink.Start(fakejobsink.Options{Token: dbPassword})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(jobs.Close)
		billingRec, sinkRec := newRecorder(fake.URL()), newRecorder(jobs.URL())
		DeferCleanup(billingRec.Close)
		DeferCleanup(sinkRec.Close)

		bp := fixtures.BillingProvider(ns, billingRec.URL)
		bp.Spec.CredentialsSecretRef = hooksv1alpha1.SecretKeyReference{Name: dbSecret, Key: "password"}
		bp.Spec.RequestTimeout = fixtures.Duration(time.Second)
		wp := fixtures.WebhookProvider(ns)
		wp.Spec.Routes[0].Operations[0].JobCompletion.Sink = jobSinkFor(sinkRec.URL, dbSecret)
		Expect(author.Create(ctx, bp)).To(Succeed())
		Expect(author.Create(ctx, wp)).To(Succeed())
		sendOK(ns, "msg_creds_1", jobEvent("job-creds-1", 1, 42))

		By("nothing reaches either server: not the BillingProvider's first reconciliation pass, not the settlement, not the job sink")
		Consistently(func() []string { return append(billingRec.received(dbPassword), sinkRec.received(dbPassword)...) }).
			WithTimeout(5 * time.Second).Should(BeEmpty())

		By("each refusal is visible, with what to add to the Secret")
		Eventually(readyOf(ns, bp)).Should(And(HaveField("Reason", refused),
			HaveField("Message", And(ContainSubstring(labelFor+"=billing"), ContainSubstring(annotDest)))))
		Eventually(readyOf(ns, wp)).Should(And(HaveField("Reason", refused),
			HaveField("Message", ContainSubstring(labelFor+"=job-sink"))))
		Eventually(func(g Gomega) {
			jc := jobOf(ns, "job-creds-1")
			g.Expect(jc.Progress().State).To(Equal(hooksv1alpha1.JobCompletionPending))
			g.Expect(condition(jc.Status.Conditions, hooksv1alpha1.ConditionReady)).To(HaveField("Reason", refused))
			bs := settlementOf(ns, "job-creds-1")
			g.Expect(bs.Status.State).To(Equal(hooksv1alpha1.SettlementPending))
			g.Expect(bs.Status.Exposure).To(Equal(hooksv1alpha1.ExposureNone))
			g.Expect(condition(bs.Status.Conditions, hooksv1alpha1.ConditionReady)).To(HaveField("Reason", refused))
			g.Expect(condition(bs.Status.Conditions, hooksv1alpha1.ConditionDeadLettered)).To(BeNil())
		}).Should(Succeed())
		var reports hooksv1alpha1.ReconciliationReportList
		Expect(k8s.List(ctx, &reports, client.InNamespace(ns))).To(Succeed())
		Expect(reports.Items).To(BeEmpty(), "no reconciliation pass without usable credentials")

		By("a Secret opted in to billing somewhere else is still not sent here")
		patchSecret(ns, dbSecret, map[string]string{labelFor: "billing"}, map[string]string{annotDest: "https://billing.example.com/v1"})
		Eventually(readyOf(ns, bp)).Should(And(HaveField("Reason", refused),
			HaveField("Message", ContainSubstring("does not list this destination"))))
		Consistently(func() []string { return append(billingRec.received(dbPassword), sinkRec.received(dbPassword)...) }).
			WithTimeout(3 * time.Second).Should(BeEmpty())

		By("once the Secret lists the endpoint, billing works normally: a pass, and the charge settles")
		patchSecret(ns, dbSecret, nil, map[string]string{annotDest: billingRec.URL + ", " + sinkRec.URL})
		Eventually(readyOf(ns, bp)).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(settlementState(ns, "job-creds-1")).Should(Equal(hooksv1alpha1.SettlementSettled))
		Expect(billingRec.carried(dbPassword)).To(BeTrue())
		Eventually(func(g Gomega) {
			g.Expect(k8s.List(ctx, &reports, client.InNamespace(ns))).To(Succeed())
			g.Expect(reports.Items).NotTo(BeEmpty())
		}).Should(Succeed())

		By("a billing credential is not a job sink credential")
		Consistently(sinkRec.received).WithArguments(dbPassword).WithTimeout(2 * time.Second).Should(BeEmpty())
		Expect(jobOf(ns, "job-creds-1").Progress().State).To(Equal(hooksv1alpha1.JobCompletionPending))

		By("opted in to the job sink, the completion is applied")
		patchSecret(ns, dbSecret, map[string]string{labelFor: "job-sink"}, nil)
		Eventually(jobState(ns, "job-creds-1")).Should(Equal(hooksv1alpha1.JobCompletionApplied))
		Expect(sinkRec.carried(dbPassword)).To(BeTrue())
		Eventually(readyOf(ns, wp)).Should(HaveField("Status", metav1.ConditionTrue))
	})
})

// jobSinkFor is an HTTP job sink at url whose bearer token is key "password" of secret.
func jobSinkFor(url, secret string) *hooksv1alpha1.JobSink {
	return &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP, URL: url, AllowInsecureHTTP: true,
		CredentialsSecretRef: &hooksv1alpha1.SecretKeyReference{Name: secret, Key: "password"}}
}

// readyOf returns the object's Ready condition (nil until it has one).
func readyOf(ns string, obj client.Object) func() *metav1.Condition {
	return func() *metav1.Condition {
		o := obj.DeepCopyObject().(client.Object)
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: obj.GetName()}, o); err != nil {
			return nil
		}
		switch t := o.(type) {
		case *hooksv1alpha1.BillingProvider:
			return condition(t.Status.Conditions, hooksv1alpha1.ConditionReady)
		case *hooksv1alpha1.WebhookProvider:
			return condition(t.Status.Conditions, hooksv1alpha1.ConditionReady)
		}
		return nil
	}
}

// patchSecret merges labels and annotations into a Secret, as its owner would.
func patchSecret(ns, name string, labels, annotations map[string]string) {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s)).To(Succeed())
	patch := client.MergeFrom(s.DeepCopy())
	for k, v := range labels {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
	for k, v := range annotations {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
	Expect(k8s.Patch(ctx, s, patch)).To(Succeed())
}
