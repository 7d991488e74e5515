// Package archivelist is `kubectl settlement archive list`: the archived settlements a
// customer, a state and a time window select, as a table or -o json|yaml, bounded by
// --limit. It reads the archive read-only.
package archivelist

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivefilter"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/printers"
)

const listHelp = `List archived settlements, oldest first.

Usage:
  kubectl settlement archive list [-n NS | -A] [--customer ID] [--state STATE]
      [--since T] [--until T] [--by created|settled|archived] [--limit N] [-o yaml|json]

  --limit N                 at most N settlements (default 100; 0 for no limit). When more
                            match, a note on stderr says so
  -o, --output FORMAT       yaml or json: a List of the archived objects
` + archivefilter.Help + cmdline.CommonHelp + `
Examples:
  kubectl settlement archive list -n tenant-a --customer cus_1 --since 2026-11-01 --until 2026-12-01
  kubectl settlement archive list -A --state Failed --since 7d
`

// Run is `kubectl settlement archive list` with its arguments (after "list"): it
// prints the archived settlements the filters select, oldest first, up to --limit, and
// says on stderr when more match. red learns the archive's URL, so that no message
// shows it.
func Run(ctx context.Context, c cmdline.Env, red *archivedb.Redactor, args []string) error {
	const cmd = "archive list"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var common cmdline.Flags
	common.Register(fs)
	var filters archivefilter.Flags
	filters.Register(fs)
	var output string
	var limit int
	fs.StringVar(&output, "o", "", "")
	fs.StringVar(&output, "output", "", "")
	fs.IntVar(&limit, "limit", 100, "")
	pos, set, err := cmdline.Parse(cmd, fs, args, listHelp)
	if err != nil {
		return err
	}
	if err := common.Validate(cmd, set); err != nil {
		return err
	}
	if len(pos) > 0 {
		return cmdline.Usagef(cmd, "unexpected argument %q (list takes only flags; to find one record use 'archive get')", pos[0])
	}
	if err := printers.CheckFormat(cmd, output); err != nil {
		return err
	}
	if limit < 0 {
		return cmdline.Usagef(cmd, "--limit must be 0 (no limit) or more, got %d", limit)
	}
	f, err := filters.Filter(cmd, set, time.Now())
	if err != nil {
		return err
	}
	if f.Namespace, err = kube.Namespace(&common, c.Getenv); err != nil {
		return err
	}
	if limit > 0 {
		f.Limit = limit + 1 // one more, to know whether there are more
	}
	store, err := archivedb.Open(ctx, cmd, &common, c.Getenv, red)
	if err != nil {
		return err
	}
	defer store.Close()
	got, err := store.ListSettlements(ctx, f)
	if err != nil {
		return err
	}
	more := limit > 0 && len(got) > limit
	if more {
		got = got[:limit]
	}
	w := bufio.NewWriter(c.Stdout)
	switch {
	case output != "":
		objs := make([][]byte, len(got))
		for i, s := range got {
			objs[i] = s.Raw
		}
		if err := printers.PrintObjects(w, output, objs, true); err != nil {
			return err
		}
	case len(got) == 0:
		if f.Namespace == "" {
			fmt.Fprintln(c.Stderr, "No archived settlements found.")
		} else {
			fmt.Fprintf(c.Stderr, "No archived settlements found in %s namespace.\n", f.Namespace)
		}
	default:
		printers.PrintSettlements(w, got, f.Namespace == "")
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(c.Stderr, "More archived settlements match: showing the first %d. Narrow the window (--since, --until), raise --limit, or use 'archive export'.\n", limit)
	}
	return nil
}
