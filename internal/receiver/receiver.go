// Package receiver is the webhook ingestion endpoint (docs/design.md §4): it authenticates a
// delivery, extracts its facts and stores it as exactly one WebhookEvent, and answers
// 2xx only once the API server has accepted that write or the delivery is proven to
// be a duplicate of one it accepted.
package receiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/cloudevents"
	"github.com/settlement-operator/settlement-operator/internal/extract"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/payload"
	"github.com/settlement-operator/settlement-operator/internal/senders"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/internal/signingkeys"
)

// PathPrefix is where senders post: PathPrefix + "{namespace}/{provider}".
const PathPrefix = identity.EndpointPathPrefix

// EndpointPath is the path a provider's senders post to.
func EndpointPath(namespace, provider string) string {
	return identity.EndpointPath(namespace, provider)
}

// Options tune the receiver; zero values take the defaults in parentheses.
type Options struct {
	// BindAddress is the listen address (":8090").
	BindAddress string
	// MaxBodyBytes caps a delivery's body (1 MiB); larger ones get 413.
	MaxBodyBytes int64
	// MaxUnauthenticatedPerAddress bounds one source address's deliveries that are
	// not authenticated yet: body being read, signature being checked (4; docs/design.md
	// §15). More get 429 too_many_requests_address. No shared slot is taken before the
	// signature is verified, so one client's slow or forged deliveries never turn
	// another's into 429s.
	MaxUnauthenticatedPerAddress int
	// TrustedProxies are the proxies whose X-Forwarded-For names the source address
	// (none): the right-most hop that is not one of them is the client. Without them,
	// or from any other peer, the source is the TCP peer and the header is ignored.
	TrustedProxies []netip.Prefix
	// MaxInFlight bounds the verified deliveries of this replica that are talking to
	// the API server (64); more get 429, protecting the API server from a burst the
	// receiver could only turn into timeouts.
	MaxInFlight int
	// MaxInFlightPerNamespace bounds one namespace's (one tenant's) verified
	// deliveries in flight (32), so one tenant never holds every slot.
	MaxInFlightPerNamespace int
	// MaxInFlightPerProvider bounds one provider's verified deliveries in flight (16):
	// a flood at one provider is answered 429 at that provider.
	MaxInFlightPerProvider int
	// AdmissionWait is how long a delivery waits for a free slot (any of the four
	// limits) before it is answered 429 (1s): a sender's burst is smoothed rather than
	// refused. A waiting delivery holds no slot.
	AdmissionWait time.Duration
	// BodyReadTimeout bounds the time from the request's start to the end of its body
	// (3s), the wait for the address's slot included; a slower body is answered 408
	// and its connection closed. It is set on the connection per request, on top of
	// the server's ReadTimeout, and never past RequestTimeout.
	BodyReadTimeout time.Duration
	// RequestTimeout bounds the time from the request's start (its headers in) to its
	// answer (4s): every wait, the Secret read and the API calls share it, so a sender
	// is answered well within the shortest sender timeout in use (EventBridge's 5s);
	// past it the answer is 503 (or 429 while waiting for a slot) and the sender retries.
	RequestTimeout time.Duration
	// APITimeout bounds each API-server call of a delivery (10s); past it the answer
	// is 503 and the sender retries.
	APITimeout time.Duration
	// RetryAfter is the Retry-After given with 503 (5s) and 429 (1s).
	RetryAfter, BusyRetryAfter time.Duration
	// ReadHeaderTimeout (2s), ReadTimeout (30s), WriteTimeout (30s), IdleTimeout (2m)
	// cut off slow or idle clients. A sender writes its headers at once; a client
	// that trickles them holds a connection and goroutine, nothing else, for 2s.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ShutdownTimeout bounds the wait for in-flight deliveries at shutdown (25s).
	ShutdownTimeout time.Duration
	// SecretTTL is how long a signing Secret is cached (30s).
	SecretTTL time.Duration
	// Now is the clock for signature timestamps (time.Now).
	Now func() time.Time
	// Archive, when set, is asked on a cache miss whether the event ID was received
	// and archived before (docs/design.md §12). Receipt never depends on it: when it
	// does not answer within ArchiveTimeout the delivery is stored as usual, and the
	// event controller decides before dispatch.
	Archive ArchivedReceipts
	// ArchiveTimeout bounds that lookup (300ms).
	ArchiveTimeout time.Duration
	// Namespaces, when set, are the only namespaces this deployment serves
	// (--watch-namespaces). A delivery for another one is our routing's mistake, not
	// the sender's: it is answered 503 (retried, never lost) with a message saying so.
	Namespaces map[string]bool
	// RejectionFlushInterval is how often, at most, a provider's refused deliveries
	// are written to its status.lastRejection (10s; rejections.go).
	RejectionFlushInterval time.Duration
}

