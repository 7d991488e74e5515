package receiver

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/extract"
)

// Refused deliveries are made visible on their WebhookProvider (decisions.md
// "Rejections"): status.lastRejection, a Warning Event and an info log line,
// each at most once per provider per interval. A delivery only records its refusal in
// memory (a map under a mutex); one goroutine per replica writes the aggregate, so a
// flood of bad deliveries never turns into a flood of API writes and never waits on one.

// signedPrecedence is how long a refusal of a verified delivery stays in
// status.lastRejection against unsigned refusals: anyone who can reach the endpoint
// can cause a 401, only the real sender a 400 after a valid signature.
const signedPrecedence = 10 * time.Minute

// rejectionNoticeInterval bounds the Warning Events and log lines per provider.
const rejectionNoticeInterval = time.Minute

// rejection is one refused delivery's summary: a closed reason, the path at fault and
// a message with no value from the payload.
type rejection struct {
	reason, path, message string
	signed                bool
}

// signedRejection summarizes a refusal after the signature verified.
func signedRejection(err error) *rejection {
	var fe *extract.FieldError
	switch {
	case errors.As(err, &fe) && fe.Missing:
		return &rejection{reason: hooksv1alpha1.RejectionMissingField, path: fe.Path, message: fe.Problem, signed: true}
	case errors.As(err, &fe) && fe.Condition:
		return &rejection{reason: hooksv1alpha1.RejectionWhenFailed, path: fe.Path, message: fe.Problem, signed: true}
	case errors.As(err, &fe):
		return &rejection{reason: hooksv1alpha1.RejectionInvalidField, path: fe.Path, message: fe.Problem, signed: true}
	}
	// Other content problems' messages may quote a (truncated) value: the status gets
	// a fixed sentence, the sender's answer the details.
	return &rejection{reason: hooksv1alpha1.RejectionInvalidEvent, signed: true,
		message: "the event's content was refused; the sender's 400 answer names the problem"}
}

var (
	rejectMalformedJSON = &rejection{reason: hooksv1alpha1.RejectionMalformedJSON, signed: true,
		message: "the signed body is not valid JSON"}
	rejectSignature = &rejection{reason: hooksv1alpha1.RejectionInvalidSignature,
		message: "the signature is missing, malformed, out of tolerance or does not match the signing Secret's keys"}
	rejectMediaType = &rejection{reason: hooksv1alpha1.RejectionUnsupportedMediaType,
		message: "the Content-Type is not application/json"}
	rejectTooLarge = &rejection{reason: hooksv1alpha1.RejectionPayloadTooLarge,
		message: "the body exceeds the receiver's size limit (--receiver-max-body-bytes)"}
)

// pendingKey is one kind of refusal of one provider.
type pendingKey struct{ reason, path string }

type pendingRejection struct {
	r           rejection
	count       int64
	first, last time.Time
}

// providerRejections is one provider's refusals since its last successful flush.
type providerRejections struct {
	pending    map[pendingKey]*pendingRejection
	lastFlush  time.Time
	lastNotice time.Time
}

// rejections aggregates refusals per provider and writes them asynchronously.
type rejections struct {
	interval time.Duration
	now      func() time.Time

	mu    sync.Mutex
	byKey map[types.NamespacedName]*providerRejections
}

func newRejections(interval time.Duration, now func() time.Time) *rejections {
	return &rejections{interval: interval, now: now, byKey: map[types.NamespacedName]*providerRejections{}}
}

// entry is the provider's refusals, made on first use; s.mu must be held.
func (s *rejections) entry(key types.NamespacedName) *providerRejections {
	p := s.byKey[key]
	if p == nil {
		p = &providerRejections{}
		s.byKey[key] = p
	}
	return p
}

// record counts a refusal; it never blocks on anything but the map's mutex.
func (s *rejections) record(key types.NamespacedName, r *rejection) {
	rejectionsTotal.WithLabelValues(key.Namespace, key.Name, r.reason).Inc()
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.entry(key)
	if p.pending == nil {
		p.pending = map[pendingKey]*pendingRejection{}
	}
	k := pendingKey{r.reason, r.path}
	e := p.pending[k]
	if e == nil {
		e = &pendingRejection{r: *r, first: now}
		p.pending[k] = e
	}
	e.count++
	e.last = now
}

// due takes the pending refusals of the providers whose interval has passed (all of
// them when final); a failed flush gives them back with restore.
func (s *rejections) due(final bool) map[types.NamespacedName]map[pendingKey]*pendingRejection {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[types.NamespacedName]map[pendingKey]*pendingRejection{}
	for key, p := range s.byKey {
		if len(p.pending) == 0 || (!final && now.Sub(p.lastFlush) < s.interval) {
			continue
		}
		out[key] = p.pending
		p.pending = nil
		p.lastFlush = now
	}
	return out
}

// restore gives back refusals whose flush failed, so the next flush adds them: a
// conflict or an unavailable API server delays a count, never drops it.
func (s *rejections) restore(key types.NamespacedName, pending map[pendingKey]*pendingRejection) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.entry(key)
	if p.pending == nil {
		p.pending = pending
		return
	}
	for k, e := range pending {
		if cur := p.pending[k]; cur != nil {
			cur.count += e.count
			if e.first.Before(cur.first) {
				cur.first = e.first
			}
			continue
		}
		p.pending[k] = e
	}
}

