package webhookevent

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/index"
)

// eventChildren lists the child names an event's facts derive, for the index.
func eventChildren(obj client.Object) []string {
	ev := obj.(*hooksv1alpha1.WebhookEvent)
	var names []string
	jobs, stls, _ := facts(ev)
	for _, f := range jobs {
		names = append(names, identity.JobCompletionName(ev.Spec.Provider, f.JobID))
	}
	for _, f := range stls {
		names = append(names, identity.SettlementNameFor(ev.Spec.Provider, f.SettlementKey))
		if k, ok := identity.ParseSettlementKey(f.SettlementKey); ok && k.Kind == identity.KeyKindFields {
			// The charge may live under its legacy name (legacySettlement).
			names = append(names, identity.SettlementName(ev.Spec.Provider, k.LegacyKey()))
		}
	}
	return names
}

// IndexEvents registers the WebhookEvent index the controller reads (IndexEventChildren);
// SetupWithManager calls it.
func IndexEvents(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &hooksv1alpha1.WebhookEvent{},
		index.EventChildren, eventChildren); err != nil {
		return fmt.Errorf("index webhookevents by child: %w", err)
	}
	return nil
}

// eventsOfChild maps a changed child to the events that dispatched it.
func (r *Reconciler) eventsOfChild(ctx context.Context, obj client.Object) []reconcile.Request {
	var l hooksv1alpha1.WebhookEventList
	if err := r.List(ctx, &l, client.InNamespace(obj.GetNamespace()), client.MatchingFields{index.EventChildren: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "list events of child", "child", obj.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(l.Items))
	for _, ev := range l.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ev.Namespace, Name: ev.Name}})
	}
	return reqs
}

// childHandler enqueues a child's events when they have something to write about it
// (docs/design.md §9: an event's status is written when its operations are decided
// and when they finish, and when one goes wrong). A child's creation was done (or
// linked) by the event itself, so it enqueues nothing; its deletion always enqueues.
// An update enqueues only when the child's health as its events classify it changes
// (Pending → Submitted does not), and a child that turned out well only once none of
// the event's other children is still progressing: partial progress is read on the
// children, not rewritten on every event (measured: 3.4 event reconciles per event
// before, 2 now).
func (r *Reconciler) childHandler(healthOf func(client.Object) health) handler.Funcs {
	enqueue := func(ctx context.Context, obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request], whenDone bool) {
		for _, req := range r.eventsOfChild(ctx, obj) {
			if whenDone && !r.othersDone(ctx, req.NamespacedName, obj) {
				continue
			}
			q.Add(req)
		}
	}
	return handler.Funcs{
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.GetResourceVersion() == e.ObjectNew.GetResourceVersion() {
				enqueue(ctx, e.ObjectNew, q, false) // a resync: the safety net for anything missed
				return
			}
			was, is := healthOf(e.ObjectOld), healthOf(e.ObjectNew)
			if was != is {
				enqueue(ctx, e.ObjectNew, q, is == healthGood)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q, false)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q, false)
		},
	}
}

func childHealthOfJob(o client.Object) health {
	return operationHealth(hooksv1alpha1.OperationStatus{State: mirroredJobState(o.(*hooksv1alpha1.JobCompletion))})
}

func childHealthOfSettlement(o client.Object) health {
	return operationHealth(hooksv1alpha1.OperationStatus{State: mirroredSettlementState(o.(*hooksv1alpha1.BillingSettlement))})
}

// othersDone reports whether none of the event's children but changed is still
// progressing, as the cache shows them. Whatever it cannot tell (the event or a
// child not in the cache) counts as done, so the event is reconciled rather than
// missed. Of two children finishing at once, the later notification sees the other's
// new state (an informer updates its store before it notifies), so one enqueues.
func (r *Reconciler) othersDone(ctx context.Context, key types.NamespacedName, changed client.Object) bool {
	var ev hooksv1alpha1.WebhookEvent
	if err := r.Get(ctx, key, &ev); err != nil {
		return true
	}
	progressing := func(name string, obj client.Object, h func(client.Object) health) bool {
		if name == changed.GetName() {
			return false
		}
		if err := r.Get(ctx, types.NamespacedName{Namespace: ev.Namespace, Name: name}, obj); err != nil {
			return false
		}
		return h(obj) == healthProgressing
	}
	jobs, stls, _ := facts(&ev)
	for _, f := range jobs {
		var jc hooksv1alpha1.JobCompletion
		name := identity.JobCompletionName(ev.Spec.Provider, f.JobID)
		if progressing(name, &jc, childHealthOfJob) && jc.Spec.Completion.Version <= f.Version {
			// (A newer version's progress is not this event's: its operation is Superseded.)
			return false
		}
	}
	for _, f := range stls {
		var bs hooksv1alpha1.BillingSettlement
		if progressing(identity.SettlementNameFor(ev.Spec.Provider, f.SettlementKey), &bs, childHealthOfSettlement) {
			return false
		}
	}
	return true
}

// notOnlyStatus passes every change of an object but one to its status alone: the
// event controller writes its events' status itself and reads nothing else there, so
// its own write must not cost it another reconcile (measured: about one per event).
// Its writes carry the resourceVersion they were computed from, so one computed from
// a cache that had not seen the previous write yet conflicts and is redone, instead
// of being skipped or half-applied with nothing to wake the event again.
// Everything it acts on is in the spec (generation), metadata (the replay annotation,
// labels, finalizers, deletion) or its children, which are watched on their own.
func notOnlyStatus() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		if o == nil || n == nil {
			return true
		}
		return o.GetResourceVersion() == n.GetResourceVersion() || // a resync
			o.GetGeneration() != n.GetGeneration() ||
			!maps.Equal(o.GetAnnotations(), n.GetAnnotations()) ||
			!maps.Equal(o.GetLabels(), n.GetLabels()) ||
			!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
			!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp()) ||
			len(o.GetOwnerReferences()) != len(n.GetOwnerReferences())
	}}
}
