// Package replay is `kubectl settlement replay`: it replays a dead-lettered (Failed)
// or RequiresReconciliation settlement, or (`replay event`) a WebhookEvent whose job
// states were unmapped, by setting its replay annotation, and nothing else, after
// checking that the controller would act on the replay. The controller
// does the rest, with the same idempotency key, so a replay never charges twice.
package replay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
)

const replayHelp = `Replay a dead-lettered (Failed) or RequiresReconciliation settlement: set its
hooks.settlement.dev/replay annotation to a new unique value, as the runbook's
kubectl annotate does. The controller resumes it with the same idempotency key and a
fresh retry budget; if money may have moved it asks the provider by key first, so a
replay never charges twice. Only metadata is patched: the settlement-replayer
ClusterRole (get/list/patch billingsettlements) suffices.

A settlement in another state, being deleted, or refused for its identity or as an
archived duplicate is not annotated: the controller would ignore the replay.

Usage:
  kubectl settlement replay <settlement-name|settlement-key|idempotency-key> [-n NS] [--provider NAME]
  kubectl settlement replay event <event-name|event-id> [-n NS] [--provider NAME]
    (an event whose job states were unmapped: see 'kubectl settlement replay event --help')
` + kube.Help + `
Examples:
  kubectl settlement replay inference-stl-6f1c0d9e8b7a6f5e4d3c2b1a0f9e8d7c -n tenant-a
  kubectl settlement replay '["job","tenant-a","inference","job-7781"]' -n tenant-a
`

// replayable says why the controller would ignore a replay of bs, or "" when it would
// act on it. It mirrors controllers/billingsettlement/phases.go: handleReplay resumes
// only Failed and RequiresReconciliation; checkIdentity and checkArchive stop a refused
// settlement before handleReplay runs; a settlement being deleted runs no handleReplay.
func replayable(bs *hooksv1alpha1.BillingSettlement) string {
	st := bs.Status.State
	ready := meta.FindStatusCondition(bs.Status.Conditions, hooksv1alpha1.ConditionReady)
	switch {
	case !bs.DeletionTimestamp.IsZero():
		return "it is being deleted: the controller only resolves it by lookups now and ignores a replay"
	case st != hooksv1alpha1.SettlementFailed && st != hooksv1alpha1.SettlementRequiresReconciliation:
		s := string(st)
		if s == "" {
			s = "new (no state yet)"
		}
		return "it is " + s + ", not Failed or RequiresReconciliation: the controller would record the replay and ignore it" + stateHint(st)
	case ready != nil && ready.Reason == hooksv1alpha1.ReasonInvalidIdentity:
		return "it was refused for its identity (InvalidIdentity) and nothing was sent: a replay cannot fix an immutable spec; " +
			"create a settlement with the derived name and keys instead (kubectl settlement keys)"
	case ready != nil && ready.Reason == hooksv1alpha1.ReasonArchivedDuplicate:
		return "the archive already holds its key (ArchivedDuplicate): it is never sent; find the original with kubectl settlement archive get " +
			bs.Spec.IdempotencyKey
	}
	return ""
}

func stateHint(st hooksv1alpha1.SettlementState) string {
	switch st {
	case hooksv1alpha1.SettlementPending, hooksv1alpha1.SettlementSubmitted:
		return " (it is still being worked on: its Ready condition says what it waits for)"
	case hooksv1alpha1.SettlementSettled:
		return " (it is settled: a correction is a Refund)"
	}
	return ""
}

