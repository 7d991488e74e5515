package receiver

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/sender"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// BenchmarkIngestion compares, against one API server in one run, the raw create rate
// of a minimal WebhookEvent (the ceiling of a design whose ack is one create) with the
// receiver's accepted-events/s and duplicates/s, each with the same number of
// concurrent senders. Numbers are reported as ratios to that baseline; nothing here
// asserts a time.
//
//	make bench   (or: KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go test -run '^$' -bench Ingestion ./internal/receiver)
func BenchmarkIngestion(b *testing.B) {
	const perRound, senders = 400, 16
	env, err := testenv.New()
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		b.Fatal(err)
	}
	r := New(Options{BindAddress: "127.0.0.1:0", MaxInFlight: 256}, mgr.GetCache(), mgr.GetClient(), mgr.GetAPIReader(),
		mgr.GetEventRecorder("bench"))
	if err := WarmCache(ctx, mgr.GetCache()); err != nil {
		b.Fatal(err)
	}
	if err := mgr.Add(r); err != nil {
		b.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()
	addr, err := r.Addr(ctx)
	if err != nil {
		b.Fatal(err)
	}

	ns := "bench"
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	must(k.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-secret"},
		StringData: map[string]string{"k": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}))
	p := &hooksv1alpha1.WebhookProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference"},
		Spec: hooksv1alpha1.WebhookProviderSpec{
			Signature: hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeStandardWebhooks,
				SecretRef: hooksv1alpha1.SecretReference{Name: "inference-secret"}},
			EventID: hooksv1alpha1.EventIDSource{Header: "webhook-id"}, EventType: hooksv1alpha1.FieldSource{JSONPath: ".type"},
			Routes: []hooksv1alpha1.Route{{EventType: "job.completed", Operations: []hooksv1alpha1.RouteOperation{
				{Type: hooksv1alpha1.OperationJobCompletion, JobCompletion: &hooksv1alpha1.JobCompletionMapping{
					JobID: ".data.job_id", CompletionVersion: ".data.version"}},
				{Type: hooksv1alpha1.OperationBillingSettlement, Settlement: &hooksv1alpha1.SettlementMapping{
					BillingProviderRef: "billing", JobID: ".data.job_id", Customer: ".data.customer",
					Usage: &hooksv1alpha1.UsageMapping{Quantity: ".data.tokens", Meter: "tokens"}}},
			}}},
		}}
	must(k.Create(ctx, p))
	for {
		if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(p), &hooksv1alpha1.WebhookProvider{}); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: senders}}
	url := "http://" + addr.String() + EndpointPath(ns, "inference")
	body := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"type":"job.completed","data":{"job_id":"job-%d","version":1,"customer":"c","tokens":%d}}`, i, i))
	}

	// parallel runs n tasks on `senders` workers and returns the wall time.
	parallel := func(n int, task func(i int) error) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		var failed atomic.Value
		start := time.Now()
		for range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return
					}
					if err := task(i); err != nil {
						failed.Store(err)
					}
				}
			}()
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	deliver := func(id string, i int, want string) error {
		resp, err := sender.Send(ctx, hc, sender.Delivery{URL: url, ID: id, Body: body(i),
			Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks},
			Secret:    []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")})
		if err != nil {
			return err
		}
		if resp.Status != http.StatusOK || !strings.Contains(resp.Body, want) {
			return fmt.Errorf("delivery %s: %d %s", id, resp.Status, resp.Body)
		}
		return nil
	}

	var raw, accepted, dup time.Duration
	total := 0
	for round := 0; round < b.N; round++ {
		base := round * perRound
		raw += parallel(perRound, func(i int) error {
			return k.Create(ctx, &hooksv1alpha1.WebhookEvent{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("raw-%d", base+i)},
				Spec: hooksv1alpha1.WebhookEventSpec{Provider: "inference", EventID: fmt.Sprint(base + i), EventType: "job.completed",
					PayloadHash: "sha256:" + strings.Repeat("0", 64), ReceivedAt: metav1.Now()},
			})
		})
		accepted += parallel(perRound, func(i int) error { return deliver(fmt.Sprintf("msg_%d", base+i), base+i, "accepted") })
		dup += parallel(perRound, func(i int) error { return deliver(fmt.Sprintf("msg_%d", base+i), base+i, "duplicate") })
		total += perRound
	}
	rate := func(d time.Duration) float64 { return float64(total) / d.Seconds() }
	b.ReportMetric(rate(raw), "raw-creates/s")
	b.ReportMetric(rate(accepted), "accepted/s")
	b.ReportMetric(rate(dup), "duplicates/s")
	b.ReportMetric(rate(accepted)/rate(raw), "accepted/raw")
	b.ReportMetric(rate(dup)/rate(accepted), "duplicate/accepted")
	b.ReportMetric(0, "ns/op")
}
