package sharding

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// LeaseName names the Lease by which a deployment claims a namespace it serves: one per
// served namespace, in that namespace, so that two deployments installed anywhere meet
// on it (docs/design.md §16).
const LeaseName = "settlement-operator-shard"

// AnnotationScope on a claim Lease says what its holder serves: "AllNamespaces" for a
// deployment without --watch-namespaces (its one Lease is in its own namespace), absent
// for one namespace.
const AnnotationScope = "hooks.settlement.dev/shard-scope"

// ScopeAllNamespaces is AnnotationScope's value for a deployment serving every namespace.
const ScopeAllNamespaces = "AllNamespaces"

// DefaultLeaseDuration is how long a claim stands without renewal: a deployment that
// stopped without releasing its claims (a crash) frees its namespaces after it.
const DefaultLeaseDuration = 2 * time.Minute

// ErrOverlap is returned (wrapped, naming the namespaces and holders) when another live
// deployment serves a namespace this one would.
var ErrOverlap = errors.New("another settlement-operator deployment serves the same namespaces")

// Its RBAC: the claim Leases by name only; create cannot be limited by name (the API
// server authorizes a create before the object's name is known).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;update,resourceNames=settlement-operator-shard
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=create

// Claim holds one deployment's claims on the namespaces it serves. Acquire takes them
// before the manager starts; Start (a leader-only Runnable) renews them, and fails —
// stopping the manager — if one was taken by another deployment meanwhile.
type Claim struct {
	// Client writes the Leases; Reader lists them (live, from the API server).
	Client client.Client
	Reader client.Reader
	// Identity is the deployment's identity: "<operator namespace>/<leader election ID>",
	// the same for all of its replicas.
	Identity string
	// Namespaces served (--watch-namespaces); empty: all namespaces.
	Namespaces []string
	// Home is the operator's own namespace, where an all-namespaces deployment keeps its
	// one claim.
	Home string
	// Duration of a claim (DefaultLeaseDuration when zero); it is renewed every third.
	Duration time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
}

func (c *Claim) duration() time.Duration {
	if c.Duration > 0 {
		return c.Duration
	}
	return DefaultLeaseDuration
}

func (c *Claim) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// all reports whether this deployment serves every namespace.
func (c *Claim) all() bool { return len(c.Namespaces) == 0 }

// claimed is where this deployment's Leases are.
func (c *Claim) claimed() []string {
	if c.all() {
		return []string{c.Home}
	}
	out := slices.Clone(c.Namespaces)
	sort.Strings(out)
	return out
}

// live reports whether a Lease is an unexpired claim.
func (c *Claim) live(l *coordinationv1.Lease) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	return c.now().Before(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
}

// Overlaps lists, as "namespace (held by identity)", the live claims of other
// deployments that overlap this one's: a claim on a namespace it serves, any claim of
// an all-namespaces deployment, and — for an all-namespaces deployment — any claim.
func (c *Claim) Overlaps(ctx context.Context) ([]string, error) {
	var l coordinationv1.LeaseList
	if err := c.Reader.List(ctx, &l, client.MatchingFields{"metadata.name": LeaseName}); err != nil {
		return nil, fmt.Errorf("list %s Leases: %w", LeaseName, err)
	}
	var out []string
	for i := range l.Items {
		lease := &l.Items[i]
		holder := ptr.Deref(lease.Spec.HolderIdentity, "")
		if holder == c.Identity || !c.live(lease) {
			continue
		}
		theirsAll := lease.Annotations[AnnotationScope] == ScopeAllNamespaces
		if c.all() || theirsAll || slices.Contains(c.Namespaces, lease.Namespace) {
			what := lease.Namespace
			if theirsAll {
				what = "all namespaces"
			}
			out = append(out, fmt.Sprintf("%s (held by %s)", what, holder))
		}
	}
	sort.Strings(out)
	return out, nil
}

// Acquire takes (or renews) this deployment's claims, unless another live deployment
// overlaps: then nothing is taken and the error wraps ErrOverlap, naming the
// namespaces, their holders and what to do.
func (c *Claim) Acquire(ctx context.Context) error {
	if over, err := c.Overlaps(ctx); err != nil {
		return err
	} else if len(over) > 0 {
		return c.overlap(over)
	}
	for _, ns := range c.claimed() {
		if err := c.takeRetrying(ctx, ns); err != nil {
			return err
		}
	}
	// Two deployments starting at once may each have found nothing before either
	// wrote: look again now that ours are written. Both then refuse, which is safe.
	if over, err := c.Overlaps(ctx); err != nil {
		return err
	} else if len(over) > 0 {
		return c.overlap(over)
	}
	return nil
}