// DefaultMaxUnauthenticatedPerAddress is MaxUnauthenticatedPerAddress's default: a
// sender's deliveries are unauthenticated for the milliseconds of their body read and
// signature check, so 4 at once from one address serve a burst of hundreds per second,
// while a client that stalls its bodies holds 4 connections, not a tenant's slots.
const DefaultMaxUnauthenticatedPerAddress = 4

// ArchivedReceipts finds archived event receipts (archive.Store).
type ArchivedReceipts interface {
	Event(ctx context.Context, namespace, provider, eventID string) (*archive.EventReceipt, error)
}

func (o *Options) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if o.BindAddress == "" {
		o.BindAddress = ":8090"
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 1 << 20
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = 64
	}
	if o.MaxInFlightPerNamespace == 0 {
		o.MaxInFlightPerNamespace = 32
	}
	if o.MaxInFlightPerProvider == 0 {
		o.MaxInFlightPerProvider = 16
	}
	if o.MaxUnauthenticatedPerAddress == 0 {
		o.MaxUnauthenticatedPerAddress = DefaultMaxUnauthenticatedPerAddress
	}
	def(&o.BodyReadTimeout, 3*time.Second)
	def(&o.RequestTimeout, 4*time.Second)
	def(&o.AdmissionWait, time.Second)
	def(&o.APITimeout, 10*time.Second)
	def(&o.RetryAfter, 5*time.Second)
	def(&o.BusyRetryAfter, time.Second)
	def(&o.ReadHeaderTimeout, 2*time.Second)
	def(&o.ReadTimeout, 30*time.Second)
	def(&o.WriteTimeout, 30*time.Second)
	def(&o.IdleTimeout, 2*time.Minute)
	def(&o.ShutdownTimeout, 25*time.Second)
	def(&o.SecretTTL, 30*time.Second)
	def(&o.ArchiveTimeout, 300*time.Millisecond)
	def(&o.RejectionFlushInterval, 10*time.Second)
	if o.Now == nil {
		o.Now = time.Now
	}
}

// The receiver reads providers and events from the cache, creates events, reads
// signing Secrets by name, records Warning events for conflicting reuse and refused
// deliveries, and patches a provider's status.lastRejection (rejections.go).
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders/status,verbs=get;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Receiver is a manager.Runnable serving the webhook endpoint on every replica.
type Receiver struct {
	opts Options
	// cache reads providers and events from the manager's informers; writer creates
	// events directly on the API server; live reads the API server when the cache
	// cannot know yet (an AlreadyExists for an object it has not seen).
	cache    client.Reader
	writer   client.Writer
	live     client.Reader
	recorder recorder.EventRecorder
	secrets  *secretCache
	// status patches status.lastRejection (the writer, when it can write status);
	// rejections aggregates refused deliveries until the next flush.
	status     client.StatusClient
	rejections *rejections
	// addresses bounds each source address's deliveries until their signature is
	// verified; tenants bounds each namespace's and provider's verified deliveries
	// until their answer; slots bounds this replica's verified deliveries talking to
	// the API server (decisions.md "Receiver admission").
	addresses *addressSlots
	tenants   *tenantSlots
	slots     chan struct{}

	mu         sync.Mutex
	extractors map[types.UID]compiled

	addrMu   sync.Mutex
	addr     net.Addr
	listener chan struct{}
}

type compiled struct {
	generation int64
	x          *extract.Extractor
	sig        signature.Config
	// cloudEvents: deliveries are CloudEvents (cloudevents.go), identified by their
	// attributes, and routes read their data.
	cloudEvents bool
}

// New builds a Receiver. cache must be backed by informers for WebhookProvider and
// WebhookEvent (the manager's cache); live must read the API server directly.
func New(opts Options, cache client.Reader, writer client.Writer, live client.Reader, rec recorder.EventRecorder) *Receiver {
	opts.defaults()
	status, _ := writer.(client.StatusClient)
	return &Receiver{
		opts: opts, cache: cache, writer: writer, live: live, recorder: rec, status: status,
		rejections: newRejections(opts.RejectionFlushInterval, opts.Now),
		secrets:    newSecretCache(live, opts.SecretTTL, 5*time.Second, opts.APITimeout),
		addresses:  &addressSlots{size: opts.MaxUnauthenticatedPerAddress},
		tenants:    newTenantSlots(opts.MaxInFlightPerNamespace, opts.MaxInFlightPerProvider),
		slots:      make(chan struct{}, opts.MaxInFlight),
		extractors: map[types.UID]compiled{},
		listener:   make(chan struct{}),
	}
}

