// Package archiveget is `kubectl settlement archive get`: every record of the
// operator's archive (settlements, job completions, event receipts) that one reference
// names, by settlement key, idempotency key, job ID, event ID or object name. It reads
// the archive read-only.
package archiveget

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/printers"
)

const getHelp = `Find every archived record a reference names.

Usage:
  kubectl settlement archive get <ref> [-n NS | -A] [-o yaml|json]

<ref> is matched exactly against
  settlements:      settlement key, idempotency key (stl_…), object name, job ID
  job completions:  job ID, object name (every archived version is shown)
  event receipts:   event ID, object name

Records still in flight are in the cluster (kubectl get bs,jc,whe), not in the archive.
Amounts are in the currency's minor unit, as everywhere in the operator (1250 USD is
12.50 USD).

  -o, --output FORMAT       yaml or json: the archived objects (one object, or a List
                            when several match); default a table per kind
` + cmdline.CommonHelp + `
Examples:
  kubectl settlement archive get stl_3f9a0c2b8d7e6f5a4b3c2d1e0f9a8b7c -n tenant-a
  kubectl settlement archive get job-1001 -n tenant-a -o yaml
  kubectl settlement archive get msg_job-1001_v1 -A
`

// Run is `kubectl settlement archive get` with its arguments (after "get"): it prints
// every archived record the reference names, as tables or -o json|yaml. red learns the
// archive's URL, so that no message shows it.
func Run(ctx context.Context, c cmdline.Env, red *archivedb.Redactor, args []string) error {
	const cmd = "archive get"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var common cmdline.Flags
	common.Register(fs)
	var output string
	fs.StringVar(&output, "o", "", "")
	fs.StringVar(&output, "output", "", "")
	pos, set, err := cmdline.Parse(cmd, fs, args, getHelp)
	if err != nil {
		return err
	}
	if err := common.Validate(cmd, set); err != nil {
		return err
	}
	switch len(pos) {
	case 0:
		return cmdline.Usagef(cmd, "give the reference to look for: a settlement key, idempotency key, job ID, event ID or object name")
	case 1:
	default:
		return cmdline.Usagef(cmd, "give one reference, got %d: %s", len(pos), strings.Join(pos, " "))
	}
	ref := pos[0]
	if ref == "" {
		return cmdline.Usagef(cmd, "the reference is empty")
	}
	if err := printers.CheckFormat(cmd, output); err != nil {
		return err
	}
	ns, err := kube.Namespace(&common, c.Getenv)
	if err != nil {
		return err
	}
	store, err := archivedb.Open(ctx, cmd, &common, c.Getenv, red)
	if err != nil {
		return err
	}
	defer store.Close()
	found, err := store.Find(ctx, ns, ref)
	if err != nil {
		return err
	}
	if found.Len() == 0 {
		where := fmt.Sprintf("in namespace %q", ns)
		if ns == "" {
			where = "in any namespace"
		}
		return fmt.Errorf("no archived settlement, job completion or event receipt matches %q %s (records still in flight are in the cluster, not the archive)", ref, where)
	}
	w := bufio.NewWriter(c.Stdout)
	if output != "" {
		var objs [][]byte
		for _, s := range found.Settlements {
			objs = append(objs, s.Raw)
		}
		for _, j := range found.Jobs {
			objs = append(objs, j.Raw)
		}
		for _, e := range found.Events {
			objs = append(objs, e.Raw)
		}
		if err := printers.PrintObjects(w, output, objs, len(objs) > 1); err != nil {
			return err
		}
		return w.Flush()
	}
	all := ns == ""
	sep := false
	if len(found.Settlements) > 0 {
		printers.PrintSettlements(w, found.Settlements, all)
		sep = true
	}
	if len(found.Jobs) > 0 {
		if sep {
			fmt.Fprintln(w)
		}
		printers.PrintJobs(w, found.Jobs, all)
		sep = true
	}
	if len(found.Events) > 0 {
		if sep {
			fmt.Fprintln(w)
		}
		printers.PrintEvents(w, found.Events, all)
	}
	return w.Flush()
}
