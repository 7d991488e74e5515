// Command manager runs the settlement-operator: the controllers (behind leader
// election) and, on every replica, the webhook receiver.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"net/http"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers"
	"github.com/settlement-operator/settlement-operator/internal/receiver"
)

var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(hooksv1alpha1.AddToScheme(scheme))
}

func main() {
	var (
		metricsAddr          string
		probeAddr            string
		enableLeaderElection bool
		secureMetrics        bool
		enableHTTP2          bool
		recvOpts             receiver.Options
		leaderNamespace      string
		workers              int
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080",
		"Address the metrics endpoint binds to; \"0\" disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address the health probes bind to.")
	flag.BoolVar(&enableLeaderElection, "leader-elect", false,
		"Elect a leader for the controllers; the receiver runs on every replica regardless.")
	flag.BoolVar(&secureMetrics, "metrics-secure", false, "Serve metrics over HTTPS.")
	flag.BoolVar(&enableHTTP2, "enable-http2", false,
		"Allow HTTP/2 on the metrics server (off: HTTP/2 Rapid Reset and Stream Cancellation CVEs).")
	flag.StringVar(&leaderNamespace, "leader-election-namespace", "",
		"Namespace of the leader-election Lease; required with --leader-elect outside a cluster.")
	flag.IntVar(&workers, "max-concurrent-reconciles", 4,
		"Records each controller works on at once; settlements call the billing provider, so a slow provider must not hold the others back.")
	flag.StringVar(&recvOpts.BindAddress, "receiver-bind-address", ":8090",
		"Address the webhook receiver binds to (every replica receives).")
	flag.IntVar(&recvOpts.MaxInFlight, "receiver-max-in-flight", 64,
		"Deliveries processed at once; more are answered 429 with Retry-After.")
	flag.Int64Var(&recvOpts.MaxBodyBytes, "receiver-max-body-bytes", 1<<20, "Largest accepted delivery body; larger ones get 413.")
	flag.DurationVar(&recvOpts.APITimeout, "receiver-api-timeout", 10*time.Second,
		"Bound on each API-server call of a delivery; past it the delivery is answered 503.")
	opts := zap.Options{Development: false}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	var tlsOpts []func(*tls.Config)
	if !enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme: scheme,
		Metrics: metricsserver.Options{
			BindAddress:   metricsAddr,
			SecureServing: secureMetrics,
			TLSOpts:       tlsOpts,
		},
		HealthProbeBindAddress: probeAddr,
		// The operator never reads managedFields; they are ~40% of each cached object.
		Cache:                   cache.Options{DefaultTransform: cache.TransformStripManagedFields()},
		LeaderElection:          enableLeaderElection,
		LeaderElectionID:        "settlement-operator.hooks.settlement.dev",
		LeaderElectionNamespace: leaderNamespace,
		// Release the lease on clean shutdown so a new leader takes over at once.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		log.Error(err, "unable to create manager")
		os.Exit(1)
	}

	if err := (&controllers.WebhookProviderReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", controllers.WebhookProviderControllerName)
		os.Exit(1)
	}
	if err := (&controllers.WebhookEventReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), MaxConcurrentReconciles: workers,
		Recorder: mgr.GetEventRecorder(controllers.WebhookEventControllerName),
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", controllers.WebhookEventControllerName)
		os.Exit(1)
	}
	if err := (&controllers.JobCompletionReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), MaxConcurrentReconciles: workers,
		Recorder: mgr.GetEventRecorder(controllers.JobCompletionControllerName),
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", controllers.JobCompletionControllerName)
		os.Exit(1)
	}
	if err := (&controllers.BillingSettlementReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), MaxConcurrentReconciles: workers,
		Recorder: mgr.GetEventRecorder(controllers.BillingSettlementControllerName),
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", controllers.BillingSettlementControllerName)
		os.Exit(1)
	}
	if err := (&controllers.BillingProviderReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorder(controllers.BillingProviderControllerName),
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", controllers.BillingProviderControllerName)
		os.Exit(1)
	}
	metrics.Registry.MustRegister(controllers.NewObjectsCollector(mgr.GetCache()))

	recv := receiver.New(recvOpts, mgr.GetCache(), mgr.GetClient(), mgr.GetAPIReader(),
		mgr.GetEventRecorder("settlement-receiver"))
	if err := receiver.WarmCache(context.Background(), mgr.GetCache()); err != nil {
		log.Error(err, "unable to set up the receiver's cache")
		os.Exit(1)
	}
	if err := mgr.Add(recv); err != nil {
		log.Error(err, "unable to add the receiver")
		os.Exit(1)
	}

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "unable to set up health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "unable to set up ready check")
		os.Exit(1)
	}
	// Ready only once the receiver listens (it starts after the caches have synced), so
	// neither a Service nor a rollout counts on a replica that would refuse deliveries.
	if err := mgr.AddReadyzCheck("receiver", func(*http.Request) error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := recv.Addr(ctx); err != nil {
			return errors.New("the webhook receiver is not listening yet")
		}
		return nil
	}); err != nil {
		log.Error(err, "unable to set up ready check")
		os.Exit(1)
	}

	log.Info("starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager exited with an error")
		os.Exit(1)
	}
}
