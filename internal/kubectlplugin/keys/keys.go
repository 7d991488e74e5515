// Package keys is `kubectl settlement keys`: it prints the names and keys the operator
// derives from an event ID, a job ID or a settlement key, computed with
// internal/identity (the operator's own functions), so that nobody computes a hash by
// hand. It reads the cluster only for the namespace's webhook providers.
package keys

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/printers"
)

const keysHelp = `Print the names and keys the operator derives from an event ID, a job ID or a
settlement key, for a namespace and a webhook provider (docs/design.md §3), so nobody
computes a hash by hand. The reference is shown under each reading; nothing is looked up.

Usage:
  kubectl settlement keys <event-id|job-id|settlement-key> [-n NS] [--provider NAME] [-o json]

  -o, --output json         one JSON object per webhook provider, in a list
` + kube.Help + `
Without --provider the namespace's WebhookProviders are read from the cluster.

Examples:
  kubectl settlement keys job-7781 -n tenant-a --provider inference
  kubectl settlement keys 'refund/inference/job-7781' -n tenant-a --provider inference -o json
`

// derivedKeys is every name and key one reference can stand for. The JSON names are
// part of the command's output contract.
type derivedKeys struct {
	// Namespace is the namespace the names are derived for.
	Namespace string `json:"namespace"`
	// Provider is the webhook provider the names are derived for.
	Provider string `json:"provider"`
	// Reference is the reference as given, shown under each reading.
	Reference string `json:"reference"`
	// EventName is the WebhookEvent of the reference as an event ID.
	EventName string `json:"eventName"`
	// JobCompletionName is the JobCompletion of the reference as a job ID.
	JobCompletionName string `json:"jobCompletionName"`
	// JobSettlementKey is the settlement key of the job's charge (no keyFrom).
	JobSettlementKey string `json:"jobSettlementKey"`
	// JobSettlementName is the BillingSettlement of the job's charge.
	JobSettlementName string `json:"jobSettlementName"`
	// JobIdempotencyKey is the idempotency key of the job's charge.
	JobIdempotencyKey string `json:"jobIdempotencyKey"`
	// LegacyJobSettleKey is the job's settlement key from before keys were bound to
	// the namespace, which older settlements still carry.
	LegacyJobSettleKey string `json:"legacyJobSettlementKey"`
	// LegacyJobIdempotency is the idempotency key of LegacyJobSettleKey, likewise.
	LegacyJobIdempotency string `json:"legacyJobIdempotencyKey"`
	// SettlementName is the BillingSettlement of the reference as a settlement key.
	SettlementName string `json:"settlementName"`
	// IdempotencyKey is the idempotency key of the reference as a settlement key.
	IdempotencyKey string `json:"idempotencyKey"`
	// LegacyIdempotencyKey is that idempotency key from before keys were bound to the
	// namespace, which older settlements still carry.
	LegacyIdempotencyKey string `json:"legacyIdempotencyKey"`
	// Note says when a structured settlement key names another namespace or provider.
	Note string `json:"note,omitempty"`
}

// derive computes every reading of ref with internal/identity, the functions the
// operator itself uses.
func derive(ns, provider, ref string) derivedKeys {
	jobKey := identity.JobSettlementKey(ns, provider, ref)
	legacyJobKey := identity.DefaultSettlementKey(provider, ref)
	d := derivedKeys{
		Namespace: ns, Provider: provider, Reference: ref,
		EventName:         identity.EventName(ns, provider, ref),
		JobCompletionName: identity.JobCompletionName(provider, ref),
		JobSettlementKey:  jobKey, JobSettlementName: identity.SettlementNameFor(provider, jobKey),
		JobIdempotencyKey:  identity.NamespacedIdempotencyKey(ns, jobKey),
		LegacyJobSettleKey: legacyJobKey, LegacyJobIdempotency: identity.IdempotencyKey(legacyJobKey),
		SettlementName: identity.SettlementNameFor(provider, ref), IdempotencyKey: identity.NamespacedIdempotencyKey(ns, ref),
		LegacyIdempotencyKey: identity.IdempotencyKey(ref),
	}
	if k, ok := identity.ParseSettlementKey(ref); ok {
		switch {
		case k.Namespace != ns:
			d.Note = fmt.Sprintf("this settlement key belongs to namespace %q: a settlement in %q with it is refused (InvalidIdentity)", k.Namespace, ns)
		case k.Provider != provider:
			d.Note = fmt.Sprintf("this settlement key is webhook provider %q's: its settlement is named from it, whatever --provider says", k.Provider)
		}
	}
	return d
}

