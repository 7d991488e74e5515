package webhookevent

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
	"github.com/settlement-operator/settlement-operator/internal/extract"
	"github.com/settlement-operator/settlement-operator/internal/senders"
)

// replayRequested says whether the event's replay annotation holds a value not acted
// on yet.
func replayRequested(ev *hooksv1alpha1.WebhookEvent) (string, bool) {
	token := ev.Annotations[hooksv1alpha1.AnnotationReplay]
	if token == "" {
		return "", false
	}
	return token, ev.Status.Replay == nil || ev.Status.Replay.LastToken != token
}

// replay acts on a new replay annotation (docs/design.md §5.1, "Replay"): it reads the
// event's unmapped job states through the WebhookProvider's spec.states as they are
// now and, when they all map to one meaning, records it in status.replay.mappedAs, so
// that this and every later dispatch includes the facts held for it (spec.heldFacts)
// and no longer shows the states as unmapped. The children are created by the usual
// dispatch, under the names and keys a delivery derives, so a replay twice, or a
// replay beside a redelivery of the same event, creates and charges each once.
// Otherwise the event stays as it is and status.replay.message says why. A replay
// once mapped, or of an event without unmapped states, is recorded and changes nothing.
func (r *Reconciler) replay(ctx context.Context, ev *hooksv1alpha1.WebhookEvent, token string) error {
	st := ev.Status.Replay
	if st == nil {
		st = &hooksv1alpha1.EventReplayStatus{}
	}
	as, message, err := r.replayMeaning(ctx, ev, st)
	if err != nil {
		return err // not recorded: the next reconcile acts on the token again
	}
	now := metav1.NewTime(r.now())
	st.LastToken, st.Count, st.LastAt = token, st.Count+1, &now
	st.Message = conditions.TruncateMessage(fmt.Sprintf("replay %q: %s", token, message))
	if as != "" {
		st.MappedAs = as
		r.Recorder.Eventf(ev, nil, corev1.EventTypeNormal, hooksv1alpha1.ReasonReplayed, "Replay", "%s", st.Message)
	} else {
		r.Recorder.Eventf(ev, nil, corev1.EventTypeWarning, hooksv1alpha1.ReasonReplayNotApplied, "Replay", "%s", st.Message)
	}
	ev.Status.Replay = st
	return nil
}

// replayMeaning decides what a replay does: the meaning the states map to now ("" for
// nothing) and a message saying so.
func (r *Reconciler) replayMeaning(ctx context.Context, ev *hooksv1alpha1.WebhookEvent,
	st *hooksv1alpha1.EventReplayStatus) (hooksv1alpha1.JobStateMeaning, string, error) {
	switch {
	case st.MappedAs != "":
		return "", fmt.Sprintf("the job states were already mapped as %s by an earlier replay; nothing more to do", st.MappedAs), nil
	case ev.Spec.Quarantine != nil:
		return "", "a quarantined delivery is never dispatched", nil
	case len(ev.Spec.UnmappedJobStates) == 0:
		return "", "the event has no unmapped job states; nothing to do", nil
	}
	var wp hooksv1alpha1.WebhookProvider
	if err := r.Get(ctx, types.NamespacedName{Namespace: ev.Namespace, Name: ev.Spec.Provider}, &wp); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Sprintf("WebhookProvider %s does not exist; its spec.states is needed to read the job states", ev.Spec.Provider), nil
		}
		return "", "", fmt.Errorf("get webhookprovider %s: %w", ev.Spec.Provider, err)
	}
	spec := senders.Apply(&wp.Spec)
	table := extract.StateTable(spec.States)
	meanings := map[hooksv1alpha1.JobStateMeaning][]string{}
	var unmapped []string
	for _, u := range ev.Spec.UnmappedJobStates {
		m, ok := table.Resolve(u.State)
		if !ok {
			unmapped = append(unmapped, fmt.Sprintf("%q", u.State))
			continue
		}
		meanings[m] = append(meanings[m], fmt.Sprintf("%q", u.State))
	}
	if len(unmapped) > 0 {
		return "", fmt.Sprintf("job state(s) %s is still not mapped by WebhookProvider %s's spec.states; the event is left as it is. "+
			"Add the state(s), then replay again", strings.Join(unique(unmapped), ", "), ev.Spec.Provider), nil
	}
	if len(meanings) > 1 {
		var parts []string
		for m, s := range meanings {
			parts = append(parts, fmt.Sprintf("%s as %s", strings.Join(unique(s), ", "), m))
		}
		sort.Strings(parts)
		return "", fmt.Sprintf("the event's job states now map to different meanings (%s): the facts kept at receipt assume one "+
			"meaning for all of them, so the event is left as it is; complete or charge these jobs from the sender's own record "+
			"(docs/runbook.md, UnmappedState)", strings.Join(parts, "; ")), nil
	}
	var as hooksv1alpha1.JobStateMeaning
	for m := range meanings {
		as = m
	}
	if as == hooksv1alpha1.JobStateIgnored {
		return as, "the job states now map to Ignored: nothing is created for those jobs", nil
	}
	for _, h := range ev.Spec.HeldFacts {
		if h.As == as {
			return as, fmt.Sprintf("the job states now map to %s: dispatching %d job completion(s) and %d settlement(s) held for it",
				as, len(h.JobCompletions), len(h.Settlements)), nil
		}
	}
	return "", fmt.Sprintf("the job states now map to %s, but the event holds no facts for that meaning (received before facts "+
		"were held, or its route could not be read for it); the event is left as it is: complete or charge the jobs from the "+
		"sender's own record (docs/runbook.md, UnmappedState)", as), nil
}

func unique(in []string) []string {
	seen := map[string]bool{}
	out := in[:0]
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// mappedByReplay is the meaning a replay found the event's unmapped states mapped to;
// "" while they are unmapped.
func mappedByReplay(ev *hooksv1alpha1.WebhookEvent) hooksv1alpha1.JobStateMeaning {
	if ev.Status.Replay == nil {
		return ""
	}
	return ev.Status.Replay.MappedAs
}

// facts are the job completions and settlements the event dispatches, and the
// unmapped job states it shows: those of its spec, and once a replay mapped the
// unmapped states, the facts held for their meaning instead of the states.
func facts(ev *hooksv1alpha1.WebhookEvent) ([]hooksv1alpha1.JobCompletionFacts, []hooksv1alpha1.SettlementFacts,
	[]hooksv1alpha1.UnmappedJobState) {
	as := mappedByReplay(ev)
	if as == "" {
		return ev.Spec.JobCompletions, ev.Spec.Settlements, ev.Spec.UnmappedJobStates
	}
	jobs, stls := ev.Spec.JobCompletions, ev.Spec.Settlements
	for _, h := range ev.Spec.HeldFacts {
		if h.As == as {
			jobs = append(jobs[:len(jobs):len(jobs)], h.JobCompletions...)
			stls = append(stls[:len(stls):len(stls)], h.Settlements...)
		}
	}
	return jobs, stls, nil
}