// Run is `kubectl settlement replay` with its arguments (after "replay"): it finds the
// settlement, refuses one the controller would not replay, and patches the annotation
// guarded by the resourceVersion it checked.
func Run(ctx context.Context, c cmdline.Env, args []string) error {
	if len(args) > 0 && args[0] == "event" {
		return runEvent(ctx, c, args[1:])
	}
	const cmd = "replay"
	cf, ref, ns, cl, err := kube.Start(c.Getenv, cmd, args, false, replayHelp,
		"the settlement to replay: its name, settlement key or idempotency key")
	if err != nil {
		return err
	}
	bs, tried, err := kube.ResolveSettlement(ctx, cl, ns, cf.Provider, ref)
	if err != nil {
		return err
	}
	if bs == nil {
		return fmt.Errorf("no BillingSettlement in namespace %q matches %q; tried: %s", ns, ref, strings.Join(tried, "; "))
	}
	if why := replayable(bs); why != "" {
		return fmt.Errorf("not replaying billingsettlement %s/%s: %s", ns, bs.Name, why)
	}
	token, err := replayToken(time.Now())
	if err != nil {
		return err
	}
	// A merge patch of the annotation only, guarded by the resourceVersion that was
	// checked: if the settlement changed since (settled, replayed by someone else),
	// the patch fails instead of replaying a state nobody looked at.
	before := bs.DeepCopy()
	if bs.Annotations == nil {
		bs.Annotations = map[string]string{}
	}
	bs.Annotations[hooksv1alpha1.AnnotationReplay] = token
	patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	if err := cl.Patch(ctx, bs, patch); err != nil {
		switch {
		case apierrors.IsConflict(err):
			return fmt.Errorf("billingsettlement %s/%s changed while it was being replayed; nothing was done: look at it again (kubectl settlement trace %s -n %s)", ns, bs.Name, bs.Name, ns)
		case apierrors.IsForbidden(err):
			return fmt.Errorf("not allowed to patch billingsettlement %s/%s: a replay needs the settlement-replayer ClusterRole (kubectl auth can-i patch billingsettlements -n %s)", ns, bs.Name, ns)
		}
		return fmt.Errorf("annotate billingsettlement %s/%s: %w", ns, bs.Name, err)
	}
	fmt.Fprintf(c.Stdout, "billingsettlement %s/%s annotated %s=%s\n", ns, bs.Name, hooksv1alpha1.AnnotationReplay, token)
	fmt.Fprintln(c.Stdout, whatHappensNext(before))
	fmt.Fprintf(c.Stdout, "Follow it: kubectl settlement trace %s -n %s   (or kubectl get bs %s -n %s -w)\n", bs.Name, ns, bs.Name, ns)
	return nil
}

// whatHappensNext explains what the controller does with the replay, from the state
// and exposure the settlement had (docs/design.md §5.3 Replay, §11).
func whatHappensNext(bs *hooksv1alpha1.BillingSettlement) string {
	st := &bs.Status
	var b strings.Builder
	fmt.Fprintf(&b, "Next: the controller records the replay in status.replay and resumes it from %s with the same idempotency key %s and a fresh retry budget. ",
		st.State, bs.Spec.IdempotencyKey)
	switch st.Exposure {
	case hooksv1alpha1.ExposureNone:
		b.WriteString("Exposure is None (nothing can have moved): it is sent to the provider again.")
	case "":
		b.WriteString("Its exposure is not recorded: it asks the provider by key before anything is sent.")
	default:
		fmt.Fprintf(&b, "Exposure is %s (money may have moved): it asks the provider by key first and sends nothing until the provider answered; a charge already there is adopted, never repeated.", st.Exposure)
	}
	if d := st.Disagreement; d != nil {
		fmt.Fprintf(&b, " The provider's record under this key disagrees (%s, field %q): it is not adopted, and the disagreement stays until the provider answers \"not found\".", d.Reason, d.Field)
	}
	if c := meta.FindStatusCondition(st.Conditions, hooksv1alpha1.ConditionDeadLettered); st.State == hooksv1alpha1.SettlementFailed && (c == nil || c.Status != "True") {
		b.WriteString(" Note: it was not dead-lettered; the provider itself failed it (" + readyReason(bs) + "), and will likely answer the same again.")
	}
	return b.String()
}

func readyReason(bs *hooksv1alpha1.BillingSettlement) string {
	if c := meta.FindStatusCondition(bs.Status.Conditions, hooksv1alpha1.ConditionReady); c != nil {
		return c.Reason
	}
	return "no Ready condition"
}

// replayToken is a new value for the replay annotation: the time and 48 random bits,
// so two people replaying in the same second still set different values.
func replayToken(now time.Time) (string, error) {
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", fmt.Errorf("make a replay token: %w", err)
	}
	return "kubectl-settlement-" + now.UTC().Format("20060102t150405z") + "-" + hex.EncodeToString(r[:]), nil
}
