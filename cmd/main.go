// Command manager runs the settlement-operator: the controllers (behind leader
// election) and, on every replica, the webhook receiver.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
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
	"github.com/settlement-operator/settlement-operator/internal/metrics"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
	"github.com/settlement-operator/settlement-operator/internal/receiver"
	"github.com/settlement-operator/settlement-operator/internal/sharding"
	"github.com/settlement-operator/settlement-operator/internal/tombstone"
)

var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(hooksv1alpha1.AddToScheme(scheme))
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == checkReceiverCommand {
		os.Exit(checkReceiver(os.Args[2:], os.Stdout, os.Stderr))
	}
	var (
		metricsAddr          string
		probeAddr            string
		settlementWorkers    int
		settlementShare      int
		pprofAddr            string
		enableLeaderElection bool
		secureMetrics        bool
		metricsCertDir       string
		enableHTTP2          bool
		recvOpts             receiver.Options
		leaderNamespace      string
		workers              int
		maxLookups           int
		archiveURL           string
		archiveCfg           archive.Config
		archiveAfter         time.Duration
		watchNamespaces      string
		leaderElectionID     string
		operatorNamespace    string
		transitionEvents     bool
		eventStatusDelay     time.Duration
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443",
		"Address the metrics endpoint binds to; \"0\" disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address the health probes bind to.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "",
		"Address Go's profiling endpoints (/debug/pprof/) bind to, unauthenticated: loopback only (e.g. 127.0.0.1:8082, "+
			"then kubectl port-forward); empty: off.")
	flag.BoolVar(&enableLeaderElection, "leader-elect", false,
		"Elect a leader for the controllers; the receiver runs on every replica regardless.")
	flag.BoolVar(&secureMetrics, "metrics-secure", true,
		"Serve metrics over HTTPS to authenticated and authorized clients only (a bearer token allowed to get /metrics, "+
			"e.g. by the metrics-reader ClusterRole). false: plain HTTP to anyone who can connect, for a local process on loopback.")
	flag.StringVar(&metricsCertDir, "metrics-cert-dir", "",
		"Directory with tls.crt and tls.key for the metrics endpoint (reloaded when they change); empty or missing: a self-signed certificate made at start.")
	flag.BoolVar(&enableHTTP2, "enable-http2", false,
		"Allow HTTP/2 on the metrics server (off: HTTP/2 Rapid Reset and Stream Cancellation CVEs).")
	flag.StringVar(&leaderNamespace, "leader-election-namespace", "",
		"Namespace of the leader-election Lease; required with --leader-elect outside a cluster.")
	flag.BoolVar(&transitionEvents, "transition-events", false,
		"Record a Normal Kubernetes Event for every routine step of a charge (submitted, settled); warnings, dead letters, replays and supersedes are always recorded.")
	flag.DurationVar(&eventStatusDelay, "event-status-delay", webhookevent.DefaultEventStatusDelay,
		"How long after receipt an event whose operations are all under way waits before its status is first written: one that finishes within it is written once (0: at once).")
	flag.IntVar(&workers, "max-concurrent-reconciles", 4,
		"Records each controller works on at once, settlements excepted (--settlement-workers).")
	flag.IntVar(&maxLookups, "reconciliation-max-lookups", billingprovider.DefaultMaxLookups,
		"Lookups by key one reconciliation pass makes at most, for settled charges its provider's list did not show (every Metronome charge); "+
			"the rest wait for the next pass, oldest first, and the report counts them (examined.SettlementLookupDeferred).")
	flag.IntVar(&settlementWorkers, "settlement-workers", 16,
		"Settlements worked on at once: each waits on the billing provider (and on the API server around the call), not on this process's CPU.")
	flag.IntVar(&settlementShare, "settlement-workers-per-provider", 0,
		"Settlement workers the settlements of one BillingProvider may hold at once while they call it (0: a quarter of --settlement-workers, at least 1); the rest wait in the queue, so a provider that never answers holds up no other.")
	flag.StringVar(&recvOpts.BindAddress, "receiver-bind-address", ":8090",
		"Address the webhook receiver binds to (every replica receives).")
	flag.IntVar(&recvOpts.MaxUnauthenticatedPerAddress, "receiver-max-unauthenticated-per-address", receiver.DefaultMaxUnauthenticatedPerAddress,
		"Deliveries from one source address whose body is being read or signature checked, per replica; more are answered 429 "+
			"(too_many_requests_address). Nothing shared is held before the signature is verified.")
	flag.Func("receiver-trusted-proxies",
		"Comma-separated CIDRs (or IPs) of proxies whose X-Forwarded-For names the source address: the right-most hop that is not one of them. "+
			"Empty (default): the TCP peer is the source and the header is ignored. Behind an ingress, list the ingress's addresses.",
		func(v string) error {
			p, err := receiver.ParseTrustedProxies(v)
			if err != nil {
				return err
			}
			recvOpts.TrustedProxies = p
			return nil
		})
	flag.IntVar(&recvOpts.MaxInFlight, "receiver-max-in-flight", 64,
		"Verified deliveries being stored at once, per replica (a body still arriving holds none); more are answered 429 with Retry-After.")
	flag.IntVar(&recvOpts.MaxInFlightPerNamespace, "receiver-max-in-flight-per-namespace", 32,
		"Verified deliveries in flight for one namespace (one tenant); more are answered 429, so one tenant cannot take every slot.")
	flag.IntVar(&recvOpts.MaxInFlightPerProvider, "receiver-max-in-flight-per-provider", 16,
		"Verified deliveries in flight for one WebhookProvider; more are answered 429 at that provider only.")
	flag.DurationVar(&recvOpts.AdmissionWait, "receiver-admission-wait", time.Second,
		"How long a delivery waits for a free slot before it is answered 429; smooths a sender's bursts.")
	flag.DurationVar(&recvOpts.BodyReadTimeout, "receiver-body-read-timeout", 3*time.Second,
		"A delivery's request, body included, must arrive within this of its headers (the wait for its address's slot included); "+
			"a slower one is answered 408 and its connection closed. At most --receiver-request-timeout.")
	flag.DurationVar(&recvOpts.RequestTimeout, "receiver-request-timeout", 4*time.Second,
		"Bound from a delivery's headers to its answer, every wait and API call included; keep it under the shortest sender timeout "+
			"(EventBridge: 5s). Past it the delivery is answered 503 and retried.")
	flag.Int64Var(&recvOpts.MaxBodyBytes, "receiver-max-body-bytes", 1<<20, "Largest accepted delivery body; larger ones get 413.")
	flag.DurationVar(&recvOpts.APITimeout, "receiver-api-timeout", 10*time.Second,
		"Bound on each API-server call of a delivery; past it the delivery is answered 503.")
	flag.StringVar(&archiveURL, "archive-database-url", "",
		"PostgreSQL URL of the archive (docs/archive.md); prefer the ARCHIVE_DATABASE_URL environment variable from a Secret, since flags show in the pod spec. Empty: no archive, every record stays in the cluster.")
	archiveCfg.MaxConns = 8
	flag.Func("archive-max-conns", "Connections to the archive at most, per replica (8).", func(v string) error {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			return errors.New("want a positive number")
		}
		archiveCfg.MaxConns = int32(n)
		return nil
	})
	flag.DurationVar(&archiveCfg.StatementTimeout, "archive-statement-timeout", 5*time.Second,
		"Bound on every statement on the archive's server.")
	flag.DurationVar(&archiveAfter, "archive-after", archiver.DefaultAfter,
		"How long a finished record stays in the cluster (for kubectl) before it is archived and removed.")
	flag.StringVar(&leaderElectionID, "leader-election-id", "settlement-operator.hooks.settlement.dev",
		"Name of the leader-election Lease; deployments sharding tenants with --watch-namespaces in one namespace need one each.")
	flag.StringVar(&operatorNamespace, "operator-namespace", os.Getenv("POD_NAMESPACE"),
		"The operator's own namespace (default: $POD_NAMESPACE), where it records which archive it archives to and, without an archive, the tombstones of settlements deleted with their namespace.")
	flag.StringVar(&watchNamespaces, "watch-namespaces", "",
		"Comma-separated namespaces this deployment serves (receiver and controllers); empty: all. Lets several deployments shard tenants.")
	opts := zap.Options{Development: false}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	var tlsOpts []func(*tls.Config)
	if !enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}

	if archiveURL == "" {
		archiveURL = os.Getenv("ARCHIVE_DATABASE_URL")
	}
	if pprofAddr != "" && pprofAddr != "0" && !loopback(pprofAddr) {
		log.Error(fmt.Errorf("--pprof-bind-address %q is not a loopback address", pprofAddr),
			"the profiling endpoints are unauthenticated: bind them to 127.0.0.1 or [::1] (kubectl port-forward reaches them)")
		os.Exit(2)
	}
	if workers < 1 || settlementWorkers < 1 {
		log.Error(errors.New("--max-concurrent-reconciles and --settlement-workers must be positive"), "invalid flags")
		os.Exit(2)
	}
	if settlementShare < 0 || settlementShare > settlementWorkers {
		log.Error(fmt.Errorf("--settlement-workers-per-provider %d is not between 0 and --settlement-workers (%d)", settlementShare, settlementWorkers), "invalid flags")
		os.Exit(2)
	}
	if recvOpts.MaxInFlight < 1 || recvOpts.MaxInFlightPerNamespace < 1 || recvOpts.MaxInFlightPerProvider < 1 ||
		recvOpts.MaxUnauthenticatedPerAddress < 1 ||
		recvOpts.BodyReadTimeout <= 0 || recvOpts.AdmissionWait <= 0 || recvOpts.RequestTimeout <= 0 {
		log.Error(errors.New("--receiver-max-in-flight, --receiver-max-in-flight-per-namespace, --receiver-max-in-flight-per-provider, "+
			"--receiver-max-unauthenticated-per-address, --receiver-body-read-timeout, --receiver-request-timeout and --receiver-admission-wait must be positive"), "invalid flags")
		os.Exit(2)
	}
	if recvOpts.BodyReadTimeout > recvOpts.RequestTimeout {
		log.Error(fmt.Errorf("--receiver-body-read-timeout %s is longer than --receiver-request-timeout %s", recvOpts.BodyReadTimeout, recvOpts.RequestTimeout),
			"invalid flags: the body must be in before the request's deadline")
		os.Exit(2)
	}
	if archiveAfter <= 0 {
		log.Error(errors.New("--archive-after must be positive"), "invalid flags")
		os.Exit(2)
	}
	cacheOpts := cache.Options{DefaultTransform: cache.TransformStripManagedFields(),
		DefaultNamespaces: sharding.WatchedNamespaces(watchNamespaces)}

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsOptions(metricsAddr, secureMetrics, metricsCertDir, tlsOpts),
		HealthProbeBindAddress: probeAddr,
		PprofBindAddress:       pprofAddr,
		// The operator never reads managedFields; they are ~40% of each cached object.
		Cache:                   cacheOpts,
		LeaderElection:          enableLeaderElection,
		LeaderElectionID:        leaderElectionID,
		LeaderElectionNamespace: leaderNamespace,
		// Release the lease on clean shutdown so a new leader takes over at once.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		log.Error(err, "unable to create manager")
		os.Exit(1)
	}

	// Reads and writes of the operator's own ConfigMaps go to the API server: no cache to lag.
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: scheme})
	if err != nil {
		log.Error(err, "unable to create a client")
		os.Exit(1)
	}
	// Tombstones of settlements deleted without an archive (docs/design.md §8): kept
	// whenever there is an operator namespace, and read with an archive too, since
	// tombstones written before the archive was configured still count.
	tombstones := &tombstone.Keeper{Client: direct, Namespace: operatorNamespace}

	// One deployment per namespace: a second one whose --watch-namespaces overlap (or
	// that serves all namespaces beside another) refuses to start (docs/design.md §16).
	if home := cmp.Or(operatorNamespace, leaderNamespace); home != "" {
		claim := &sharding.Claim{Client: direct, Reader: mgr.GetAPIReader(), Identity: home + "/" + leaderElectionID,
			Namespaces: slices.Sorted(maps.Keys(sharding.WatchedNamespaces(watchNamespaces))), Home: home}
		if err := claim.Acquire(context.Background()); errors.Is(err, sharding.ErrOverlap) {
			log.Error(err, "refusing to start: the namespaces this deployment would serve are claimed by another")
			os.Exit(1)
		} else if err != nil {
			log.Error(err, "unable to claim the namespaces this deployment serves")
			os.Exit(1)
		}
		if err := mgr.Add(claim); err != nil {
			log.Error(err, "unable to add the namespace claims")
			os.Exit(1)
		}
	} else {
		log.Info("no operator namespace (--operator-namespace, $POD_NAMESPACE): namespaces are not claimed, " +
			"so another deployment serving the same ones would not be detected")
	}

	var store *archive.Store
	var watermark *archivewatermark.Keeper
	if archiveURL != "" {
		archiveCfg.URL = archiveURL
		if store, err = archive.Open(archiveCfg); err != nil {
			log.Error(err, "unable to configure the archive")
			os.Exit(1)
		}
		defer store.Close()
		// The watermark of what was archived, beside the archive's identity: every
		// replica compares the archive with it; the leader moves it forward.
		watermark = &archivewatermark.Keeper{Client: direct, Archive: store, Namespace: operatorNamespace,
			ConfigMap: leaderElectionID + "-archive", Recorder: mgr.GetEventRecorder("archive")}
		if err := mgr.Add(&archiver.Migrator{Archive: store, Client: direct, Watermark: watermark,
			Namespace: operatorNamespace, ConfigMap: leaderElectionID + "-archive"}); err != nil {
			log.Error(err, "unable to add the archive migrator")
			os.Exit(1)
		}
		if err := (&archiver.Reconciler{Client: mgr.GetClient(), Archive: store, After: archiveAfter, Watermark: watermark,
			Recorder: mgr.GetEventRecorder(archiver.ControllerName), MaxConcurrentReconciles: workers,
		}).SetupWithManager(mgr); err != nil {
			log.Error(err, "unable to set up controller", "controller", archiver.ControllerName)
			os.Exit(1)
		}
		log.Info("archive on: finished records leave the cluster for PostgreSQL", "archiveAfter", archiveAfter.String(),
			"maxConns", archiveCfg.MaxConns, "statementTimeout", archiveCfg.StatementTimeout.String())
	} else {
		if operatorNamespace != "" {
			// This cluster archived before: without its archive, archived events and keys
			// would be dispatched and charged again. Refuse to start rather than guess.
			var cm corev1.ConfigMap
			err := mgr.GetAPIReader().Get(context.Background(), types.NamespacedName{Namespace: operatorNamespace,
				Name: leaderElectionID + "-archive"}, &cm)
			if err == nil {
				log.Error(errors.New("no archive configured"), "this cluster's finished records are in an archive "+
					"(ConfigMap "+operatorNamespace+"/"+cm.Name+"); set ARCHIVE_DATABASE_URL to it, or delete the ConfigMap "+
					"to run without it on purpose (archived events and keys would then be processed again)")
				os.Exit(1)
			}
		}
		if tombstones.Off() {
			log.Info("no archive and no --operator-namespace: a settlement that presented its key and is deleted " +
				"(with its namespace) stays held, reason TombstoneNotWritten, since nothing outside the namespace could " +
				"record its key (docs/runbook.md, \"Deleting a namespace\")")
		}
		// Say what running without an archive implies (docs/capacity.md has the numbers).
		log.Info("archive off: every JobCompletion and BillingSettlement stays in etcd and in this manager's memory; " +
			"measured: one 8 GiB etcd fills after about 14 days at 1 event/s, and the 512 MiB memory limit is reached after about 20,000 lifetime jobs. " +
			"Configure --archive-database-url / ARCHIVE_DATABASE_URL (docs/archive.md) for a working set bounded by what is in flight")
	}
	metrics.SetArchiveEnabled(store != nil)

	if err := (&webhookprovider.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", webhookprovider.ControllerName)
		os.Exit(1)
	}
	if err := (&webhookevent.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), MaxConcurrentReconciles: workers, Archive: store,
		Recorder: mgr.GetEventRecorder(webhookevent.ControllerName), StatusDelay: eventStatusDelay,
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", webhookevent.ControllerName)
		os.Exit(1)
	}
	if err := (&jobcompletion.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), MaxConcurrentReconciles: workers,
		Recorder: mgr.GetEventRecorder(jobcompletion.ControllerName),
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", jobcompletion.ControllerName)
		os.Exit(1)
	}
	// What the settlements' calls learn about each billing provider, shown on it.
	health := providerclient.NewHealth()
	if err := (&billingsettlement.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), MaxConcurrentReconciles: settlementWorkers, ProviderShare: settlementShare, Archive: store, Watermark: watermark,
		Recorder: mgr.GetEventRecorder(billingsettlement.ControllerName), TransitionEvents: transitionEvents,
		Health: health, Tombstones: tombstones,
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", billingsettlement.ControllerName)
		os.Exit(1)
	}
	if err := (&billingprovider.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Archive: store, Health: health, MaxConcurrentReconciles: workers,
		MaxLookups: maxLookups, Recorder: mgr.GetEventRecorder(billingprovider.ControllerName),
	}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to set up controller", "controller", billingprovider.ControllerName)
		os.Exit(1)
	}
	crmetrics.Registry.MustRegister(metrics.NewObjectsCollector(mgr.GetCache()))

	if store != nil {
		recvOpts.Archive = store
	}
	if served := sharding.WatchedNamespaces(watchNamespaces); served != nil {
		recvOpts.Namespaces = map[string]bool{}
		for ns := range served {
			recvOpts.Namespaces[ns] = true
		}
	}
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

// metricsOptions serves metrics as kubebuilder's scaffold does: by default over HTTPS,
// and only to a client whose bearer token the API server authenticates (TokenReview)
// and authorizes for `get` on the non-resource URL /metrics (SubjectAccessReview).
// The metrics say how much is billed, to whom and how often, per provider: they are
// not for anyone who can reach the Pod. Plain HTTP is for a local process on loopback.
func metricsOptions(addr string, secure bool, certDir string, tlsOpts []func(*tls.Config)) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: addr, SecureServing: secure, TLSOpts: tlsOpts}
	if secure {
		opts.FilterProvider = filters.WithAuthenticationAndAuthorization
		opts.CertDir = certDir
	}
	return opts
}

// loopback reports whether a bind address's host is a loopback address or localhost.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