// NeedLeaderElection is false: every replica receives webhooks.
func (r *Receiver) NeedLeaderElection() bool { return false }

// Addr returns the bound address once the receiver listens (useful with port 0).
func (r *Receiver) Addr(ctx context.Context) (net.Addr, error) {
	select {
	case <-r.listener:
		r.addrMu.Lock()
		defer r.addrMu.Unlock()
		return r.addr, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Handler returns the HTTP handler, for tests and for embedding.
func (r *Receiver) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(PathPrefix+"{namespace}/{provider}", r.serve)
	return mux
}

// Start listens until ctx is cancelled, then stops accepting and lets in-flight
// deliveries finish (up to ShutdownTimeout): a delivery being stored is answered.
func (r *Receiver) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("receiver")
	srv := &http.Server{
		Handler:           r.Handler(),
		ReadHeaderTimeout: r.opts.ReadHeaderTimeout,
		ReadTimeout:       r.opts.ReadTimeout,
		WriteTimeout:      r.opts.WriteTimeout,
		IdleTimeout:       r.opts.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return log.IntoContext(context.Background(), logger) },
	}
	ln, err := net.Listen("tcp", r.opts.BindAddress)
	if err != nil {
		return fmt.Errorf("receiver listen on %s: %w", r.opts.BindAddress, err)
	}
	r.addrMu.Lock()
	r.addr = ln.Addr()
	r.addrMu.Unlock()
	close(r.listener)
	logger.Info("receiving webhooks", "address", ln.Addr().String(), "path", PathPrefix+"{namespace}/{provider}")

	rejCtx, stopRejections := context.WithCancel(log.IntoContext(context.WithoutCancel(ctx), logger))
	rejDone := make(chan struct{})
	go func() { defer close(rejDone); r.runRejections(rejCtx) }()
	// After the server's shutdown, so the last deliveries' refusals are flushed too.
	defer func() { stopRejections(); <-rejDone }()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("receiver: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), r.opts.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("receiver shutdown: %w", err)
	}
	logger.Info("receiver stopped")
	return nil
}

// answer is one response: the status code, the JSON body and the metric outcome.
type answer struct {
	code       int
	outcome    string
	event      string
	message    string
	retryAfter time.Duration
	// rejected, when set, is recorded on the provider (rejections.go).
	rejected *rejection
}

// delivery is what serve needs to know about a request once handle has answered it.
type delivery struct {
	// namespace and provider are the metric labels: "unknown" until the WebhookProvider
	// is found in the cache, so a sender cannot mint label values by inventing paths.
	namespace, provider string
	// bodyRead is true once the whole body was read.
	bodyRead bool
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	// The whole request, body included, must be in within BodyReadTimeout of its
	// start (and never later than its RequestTimeout): a slow or stalled body is cut
	// off however the sender paces it, and holds its address's slot no longer than
	// that (the server's ReadTimeout stays as a backstop). A ResponseWriter without a
	// connection (httptest) cannot take a deadline; the server's timeouts then apply
	// alone.
	_ = http.NewResponseController(w).SetReadDeadline(start.Add(min(r.opts.BodyReadTimeout, r.opts.RequestTimeout)))
	// Everything after the headers, waits and API calls included, ends by RequestTimeout
	// (docs/design.md §15: the time budget).
	rctx, cancel := context.WithDeadline(req.Context(), start.Add(r.opts.RequestTimeout))
	defer cancel()
	req = req.WithContext(rctx)
	ns, name := req.PathValue("namespace"), req.PathValue("provider")
	d := delivery{namespace: outcomeLabelUnknownValue, provider: outcomeLabelUnknownValue}
	a := r.handle(req, ns, name, &d)
	if a.rejected != nil && d.namespace != outcomeLabelUnknownValue {
		r.rejections.record(types.NamespacedName{Namespace: d.namespace, Name: d.provider}, a.rejected)
	}
	requestsTotal.WithLabelValues(d.namespace, d.provider, a.outcome).Inc()
	requestDuration.WithLabelValues(a.outcome).Observe(time.Since(start).Seconds())

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !d.bodyRead && req.ContentLength != 0 {
		// Answered without reading the body (refused, or the body was too slow or too
		// large): close the connection rather than spend more time draining it.
		w.Header().Set("Connection", "close")
	}
	if a.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((a.retryAfter+time.Second-1)/time.Second)))
	}
	if a.code == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", http.MethodPost)
	}
	w.WriteHeader(a.code)
	var body any
	if a.code < 300 || a.code == http.StatusConflict {
		body = map[string]string{"status": a.outcome, "event": a.event}
		if a.code == http.StatusConflict {
			body = map[string]string{"error": a.outcome, "event": a.event, "message": a.message}
		}
	} else {
		body = map[string]string{"error": a.outcome, "message": a.message}
	}
	_ = json.NewEncoder(w).Encode(body)
}

