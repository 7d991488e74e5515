package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// BillingProviderControllerName names the controller in logs and metrics.
const BillingProviderControllerName = "billingprovider"

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
)

// BillingProviderReconciler reports whether a billing backend is usable and runs
// the periodic reconciliation pass (DESIGN §7): it compares events, job completions,
// settlements and the provider's records, writes a ReconciliationReport, and carries
// out automatic repairs through the records' own controllers (a reconcile-request
// annotation), never around them. It deletes nothing but its own old reports.
type BillingProviderReconciler struct {
	client.Client
	// APIReader reads credentials (Secrets) by name.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// NewClient builds a provider client; billing.NewHTTP when nil.
	NewClient func(cfg billing.HTTPConfig) (billing.Client, error)
	// Now is the clock (time.Now).
	Now func() time.Time

	clients providerClients
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingproviders/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=reconciliationreports,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=reconciliationreports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=jobcompletions,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements/status,verbs=get;update;patch

func (r *BillingProviderReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile checks the provider's credentials and runs a pass when one is due.
func (r *BillingProviderReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	var bp hooksv1alpha1.BillingProvider
	if err := r.Get(ctx, req.NamespacedName, &bp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := bp.DeepCopy()
	defer func() {
		if !equality.Semantic.DeepEqual(before.Status, bp.Status) {
			if perr := r.Status().Patch(ctx, &bp, client.MergeFrom(before)); perr != nil && err == nil {
				err = fmt.Errorf("patch status of billingprovider %s: %w", req.NamespacedName, perr)
			}
		}
	}()
	bp.Status.ObservedGeneration = bp.Generation

	c, err := r.clientFor(ctx, &bp)
	if err != nil {
		setCondition(&bp.Status.Conditions, bp.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionFalse,
			ReasonBillingProviderNotFound, truncateMessage(err.Error()))
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	setCondition(&bp.Status.Conditions, bp.Generation, hooksv1alpha1.ConditionReady, metav1.ConditionTrue,
		hooksv1alpha1.ReasonValid, "credentials found; settlements are sent to "+bp.Spec.Endpoint)

	policy := reconciliationPolicyOf(&bp)
	now := r.now()
	if last := bp.Status.LastReconciliation; last != nil {
		if due := last.Add(policy.interval); now.Before(due) {
			return ctrl.Result{RequeueAfter: due.Sub(now)}, nil
		}
	}
	report, listedAll, err := r.pass(ctx, &bp, c, policy, now)
	if err != nil && report == "" {
		return ctrl.Result{}, err
	}
	if err != nil {
		// The report records the failure; the next pass comes at the usual interval
		// rather than in a tight error loop against a provider that is down.
		r.Recorder.Eventf(&bp, nil, "Warning", "ReconciliationFailed", "Reconcile", "%s: %s", report, truncateMessage(err.Error()))
	}
	end := metav1.NewTime(now)
	bp.Status.LastReconciliation, bp.Status.LastReport = &end, report
	if listedAll {
		bp.Status.ProviderListedUntil = &end
	}
	if err := r.prune(ctx, &bp, policy.keep); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: policy.interval}, nil
}

type reconciliationPolicy struct {
	interval, stuckAfter, eventStaleAfter time.Duration
	keep                                  int
}

func reconciliationPolicyOf(bp *hooksv1alpha1.BillingProvider) reconciliationPolicy {
	p := reconciliationPolicy{interval: defaultReconcileInterval, stuckAfter: defaultStuckAfter,
		eventStaleAfter: defaultEventStaleAfter, keep: defaultKeepReports}
	if rp := bp.Spec.Reconciliation; rp != nil {
		p.interval = durationOr(rp.Interval, p.interval)
		p.stuckAfter = durationOr(rp.StuckAfter, p.stuckAfter)
		p.eventStaleAfter = durationOr(rp.EventStaleAfter, p.eventStaleAfter)
		if rp.KeepReports > 0 {
			p.keep = int(rp.KeepReports)
		}
	}
	return p
}

func (r *BillingProviderReconciler) clientFor(ctx context.Context, bp *hooksv1alpha1.BillingProvider) (billing.Client, error) {
	return r.clients.get(ctx, r.APIReader, r.NewClient, bp)
}

// ReportName is a pass's report name: the provider's name and the pass's UTC time,
// lower-case so it is a valid object name, and sortable.
func ReportName(provider string, t time.Time) string {
	return provider + "-" + strings.ToLower(t.UTC().Format("20060102t150405z"))
}

// prune deletes the oldest reports beyond keep; reports are the only thing a pass
// ever deletes.
func (r *BillingProviderReconciler) prune(ctx context.Context, bp *hooksv1alpha1.BillingProvider, keep int) error {
	var l hooksv1alpha1.ReconciliationReportList
	if err := r.List(ctx, &l, client.InNamespace(bp.Namespace),
		client.MatchingLabels{hooksv1alpha1.LabelBillingProvider: bp.Name}); err != nil {
		return fmt.Errorf("list reports of %s: %w", bp.Name, err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Spec.WindowEnd.Before(&l.Items[j].Spec.WindowEnd) })
	for i := 0; i < len(l.Items)-keep; i++ {
		if err := r.Delete(ctx, &l.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("prune report %s: %w", l.Items[i].Name, err)
		}
	}
	return nil
}

// SetupWithManager registers the controller. Passes are driven by RequeueAfter;
// spec changes (e.g. a shorter interval) take effect at once.
func (r *BillingProviderReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(BillingProviderControllerName).
		For(&hooksv1alpha1.BillingProvider{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}