// Run is `kubectl settlement keys` with its arguments (after "keys"): it prints every
// reading of one reference, for each webhook provider, as text or -o json.
func Run(ctx context.Context, c cmdline.Env, args []string) error {
	const cmd = "keys"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var cf kube.Flags
	cf.Register(fs, false)
	var output string
	fs.StringVar(&output, "o", "", "")
	fs.StringVar(&output, "output", "", "")
	pos, set, err := cmdline.Parse(cmd, fs, args, keysHelp)
	if err != nil {
		return err
	}
	if err := cf.Validate(cmd, set); err != nil {
		return err
	}
	ref, err := cmdline.OneReference(cmd, pos, "an event ID, job ID or settlement key")
	if err != nil {
		return err
	}
	if output != "" && output != "json" {
		return cmdline.Usagef(cmd, "--output %q: want json (or nothing, for text)", output)
	}
	ns, err := kube.Namespace(&cf.Common, c.Getenv)
	if err != nil {
		return err
	}
	providers := []string{cf.Provider}
	if cf.Provider == "" {
		cl, err := kube.Client(&cf.Common, c.Getenv)
		if err != nil {
			return err
		}
		if providers, err = kube.WebhookProviders(ctx, cl, ns, ""); err != nil {
			return err
		}
		if len(providers) == 0 {
			return fmt.Errorf("namespace %q has no WebhookProvider: give --provider", ns)
		}
	}
	all := make([]derivedKeys, len(providers))
	for i, p := range providers {
		all[i] = derive(ns, p, ref)
	}
	w := bufio.NewWriter(c.Stdout)
	if output == "json" {
		b, err := json.MarshalIndent(all, "", "    ")
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n", b)
		return w.Flush()
	}
	for i, d := range all {
		if i > 0 {
			fmt.Fprintln(w)
		}
		printKeys(w, d)
	}
	return w.Flush()
}

func printKeys(w *bufio.Writer, d derivedKeys) {
	fmt.Fprintf(w, "Namespace %q, webhook provider %q, reference %q\n", d.Namespace, d.Provider, d.Reference)
	tw := printers.Table(w)
	fmt.Fprintln(tw, "As an event ID:")
	fmt.Fprintf(tw, "  WebhookEvent\t%s\n", d.EventName)
	fmt.Fprintln(tw, "As a job ID:")
	fmt.Fprintf(tw, "  JobCompletion\t%s\n", d.JobCompletionName)
	fmt.Fprintf(tw, "  settlement key\t%s\n", d.JobSettlementKey)
	fmt.Fprintf(tw, "  BillingSettlement\t%s\n", d.JobSettlementName)
	fmt.Fprintf(tw, "  idempotency key\t%s\n", d.JobIdempotencyKey)
	fmt.Fprintf(tw, "  before keys were namespaced\tsettlement key %s, idempotency key %s (same BillingSettlement name)\n", d.LegacyJobSettleKey, d.LegacyJobIdempotency)
	fmt.Fprintln(tw, "As a settlement key:")
	fmt.Fprintf(tw, "  BillingSettlement\t%s\n", d.SettlementName)
	fmt.Fprintf(tw, "  idempotency key\t%s\n", d.IdempotencyKey)
	fmt.Fprintf(tw, "  before keys were namespaced\tidempotency key %s\n", d.LegacyIdempotencyKey)
	_ = tw.Flush()
	if d.Note != "" {
		fmt.Fprintln(w, "Note: "+d.Note)
	}
}