func (r *Receiver) handle(req *http.Request, ns, name string, d *delivery) answer {
	ctx := req.Context()
	logger := log.FromContext(ctx).WithValues("namespace", ns, "provider", name)

	// 1. Method and media type: cheap refusals, nothing taken.
	if req.Method != http.MethodPost {
		return answer{code: http.StatusMethodNotAllowed, outcome: OutcomeMethodNotAllowed, message: "only POST is accepted"}
	}
	if batch := cloudevents.IsBatch(req.Header.Get("Content-Type")); batch || !isJSON(req.Header.Get("Content-Type")) {
		a := answer{code: http.StatusUnsupportedMediaType, outcome: OutcomeUnsupportedType,
			message: "Content-Type must be application/json", rejected: rejectMediaType}
		if batch {
			a.message = batchRefused
		}
		// Recorded only for a provider the cache knows (a cached read, no API call).
		if r.opts.Namespaces == nil || r.opts.Namespaces[ns] {
			if r.cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &hooksv1alpha1.WebhookProvider{}) == nil {
				d.namespace, d.provider = ns, name
			}
		}
		return a
	}

	// 2. Provider, from the informer cache: an unknown provider costs no API call and
	// holds no slot (its body is never read).
	if r.opts.Namespaces != nil && !r.opts.Namespaces[ns] {
		return answer{code: http.StatusServiceUnavailable, outcome: OutcomeNotServed, retryAfter: r.opts.RetryAfter,
			message: fmt.Sprintf("namespace %q is not served by this deployment (--watch-namespaces); the delivery was routed to the wrong one, nothing was acknowledged", ns)}
	}
	var provider hooksv1alpha1.WebhookProvider
	if err := r.cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &provider); err != nil {
		if apierrors.IsNotFound(err) {
			return answer{code: http.StatusNotFound, outcome: OutcomeUnknownProvider,
				message: fmt.Sprintf("no WebhookProvider %s/%s", ns, name)}
		}
		logger.Error(err, "provider lookup failed")
		return r.unavailable("provider lookup failed")
	}
	d.namespace, d.provider = ns, name
	c, err := r.compiledFor(&provider)
	if err != nil {
		// Our configuration is wrong, not the delivery: 503 keeps the sender retrying
		// until it is fixed; the provider's Ready condition says what is wrong.
		logger.Info("provider configuration is invalid", "error", err.Error())
		return answer{code: http.StatusServiceUnavailable, outcome: OutcomeProviderNotReady,
			message: "the provider's configuration is invalid; see its Ready condition", retryAfter: r.opts.RetryAfter}
	}

	// 3. Admission, per source address (docs/design.md §15): one of the client's own
	// slots, waited for up to AdmissionWait, held through the body read and the
	// signature check and no longer. Nothing shared is held before the delivery is
	// authenticated, so a client's slow or forged bodies cost only its own slots.
	releaseAddress, ok := r.addresses.enter(ctx, r.sourceOf(req), r.opts.AdmissionWait)
	if !ok {
		return r.busy(LimitAddress)
	}
	defer releaseAddress()
	inFlight.Inc()
	defer inFlight.Dec()

	// 4. Body, within the read deadline set in serve and the size limit.
	body, err := io.ReadAll(http.MaxBytesReader(nil, req.Body, r.opts.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			return answer{code: http.StatusRequestEntityTooLarge, outcome: OutcomeTooLarge,
				message: fmt.Sprintf("body exceeds %d bytes", r.opts.MaxBodyBytes), rejected: rejectTooLarge}
		case isTimeout(err):
			return answer{code: http.StatusRequestTimeout, outcome: OutcomeBodyTimeout,
				message: fmt.Sprintf("the body did not arrive within %s; nothing was stored, send it again", r.opts.BodyReadTimeout)}
		}
		return answer{code: http.StatusBadRequest, outcome: OutcomeBadRequest, message: "could not read the body"}
	}
	d.bodyRead = true

	if c.sig.Scheme == signature.SchemeStandardWebhooks {
		// Svix's svix-* headers are Standard Webhooks' under other names: read them as
		// webhook-* for the signature and for the event ID alike.
		req.Header = signature.StandardHeaders(req.Header)
	}

	// 5. Signature, before any other API or archive call and any shared slot: the
	// signing Secret's read is the only call an unsigned delivery can cause, and it is
	// bounded (secrets.go). Its cost is an HMAC over bytes already received.
	verified, a, ok := r.verify(ctx, &provider, c.sig, req.Header, body)
	if !ok {
		return a
	}
	signatureSecretIndex.WithLabelValues(d.namespace, d.provider, strconv.Itoa(verified.SecretIndex)).Inc()
	// Authenticated: the address's slot goes back now, so a sender's burst waiting
	// below for its tenant's slots does not hold its own address's.
	releaseAddress()

	// 6. Admission, per tenant: the provider's and its namespace's slots (waiting up
	// to AdmissionWait for them), held until the answer. A flood at one provider uses
	// up that provider's slots (and at most its namespace's), never another tenant's.
	release, limit := r.tenants.enter(ctx, ns, ns+"/"+name, r.opts.AdmissionWait)
	if limit != "" {
		return r.busy(limit)
	}
	defer release()

	// Then the replica's slot, taken last: it bounds the API calls this replica runs
	// at once, and only verified deliveries within their tenant's share reach it.
	releaseGlobal, ok := acquireGlobal(ctx, r.slots, r.opts.AdmissionWait)
	if !ok {
		return r.busy(LimitGlobal)
	}
	defer releaseGlobal()

	// 7. Parse, identify, route. A CloudEvent is identified by its attributes, and
	// its data is the payload (stored, hashed and read by routes) in either mode.
	var ce *cloudevents.Event
	if c.cloudEvents {
		if ce, err = cloudevents.Read(req.Header, body); err != nil {
			return answer{code: http.StatusBadRequest, outcome: OutcomeBadRequest, message: err.Error(), rejected: rejectCloudEvent}
		}
		body = ce.Data
	}
	doc, err := payload.Decode(body)
	if err != nil {
		return answer{code: http.StatusBadRequest, outcome: OutcomeBadRequest, message: "malformed JSON: " + err.Error(),
			rejected: rejectMalformedJSON}
	}
	var ev *extract.Event
	if ce != nil {
		ev, err = c.x.IdentifyAs(ce.Identity(), ce.Type, body, doc)
	} else {
		ev, err = c.x.Identify(req.Header, body, doc)
	}
	if err != nil {
		return badRequest(err)
	}
	eventName := identity.EventName(ns, name, ev.ID)
	if !ev.Store {
		msg := "no route for this event type"
		if ev.Conditional {
			msg = "the route for this event type does not apply to it (its when condition is false)"
		}
		return answer{code: http.StatusOK, outcome: OutcomeIgnored, message: msg}
	}

	// 8. A duplicate is answered from a cached read, with no write at all.
	var existing hooksv1alpha1.WebhookEvent
	if err := r.cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: eventName}, &existing); err == nil {
		return r.compare(ctx, &provider, &existing, ev)
	}

	if prior := r.archived(ctx, ns, name, ev.ID); prior != nil {
		// Received and archived before: answered from its archived receipt.
		return r.compare(ctx, &provider, &hooksv1alpha1.WebhookEvent{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: prior.Name},
			Spec:       hooksv1alpha1.WebhookEventSpec{PayloadHash: prior.PayloadHash}}, ev)
	}

	apiCtx, cancel := context.WithTimeout(ctx, r.opts.APITimeout)
	defer cancel()
	if ev.Routed {
		if err := c.x.Facts(ev, doc); err != nil {
			// The same delivery may have been stored before its facts became
			// unreadable (the route or its when condition changed) or before our
			// cache saw it: a redelivery of a stored event is still a duplicate, never
			// a 400.
			if gerr := r.live.Get(apiCtx, types.NamespacedName{Namespace: ns, Name: eventName}, &existing); gerr == nil {
				return r.compare(ctx, &provider, &existing, ev)
			}
			return badRequest(err)
		}
	}
	obj := r.newEvent(ns, eventName, &provider, ev, body)
	err = r.writer.Create(apiCtx, obj)
	switch {
	case err == nil:
		logger.V(1).Info("event accepted", "event", eventName, "type", ev.Type)
		if n := len(ev.UnmappedJobStates); n > 0 {
			unmappedJobStates.WithLabelValues(ns, name).Add(float64(n))
		}
		return answer{code: http.StatusOK, outcome: OutcomeAccepted, event: eventName}
	case apierrors.IsAlreadyExists(err):
		// Created concurrently, or before our cache saw it: read it live.
		if err := r.live.Get(apiCtx, client.ObjectKeyFromObject(obj), &existing); err != nil {
			logger.Error(err, "reading the existing event failed", "event", eventName)
			return r.unavailable("could not read the existing event")
		}
		return r.compare(ctx, &provider, &existing, ev)
	case apierrors.IsInvalid(err):
		// The content passed our checks but not the CRD's: a delivery problem, named.
		return answer{code: http.StatusBadRequest, outcome: OutcomeBadRequest, message: invalidMessage(err),
			rejected: signedRejection(err)}
	default:
		logger.Error(err, "storing the event failed", "event", eventName)
		return r.unavailable("the event could not be stored")
	}
}

