package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers/archiver"
	"github.com/settlement-operator/settlement-operator/controllers/billingprovider"
	"github.com/settlement-operator/settlement-operator/controllers/billingsettlement"
	"github.com/settlement-operator/settlement-operator/controllers/jobcompletion"
	"github.com/settlement-operator/settlement-operator/controllers/webhookevent"
	"github.com/settlement-operator/settlement-operator/controllers/webhookprovider"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivewatermark"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
	"github.com/settlement-operator/settlement-operator/internal/receiver"
	"github.com/settlement-operator/settlement-operator/internal/tombstone"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fakejobsink"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The operations suite runs the whole operator — receiver and controllers in a real
// manager — against a real kube-apiserver, with a fake billing provider and job sink
// that are real HTTP servers with a ledger and fault injection. Its assertions are
// about the world: objects' states and the provider's ledger, never calls made.

var (
	env     *envtest.Environment
	cfg     *rest.Config
	k8s     client.Client
	ctx     context.Context
	cancel  context.CancelFunc
	billing *fakebilling.Server
	sink    *fakejobsink.Server
	mgr     *runningManager
	// tombstones is where every manager of the suite keeps the tombstones of
	// settlements deleted without an archive (the operator's namespace).
	tombstones *tombstone.Keeper
)

// operatorNamespace stands for the operator's own namespace.
const operatorNamespace = "settlement-operator-system"

