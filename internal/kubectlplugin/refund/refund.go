// Package refund is `kubectl settlement refund`: it creates the compensating
// BillingSettlement (type Refund) of a settled charge, named and keyed as the operator
// derives them, so that a retried command finds the refund it made instead of
// refunding twice. The operator checks the refund against the charge before it sends
// it; this command refuses early what it can see.
package refund

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
	"github.com/settlement-operator/settlement-operator/internal/money"
)

const refundHelp = `Refund a settled charge: create the compensating BillingSettlement (type Refund,
reversing the charge) with its derived name and keys, as docs/runbook.md
"Compensate" describes. The charge itself is never edited. The operator sends the
refund only after checking it against the charge: same customer, currency and
BillingProvider, the charge Settled, and all its refunds together (archived ones
too) no more than it charged; otherwise the refund waits with reason
CompensationNotAllowed. The command refuses early what it can see: an unsettled
charge, and more than is left after the charge's refunds in the cluster.

Each refund of a charge has a refund ID (default 1), part of its settlement key: the
same command run again creates nothing (the refund exists) and says so, so a retried
command never refunds twice. A second, separate refund of the same charge needs
another --refund-id. Creating needs create on billingsettlements in the namespace and,
where the record-protection policy is installed, being one of the compensators the
install lists on the manager's ServiceAccount (docs/runbook.md "Compensate").

Usage:
  kubectl settlement refund <charge: settlement-name|settlement-key|idempotency-key> (--amount DECIMAL | --full) [--refund-id ID] [-n NS]

  --amount DECIMAL          the amount to refund in the charge's currency's major unit
                            (12.50 for 12.50 USD), at most what is left to refund
  --full                    refund what is left: what the charge charged, less its
                            refunds in the cluster
  --refund-id ID            tells this refund apart from other refunds of the same
                            charge (default 1; lowercase letters, digits, '-', '.')
  --dry-run                 print the refund that would be created; create nothing
` + kube.Help + `
Examples:
  kubectl settlement refund inference-stl-6f1c0d9e8b7a6f5e4d3c2b1a0f9e8d7c --amount 12.50 -n tenant-a
  kubectl settlement refund '["job","tenant-a","inference","job-7781"]' --full -n tenant-a
`

// refundFlags are refund's own flags.
type refundFlags struct {
	amount   string
	full     bool
	refundID string
	dryRun   bool
}

func (f *refundFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.amount, "amount", "", "")
	fs.BoolVar(&f.full, "full", false, "")
	fs.StringVar(&f.refundID, "refund-id", "1", "")
	fs.BoolVar(&f.dryRun, "dry-run", false, "")
}

// chargedAmount is what a charge charged: its own amount, or for a usage-priced
// charge the amount its provider reported (status.chargedAmount).
func chargedAmount(bs *hooksv1alpha1.BillingSettlement) *hooksv1alpha1.Amount {
	if bs.Spec.Amount != nil {
		return bs.Spec.Amount
	}
	return bs.Status.ChargedAmount
}

// refundedSoFar adds up the charge's refunds in the cluster, as the operator does
// before it sends one (a refund Failed with exposure None refunded nothing), leaving
// out the refund named skip (this command's own, if it exists already). The operator
// also counts archived refunds, and holds a refund that would go over. voidedBy names
// a Void of the charge that may have cancelled it whole ("" when none): the operator
// holds any refund beside it.
func refundedSoFar(ctx context.Context, cl client.Client, charge *hooksv1alpha1.BillingSettlement, skip string) (total int64, names []string, voidedBy string, _ error) {
	var l hooksv1alpha1.BillingSettlementList
	if err := cl.List(ctx, &l, client.InNamespace(charge.Namespace)); err != nil {
		if apierrors.IsForbidden(err) {
			return 0, nil, "", fmt.Errorf("not allowed to list billingsettlements in %s (the earlier refunds of the charge): %w", charge.Namespace, err)
		}
		return 0, nil, "", fmt.Errorf("list the refunds of %s: %w", charge.Name, err)
	}
	for i := range l.Items {
		o := &l.Items[i]
		if o.Name == skip || o.Spec.Reverses != charge.Name {
			continue
		}
		if o.Status.State == hooksv1alpha1.SettlementFailed && o.Status.Exposure == hooksv1alpha1.ExposureNone {
			continue
		}
		held := (o.Status.State == "" || o.Status.State == hooksv1alpha1.SettlementPending) && o.Status.FirstSubmittedAt == nil &&
			o.Status.Attempts == 0 && o.Status.SentTo == nil && o.Status.Disagreement == nil && o.Status.ProviderRef == ""
		if o.Spec.Type == hooksv1alpha1.SettlementVoid && !held {
			voidedBy = o.Name // a Void held by its guard, never sent, blocks nothing (as in the operator)
		}
		if o.Spec.Type != hooksv1alpha1.SettlementRefund || o.Spec.Amount == nil {
			continue
		}
		total += o.Spec.Amount.Minor
		names = append(names, o.Name)
	}
	return total, names, voidedBy, nil
}