// archived looks an event ID up in the archive, within ArchiveTimeout; nil when there
// is no archive, it holds no such receipt, or it did not answer (then the delivery is
// stored, and the event controller asks again before dispatch).
func (r *Receiver) archived(ctx context.Context, ns, provider, eventID string) *archive.EventReceipt {
	if r.opts.Archive == nil {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, r.opts.ArchiveTimeout)
	defer cancel()
	prior, err := r.opts.Archive.Event(actx, ns, provider, eventID)
	switch {
	case err != nil:
		archiveLookups.WithLabelValues("error").Inc()
		log.FromContext(ctx).V(1).Info("archive lookup failed; storing the delivery", "error", err.Error())
		return nil
	case prior == nil:
		archiveLookups.WithLabelValues("miss").Inc()
		return nil
	}
	archiveLookups.WithLabelValues("hit").Inc()
	return prior
}

// busy answers 429 naming the limit that was hit, in the error code and the metric.
func (r *Receiver) busy(limit string) answer {
	throttled.WithLabelValues(limit).Inc()
	a := answer{code: http.StatusTooManyRequests, retryAfter: r.opts.BusyRetryAfter}
	switch limit {
	case LimitProvider:
		a.outcome = OutcomeBusyProvider
		a.message = fmt.Sprintf("this provider's %d in-flight slots (--receiver-max-in-flight-per-provider) stayed busy for %s; retry later", r.opts.MaxInFlightPerProvider, r.opts.AdmissionWait)
	case LimitAddress:
		a.outcome = OutcomeBusyAddress
		a.message = fmt.Sprintf("this source address's %d slots for deliveries not yet authenticated (--receiver-max-unauthenticated-per-address) stayed busy for %s; retry later", r.opts.MaxUnauthenticatedPerAddress, r.opts.AdmissionWait)
	case LimitNamespace:
		a.outcome = OutcomeBusyNamespace
		a.message = fmt.Sprintf("this namespace's %d in-flight slots (--receiver-max-in-flight-per-namespace) stayed busy for %s; retry later", r.opts.MaxInFlightPerNamespace, r.opts.AdmissionWait)
	default:
		a.outcome = OutcomeBusyGlobal
		a.message = fmt.Sprintf("this replica's %d in-flight slots (--receiver-max-in-flight) stayed busy for %s; retry later", r.opts.MaxInFlight, r.opts.AdmissionWait)
	}
	return a
}