// forget drops a provider that no longer exists.
func (s *rejections) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byKey, key)
}

// notice reports whether a Warning Event and log line may be emitted for key now.
func (s *rejections) notice(key types.NamespacedName) bool {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.byKey[key]
	if p == nil || (!p.lastNotice.IsZero() && now.Sub(p.lastNotice) < rejectionNoticeInterval) {
		return false
	}
	p.lastNotice = now
	return true
}

// mergeRejection folds one provider's pending refusals into its current
// lastRejection. The candidate is the latest signed refusal if there is one, else the
// latest; an unsigned candidate does not replace a signed lastRejection younger than
// signedPrecedence (its deliveries stay counted in the metric). Counts add up while
// the reason and path stay the same, and start over when they change. It returns the
// new value, the number of deliveries it adds, and false when nothing changes.
func mergeRejection(cur *hooksv1alpha1.DeliveryRejection, pending map[pendingKey]*pendingRejection, now time.Time) (*hooksv1alpha1.DeliveryRejection, int64, bool) {
	entries := make([]*pendingRejection, 0, len(pending))
	for _, e := range pending {
		entries = append(entries, e)
	}
	// Latest first, signed before unsigned; reason and path break ties so the choice
	// is deterministic.
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i], entries[j]
		if a.r.signed != b.r.signed {
			return a.r.signed
		}
		if !a.last.Equal(b.last) {
			return a.last.After(b.last)
		}
		return a.r.reason+a.r.path < b.r.reason+b.r.path
	})
	c := entries[0]
	if cur != nil && cur.Signed && !c.r.signed && now.Sub(cur.LastTime.Time) < signedPrecedence {
		return cur, 0, false
	}
	next := &hooksv1alpha1.DeliveryRejection{
		Reason: c.r.reason, Path: truncateText(c.r.path, 512), Message: truncateText(c.r.message, 1024),
		Signed: c.r.signed, Count: c.count, LastTime: metav1.NewTime(c.last.UTC().Truncate(time.Second)),
	}
	first := metav1.NewTime(c.first.UTC().Truncate(time.Second))
	next.FirstTime = &first
	if cur != nil && cur.Reason == next.Reason && cur.Path == next.Path {
		next.Count += cur.Count
		if cur.FirstTime != nil {
			next.FirstTime = cur.FirstTime.DeepCopy()
		}
	}
	return next, c.count, true
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// runRejections flushes due refusals until ctx ends, then once more for all of them.
func (r *Receiver) runRejections(ctx context.Context) {
	tick := r.opts.RejectionFlushInterval / 10
	tick = min(max(tick, 50*time.Millisecond), time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			r.flushRejections(final, true)
			cancel()
			return
		case <-t.C:
			r.flushRejections(ctx, false)
		}
	}
}

func (r *Receiver) flushRejections(ctx context.Context, final bool) {
	for key, pending := range r.rejections.due(final) {
		if err := r.flushProvider(ctx, key, pending); err != nil {
			r.rejections.restore(key, pending)
			// Conflicts are expected (the provider controller or another replica
			// wrote in between): the next flush adds the count again.
			if !apierrors.IsConflict(err) {
				log.FromContext(ctx).Info("recording rejected deliveries on the provider failed; retrying at the next flush",
					"namespace", key.Namespace, "provider", key.Name, "error", err.Error())
			}
		}
	}
}

// flushProvider writes one provider's refusals: a merge patch of status.lastRejection
// guarded by the resourceVersion just read, then (rate-limited) an Event and a log line.
func (r *Receiver) flushProvider(ctx context.Context, key types.NamespacedName, pending map[pendingKey]*pendingRejection) error {
	apiCtx, cancel := context.WithTimeout(ctx, r.opts.APITimeout)
	defer cancel()
	var p hooksv1alpha1.WebhookProvider
	if err := r.live.Get(apiCtx, key, &p); err != nil {
		if apierrors.IsNotFound(err) {
			r.rejections.forget(key)
			return nil
		}
		return err
	}
	next, added, changed := mergeRejection(p.Status.LastRejection, pending, r.opts.Now())
	if changed && r.status != nil {
		before := p.DeepCopy()
		p.Status.LastRejection = next
		patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
		if err := r.status.Status().Patch(apiCtx, &p, patch); err != nil {
			if apierrors.IsNotFound(err) {
				r.rejections.forget(key)
				return nil
			}
			return err
		}
	}
	if !changed || !r.rejections.notice(key) {
		return nil
	}
	log.FromContext(ctx).Info("deliveries refused", "namespace", key.Namespace, "provider", key.Name,
		"reason", next.Reason, "path", next.Path, "signed", next.Signed, "count", added, "message", next.Message)
	where := ""
	if next.Path != "" {
		where = " at " + next.Path
	}
	r.recorder.Eventf(&p, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonDeliveriesRejected, "Receive",
		"%d deliveries refused (%s%s): %s; see status.lastRejection", added, next.Reason, where, next.Message)
	return nil
}
