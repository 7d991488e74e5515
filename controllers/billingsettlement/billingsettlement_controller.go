package billingsettlement

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

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

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivewatermark"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
	"github.com/settlement-operator/settlement-operator/internal/index"
	"github.com/settlement-operator/settlement-operator/internal/keyedsem"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/internal/tombstone"
)

// ControllerName names the controller in logs and metrics.
const ControllerName = "billingsettlement"

// Reconciler drives one financial operation to the provider's final
// answer with one idempotency key, set at creation and reused on every attempt and
// replay (docs/design.md §5, §11). What happens next is decided by one pure function
// (internal/settlement's Decide) from the settlement's exposure — could money have moved
// under its key? — which is persisted before every call that could move money and
// lowered only by the provider's authoritative answer.
//
// The reconcile is cluster-api shaped: get → finalizer → snapshot → phases
// (phases.go, provider.go, compensation.go, drive.go), each func(ctx, *settlementScope)
// (ctrl.Result, error) where a non-zero result or an error stops → one deferred status
// patch (status.go computes the conditions).
type Reconciler struct {
	client.Client
	// APIReader reads provider credentials (Secrets) by name, and compensations live
	// (two refunds created at once must see each other).
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// NewClient builds a provider client; the registry's adapter of the provider's type
	// (adapters.New) when nil.
	NewClient func(adapters.Settings) (billing.Client, error)
	// Now is the clock (time.Now).
	Now func() time.Time
	// Random returns a number in [0, 1) for jitter (math/rand/v2 when nil).
	Random func() float64
	// MaxConcurrentReconciles is how many records are worked on at once (1): calls to
	// slow peers must not queue every other record behind them.
	MaxConcurrentReconciles int
	// ProviderShare is how many of those workers the settlements of one
	// BillingProvider may hold at once while they call it (slots.go); 0: a quarter of
	// them, at least 1. A provider that never answers then holds its share, and every
	// other provider's settlements keep the rest.
	ProviderShare int
	// Archive, when set, holds the settlements that left the cluster: a key it holds is
	// never sent again, a settlement leaves only once it is archived, and compensations
	// count the archived refunds of their charge (docs/design.md §12).
	Archive *archive.Store
	// Watermark is moved past a settlement the deletion path archives, before its
	// finalizer goes (internal/archivewatermark; nil: not kept).
	Watermark *archivewatermark.Keeper
	// Tombstones, without an archive, records the name and key of a settlement that
	// presented its key before its finalizer goes, and is read before a settlement is
	// taken for never presented: a namespace deleted and created again under the same
	// name derives the same keys (internal/tombstone, docs/design.md §8). Nil keeps
	// none: such a settlement is then held when deleted.
	Tombstones *tombstone.Keeper
	// TransitionEvents records a Normal Kubernetes Event for every routine step of a
	// charge (submitted, settled). Off by default: Events are for what a human acts on
	// (warnings, dead letters, replays), and two routine Events per charge were a fifth
	// of the API writes and most of the etcd bytes per event (docs/decisions.md).
	TransitionEvents bool
	// Health, shared with the BillingProvider controller, learns from every provider
	// call how the provider is doing (its ProviderHealthy condition); nil leaves it out.
	Health *providerclient.Health
	// CredentialRecheckInterval is how soon a settlement whose provider's Secret is
	// refused (CredentialsNotAllowed) looks again (30s): Secrets are not watched.
	CredentialRecheckInterval time.Duration

	clients providerclient.Clients
	// slots holds each BillingProvider's share of the workers (takeSlot).
	slots keyedsem.Set
	// compensationLocks is one lock per charge for this manager's workers
	// (compensation.go); two managers — in two processes, or two in one test — hold two.
	compensationLocks chargeLocks
}

func (r *Reconciler) credentialRecheck() time.Duration {
	if r.CredentialRecheckInterval > 0 {
		return r.CredentialRecheckInterval
	}
	return waitForReference
}

// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingsettlements/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=billingproviders,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=webhookevents,verbs=get;list;watch
// +kubebuilder:rbac:groups=hooks.settlement.dev,resources=jobcompletions,verbs=get;list;watch