// isTimeout reports a read that hit its deadline (the per-request body deadline or
// the server's ReadTimeout).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func (r *Receiver) unavailable(msg string) answer {
	return answer{code: http.StatusServiceUnavailable, outcome: OutcomeUnavailable,
		message: msg + "; nothing was acknowledged, retry later", retryAfter: r.opts.RetryAfter}
}

// badRequest answers a content problem of a verified delivery.
func badRequest(err error) answer {
	return answer{code: http.StatusBadRequest, outcome: OutcomeBadRequest, message: err.Error(), rejected: signedRejection(err)}
}

// verify checks the signature against the keys the provider signs with
// (internal/signingkeys: the same selection its Ready condition reports), refreshing
// the Secret once on a mismatch in case the sender already signs with a newly added
// key, or once when its keys are refused in case the Secret was just fixed.
func (r *Receiver) verify(ctx context.Context, p *hooksv1alpha1.WebhookProvider, cfg signature.Config,
	h http.Header, body []byte) (signature.Result, answer, bool) {
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.Signature.SecretRef.Name}
	ref := p.Spec.Signature.SecretRef
	apiCtx, cancel := context.WithTimeout(ctx, r.opts.APITimeout)
	defer cancel()
	secret, fresh, err := r.secrets.get(apiCtx, key, false)
	if err != nil {
		log.FromContext(ctx).Error(err, "signing secret unavailable", "secret", key.Name)
		return signature.Result{}, answer{code: http.StatusServiceUnavailable, outcome: OutcomeProviderNotReady,
			message: "the provider's signing secret is unavailable; retry later", retryAfter: r.opts.RetryAfter}, false
	}
	keys, err := signingkeys.Select(secret, ref, cfg.Scheme)
	if err != nil && !fresh {
		// Bounded like a mismatch's refresh: at most one read per refreshAfter.
		if again, refreshed, gerr := r.secrets.get(apiCtx, key, true); gerr == nil && refreshed {
			keys, err = signingkeys.Select(again, ref, cfg.Scheme)
			fresh = true
		}
	}
	if err != nil {
		return signature.Result{}, r.keysRefused(ctx, key, err), false
	}
	res, err := signature.Verify(cfg, keys.Values, h, body, r.opts.Now())
	if errors.Is(err, signature.ErrSignatureMismatch) && !fresh {
		again, refreshed, gerr := r.secrets.get(apiCtx, key, true)
		if gerr != nil {
			// The sender may already sign with a key we could not load: our failure,
			// so 503 and the sender retries, never a 401.
			log.FromContext(ctx).Error(gerr, "refreshing the signing secret failed", "secret", key.Name)
			return signature.Result{}, answer{code: http.StatusServiceUnavailable, outcome: OutcomeProviderNotReady,
				message: "the provider's signing secret could not be refreshed; retry later", retryAfter: r.opts.RetryAfter}, false
		}
		if refreshed {
			keys, serr := signingkeys.Select(again, ref, cfg.Scheme)
			if serr != nil {
				return signature.Result{}, r.keysRefused(ctx, key, serr), false
			}
			res, err = signature.Verify(cfg, keys.Values, h, body, r.opts.Now())
		}
	}
	switch {
	case err == nil:
		return res, answer{}, true
	case errors.Is(err, signature.ErrNoSecrets), errors.Is(err, signature.ErrInvalidConfig):
		return res, answer{code: http.StatusServiceUnavailable, outcome: OutcomeProviderNotReady,
			message: "the provider's signing secret is unusable; retry later", retryAfter: r.opts.RetryAfter}, false
	default:
		// The error names only the failure class (missing, malformed, out of
		// tolerance, mismatch): never a secret or the body.
		return res, answer{code: http.StatusUnauthorized, outcome: OutcomeUnauthorized, message: err.Error(), rejected: rejectSignature}, false
	}
}

