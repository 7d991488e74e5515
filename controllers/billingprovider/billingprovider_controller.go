package billingprovider

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivedmemory"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/credentials"
	"github.com/settlement-operator/settlement-operator/internal/index"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/internal/statuspatch"
)

// ControllerName names the controller in logs and metrics.
const ControllerName = "billingprovider"

// Defaults of a BillingProvider's reconciliation policy.
const (
	defaultReconcileInterval = 10 * time.Minute
	defaultStuckAfter        = 15 * time.Minute
	defaultEventStaleAfter   = 30 * time.Minute
	defaultKeepReports       = 10
	// firstWindow is how far back the first pass looks at the provider's records.
	firstWindow = 24 * time.Hour
	// maxListPages bounds one pass's walk of the provider's list endpoint.
	maxListPages = 50
	// passCalls is how many provider calls' worth of requestTimeout one pass may take
	// in all (passDeadline).
	passCalls = 20
	// defaultWorkers is how many BillingProviders are reconciled at once when
	// MaxConcurrentReconciles is 0: a pass waits on its provider, and one provider
	// that does not answer must not hold up every other provider's pass and checks.
	defaultWorkers = 4
	// continueWalkAfter is how soon a pass whose walk of the provider's list was cut at
	// maxListPages is followed by the next, which goes on from the cut.
	continueWalkAfter = 5 * time.Second
)

// Reconciler reports whether a billing backend is usable and runs
// the periodic reconciliation pass (docs/design.md §7): it compares events, job completions,
// settlements and the provider's records, writes a ReconciliationReport, and carries
// out automatic repairs through the records' own controllers (a reconcile-request
// annotation), never around them. It deletes nothing but its own old reports.
type Reconciler struct {
	client.Client
	// APIReader reads credentials (Secrets) by name.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// NewClient builds a provider client; the registry's adapter of the provider's type
	// (adapters.New) when nil.
	NewClient func(adapters.Settings) (billing.Client, error)
	// Now is the clock (time.Now).
	Now func() time.Time
	// Archive, when set, holds the records that left the cluster: the reconciliation
	// pass compares the provider with cluster ∪ archive (docs/design.md §12).
	Archive *archive.Store
	// CredentialRecheckInterval is how soon missing or refused credentials are looked
	// at again (1m): Secrets are not watched, so this is how a fix is noticed.
	CredentialRecheckInterval time.Duration
	// Health, shared with the settlement controller, tells how the latest calls to
	// each provider went (the ProviderHealthy condition); nil leaves it out.
	Health *providerclient.Health
	// WaitingGrace is how long a provider whose credentials Secret is not created yet,
	// or which does not answer, is Reconciling before it is Stalled
	// (conditions.DefaultWaitingGrace).
	WaitingGrace time.Duration
	// MaxConcurrentReconciles is how many BillingProviders are reconciled at once
	// (defaultWorkers when 0).
	MaxConcurrentReconciles int
	// MaxListPages caps one pass's walk of the provider's list endpoint (50 pages).
	MaxListPages int
	// MaxLookups caps one pass's lookups by key of settlements the provider's list did
	// not show (DefaultMaxLookups when 0); the rest wait for the next pass.
	MaxLookups int
	// UsageTotalsLag is how far behind the pass a usage-totals window ends (1h: Stripe
	// aggregates meter events asynchronously; the tests' fakes do not, 1s there).
	// UsageClockSkew widens each settlement's span at the provider (1m).
	UsageTotalsLag, UsageClockSkew time.Duration

	clients providerclient.Clients
	// findings remembers each provider's last pass, so new findings are counted once.
	findings findingMemory
	// walks keeps each provider's list walk that a pass cut at MaxListPages.
	walks walkMemory
	// lookups remembers what each provider's lookups by key left for its next pass.
	lookups lookupQueue
	// archived remembers the provider records each pass found matching their archived
	// settlement, so the next pass does not read them back again (internal/archivedmemory).
	archived archivedmemory.Memory
	// usage remembers where each provider's last usage-totals comparison ended.
	usage usageMarks
}

