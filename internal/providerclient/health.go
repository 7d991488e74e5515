package providerclient

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/credentials"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// Health remembers how the latest calls to each BillingProvider went, so that
// the BillingProvider's status says what every settlement sees — the provider refuses
// the token, or its endpoint cannot be reached — instead of Ready=True while every
// call fails (docs/decisions.md "Provider health"). It lives in memory: only the
// leader calls providers, and a new leader learns again from its first calls. The
// settlement and BillingProvider controllers share one.
type Health struct {
	// Hold is how long a failure stands against later successes (30s), so that a
	// provider failing some calls does not flap between healthy and not.
	Hold time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time

	mu      sync.Mutex
	state   map[types.UID]*providerHealthState
	changed chan event.GenericEvent
}

type providerHealthState struct {
	// generation of the provider the calls went to: a spec change (a new endpoint)
	// starts over.
	generation      int64
	reason, message string
	lastFailure     time.Time
}

// NewHealth makes an empty tracker.
func NewHealth() *Health {
	return &Health{state: map[types.UID]*providerHealthState{}, changed: make(chan event.GenericEvent, 1024)}
}

// Changes delivers a BillingProvider whose health reason changed, for its controller
// to write the condition (a source.Channel). When the channel is full the change waits
// for the provider's next reconcile.
func (h *Health) Changes() <-chan event.GenericEvent { return h.changed }

func (h *Health) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

func (h *Health) hold() time.Duration {
	if h.Hold > 0 {
		return h.Hold
	}
	return 30 * time.Second
}

// observe records the outcome of one call to bp.
func (h *Health) observe(bp *hooksv1alpha1.BillingProvider, err error) {
	if h == nil {
		return
	}
	reason, message := healthOf(bp, err)
	if reason == "" {
		return
	}
	now := h.now()
	h.mu.Lock()
	st := h.state[bp.UID]
	switch {
	case st == nil || bp.Generation > st.generation:
		st = &providerHealthState{generation: bp.Generation}
		h.state[bp.UID] = st
	case bp.Generation < st.generation:
		h.mu.Unlock()
		return // a call through the provider's older spec, still in flight
	}
	if reason == hooksv1alpha1.ReasonCallsSucceeding && st.reason != "" && st.reason != reason &&
		now.Sub(st.lastFailure) < h.hold() {
		h.mu.Unlock()
		return
	}
	if reason != hooksv1alpha1.ReasonCallsSucceeding {
		st.lastFailure = now
	}
	changed := st.reason != reason
	st.reason, st.message = reason, message
	h.mu.Unlock()
	if changed {
		obj := &hooksv1alpha1.BillingProvider{ObjectMeta: metav1.ObjectMeta{Namespace: bp.Namespace, Name: bp.Name}}
		select {
		case h.changed <- event.GenericEvent{Object: obj}:
		default:
		}
	}
}

// Condition is the ProviderHealthy condition for a provider; ok is false before its
// first call.
func (h *Health) Condition(uid types.UID, generation int64) (status metav1.ConditionStatus, reason, message string, ok bool) {
	if h == nil {
		return "", "", "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.state[uid]
	if st == nil || st.reason == "" || st.generation != generation {
		return "", "", "", false
	}
	status = metav1.ConditionFalse
	if st.reason == hooksv1alpha1.ReasonCallsSucceeding {
		status = metav1.ConditionTrue
	}
	return status, st.reason, st.message, true
}

// Forget drops a deleted provider.
func (h *Health) Forget(uid types.UID) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.state, uid)
}

