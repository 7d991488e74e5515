package receiver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers/webhookprovider"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The receiver's suite runs a real manager (informer cache, live client, event
// recorder) against a real kube-apiserver, and talks to the receiver over real HTTP.

var (
	env     *envtest.Environment
	cfg     *rest.Config
	k8s     client.Client
	ctx     context.Context
	cancel  context.CancelFunc
	baseURL string
	creates atomic.Int64 // WebhookEvent creates the receiver sent to the API server
	// statusPatches counts the receiver's status patches per WebhookProvider
	// ("ns/name"), so "no write per delivery" is measured.
	statusPatches sync.Map
	// logs holds everything the suite's components log, for specs that check a line.
	logs     lockedBuffer
	recv     *Receiver
	mgrCache interface {
		client.Reader
	}
)

func TestReceiver(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Receiver suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(io.MultiWriter(GinkgoWriter, &logs)), zap.UseDevMode(true)))
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	Expect((&webhookprovider.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), SecretRecheckInterval: 2 * time.Second,
	}).SetupWithManager(mgr)).To(Succeed())

	// Count the receiver's writes, so "a duplicate costs no write" is measured, not assumed.
	direct, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	writer := interceptor.NewClient(direct, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*hooksv1alpha1.WebhookEvent); ok {
				creates.Add(1)
			}
			return c.Create(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if _, ok := obj.(*hooksv1alpha1.WebhookProvider); ok && sub == "status" {
				n, _ := statusPatches.LoadOrStore(obj.GetNamespace()+"/"+obj.GetName(), &atomic.Int64{})
				n.(*atomic.Int64).Add(1)
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	recv = New(Options{
		BindAddress: "127.0.0.1:0", APITimeout: 2 * time.Second, MaxBodyBytes: 64 << 10,
		RetryAfter: 3 * time.Second, SecretTTL: time.Second, RejectionFlushInterval: rejectionFlush,
	}, mgr.GetCache(), writer, mgr.GetAPIReader(), mgr.GetEventRecorder("settlement-receiver"))
	mgrCache = mgr.GetCache()
	Expect(WarmCache(ctx, mgr.GetCache())).To(Succeed())
	Expect(mgr.Add(recv)).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	addr, err := recv.Addr(ctx)
	Expect(err).NotTo(HaveOccurred())
	baseURL = "http://" + addr.String()
})

var _ = AfterSuite(func() {
	if cancel != nil {
		cancel()
	}
	if env != nil {
		// If a spec left the API server stopped, let it go so Stop can finish.
		_ = signalAPIServer(syscall.SIGCONT)
		Expect(env.Stop()).To(Succeed())
	}
})

func signalAPIServer(sig syscall.Signal) error { return testenv.SignalAPIServer(env, sig) }

var nsCounter atomic.Int64

func newNamespace() string {
	name := fmt.Sprintf("recv-%d", nsCounter.Add(1))
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}

func url(ns, provider string) string { return baseURL + EndpointPath(ns, provider) }

func listEvents(ns string) []hooksv1alpha1.WebhookEvent {
	var l hooksv1alpha1.WebhookEventList
	Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
	return l.Items
}

func plainPost(u, contentType, body string) *http.Response {
	resp, err := http.Post(u, contentType, strings.NewReader(body))
	Expect(err).NotTo(HaveOccurred())
	return resp
}

// rejectionFlush is the suite receiver's RejectionFlushInterval.
const rejectionFlush = 2 * time.Second

// lockedBuffer is a bytes.Buffer safe for the loggers' concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