func (r *Reconciler) credentialRecheck() time.Duration {
	if r.CredentialRecheckInterval > 0 {
		return r.CredentialRecheckInterval
	}
	return time.Minute
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingproviders,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingproviders/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=reconciliationreports,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=reconciliationreports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=jobcompletions,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements/status,verbs=get;update;patch

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile checks the provider's credentials and runs a pass when one is due; while
// the provider is being deleted it only decides whether the deletion may go ahead.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var bp hooksv1alpha1.BillingProvider
	if err := r.Get(ctx, req.NamespacedName, &bp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !bp.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, &bp)
	}
	// The finalizer goes on before anything else: settlements start using a provider
	// as soon as it exists, and its deletion must wait for those that may have moved
	// money there. (A provider deleted before its first reconcile goes at once.)
	if !controllerutil.ContainsFinalizer(&bp, hooksv1alpha1.FinalizerBillingProviderInUse) {
		// Optimistic lock: finalizers is a list, a merge patch replaces it whole, and
		// another controller's finalizer added meanwhile must not be dropped.
		patch := client.MergeFromWithOptions(bp.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&bp, hooksv1alpha1.FinalizerBillingProviderInUse)
		if err := r.Patch(ctx, &bp, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to billingprovider %s: %w", req.NamespacedName, err)
		}
	}
	return r.reconcileNormal(ctx, &bp)
}

// reconcileNormal checks the credentials and runs a pass when one is due; status is
// patched once, at the end.
func (r *Reconciler) reconcileNormal(ctx context.Context, bp *hooksv1alpha1.BillingProvider) (result ctrl.Result, err error) {
	before := bp.DeepCopy()
	defer func() {
		if _, perr := statuspatch.Patch(ctx, r.Client, bp, before, false); perr != nil && err == nil {
			err = perr
		}
	}()
	bp.Status.ObservedGeneration = bp.Generation

	// No pass and no call without usable credentials: the pass is the first thing that
	// would send the token to the endpoint.
	c, err := r.clientFor(ctx, bp)
	if err != nil {
		reason := hooksv1alpha1.ReasonBillingProviderNotReady
		if credentials.IsRefused(err) {
			reason = hooksv1alpha1.ReasonCredentialsNotAllowed
			if prev := apimeta.FindStatusCondition(before.Status.Conditions, hooksv1alpha1.ConditionReady); prev == nil || prev.Reason != reason {
				r.Recorder.Eventf(bp, nil, corev1.EventTypeWarning, reason, "CheckCredentials", "%s", conditions.TruncateMessage(err.Error()))
			}
		}
		// A Secret not created yet (or an API server that did not answer) may still
		// come; a refused opt-in, a missing key or a key the adapter cannot use will not.
		readiness := conditions.Broken
		var apiStatus apierrors.APIStatus
		if !credentials.IsRefused(err) && !errors.Is(err, credentials.ErrKeyMissing) && errors.As(err, &apiStatus) {
			readiness = conditions.Waiting
		}
		stallIn := conditions.SetReadiness(&bp.Status.Conditions, bp.Generation, readiness,
			reason, conditions.TruncateMessage(err.Error()), r.now(), r.WaitingGrace)
		// No call is made without usable credentials: what earlier calls said is stale,
		// and so is the mode of a key that cannot be used.
		apimeta.RemoveStatusCondition(&bp.Status.Conditions, hooksv1alpha1.ConditionProviderHealthy)
		bp.Status.Mode = ""
		if stallIn > 0 && stallIn < r.credentialRecheck() {
			return ctrl.Result{RequeueAfter: stallIn}, nil // the wait turns Stalled on time
		}
		return ctrl.Result{RequeueAfter: r.credentialRecheck()}, nil
	}
	bp.Status.Mode = adapters.Mode(c) // a Stripe key's test or live mode, for all to see
	// Deferred: the pass below calls the provider too, and its outcome belongs in this
	// write. Ready is decided once, so its lastTransitionTime keeps its meaning.
	defer func() {
		// A provider that does not answer turns Stalled on time, not at the next pass.
		if stallIn := r.applyHealth(bp); stallIn > 0 && err == nil && (result.RequeueAfter == 0 || stallIn < result.RequeueAfter) {
			result.RequeueAfter = stallIn
		}
	}()

	policy := reconciliationPolicyOf(bp)
	now := r.now()
	if last := bp.Status.LastReconciliation; last != nil {
		if due := last.Add(r.passInterval(bp.UID, policy, last.Time)); now.Before(due) {
			return ctrl.Result{RequeueAfter: due.Sub(now)}, nil
		}
	}
	report, listedUntil, err := r.pass(ctx, bp, c, policy, now)
	if err != nil && report == "" {
		return ctrl.Result{}, err
	}
	if err != nil {
		// The report records the failure; the next pass comes at the usual interval
		// rather than in a tight error loop against a provider that is down.
		r.Recorder.Eventf(bp, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonReconciliationFailed, "Reconcile", "%s: %s", report, conditions.TruncateMessage(err.Error()))
	}
	end := metav1.NewTime(now)
	bp.Status.LastReconciliation, bp.Status.LastReport = &end, report
	if !listedUntil.IsZero() {
		mark := metav1.NewTime(listedUntil)
		bp.Status.ProviderListedUntil = &mark
	}
	if err := r.prune(ctx, bp, policy.keep); err != nil {
		return ctrl.Result{}, err
	}
	if err != nil {
		return ctrl.Result{RequeueAfter: policy.interval}, nil // a failed pass is not hurried
	}
	return ctrl.Result{RequeueAfter: r.passInterval(bp.UID, policy, r.now())}, nil
}