// healthOf says what one call's outcome tells about the provider as a whole; an
// empty reason means nothing (our own cancellation, an error from outside the
// adapter). A 5xx says the provider is failing; any other answer but 401/403 proves the
// endpoint is reachable and the credentials accepted: a 4xx about one settlement (a
// refusal, a 404 lookup, a 409 key in use, a 429) is that settlement's story.
func healthOf(bp *hooksv1alpha1.BillingProvider, err error) (reason, message string) {
	if err == nil {
		return hooksv1alpha1.ReasonCallsSucceeding, "the latest calls reached " + bp.Spec.Endpoint + " and it accepted the credentials"
	}
	e, ok := billing.AsError(err)
	if !ok || e.Unanswerable || e.Local {
		return "", "" // (a lookup the adapter cannot make, or a request it refused unsent, says nothing about the provider)
	}
	switch {
	case e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden:
		return hooksv1alpha1.ReasonCredentialsRejected, fmt.Sprintf(
			"the provider refused the credentials (HTTP %d): check that key %q of Secret %q holds a valid token for %s",
			e.Status, secretKeyOf(bp), bp.Spec.CredentialsSecretRef.Name, bp.Spec.Endpoint)
	case e.Status >= 500:
		return hooksv1alpha1.ReasonProviderErroring, fmt.Sprintf(
			"the provider answers with errors (HTTP %d): check its status; settlements whose outcome is unknown are asked by key once it recovers",
			e.Status)
	case e.Status != 0:
		return hooksv1alpha1.ReasonCallsSucceeding, "the latest calls reached " + bp.Spec.Endpoint + " and it accepted the credentials"
	case e.Code == "canceled":
		return "", ""
	case e.Code == "timeout":
		return hooksv1alpha1.ReasonProviderNotAnswering, fmt.Sprintf(
			"calls to %s get no answer within its requestTimeout (%s): the provider is overloaded or hung, or the network drops the calls; "+
				"its settlements take turns for its share of the workers, so other providers' are not held up, "+
				"and those whose outcome is unknown are asked by key once it answers",
			bp.Spec.Endpoint, settlement.RequestTimeoutOf(bp))
	default:
		return hooksv1alpha1.ReasonEndpointUnreachable, fmt.Sprintf(
			"calls to %s get no answer (%s): check the endpoint, the provider's status and the network path", bp.Spec.Endpoint, e.Code)
	}
}

func secretKeyOf(bp *hooksv1alpha1.BillingProvider) string {
	if bp.Spec.CredentialsSecretRef.Key != "" {
		return bp.Spec.CredentialsSecretRef.Key
	}
	return "token"
}

// observedClient reports every call's outcome to the provider's health.
type observedClient struct {
	billing.Client
	bp     *hooksv1alpha1.BillingProvider
	health *Health // nil: not shown
	// rejected is called on a 401/403 (the credential is read again before the next call).
	rejected func()
}

func (c observedClient) observe(err error) {
	if c.health != nil {
		c.health.observe(c.bp, err)
	}
	if c.rejected != nil && credentials.Rejected(err) {
		c.rejected()
	}
}

func (c observedClient) Submit(ctx context.Context, r billing.Request) (billing.Record, error) {
	rec, err := c.Client.Submit(ctx, r)
	c.observe(err)
	return rec, err
}

func (c observedClient) Lookup(ctx context.Context, key string) (billing.Record, bool, error) {
	rec, found, err := c.Client.Lookup(ctx, key)
	c.observe(err)
	return rec, found, err
}

// LookupRequest asks through the adapter's own lookup by request, if it has one.
func (c observedClient) LookupRequest(ctx context.Context, r billing.Request) (billing.Record, bool, error) {
	rec, found, err := billing.LookupFor(ctx, c.Client, r)
	c.observe(err)
	return rec, found, err
}

// Unwrap is the adapter (billing.Unwrap).
func (c observedClient) Unwrap() billing.Client { return c.Client }

func (c observedClient) List(ctx context.Context, since time.Time, cursor string) ([]billing.Record, string, error) {
	items, next, err := c.Client.List(ctx, since, cursor)
	c.observe(err)
	return items, next, err
}

// ReportFailureReason is a failed pass's reason: what the provider call that failed
// says, or APIServerFailure when the pass failed on the cluster or the archive.
func ReportFailureReason(err error) string {
	e, ok := billing.AsError(err)
	switch {
	case !ok:
		return hooksv1alpha1.ReasonAPIServerFailure
	case e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden:
		return hooksv1alpha1.ReasonCredentialsRejected
	case e.Status == 0 && e.Code == "timeout":
		return hooksv1alpha1.ReasonProviderNotAnswering
	case e.Status == 0 && e.Code != "canceled":
		return hooksv1alpha1.ReasonEndpointUnreachable
	default:
		return hooksv1alpha1.ReasonProviderCallFailed
	}
}
