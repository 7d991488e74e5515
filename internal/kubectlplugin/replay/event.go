package replay

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
)

const eventHelp = `Replay a WebhookEvent whose job states were unmapped (Ready reason UnmappedState),
once the WebhookProvider's spec.states lists them: set its hooks.settlement.dev/replay
annotation to a new unique value, as the runbook's kubectl annotate does. The
controller reads the states through spec.states as it is now and, when they map,
creates what the delivery would have created, under the same names and keys: a
replay never charges twice. Only metadata is patched: the settlement-replayer
ClusterRole (get/list/patch webhookevents) suffices.

An event without unmapped states, already mapped by a replay, quarantined or being
deleted is not annotated: the controller would change nothing.

Usage:
  kubectl settlement replay event <event-name|event-id> [-n NS] [--provider NAME]
` + kube.Help + `
Examples:
  kubectl settlement replay event inference-861493210e7f968ce87fd8dec48dac32 -n tenant-a
  kubectl settlement replay event msg_2hF9 -n tenant-a --provider inference
`

// eventReplayable says why the controller would change nothing on a replay of ev, or
// "" when it would read its states again (controllers/webhookevent/replay.go).
func eventReplayable(ev *hooksv1alpha1.WebhookEvent) string {
	switch {
	case !ev.DeletionTimestamp.IsZero():
		return "it is being deleted"
	case ev.Spec.Quarantine != nil:
		return "it is a quarantined delivery, never dispatched"
	case len(ev.Spec.UnmappedJobStates) == 0:
		return "it has no unmapped job states: a replay of an event only maps those (a failed settlement is replayed by its own name)"
	case ev.Status.Replay != nil && ev.Status.Replay.MappedAs != "":
		return fmt.Sprintf("a replay already mapped its job states as %s; it changes nothing more", ev.Status.Replay.MappedAs)
	}
	return ""
}

// runEvent is `kubectl settlement replay event`.
func runEvent(ctx context.Context, c cmdline.Env, args []string) error {
	const cmd = "replay event"
	cf, ref, ns, cl, err := kube.Start(c.Getenv, cmd, args, false, eventHelp,
		"the event to replay: its object name, or its event ID with --provider")
	if err != nil {
		return err
	}
	names := []string{ref}
	if cf.Provider != "" {
		names = append(names, identity.EventName(ns, cf.Provider, ref))
	}
	var ev *hooksv1alpha1.WebhookEvent
	for _, name := range names {
		var got hooksv1alpha1.WebhookEvent
		ok, err := kube.GetIfExists(ctx, cl, ns, name, &got)
		if err != nil {
			return err
		}
		if ok {
			ev = &got
			break
		}
	}
	if ev == nil {
		return fmt.Errorf("no WebhookEvent in namespace %q named %s", ns, strings.Join(names, " or "))
	}
	if why := eventReplayable(ev); why != "" {
		return fmt.Errorf("not replaying webhookevent %s/%s: %s", ns, ev.Name, why)
	}
	token, err := replayToken(time.Now())
	if err != nil {
		return err
	}
	before := ev.DeepCopy()
	if ev.Annotations == nil {
		ev.Annotations = map[string]string{}
	}
	ev.Annotations[hooksv1alpha1.AnnotationReplay] = token
	if err := cl.Patch(ctx, ev, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		switch {
		case apierrors.IsConflict(err):
			return fmt.Errorf("webhookevent %s/%s changed while it was being replayed; nothing was done: look at it again (kubectl describe whe %s -n %s)", ns, ev.Name, ev.Name, ns)
		case apierrors.IsForbidden(err):
			return fmt.Errorf("not allowed to patch webhookevent %s/%s: a replay needs the settlement-replayer ClusterRole (kubectl auth can-i patch webhookevents -n %s)", ns, ev.Name, ns)
		}
		return fmt.Errorf("annotate webhookevent %s/%s: %w", ns, ev.Name, err)
	}
	var states []string
	for _, u := range ev.Spec.UnmappedJobStates {
		states = append(states, fmt.Sprintf("%q", u.State))
	}
	fmt.Fprintf(c.Stdout, "webhookevent %s/%s annotated %s=%s\n", ns, ev.Name, hooksv1alpha1.AnnotationReplay, token)
	fmt.Fprintf(c.Stdout, "Next: the controller reads job state(s) %s through WebhookProvider %s's spec.states as it is now. "+
		"If they map to one meaning it creates what the delivery would have (same names and keys, so nothing twice) and records it in status.replay.mappedAs; "+
		"otherwise it changes nothing and status.replay.message says why.\n", strings.Join(states, ", "), ev.Spec.Provider)
	fmt.Fprintf(c.Stdout, "Follow it: kubectl describe whe %s -n %s\n", ev.Name, ns)
	return nil
}