// passDeadline bounds the provider's part of one pass (its calls and what it does
// with their answers): passCalls request timeouts. Each call is bounded by
// requestTimeout already; this bounds a provider that answers every call just in
// time. The report and the BillingProvider's status are written after it, under the
// reconcile's own context, so a pass cut short still says why.
func passDeadline(bp *hooksv1alpha1.BillingProvider) time.Duration {
	return passCalls * settlement.RequestTimeoutOf(bp)
}

// passInterval is how long after from (a pass's start, or its end) the next is due:
// the policy's interval, continueWalkAfter while a walk the last pass cut goes on, or
// sooner when the provider rate limited the last pass's lookups and said when to come
// back (lookups.go).
func (r *Reconciler) passInterval(uid types.UID, policy reconciliationPolicy, from time.Time) time.Duration {
	d := policy.interval
	if r.walks.pending(uid) {
		d = min(d, continueWalkAfter)
	}
	if in := r.lookups.resumeIn(uid, from); in > 0 {
		d = min(d, in)
	}
	return d
}

// applyHealth writes the ProviderHealthy condition from the latest calls and, while
// the provider refuses the credentials or cannot be reached, makes Ready say so:
// rejected credentials are Stalled at once (only a new token helps), a provider that
// does not answer or answers with errors is Reconciling for the waiting grace and
// Stalled after it. It returns how long until such a wait turns Stalled (0: none).
func (r *Reconciler) applyHealth(bp *hooksv1alpha1.BillingProvider) time.Duration {
	status, reason, message, ok := r.Health.Condition(bp.UID, bp.Generation)
	if ok {
		conditions.Set(&bp.Status.Conditions, bp.Generation, hooksv1alpha1.ConditionProviderHealthy, status, reason, conditions.TruncateMessage(message))
	} else {
		apimeta.RemoveStatusCondition(&bp.Status.Conditions, hooksv1alpha1.ConditionProviderHealthy)
	}
	if ok && status == metav1.ConditionFalse {
		readiness := conditions.Waiting
		if reason == hooksv1alpha1.ReasonCredentialsRejected {
			readiness = conditions.Broken
		}
		return conditions.SetReadiness(&bp.Status.Conditions, bp.Generation, readiness, reason,
			conditions.TruncateMessage(message+"; settlements keep retrying with the same keys"), r.now(), r.WaitingGrace)
	}
	return conditions.SetReadiness(&bp.Status.Conditions, bp.Generation, conditions.Working, hooksv1alpha1.ReasonValid,
		"credentials found and allowed for this endpoint; settlements are sent to "+bp.Spec.Endpoint, r.now(), r.WaitingGrace)
}

type reconciliationPolicy struct {
	interval, stuckAfter, eventStaleAfter time.Duration
	keep                                  int
}

func reconciliationPolicyOf(bp *hooksv1alpha1.BillingProvider) reconciliationPolicy {
	p := reconciliationPolicy{interval: defaultReconcileInterval, stuckAfter: defaultStuckAfter,
		eventStaleAfter: defaultEventStaleAfter, keep: defaultKeepReports}
	if rp := bp.Spec.Reconciliation; rp != nil {
		p.interval = settlement.DurationOr(rp.Interval, p.interval)
		p.stuckAfter = settlement.DurationOr(rp.StuckAfter, p.stuckAfter)
		p.eventStaleAfter = settlement.DurationOr(rp.EventStaleAfter, p.eventStaleAfter)
		if rp.KeepReports > 0 {
			p.keep = int(rp.KeepReports)
		}
	}
	return p
}

func (r *Reconciler) clientFor(ctx context.Context, bp *hooksv1alpha1.BillingProvider) (billing.Client, error) {
	return r.clients.Get(ctx, r.APIReader, r.NewClient, bp, r.Health)
}

// ReportName is a pass's report name: the provider's name and the pass's UTC time,
// lower-case so it is a valid object name, and sortable.
func ReportName(provider string, t time.Time) string {
	return provider + "-" + strings.ToLower(t.UTC().Format("20060102t150405z"))
}