const billingToken = "test-billing-token"

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(30 * time.Second)
	SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
	RunSpecs(t, "Operations suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())

	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}})).To(Succeed())
	tombstones = &tombstone.Keeper{Client: k8s, Namespace: operatorNamespace}

	billing, err = fakebilling.Start(fakebilling.Options{Token: billingToken, UsagePrice: 100})
	Expect(err).NotTo(HaveOccurred())
	sink, err = fakejobsink.Start(fakejobsink.Options{KnownJobs: fakejobsink.OnlyRegistered})
	Expect(err).NotTo(HaveOccurred())
	mgr = startManager()
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.stop()
	}
	if cancel != nil {
		cancel()
	}
	if billing != nil {
		_ = billing.Close()
	}
	if sink != nil {
		_ = sink.Close()
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// runningManager is one manager process's worth of operator: it can be stopped and a
// new one started, as a restart or a leader change would.
type runningManager struct {
	cancel  context.CancelFunc
	done    chan struct{}
	baseURL string
	m       ctrl.Manager
}

// managerOptions vary a manager from the default (no archive).
type managerOptions struct {
	// store, when set, turns the archive on with records archived after archiveAfter.
	store        *archive.Store
	archiveAfter time.Duration
	// maxListPages, when set, caps a reconciliation pass's walk of the provider's list.
	maxListPages int
	// maxLookups, when set, caps a reconciliation pass's lookups by key.
	maxLookups int
	// watermark and migrator, when set with store, keep the archive's watermark and
	// compare the archive with it (the migrator is added to the manager).
	watermark *archivewatermark.Keeper
	migrator  *archiver.Migrator
	// noEventController leaves the WebhookEvent controller out: deliveries are stored
	// and wait, as they would for a busy or starting leader.
	noEventController bool
	// settlementWorkers, when set, is how many settlements are worked on at once (1).
	settlementWorkers int
	// transport, when set, wraps every request the manager (controllers, receiver,
	// recorders) sends to the API server: writes_test.go counts them.
	transport func(http.RoundTripper) http.RoundTripper
}

// waitingGrace is how long a provider waiting for something that may still come is
// Reconciling before it is Stalled: 15s here (2m in production), so kstatus_test.go
// sees both.
const waitingGrace = 15 * time.Second

func startManager(opts ...managerOptions) *runningManager {
	GinkgoHelper()
	var o managerOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	mcfg := rest.CopyConfig(cfg)
	if o.transport != nil {
		mcfg.Wrap(o.transport)
	}
	m, err := ctrl.NewManager(mcfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// A restarted manager registers the same controllers again in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	// A Ready provider is re-checked every 10s here (1m in production), one waiting for
	// its Secret every 1s (5s): webhookprovider_test.go tells the two apart.
	Expect((&webhookprovider.Reconciler{Client: m.GetClient(), APIReader: m.GetAPIReader(),
		SecretRecheckInterval: 10 * time.Second, SecretWaitInterval: time.Second,
		WaitingGrace: waitingGrace}).SetupWithManager(m)).To(Succeed())
	if !o.noEventController {
		Expect((&webhookevent.Reconciler{Client: m.GetClient(), APIReader: m.GetAPIReader(),
			Recorder: m.GetEventRecorder("webhookevent"), Archive: o.store,
			StatusDelay: webhookevent.DefaultEventStatusDelay}).SetupWithManager(m)).To(Succeed())
	} else {
		Expect(webhookevent.IndexEvents(m)).To(Succeed()) // for a spec's own reconciler
	}
	// Secrets are not watched: a fixed opt-in is seen at the next recheck, 1s here.
	Expect((&jobcompletion.Reconciler{Client: m.GetClient(), APIReader: m.GetAPIReader(),
		Recorder: m.GetEventRecorder("jobcompletion"), CredentialRecheckInterval: time.Second}).SetupWithManager(m)).To(Succeed())
	// A failure stands against successes for 2s here (30s in production).
	health := providerclient.NewHealth()
	health.Hold = 2 * time.Second
	Expect((&billingsettlement.Reconciler{Client: m.GetClient(), APIReader: m.GetAPIReader(),
		Recorder: m.GetEventRecorder("billingsettlement"), Archive: o.store, Watermark: o.watermark, Health: health,
		Tombstones: tombstones, CredentialRecheckInterval: time.Second, MaxConcurrentReconciles: o.settlementWorkers}).SetupWithManager(m)).To(Succeed())
	Expect((&billingprovider.Reconciler{Client: m.GetClient(), APIReader: m.GetAPIReader(),
		Recorder: m.GetEventRecorder("billingprovider"), Archive: o.store, Health: health,
		CredentialRecheckInterval: time.Second, MaxListPages: o.maxListPages, MaxLookups: o.maxLookups, WaitingGrace: waitingGrace,
		// Usage totals are compared up to 1s ago with 1s of clock skew (1h and 1m in
		// production): the fakes and the API server share this machine's clock.
		UsageTotalsLag: time.Second, UsageClockSkew: time.Second}).SetupWithManager(m)).To(Succeed())
	recvOpts := receiver.Options{BindAddress: "127.0.0.1:0", SecretTTL: time.Second}
	if o.store != nil {
		Expect((&archiver.Reconciler{Client: m.GetClient(), Archive: o.store, After: o.archiveAfter,
			Recorder: m.GetEventRecorder("archiver"), Watermark: o.watermark}).SetupWithManager(m)).To(Succeed())
		if o.migrator != nil {
			if o.watermark != nil && o.watermark.Recorder == nil {
				o.watermark.Recorder = m.GetEventRecorder("archive")
			}
			Expect(m.Add(o.migrator)).To(Succeed())
		}
		recvOpts.Archive = o.store
	}
	recv := receiver.New(recvOpts, m.GetCache(),
		m.GetClient(), m.GetAPIReader(), m.GetEventRecorder("receiver"))
	Expect(receiver.WarmCache(ctx, m.GetCache())).To(Succeed())
	Expect(m.Add(recv)).To(Succeed())

	mctx, mcancel := context.WithCancel(ctx)
	rm := &runningManager{cancel: mcancel, done: make(chan struct{}), m: m}
	go func() {
		defer GinkgoRecover()
		defer close(rm.done)
		Expect(m.Start(mctx)).To(Succeed())
	}()
	addr, err := recv.Addr(ctx)
	Expect(err).NotTo(HaveOccurred())
	rm.baseURL = "http://" + addr.String()
	return rm
}

func (m *runningManager) stop() {
	m.cancel()
	Eventually(m.done).WithTimeout(time.Minute).Should(BeClosed())
}

var nsCounter atomic.Int64

// newTenant creates a namespace with a billing provider pointing at the fake, its
// token, and a webhook provider "inference" whose job.completed events complete the
// job (sink None) and charge its usage.
func newTenant(mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
	GinkgoHelper()
	return newTenantWithToken(billingToken, mutate...)
}

// newTenantWithToken is newTenant with another billing credential.
func newTenantWithToken(token string, mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
	GinkgoHelper()
	return tenantIn(fmt.Sprintf("ops-%d", nsCounter.Add(1)), token, mutate...)
}

// tenantIn creates namespace ns (a new one, or one created again after its deletion)
// with the tenant's providers and token.
func tenantIn(ns, token string, mutate ...func(*hooksv1alpha1.BillingProvider, *hooksv1alpha1.WebhookProvider)) string {
	GinkgoHelper()
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	bp := fixtures.BillingProvider(ns, billing.URL())
	bp.Spec.RequestTimeout = fixtures.Duration(time.Second)
	wp := fixtures.WebhookProvider(ns)
	for _, m := range mutate {
		m(bp, wp)
	}
	// The billing token opts in to the endpoint the provider ends up with.
	for _, sec := range fixtures.Secrets(ns, token, bp.Spec.Endpoint) {
		Expect(k8s.Create(ctx, sec)).To(Succeed())
	}
	Expect(k8s.Create(ctx, bp)).To(Succeed())
	Expect(k8s.Create(ctx, wp)).To(Succeed())
	return ns
}

// nullMode is one way a provider writes a record field that has no value: as null, or
// by leaving it out (the common JSON convention). Both must give the same answer
// (docs/design.md §6.1), so every ambiguous row of the failure matrix, the rows that
// end in a lookup, runs against both.
type nullMode struct {
	name string
	omit bool
}

var nullModes = []nullMode{{name: "provider sends nulls"}, {name: "provider omits nulls", omit: true}}

// spec names a spec of this mode.
func (m nullMode) spec(text string) string { return text + " (" + m.name + ")" }

// use sets the shared fake provider to this mode for the running spec.
func (m nullMode) use() {
	billing.SetOmitNulls(m.omit)
	DeferCleanup(billing.SetOmitNulls, false)
}

// key makes a settlement key of a hand-made settlement unique to the mode: both modes
// write to the shared provider's ledger, and a hand-made key is not per tenant.
func (m nullMode) key(k string) string {
	if m.omit {
		return k + "-omit-nulls"
	}
	return k
}

// options adds the mode to the options of a spec's own fake provider.
func (m nullMode) options(o fakebilling.Options) fakebilling.Options {
	o.OmitNulls = m.omit
	return o
}