func (c *Claim) overlap(over []string) error {
	return fmt.Errorf("%w: %s; this deployment (%s) does not start: two deployments serving one namespace would each "+
		"reconcile its settlements with its own locks (docs/design.md §16). Make --watch-namespaces disjoint "+
		"(an empty list means all namespaces), or stop the other deployment; a claim of a stopped one lapses %s "+
		"after its last renewal (docs/runbook.md, ShardOverlap)", ErrOverlap, strings.Join(over, ", "), c.Identity, c.duration())
}

// takeRetrying is take, read again after a write another writer won (two replicas of
// one deployment starting together both create or renew its claim).
func (c *Claim) takeRetrying(ctx context.Context, ns string) error {
	var err error
	for range 5 {
		if err = c.take(ctx, ns); !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return err
}

// take creates or renews the claim in ns, with the Lease's resourceVersion as the
// compare-and-swap: a claim another deployment holds live is never overwritten.
func (c *Claim) take(ctx context.Context, ns string) error {
	now := metav1.NewMicroTime(c.now())
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(c.Identity), RenewTime: &now,
		LeaseDurationSeconds: ptr.To(int32(c.duration() / time.Second))}
	var lease coordinationv1.Lease
	err := c.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: LeaseName}, &lease)
	if apierrors.IsNotFound(err) {
		spec.AcquireTime = &now
		lease = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeaseName}, Spec: spec}
		c.annotate(&lease)
		err := c.Client.Create(ctx, &lease)
		if apierrors.IsNotFound(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			// The namespace does not exist (yet), or is being deleted (it refuses creates,
			// and its Lease went early in its deletion): there is nothing new in it to
			// serve twice. Refusing to start here would stop every other tenant and keep
			// the namespace's settlements from ever releasing it. The leader's renewals
			// claim a namespace once it is created.
			return nil
		}
		if err != nil {
			return fmt.Errorf("claim namespace %s: %w", ns, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get claim of namespace %s: %w", ns, err)
	}
	if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); holder != c.Identity && c.live(&lease) {
		return c.overlap([]string{fmt.Sprintf("%s (held by %s)", ns, holder)})
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") != c.Identity {
		spec.AcquireTime = &now
		spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
	} else {
		spec.AcquireTime, spec.LeaseTransitions = lease.Spec.AcquireTime, lease.Spec.LeaseTransitions
	}
	lease.Spec = spec
	c.annotate(&lease)
	if err := c.Client.Update(ctx, &lease); err != nil {
		return fmt.Errorf("claim namespace %s: %w", ns, err)
	}
	return nil
}

func (c *Claim) annotate(l *coordinationv1.Lease) {
	if c.all() {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnotationScope] = ScopeAllNamespaces
	} else {
		delete(l.Annotations, AnnotationScope)
	}
}

// Start renews the claims now and then every third of their duration until ctx ends,
// then releases them (a clean shutdown frees the namespaces at once, as the leader
// election Lease is released). A renewal that finds another deployment's live claim
// stops the manager with that error; one the API server fails is tried again at the
// next tick (the claim stands for its duration).
func (c *Claim) Start(ctx context.Context) error {
	log := log.FromContext(ctx).WithName("shard-claim")
	t := time.NewTicker(c.duration() / 3)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				c.release(log)
				return nil
			case <-t.C:
			}
		}
		for _, ns := range c.claimed() {
			if err := c.takeRetrying(ctx, ns); errors.Is(err, ErrOverlap) {
				return err
			} else if err != nil {
				log.Error(err, "renewing a namespace claim failed; trying again", "namespace", ns)
			}
		}
		// A renewal may have claimed a namespace created since the start, where only the
		// claim of an all-namespaces deployment (in its own namespace) says it is served
		// already: look at every claim again (one list per renewal).
		if over, err := c.Overlaps(ctx); err != nil {
			log.Error(err, "checking the namespace claims for an overlap failed; trying again")
		} else if len(over) > 0 {
			return c.overlap(over)
		}
	}
}

// release gives up this deployment's claims that it still holds.
func (c *Claim) release(log logr.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, ns := range c.claimed() {
		var lease coordinationv1.Lease
		if err := c.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: LeaseName}, &lease); err != nil ||
			ptr.Deref(lease.Spec.HolderIdentity, "") != c.Identity {
			continue
		}
		lease.Spec.HolderIdentity, lease.Spec.RenewTime = nil, nil
		if err := c.Client.Update(ctx, &lease); err != nil {
			log.Error(err, "releasing a namespace claim failed: it lapses by itself", "namespace", ns, "after", c.duration())
		}
	}
}

// NeedLeaderElection: only the leader renews (every replica checked the claims at its
// start, and all replicas share the deployment's identity).
func (c *Claim) NeedLeaderElection() bool { return true }