// keysRefused answers a delivery to a provider whose signing keys the selection
// refuses (the controller reports the same on Ready): our configuration's problem,
// not the sender's, so 503 and it retries; nothing is stored.
func (r *Receiver) keysRefused(ctx context.Context, key types.NamespacedName, err error) answer {
	reason := hooksv1alpha1.ReasonSecretInvalid
	if refusal, ok := signingkeys.AsRefusal(err); ok {
		reason = refusal.Reason
	}
	// The reason only: the refusal's message names the Secret's keys, which an
	// unauthenticated sender has no business learning (the Ready condition has it).
	log.FromContext(ctx).Info("signing keys refused", "secret", key.Name, "reason", reason)
	return answer{code: http.StatusServiceUnavailable, outcome: OutcomeProviderNotReady, retryAfter: r.opts.RetryAfter,
		message: fmt.Sprintf("the provider's signing keys are not usable (%s); see its Ready condition; nothing was stored, retry later", reason)}
}

// compare answers a delivery whose event name already exists.
func (r *Receiver) compare(ctx context.Context, p *hooksv1alpha1.WebhookProvider,
	existing *hooksv1alpha1.WebhookEvent, ev *extract.Event) answer {
	if existing.Spec.PayloadHash == ev.PayloadHash {
		return answer{code: http.StatusOK, outcome: OutcomeDuplicate, event: existing.Name}
	}
	qname := identity.QuarantineName(existing.Name, ev.PayloadHash)
	q := &hooksv1alpha1.WebhookEvent{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: existing.Namespace, Name: qname,
			Labels: map[string]string{hooksv1alpha1.LabelProvider: p.Name},
		},
		Spec: hooksv1alpha1.WebhookEventSpec{
			Provider: p.Name, EventID: ev.ID, EventType: ev.Type, Sequence: ev.Sequence,
			PayloadHash: ev.PayloadHash, ReceivedAt: metav1.NewTime(r.opts.Now().UTC()),
			Quarantine: &hooksv1alpha1.QuarantineInfo{
				OriginalEvent: existing.Name, OriginalPayloadHash: existing.Spec.PayloadHash,
			},
		},
	}
	apiCtx, cancel := context.WithTimeout(ctx, r.opts.APITimeout)
	defer cancel()
	err := r.writer.Create(apiCtx, q)
	switch {
	case err == nil:
		r.recorder.Eventf(p, existing, corev1.EventTypeWarning, hooksv1alpha1.ReasonConflictingEventReuse, "Quarantine",
			"event ID of %s was delivered again with a different payload; quarantined as %s", existing.Name, qname)
	case apierrors.IsAlreadyExists(err):
		// Already quarantined by an earlier delivery: one record, one warning.
	default:
		log.FromContext(ctx).Error(err, "storing the quarantine record failed", "event", qname)
		return r.unavailable("the conflicting delivery could not be recorded")
	}
	return answer{code: http.StatusConflict, outcome: OutcomeConflict, event: qname,
		message: "this event ID was already received with a different payload; the delivery is quarantined and has no effect"}
}