// refundOf builds the refund of charge for amount under refund ID id, named and keyed
// as the operator derives them (identity.FieldsSettlementKey: namespace-bound).
func refundOf(charge *hooksv1alpha1.BillingSettlement, provider, id string, amount hooksv1alpha1.Amount) *hooksv1alpha1.BillingSettlement {
	key := identity.FieldsSettlementKey(charge.Namespace, provider, "refund", charge.Name, id)
	return &hooksv1alpha1.BillingSettlement{
		TypeMeta:   metav1.TypeMeta{APIVersion: hooksv1alpha1.GroupVersion.String(), Kind: "BillingSettlement"},
		ObjectMeta: metav1.ObjectMeta{Namespace: charge.Namespace, Name: identity.SettlementNameFor(provider, key)},
		Spec: hooksv1alpha1.BillingSettlementSpec{
			BillingProviderRef: charge.Spec.BillingProviderRef, SettlementKey: key,
			IdempotencyKey: identity.NamespacedIdempotencyKey(charge.Namespace, key),
			Type:           hooksv1alpha1.SettlementRefund, Reverses: charge.Name, Customer: charge.Spec.Customer,
			JobID: charge.Spec.JobID, WebhookProvider: provider, Amount: &amount,
		},
	}
}

// validRefundID admits one spelling per ID, so a retyped ID finds the refund it
// made: lowercase letters, digits, '-' and '.', ≤ 63, and a number without leading
// zeros ("01" would be another key than "1").
func validRefundID(id string) bool {
	if id == "" || len(id) > 63 {
		return false
	}
	numeric := true
	for _, r := range id {
		switch {
		case r >= '0' && r <= '9':
		case r >= 'a' && r <= 'z' || r == '-' || r == '.':
			numeric = false
		default:
			return false
		}
	}
	return !(numeric && len(id) > 1 && id[0] == '0')
}