// prune deletes the oldest reports beyond keep; reports are the only thing a pass
// ever deletes.
func (r *Reconciler) prune(ctx context.Context, bp *hooksv1alpha1.BillingProvider, keep int) error {
	var l hooksv1alpha1.ReconciliationReportList
	if err := r.List(ctx, &l, client.InNamespace(bp.Namespace),
		client.MatchingLabels{hooksv1alpha1.LabelBillingProvider: bp.Name}); err != nil {
		return fmt.Errorf("list reports of %s: %w", bp.Name, err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Spec.WindowEnd.Before(&l.Items[j].Spec.WindowEnd) })
	var held map[string]bool
	if n := len(l.Items) - keep; n > 0 {
		var err error
		if held, err = r.confirmBeforePrune(ctx, bp, l.Items[:n], l.Items[n:]); err != nil {
			return err
		}
	}
	for i := 0; i < len(l.Items)-keep; i++ {
		if held[l.Items[i].Name] {
			continue // a confirmation of it is not kept anywhere else yet
		}
		if err := r.Delete(ctx, &l.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("prune report %s: %w", l.Items[i].Name, err)
		}
	}
	return nil
}

// deletionNamesShown is how many holding settlements the Deleting condition names.
const deletionNamesShown = 2

// reconcileDelete lets the deletion go ahead once no referencing settlement may have
// moved money here unresolved (SettlementHoldsProvider); until then it holds the
// finalizer and says why. It runs no pass and checks nothing: the provider, its
// endpoint and its credentials Secret stay exactly as they are, because the holding
// settlements keep calling it (they read it from the cache, deletionTimestamp and all)
// until the provider answers for them.
func (r *Reconciler) reconcileDelete(ctx context.Context, bp *hooksv1alpha1.BillingProvider) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(bp, hooksv1alpha1.FinalizerBillingProviderInUse) {
		return ctrl.Result{}, nil // not ours to hold (someone else's finalizer keeps it)
	}
	holders, err := r.settlementsHolding(ctx, bp)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(holders) == 0 {
		// The cache may not have seen a settlement's bracket yet: confirm live before
		// letting the provider go (a settlement re-reads the provider live after its
		// bracket, so one of the two always sees the other).
		if holders, err = r.settlementsHoldingLive(ctx, bp); err != nil || len(holders) > 0 {
			return ctrl.Result{RequeueAfter: time.Second}, err
		}
		patch := client.MergeFromWithOptions(bp.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(bp, hooksv1alpha1.FinalizerBillingProviderInUse)
		if err := r.Patch(ctx, bp, patch); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("remove finalizer of billingprovider %s/%s: %w", bp.Namespace, bp.Name, err)
		}
		r.Health.Forget(bp.UID)
		r.findings.forget(bp.UID)
		r.walks.take(bp.UID)
		r.archived.Drop(bp.UID)
		r.lookups.drop(bp.UID)
		ctrl.LoggerFrom(ctx).Info("no settlement holds the billing provider any more; deletion goes ahead")
		return ctrl.Result{}, nil
	}

	before := bp.DeepCopy()
	msg := deletionWaitMessage(bp.Namespace, holders)
	prev := apimeta.FindStatusCondition(bp.Status.Conditions, hooksv1alpha1.ConditionDeleting)
	announce := prev == nil || prev.Status != metav1.ConditionTrue || prev.Reason != hooksv1alpha1.ReasonSettlementsInFlight
	bp.Status.ObservedGeneration = bp.Generation
	conditions.Set(&bp.Status.Conditions, bp.Generation, hooksv1alpha1.ConditionDeleting, metav1.ConditionTrue,
		hooksv1alpha1.ReasonSettlementsInFlight, msg)
	// Optimistic lock: a copy from a cache that has not seen our last write yet fails
	// here instead of announcing the wait a second time.
	wrote, err := statuspatch.Patch(ctx, r.Client, bp, before, true)
	if err != nil || !wrote {
		return ctrl.Result{}, err
	}
	if announce {
		r.Recorder.Eventf(bp, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonSettlementsInFlight, "Delete", "%s", msg)
	}
	// No requeue: a holding settlement's change re-triggers this (see SetupWithManager).
	return ctrl.Result{}, nil
}

