package receiver

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// FuzzReceiver drives the whole receiver (HTTP, media type, provider lookup, signature,
// parsing, routing, the API server write) with arbitrary deliveries: any body, up to
// maxFuzzHeaders arbitrary headers, signed with the provider's own key and scheme or
// not, to a StandardWebhooks, an HMACSHA256, a Stripe and an unknown provider, on a
// real API server. checkAnswer holds what no input may achieve (docs/design.md §4):
//   - a panic;
//   - 2xx accepted/duplicate without a stored WebhookEvent of that provider whose spec
//     carries the body's canonical payload hash (409: without the quarantine record);
//   - any 2xx or 409 for a delivery not signed with the provider's key, or for a
//     provider that does not exist.
//
// `make fuzz` runs it (hack/fuzz.sh: one worker, its own TMPDIR); plain `go test`
// runs its seeds, and TestFuzzReceiverSeeds checks that each seed reaches the outcome
// it is there for.
func FuzzReceiver(f *testing.F) {
	for _, s := range receiverSeeds {
		f.Add(s.target, s.signed, s.id, []byte(s.body), s.headers)
	}
	if isFuzzWorker() {
		// A fuzzing worker starts the control plane now: the engine allows each input
		// 10 s (then panics "deadlocked!" and records the input as a crasher), and a
		// start-up on a loaded machine takes longer. The coordinator, which never runs
		// inputs, starts none.
		fuzzEnvironment(f)
	}
	f.Fuzz(func(t *testing.T, target uint8, signed bool, id string, body []byte, headers string) {
		fe := fuzzEnvironment(t) // started on first use when go test runs the seeds
		d := fuzzDelivery{target: target, signed: signed, id: id, body: body, headers: headers}
		a, sent := fe.deliver(t, fuzzNamespace, d)
		if !sent {
			return
		}
		fe.checkAnswer(t, fuzzNamespace, d, a)
	})
}