// Run is `kubectl settlement refund` with its arguments (after "refund"): it finds the
// charge, checks what is left to refund, and creates the refund (or, with --dry-run,
// says what it would create).
func Run(ctx context.Context, c cmdline.Env, args []string) error {
	const cmd = "refund"
	var rf refundFlags
	cf, ref, ns, cl, err := kube.Start(c.Getenv, cmd, args, false, refundHelp,
		"the charge to refund: its name, settlement key or idempotency key", rf.register)
	if err != nil {
		return err
	}
	switch {
	case rf.amount == "" && !rf.full:
		return cmdline.Usagef(cmd, "give --amount DECIMAL or --full")
	case rf.amount != "" && rf.full:
		return cmdline.Usagef(cmd, "give --amount or --full, not both")
	case !validRefundID(rf.refundID):
		return cmdline.Usagef(cmd, "--refund-id %q: want 1 to 63 lowercase letters, digits, '-' or '.' (a number without leading zeros)", rf.refundID)
	}
	charge, tried, err := kube.ResolveSettlement(ctx, cl, ns, cf.Provider, ref)
	if err != nil {
		return err
	}
	if charge == nil {
		return fmt.Errorf("no BillingSettlement in namespace %q matches %q; tried: %s", ns, ref, strings.Join(tried, "; "))
	}
	what := "billingsettlement " + ns + "/" + charge.Name
	switch {
	case charge.Spec.Type != hooksv1alpha1.SettlementCharge:
		return fmt.Errorf("not refunding %s: it is a %s, not a Charge; refund the charge it reverses (%s)", what, charge.Spec.Type, charge.Spec.Reverses)
	case charge.Status.State != hooksv1alpha1.SettlementSettled:
		return fmt.Errorf("not refunding %s: it is %s, not Settled; a Refund is sent only for a settled charge "+
			"(a charge sent and not settled is voided: create a Void, docs/runbook.md \"Compensate\")", what, orNew(charge.Status.State))
	}
	// The provider comes from the charge alone: a flag would let the same refund be
	// keyed twice.
	provider := charge.Spec.WebhookProvider
	if provider == "" {
		return fmt.Errorf("not refunding %s: it names no webhook provider (made by hand?), which a refund's name and key "+
			"derive from; create the Refund by hand (docs/runbook.md \"Compensate\")", what)
	}
	charged := chargedAmount(charge)
	if charged == nil || charged.Minor <= 0 {
		return fmt.Errorf("not refunding %s: it has no amount, and its provider reported none (usage-priced): "+
			"the operator could not check a refund against it; ask the provider what it charged, then create the Refund by hand (docs/runbook.md \"Compensate\")", what)
	}
	name := refundOf(charge, provider, rf.refundID, *charged).Name
	refunded, others, voidedBy, err := refundedSoFar(ctx, cl, charge, name)
	if err != nil {
		return err
	}
	if voidedBy != "" {
		return fmt.Errorf("not refunding %s: %s voids it, and may have cancelled the whole charge; the operator holds any refund beside it", what, voidedBy)
	}
	left := charged.Minor - refunded
	minor := left
	if !rf.full {
		if minor, err = money.ParseAmount(rf.amount, charged.Currency); err != nil {
			return cmdline.Usagef(cmd, "--amount: %v", err)
		}
	}
	switch {
	case left <= 0:
		return fmt.Errorf("not refunding %s: its refunds in the cluster (%s) already add up to what it charged (%s)", what,
			strings.Join(others, ", "), money.FormatAmount(charged.Minor, charged.Currency))
	case minor > left:
		already := ""
		if refunded > 0 {
			already = fmt.Sprintf(", of which %s is refunded already (%s)", money.FormatAmount(refunded, charged.Currency), strings.Join(others, ", "))
		}
		return fmt.Errorf("not refunding %s: %s is more than is left to refund: it charged %s%s", what,
			money.FormatAmount(minor, charged.Currency), money.FormatAmount(charged.Minor, charged.Currency), already)
	}
	refund := refundOf(charge, provider, rf.refundID, hooksv1alpha1.Amount{Minor: minor, Currency: charged.Currency})
	summary := fmt.Sprintf("refund %s/%s of %s for %s (customer %s, key %s)", ns, refund.Name, charge.Name,
		money.FormatAmount(minor, charged.Currency), charge.Spec.Customer, refund.Spec.IdempotencyKey)
	if rf.dryRun {
		fmt.Fprintf(c.Stdout, "would create %s\n", summary)
		return nil
	}
	if err := cl.Create(ctx, refund); err != nil {
		switch {
		case apierrors.IsAlreadyExists(err):
			var existing hooksv1alpha1.BillingSettlement
			if gerr := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: refund.Name}, &existing); gerr != nil {
				return fmt.Errorf("%s exists, and reading it failed: %w", refund.Name, gerr)
			}
			if !equality.Semantic.DeepEqual(existing.Spec, refund.Spec) {
				got := "no amount"
				if a := existing.Spec.Amount; a != nil {
					got = money.FormatAmount(a.Minor, a.Currency)
				}
				return fmt.Errorf("refund ID %q of %s already exists as %s with %s; nothing was created. Look at it first "+
					"(kubectl settlement trace %s -n %s): if it is the refund you meant, there is nothing to do. Only for a separate, "+
					"additional refund of the same charge give another --refund-id", rf.refundID, what, existing.Name, got, existing.Name, ns)
			}
			fmt.Fprintf(c.Stdout, "%s already exists (%s); nothing was created\n", summary, orNew(existing.Status.State))
			fmt.Fprintf(c.Stdout, "Follow it: kubectl settlement trace %s -n %s\n", refund.Name, ns)
			return nil
		case apierrors.IsForbidden(err):
			// RBAC (create on billingsettlements) or the record-protection policy (a
			// compensator the install lists); the error says which.
			return fmt.Errorf("not allowed to create the refund in %s: it takes create on billingsettlements "+
				"(kubectl auth can-i create billingsettlements -n %s) and, with the record-protection policy installed, "+
				"being one of the compensators the install lists (docs/runbook.md, \"Compensate\"): %w", ns, ns, err)
		}
		return fmt.Errorf("create %s: %w", summary, err)
	}
	fmt.Fprintf(c.Stdout, "created %s\n", summary)
	fmt.Fprintln(c.Stdout, "The operator checks it against the charge before it sends it; if it may not be sent, it waits with reason CompensationNotAllowed and says why.")
	fmt.Fprintf(c.Stdout, "Follow it: kubectl settlement trace %s -n %s   (or kubectl get bs %s -n %s -w)\n", refund.Name, ns, refund.Name, ns)
	return nil
}

func orNew(st hooksv1alpha1.SettlementState) string {
	if st == "" {
		return "new (no state yet)"
	}
	return string(st)
}
