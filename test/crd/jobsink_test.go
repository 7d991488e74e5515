package crd_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// Job sinks need https:// unless explicitly allowed, as billing endpoints do.
var _ = Describe("job sink validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	withSink := func(name string, sink *hooksv1alpha1.JobSink) *hooksv1alpha1.WebhookProvider {
		p := sampleProvider(ns, name)
		p.Spec.Routes = []hooksv1alpha1.Route{{EventType: "job.completed", Operations: []hooksv1alpha1.RouteOperation{{
			Type:          hooksv1alpha1.OperationJobCompletion,
			JobCompletion: &hooksv1alpha1.JobCompletionMapping{JobID: ".job_id", Sink: sink}}}}}
		return p
	}

	It("refuses a plain http sink on a route unless allowInsecureHTTP says so", func() {
		expectInvalid(k8s.Create(ctx, withSink("plain", &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP,
			URL: "http://jobs.scheduler.svc:8080"})),
			"sink.url must use https:// unless sink.allowInsecureHTTP is true")
		Expect(k8s.Create(ctx, withSink("plain-ok", &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP,
			URL: "http://jobs.scheduler.svc:8080", AllowInsecureHTTP: true}))).To(Succeed())
		Expect(k8s.Create(ctx, withSink("tls", &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP,
			URL: "https://jobs.example.com"}))).To(Succeed())
		Expect(k8s.Create(ctx, withSink("none", &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkNone}))).To(Succeed())
	})

	It("keeps accepting a stored record's plain http sink (copied from a route written before the rule)", func() {
		jc := &hooksv1alpha1.JobCompletion{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-job-legacy"},
			Spec: hooksv1alpha1.JobCompletionSpec{Provider: "inference", JobID: "job-1",
				Completion: hooksv1alpha1.Completion{Version: 1, State: hooksv1alpha1.JobSucceeded},
				Sink:       &hooksv1alpha1.JobSink{Type: hooksv1alpha1.JobSinkHTTP, URL: "http://jobs.scheduler.svc:8080"}},
		}
		Expect(k8s.Create(ctx, jc)).To(Succeed())
	})
})