func (r *Receiver) newEvent(ns, name string, p *hooksv1alpha1.WebhookProvider, ev *extract.Event, body []byte) *hooksv1alpha1.WebhookEvent {
	obj := &hooksv1alpha1.WebhookEvent{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{hooksv1alpha1.LabelProvider: p.Name},
		},
		Spec: hooksv1alpha1.WebhookEventSpec{
			Provider: p.Name, EventID: ev.ID, EventType: ev.Type, Sequence: ev.Sequence,
			PayloadHash: ev.PayloadHash, ReceivedAt: metav1.NewTime(r.opts.Now().UTC()),
			JobCompletions: ev.JobCompletions, Settlements: ev.Settlements,
			UnmappedJobStates: ev.UnmappedJobStates, HeldFacts: ev.HeldFacts,
		},
	}
	if raw := p.Spec.RawPayload; raw != nil && raw.Enabled {
		limit := int(raw.MaxBytes)
		if limit <= 0 {
			limit = 4096
		}
		if len(body) > limit {
			obj.Spec.RawPayload, obj.Spec.RawPayloadTruncated = strings.ToValidUTF8(string(body[:limit]), ""), true
		} else {
			obj.Spec.RawPayload = strings.ToValidUTF8(string(body), "")
		}
	}
	return obj
}

// compiledFor compiles a provider's spec once per generation.
func (r *Receiver) compiledFor(p *hooksv1alpha1.WebhookProvider) (compiled, error) {
	r.mu.Lock()
	c, ok := r.extractors[p.UID]
	r.mu.Unlock()
	if ok && c.generation == p.Generation {
		return c, nil
	}
	spec := senders.Apply(&p.Spec)
	x, err := extract.Compile(p.Namespace, p.Name, &spec)
	if err != nil {
		return compiled{}, err
	}
	c = compiled{generation: p.Generation, x: x, sig: extract.SignatureConfig(&spec.Signature), cloudEvents: senders.IsCloudEvents(&spec)}
	if err := c.sig.Validate(); err != nil {
		return compiled{}, err
	}
	r.mu.Lock()
	r.extractors[p.UID] = c
	r.mu.Unlock()
	return c, nil
}

func isJSON(contentType string) bool { return cloudevents.IsJSON(contentType) }

// invalidMessage lists the API server's field causes, which name fields, not secrets.
func invalidMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		var parts []string
		for _, c := range status.Status().Details.Causes {
			parts = append(parts, c.Field+": "+c.Message)
		}
		if len(parts) > 0 {
			return "the event was refused: " + strings.Join(parts, "; ")
		}
	}
	return "the event was refused by validation"
}

// WarmCache registers the informers the receiver reads, so they start and sync with
// the manager's cache before the first delivery instead of on it.
func WarmCache(ctx context.Context, informers cache.Informers) error {
	for _, obj := range []client.Object{&hooksv1alpha1.WebhookProvider{}, &hooksv1alpha1.WebhookEvent{}} {
		if _, err := informers.GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("register informer for %T: %w", obj, err)
		}
	}
	return nil
}