// settlementsHolding returns the names, sorted, of the settlements that reference the
// provider and hold it.
func (r *Reconciler) settlementsHolding(ctx context.Context, bp *hooksv1alpha1.BillingProvider) ([]string, error) {
	var l hooksv1alpha1.BillingSettlementList
	// Read-only use of the cache's objects: no deep copy of every referencing settlement.
	if err := r.List(ctx, &l, client.InNamespace(bp.Namespace),
		client.MatchingFields{index.SettlementBillingProvider: bp.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list settlements of billingprovider %s/%s: %w", bp.Namespace, bp.Name, err)
	}
	var names []string
	for i := range l.Items {
		if settlement.HoldsProvider(&l.Items[i]) {
			names = append(names, l.Items[i].Name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// settlementsHoldingLive is settlementsHolding read from the API server.
func (r *Reconciler) settlementsHoldingLive(ctx context.Context, bp *hooksv1alpha1.BillingProvider) ([]string, error) {
	var l hooksv1alpha1.BillingSettlementList
	if err := r.APIReader.List(ctx, &l, client.InNamespace(bp.Namespace)); err != nil {
		return nil, fmt.Errorf("list settlements of billingprovider %s/%s: %w", bp.Namespace, bp.Name, err)
	}
	var names []string
	for i := range l.Items {
		if l.Items[i].Spec.BillingProviderRef == bp.Name && settlement.HoldsProvider(&l.Items[i]) {
			names = append(names, l.Items[i].Name)
		}
	}
	return names, nil
}

// deletionWaitMessage says why the deletion waits, how many settlements hold it, and
// names the first of them.
func deletionWaitMessage(namespace string, holders []string) string {
	n := len(holders)
	shown := strings.Join(holders[:min(n, deletionNamesShown)], ", ")
	if n > deletionNamesShown {
		shown += fmt.Sprintf(" and %d more", n-deletionNamesShown)
	}
	what := fmt.Sprintf("%d settlements may have moved money at this provider and have no final answer yet (%s); "+
		"they keep asking it by key, with its endpoint and credentials Secret, until they settle or fail", n, shown)
	if n == 1 {
		what = fmt.Sprintf("1 settlement may have moved money at this provider and has no final answer yet (%s); "+
			"it keeps asking it by key, with its endpoint and credentials Secret, until it settles or fails", shown)
	}
	return conditions.TruncateMessage("deletion waits: " + what + "; keep that Secret (kubectl get billingsettlements -n " + namespace + ")")
}

// SetupWithManager registers the controller. Passes are driven by RequeueAfter;
// spec changes (e.g. a shorter interval) take effect at once. A deleting provider is
// reconciled again whenever a settlement referencing it starts or stops holding it.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &hooksv1alpha1.BillingSettlement{},
		index.SettlementBillingProvider, func(obj client.Object) []string {
			return []string{obj.(*hooksv1alpha1.BillingSettlement).Spec.BillingProviderRef}
		}); err != nil {
		return fmt.Errorf("index billingsettlements by billingProviderRef: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&hooksv1alpha1.BillingProvider{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{},
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
			}}))).
		Watches(&hooksv1alpha1.BillingSettlement{}, handler.EnqueueRequestsFromMapFunc(r.deletingProviderOf),
			builder.WithPredicates(holdChanged()))
	if r.Health != nil { // a provider whose calls changed health writes it at once
		b = b.WatchesRawSource(source.Channel(r.Health.Changes(), &handler.EnqueueRequestForObject{}))
	}
	workers := r.MaxConcurrentReconciles
	if workers <= 0 {
		workers = defaultWorkers
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: workers}).Complete(r)
}

// deletingProviderOf maps a settlement to its BillingProvider, only while that
// provider is being deleted: a live provider has nothing to decide about it.
func (r *Reconciler) deletingProviderOf(ctx context.Context, obj client.Object) []reconcile.Request {
	bs, ok := obj.(*hooksv1alpha1.BillingSettlement)
	if !ok {
		return nil
	}
	key := types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.BillingProviderRef}
	var bp hooksv1alpha1.BillingProvider
	if err := r.Get(ctx, key, &bp); err != nil || bp.DeletionTimestamp.IsZero() {
		// Not found or not deleting (as far as the cache knows). A deletion the
		// cache has not shown yet reconciles on its own event, and then lists the
		// settlements from a cache that already holds this change.
		return nil
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// holdChanged passes a settlement event only when SettlementHoldsProvider's answer
// changed (or the settlement is gone): nothing else can release or newly hold a
// provider, and settlements change far more often than that.
func holdChanged() predicate.Predicate {
	holds := func(obj client.Object) bool {
		bs, ok := obj.(*hooksv1alpha1.BillingSettlement)
		return ok && settlement.HoldsProvider(bs)
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return holds(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return holds(e.ObjectOld) != holds(e.ObjectNew) },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