// TestFuzzReceiverSeeds proves the seeds exercise every path of the handler: each one
// reaches its intended outcome (and keeps FuzzReceiver's property).
func TestFuzzReceiverSeeds(t *testing.T) {
	fe := fuzzEnvironment(t)
	ns := fmt.Sprintf("fuzz-seeds-%d", fuzzSeedRuns.Add(1))
	if err := fe.install(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	for _, s := range receiverSeeds {
		// Sequential, in table order: a duplicate follows the delivery it repeats.
		t.Run(s.name, func(t *testing.T) {
			d := fuzzDelivery{target: s.target, signed: s.signed, id: s.id, body: []byte(s.body), headers: s.headers}
			a, sent := fe.deliver(t, ns, d)
			if !sent {
				t.Fatal("the seed cannot be sent over HTTP")
			}
			fe.checkAnswer(t, ns, d, a)
			// The receiver cuts API calls at 1.5 s here (for the fuzzing engine's 10 s
			// per input) and answers 503 past it, which the property allows; on a loaded
			// machine a seed is then retried, as a sender retries a 503.
			for try := 0; try < 3 && a.status == http.StatusServiceUnavailable && s.wantStatus != http.StatusServiceUnavailable; try++ {
				time.Sleep(time.Second)
				a, _ = fe.deliver(t, ns, d)
				fe.checkAnswer(t, ns, d, a)
			}
			if a.status != s.wantStatus || a.outcome != s.wantOutcome {
				t.Errorf("answer %d %s, want %d %s: %s", a.status, a.outcome, s.wantStatus, s.wantOutcome, a.raw)
			}
		})
	}
}

// isFuzzWorker tells whether this process is a fuzzing engine's worker (go test -fuzz
// runs the test binary again with -test.fuzzworker).
func isFuzzWorker() bool {
	fl := flag.Lookup("test.fuzzworker")
	return fl != nil && fl.Value.String() == "true"
}

// TestMain stops the control plane FuzzReceiver and TestFuzzReceiverSeeds started, if
// they did. A fuzzing worker the engine kills cannot do this: hack/fuzz.sh removes
// what such a worker leaves behind.
func TestMain(m *testing.M) {
	code := m.Run()
	stopFuzzEnvironment()
	os.Exit(code)
}

const (
	fuzzNamespace  = "fuzz"
	maxFuzzHeaders = 16
	hmacSecret     = "plain-hmac-secret"
	stripeSecret   = "whsec_stripe_test_secret"
)

var fuzzSeedRuns atomic.Int64

// fuzzTarget is a provider the fuzzer posts to and how its senders sign.
type fuzzTarget struct {
	provider string
	sig      signature.Config
	secret   string
	// exists is false for the unknown provider: no WebhookProvider has its name.
	exists bool
}

var (
	hmacConfig   = signature.Config{Scheme: signature.SchemeHMACSHA256, Header: "X-Signature", Prefix: "sha256=", Encoding: signature.EncodingHex, TimestampHeader: "X-Timestamp"}
	stripeConfig = signature.Config{Scheme: signature.SchemeStripe}
)

// fuzzTargets is indexed by the fuzz input's target byte (modulo its length).
var fuzzTargets = []fuzzTarget{
	{provider: "swh", sig: swh, secret: swhSecret, exists: true},
	{provider: "hmac", sig: hmacConfig, secret: hmacSecret, exists: true},
	{provider: "stripe", sig: stripeConfig, secret: stripeSecret, exists: true},
	{provider: "nobody", sig: swh, secret: swhSecret},
}

const (
	targetSWH uint8 = iota
	targetHMAC
	targetStripe
	targetUnknown
)

// receiverSeed is one seed input and the outcome it is there to reach.
type receiverSeed struct {
	name        string
	target      uint8
	signed      bool
	id          string
	body        string
	headers     string
	wantStatus  int
	wantOutcome string
}

// The seeds are the receiver's unit-test inputs (receiver_test.go: completedV2, its
// reordered and conflicting variants, the malformed and unrouted bodies, a wrong
// Content-Type, a forged signature), sent to each scheme.
var (
	withID        = func(id string) string { return strings.Replace(completedV2, `{"type"`, `{"id":"`+id+`","type"`, 1) }
	reorderedV2   = `{ "data" : { "usage":{"tokens":1523}, "completed_at":"2026-11-30T12:00:00Z", "customer":"cus_1", "state":"succeeded","version":2.0e0,"job_id":"job-1"}, "type":"job.completed" }`
	conflictingV2 = strings.Replace(completedV2, `"tokens":1523`, `"tokens":9999`, 1)
	missingJobID  = `{"type":"job.completed","data":{"version":1,"customer":"c","usage":{"tokens":1}}}`
	negativeUsage = strings.Replace(completedV2, `"tokens":1523`, `"tokens":-5`, 1)
	manyHeaders   = "X-Request-Id: 7\nX-Forwarded-For: 10.0.0.1\nUser-Agent: fuzz\nAccept: */*\nX-Event-Type: job.started\nX-Event-Id: evt_other\nWebhook-Id: msg_forged\nX-Timestamp: 0\nStripe-Signature: t=0,v1=00\nX-Signature: sha256=00\nContent-Type: application/json; charset=utf-8\nAccept-Encoding: identity\nX-Trace: a\nX-Empty:\nConnection: keep-alive\nX-Last: z"
	receiverSeeds = []receiverSeed{
		{name: "standard webhooks stored", target: targetSWH, signed: true, id: "msg_1", body: completedV2,
			wantStatus: http.StatusOK, wantOutcome: OutcomeAccepted},
		{name: "standard webhooks duplicate", target: targetSWH, signed: true, id: "msg_1", body: completedV2,
			wantStatus: http.StatusOK, wantOutcome: OutcomeDuplicate},
		{name: "reordered JSON is a duplicate", target: targetSWH, signed: true, id: "msg_1", body: reorderedV2,
			wantStatus: http.StatusOK, wantOutcome: OutcomeDuplicate},
		{name: "same ID other payload quarantined", target: targetSWH, signed: true, id: "msg_1", body: conflictingV2,
			wantStatus: http.StatusConflict, wantOutcome: OutcomeConflict},
		{name: "unsigned 401", target: targetSWH, id: "msg_2", body: completedV2,
			wantStatus: http.StatusUnauthorized, wantOutcome: OutcomeUnauthorized},
		{name: "forged signature 401", target: targetSWH, body: completedV2,
			headers:    "Webhook-Id: msg_3\nWebhook-Timestamp: 1614265330\nWebhook-Signature: v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
			wantStatus: http.StatusUnauthorized, wantOutcome: OutcomeUnauthorized},
		{name: "malformed JSON 400", target: targetSWH, signed: true, id: "msg_4", body: `{"type":`,
			wantStatus: http.StatusBadRequest, wantOutcome: OutcomeBadRequest},
		{name: "missing type 400", target: targetSWH, signed: true, id: "msg_5", body: `{"data":{}}`,
			wantStatus: http.StatusBadRequest, wantOutcome: OutcomeBadRequest},
		{name: "missing job ID 400", target: targetSWH, signed: true, id: "msg_6", body: missingJobID,
			wantStatus: http.StatusBadRequest, wantOutcome: OutcomeBadRequest},
		{name: "negative usage 400", target: targetSWH, signed: true, id: "msg_7", body: negativeUsage,
			wantStatus: http.StatusBadRequest, wantOutcome: OutcomeBadRequest},
		{name: "unrouted type ignored", target: targetSWH, signed: true, id: "msg_8", body: `{"type":"job.started","data":{}}`,
			wantStatus: http.StatusOK, wantOutcome: OutcomeIgnored},
		{name: "not JSON 415", target: targetSWH, signed: true, id: "msg_9", body: completedV2, headers: "Content-Type: text/plain",
			wantStatus: http.StatusUnsupportedMediaType, wantOutcome: OutcomeUnsupportedType},
		{name: "sixteen arbitrary headers stored", target: targetSWH, signed: true, id: "msg_10", body: completedV2, headers: manyHeaders,
			wantStatus: http.StatusOK, wantOutcome: OutcomeAccepted},
		{name: "hmac stored", target: targetHMAC, signed: true, body: withID("evt_h1"), headers: "X-Event-Type: job.started",
			wantStatus: http.StatusOK, wantOutcome: OutcomeAccepted},
		{name: "hmac duplicate", target: targetHMAC, signed: true, body: withID("evt_h1"),
			wantStatus: http.StatusOK, wantOutcome: OutcomeDuplicate},
		{name: "hmac forged 401", target: targetHMAC, body: withID("evt_h2"),
			headers:    "X-Signature: sha256=" + strings.Repeat("ab", 32) + "\nX-Timestamp: 1614265330",
			wantStatus: http.StatusUnauthorized, wantOutcome: OutcomeUnauthorized},
		{name: "stripe stored", target: targetStripe, signed: true, body: withID("evt_s1"),
			wantStatus: http.StatusOK, wantOutcome: OutcomeAccepted},
		{name: "stripe malformed 400", target: targetStripe, signed: true, body: `{"id":"evt_s2","type":[`,
			wantStatus: http.StatusBadRequest, wantOutcome: OutcomeBadRequest},
		{name: "stripe stale signature 401", target: targetStripe, body: withID("evt_s3"),
			headers:    "Stripe-Signature: t=1614265330,v1=" + strings.Repeat("0", 64),
			wantStatus: http.StatusUnauthorized, wantOutcome: OutcomeUnauthorized},
		{name: "unknown provider signed 404", target: targetUnknown, signed: true, id: "msg_11", body: completedV2,
			wantStatus: http.StatusNotFound, wantOutcome: OutcomeUnknownProvider},
		{name: "unknown provider unsigned 404", target: targetUnknown, body: `{}`,
			wantStatus: http.StatusNotFound, wantOutcome: OutcomeUnknownProvider},
	}
)

// fuzzDelivery is one fuzz input.
type fuzzDelivery struct {
	target  uint8
	signed  bool
	id      string
	body    []byte
	headers string
}

func (d fuzzDelivery) to() fuzzTarget { return fuzzTargets[int(d.target)%len(fuzzTargets)] }

// fuzzAnswer is the receiver's answer: the status and the JSON body's outcome and event.
type fuzzAnswer struct {
	status  int
	outcome string
	event   string
	raw     string
}

// fuzzEnv is the control plane and the receiver under test, one per process.
type fuzzEnv struct {
	env    *envtest.Environment
	k8s    client.Client // reads the API server directly, never a cache
	cache  client.Reader // the receiver's informer cache
	server *httptest.Server
	client *http.Client
	cancel context.CancelFunc
}

var (
	fuzzEnvOnce sync.Once
	fuzzEnvMu   sync.Mutex
	fuzzEnvVal  *fuzzEnv
	fuzzEnvErr  error
)

func fuzzEnvironment(t testing.TB) *fuzzEnv {
	t.Helper()
	fuzzEnvOnce.Do(func() {
		fe, err := startFuzzEnv()
		fuzzEnvMu.Lock()
		fuzzEnvVal, fuzzEnvErr = fe, err
		fuzzEnvMu.Unlock()
	})
	if fuzzEnvErr != nil {
		t.Fatalf("the control plane for the receiver's fuzz test did not start: %v", fuzzEnvErr)
	}
	return fuzzEnvVal
}

func stopFuzzEnvironment() {
	fuzzEnvMu.Lock()
	defer fuzzEnvMu.Unlock()
	if fuzzEnvVal != nil {
		fuzzEnvVal.stop()
		fuzzEnvVal = nil
	}
}

// startFuzzEnv starts a control plane, a manager's cache and the receiver behind an
// HTTP server, and installs the fuzz providers.
func startFuzzEnv() (fe *fuzzEnv, err error) {
	closeInheritedDescriptorsOnExec()
	// controller-runtime takes only the first SetLogger: a fuzzing worker discards its
	// logs, but under plain go test (seeds run before TestReceiver) the suite's logger,
	// which specs read lines from, must be the one that takes.
	if isFuzzWorker() {
		logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	}
	env, err := testenv.New()
	if err != nil {
		return nil, err
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fe = &fuzzEnv{env: env, cancel: cancel}
	defer func() {
		if err != nil {
			fe.stop()
		}
	}()
	if fe.k8s, err = client.New(cfg, client.Options{Scheme: env.Scheme}); err != nil {
		return fe, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		return fe, err
	}
	// Each API call is cut at 1.5 s (answered 503, which the property allows), so one
	// input stays well inside the engine's 10 s even when the API server stalls.
	rcv := New(Options{APITimeout: 1500 * time.Millisecond, RetryAfter: time.Second},
		mgr.GetCache(), fe.k8s, mgr.GetAPIReader(), mgr.GetEventRecorder("settlement-receiver"))
	fe.cache = mgr.GetCache()
	if err := WarmCache(ctx, mgr.GetCache()); err != nil {
		return fe, err
	}
	go func() { _ = mgr.Start(ctx) }()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		return fe, fmt.Errorf("the manager's cache did not sync")
	}
	fe.server = httptest.NewServer(panicReporting(rcv.Handler()))
	fe.client = fe.server.Client()
	fe.client.Timeout = 30 * time.Second
	return fe, fe.install(ctx, fuzzNamespace)
}

func (fe *fuzzEnv) stop() {
	if fe.server != nil {
		fe.server.Close()
	}
	fe.cancel()
	_ = fe.env.Stop()
}

// closeInheritedDescriptorsOnExec marks every descriptor above stderr close-on-exec.
// The fuzzing engine talks to its worker over descriptors the worker inherits without
// that flag; a control plane started from the worker would inherit them too, outlive
// the worker when the engine kills it, and keep `go test -fuzz` waiting for pipes to
// close long after -fuzztime (docs/decisions.md, "Fuzzing").
func closeInheritedDescriptorsOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// install creates ns, the providers' Secrets and the providers, and waits until the
// receiver's cache knows them.
func (fe *fuzzEnv) install(ctx context.Context, ns string) error {
	if err := fe.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	for _, tgt := range fuzzTargets {
		if !tgt.exists {
			continue
		}
		p := fuzzProvider(ns, tgt)
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Spec.Signature.SecretRef.Name},
			StringData: map[string]string{"current": tgt.secret}}
		if err := fe.k8s.Create(ctx, secret); err != nil {
			return fmt.Errorf("create secret for %s: %w", tgt.provider, err)
		}
		if err := fe.k8s.Create(ctx, p); err != nil {
			return fmt.Errorf("create provider %s: %w", tgt.provider, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for fe.cache.Get(ctx, client.ObjectKeyFromObject(p), &hooksv1alpha1.WebhookProvider{}) != nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("the receiver's cache never saw provider %s", tgt.provider)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// fuzzProvider routes job.completed to a job completion and a settlement, as the unit
// tests' provider does. Every field that decides an effect comes from signed bytes:
// the body, or the Standard Webhooks webhook-id header, which that scheme signs.
func fuzzProvider(ns string, tgt fuzzTarget) *hooksv1alpha1.WebhookProvider {
	p := inferenceProvider(ns)
	p.Name = tgt.provider
	p.Spec.Signature = hooksv1alpha1.SignatureSpec{SecretRef: hooksv1alpha1.SigningSecretReference{Name: tgt.provider + "-secret"}}
	p.Spec.EventID = hooksv1alpha1.EventIDSource{JSONPath: ".id"}
	s := &p.Spec.Signature
	switch tgt.sig.Scheme {
	case signature.SchemeStandardWebhooks:
		s.Scheme = hooksv1alpha1.SchemeStandardWebhooks
		p.Spec.EventID = hooksv1alpha1.EventIDSource{Header: signature.HeaderWebhookID}
	case signature.SchemeStripe:
		s.Scheme = hooksv1alpha1.SchemeStripe
	default:
		s.Scheme = hooksv1alpha1.SchemeHMACSHA256
		s.Header, s.Prefix, s.TimestampHeader = tgt.sig.Header, tgt.sig.Prefix, tgt.sig.TimestampHeader
		s.Encoding = hooksv1alpha1.EncodingHex
	}
	return p
}

// deliver posts d to the receiver over HTTP. sent is false when d cannot travel over
// HTTP at all (a header no client can send, which a server would refuse before the
// handler): such an input tests nothing.
func (fe *fuzzEnv) deliver(t testing.TB, ns string, d fuzzDelivery) (a fuzzAnswer, sent bool) {
	t.Helper()
	tgt := d.to()
	h := http.Header{}
	for i, line := range strings.Split(d.headers, "\n") {
		if i == maxFuzzHeaders {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if value = strings.TrimSpace(value); ok && validHeaderName(name) && validHeaderValue(value) {
			h.Add(name, value)
		}
	}
	if _, ok := h["Content-Type"]; !ok {
		h.Set("Content-Type", "application/json")
	}
	if d.signed {
		// Signed last: the signature headers are the provider's, every other header
		// stays arbitrary.
		id := d.id
		if id == "" {
			id = "msg_fuzz"
		}
		sig, err := signature.Sign(tgt.sig, []byte(tgt.secret), id, time.Now(), d.body)
		if err != nil {
			t.Fatalf("sign: %v", err)
		}
		for k, vs := range sig {
			for _, v := range vs {
				if !validHeaderValue(v) {
					return a, false
				}
			}
			h[k] = vs
		}
	}
	req, err := http.NewRequest(http.MethodPost, fe.server.URL+EndpointPath(ns, tgt.provider), bytes.NewReader(d.body))
	if err != nil {
		t.Fatalf("build request: %v", err)
	}
	req.Header = h
	resp, err := fe.client.Do(req)
	if err != nil {
		t.Fatalf("the receiver gave no answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	a = fuzzAnswer{status: resp.StatusCode, raw: string(b)}
	if resp.Header.Get(panicHeader) != "" || strings.Contains(a.raw, panicMarker) {
		t.Fatalf("the receiver panicked on %s: %s", tgt.provider, a.raw)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("answer %d is not a JSON object of strings: %q", a.status, a.raw)
	}
	a.outcome, a.event = m["status"], m["event"]
	if a.outcome == "" {
		a.outcome = m["error"]
	}
	return a, true
}

// checkAnswer asserts FuzzReceiver's property for d's answer a.
func (fe *fuzzEnv) checkAnswer(t testing.TB, ns string, d fuzzDelivery, a fuzzAnswer) {
	t.Helper()
	tgt := d.to()
	success := a.status >= 200 && a.status < 300
	if (success || a.status == http.StatusConflict) && !(d.signed && tgt.exists) {
		t.Fatalf("answered %d %s to a delivery not signed with provider %q's key (or for no provider): %s",
			a.status, a.outcome, tgt.provider, a.raw)
	}
	switch {
	case success && (a.outcome == OutcomeAccepted || a.outcome == OutcomeDuplicate):
		fe.checkStored(t, ns, tgt, d.body, a, false)
	case success && a.outcome == OutcomeIgnored:
		if a.event != "" {
			t.Fatalf("an ignored delivery names an event: %s", a.raw)
		}
	case success:
		t.Fatalf("2xx with outcome %q, which promises nothing known: %s", a.outcome, a.raw)
	case a.status == http.StatusConflict:
		fe.checkStored(t, ns, tgt, d.body, a, true)
	}
}

// checkStored reads the event a names from the API server (never a cache): it must
// exist, belong to tgt's provider and carry body's canonical payload hash.
func (fe *fuzzEnv) checkStored(t testing.TB, ns string, tgt fuzzTarget, body []byte, a fuzzAnswer, quarantine bool) {
	t.Helper()
	want, err := identity.CanonicalHash(body)
	if err != nil {
		t.Fatalf("answered %d %s for a body that has no canonical hash (%v): %s", a.status, a.outcome, err, a.raw)
	}
	if a.event == "" {
		t.Fatalf("answered %d %s without naming the event: %s", a.status, a.outcome, a.raw)
	}
	var ev hooksv1alpha1.WebhookEvent
	if err := fe.getEvent(ns, a.event, &ev); err != nil {
		t.Fatalf("answered %d %s but event %s/%s cannot be read from the API server: %v", a.status, a.outcome, ns, a.event, err)
	}
	switch {
	case ev.Spec.Provider != tgt.provider || ev.Labels[hooksv1alpha1.LabelProvider] != tgt.provider:
		t.Fatalf("answered %d %s for provider %s, but the stored event %s is provider %q's", a.status, a.outcome,
			tgt.provider, a.event, ev.Spec.Provider)
	case ev.Spec.PayloadHash != want:
		t.Fatalf("answered %d %s, but the stored event %s has payload hash %s, this body %s", a.status, a.outcome,
			a.event, ev.Spec.PayloadHash, want)
	case quarantine != (ev.Spec.Quarantine != nil):
		t.Fatalf("answered %d %s, but event %s is quarantined=%t", a.status, a.outcome, a.event, ev.Spec.Quarantine != nil)
	}
}

// getEvent reads an event from the API server, trying again for a few seconds while
// the API server does not answer (not while it says NotFound), so that a stalled API
// server is not taken for a lost event.
func (fe *fuzzEnv) getEvent(ns, name string, ev *hooksv1alpha1.WebhookEvent) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := fe.k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ev)
		cancel()
		if err == nil || apierrors.IsNotFound(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

const (
	panicHeader = "X-Fuzz-Panic"
	panicMarker = "\nthe receiver panicked: "
)

// panicReporting turns a panic of the handler into an answer FuzzReceiver reports
// with its stack (net/http would only drop the connection).
func panicReporting(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				w.Header().Set(panicHeader, "1")
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = fmt.Fprintf(w, "%s%v\n%s", panicMarker, p, debug.Stack())
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// validHeaderName and validHeaderValue are RFC 9110's token and field-value rules, as
// net/http's client enforces them.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