// settlementScope carries one reconcile's state between its phases.
type settlementScope struct {
	bs       *hooksv1alpha1.BillingSettlement
	before   *hooksv1alpha1.BillingSettlement
	provider *hooksv1alpha1.BillingProvider
	client   billing.Client
	policy   settlement.RetryPolicy
	// caps is what the provider can answer about this settlement's request.
	caps billing.Capabilities
	// neverPresented caches neverPresented's answer for the reconcile (nil: not asked).
	neverPresented *bool
	// tombstone caches presentedBefore's answer for the reconcile (asked: it was read).
	tombstone      *tombstone.Tombstone
	tombstoneName  string
	tombstoneAsked bool
	// target is where the provider points now (compared with status.sentTo).
	target hooksv1alpha1.ProviderTarget
	now    time.Time
	// reverses is the original's settlement key, for compensations, and reversesRef
	// the provider's reference of it (what Stripe cancels, deletes or credits).
	reverses, reversesRef string
	// ForceLookup: a new reconcile-request token asks the provider by key now.
	forceLookup bool
	// reconcileToken is that token, recorded once the lookup was made.
	reconcileToken string
	// lookupOnly, when set, says why this settlement is never submitted again (its
	// identity is not derived, but an older operator sent it): it is only asked by key.
	lookupOnly string
	// releaseSlot gives back the provider slot this reconcile holds (nil: none).
	releaseSlot func()
}

// settlementPhase is one step of a reconcile; a non-zero result or an error stops.
type settlementPhase func(context.Context, *settlementScope) (ctrl.Result, error)

// Reconcile drives one settlement.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	var bs hooksv1alpha1.BillingSettlement
	if err := r.Get(ctx, req.NamespacedName, &bs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// The finalizer goes on before anything is sent, so a charge can never lose its
	// local record while money may be at the provider. (Settlements the operator
	// creates carry it from birth; this is for hand-made ones.)
	if bs.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(&bs, hooksv1alpha1.FinalizerSettlementProtection) {
		patch := client.MergeFrom(bs.DeepCopy())
		controllerutil.AddFinalizer(&bs, hooksv1alpha1.FinalizerSettlementProtection)
		if err := r.Patch(ctx, &bs, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to billingsettlement %s: %w", req.NamespacedName, err)
		}
	}
	s := &settlementScope{bs: &bs, before: bs.DeepCopy(), now: r.now()}
	// Deferred first, so it runs last: only once the outcome of the call is written
	// does the provider's slot go back (the slot covers the whole of a call's life,
	// bracket to record), and it goes back even if the status write panics.
	defer func() {
		if s.releaseSlot != nil {
			s.releaseSlot()
		}
	}()
	defer func() {
		if perr := r.patchStatus(ctx, s); perr != nil && err == nil {
			err = perr
		}
	}()
	phases := []settlementPhase{r.observeGeneration, r.checkIdentity, r.checkArchive, r.initExposure, r.lookupFirstWhileArchiveBehind, r.handleReplay,
		r.handleReconcileRequest, r.updateReversedBy, r.resolveProvider, r.drive}
	if !bs.DeletionTimestamp.IsZero() {
		phases = []settlementPhase{r.observeGeneration, r.initExposure, r.resolveProviderIfHeld, r.drive}
	}
	return runPhases(ctx, s, phases)
}

// runPhases runs phases in order until one returns a non-zero result or an error.
func runPhases(ctx context.Context, s *settlementScope, phases []settlementPhase) (ctrl.Result, error) {
	for _, phase := range phases {
		res, err := phase(ctx, s)
		if err != nil || !res.IsZero() {
			return res, err
		}
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) random() float64 {
	if r.Random != nil {
		return r.Random()
	}
	return rand.Float64()
}

// SetupWithManager registers the controller. It runs on spec and metadata changes
// (new object, replay annotation, deletion), not on its own status writes, and when
// a compensation naming it appears.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &hooksv1alpha1.BillingSettlement{},
		index.SettlementReverses, func(obj client.Object) []string {
			if rev := obj.(*hooksv1alpha1.BillingSettlement).Spec.Reverses; rev != "" {
				return []string{rev}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("index billingsettlements by reverses: %w", err)
	}
	reversed := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		if rev := obj.(*hooksv1alpha1.BillingSettlement).Spec.Reverses; rev != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: rev}}}
		}
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&hooksv1alpha1.BillingSettlement{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{},
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return !e.ObjectNew.GetDeletionTimestamp().IsZero()
			}}))).
		Watches(&hooksv1alpha1.BillingSettlement{}, reversed, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false },
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1)}).
		Complete(r)
}
