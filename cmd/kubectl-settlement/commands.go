package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/printers"
)

type command struct {
	stdout, stderr io.Writer
	env            func(string) string
	red            *archivedb.Redactor
}

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

func (c *command) get(ctx context.Context, args []string) error {
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
	ns, err := kube.Namespace(&common, c.env)
	if err != nil {
		return err
	}
	store, err := archivedb.Open(ctx, cmd, &common, c.env, c.red)
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
	w := bufio.NewWriter(c.stdout)
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

// filterFlags are the settlement filters of list and export.
type filterFlags struct {
	customer, state, since, until, by string
}

const filterHelp = `
Filters:
  --customer ID             the customer's ID (exact)
  --state STATE             Pending, Submitted, Settled, Failed or RequiresReconciliation
  --since T, --until T      the time window, half-open (since <= t < until). T is an RFC 3339
                            time (2026-11-01T00:00:00Z), a date (2026-11-01, midnight UTC) or
                            a duration meaning that long ago (24h, 90m, 7d)
  --by FIELD                the time the window bounds, and rows are ordered by:
                              created  when the settlement was created, i.e. when the charge
                                       (refund, void) was decided (default)
                              settled  when the provider settled it (unsettled ones drop out
                                       of a window)
                              archived when it was archived: for incremental copies
                                       (overlap runs by a few minutes and drop rows
                                       already copied: see docs/archive.md)
`

func (f *filterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.customer, "customer", "", "")
	fs.StringVar(&f.state, "state", "", "")
	fs.StringVar(&f.since, "since", "", "")
	fs.StringVar(&f.until, "until", "", "")
	fs.StringVar(&f.by, "by", string(archive.ByCreated), "")
}

var states = []hooksv1alpha1.SettlementState{hooksv1alpha1.SettlementPending, hooksv1alpha1.SettlementSubmitted,
	hooksv1alpha1.SettlementSettled, hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation}

func (f *filterFlags) filter(cmd string, set map[string]bool, now time.Time) (archive.Filter, error) {
	var out archive.Filter
	if set["customer"] && f.customer == "" {
		return out, cmdline.Usagef(cmd, "--customer is empty")
	}
	out.Customer = f.customer
	if set["state"] {
		for _, s := range states {
			if strings.EqualFold(f.state, string(s)) {
				out.State = s
			}
		}
		if out.State == "" {
			return out, cmdline.Usagef(cmd, "--state %q: want one of %s", f.state, joinStates())
		}
	}
	switch archive.TimeField(f.by) {
	case archive.ByCreated, archive.BySettled, archive.ByArchived:
		out.By = archive.TimeField(f.by)
	default:
		return out, cmdline.Usagef(cmd, "--by %q: want created, settled or archived", f.by)
	}
	var err error
	if set["since"] {
		if out.Since, err = cmdline.ParseTime("since", f.since, now); err != nil {
			return out, &cmdline.UsageError{Cmd: cmd, Err: err}
		}
	}
	if set["until"] {
		if out.Until, err = cmdline.ParseTime("until", f.until, now); err != nil {
			return out, &cmdline.UsageError{Cmd: cmd, Err: err}
		}
	}
	if !out.Since.IsZero() && !out.Until.IsZero() && !out.Until.After(out.Since) {
		return out, cmdline.Usagef(cmd, "--until (%s) must be after --since (%s)", out.Until.Format(time.RFC3339), out.Since.Format(time.RFC3339))
	}
	return out, nil
}

func joinStates() string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

const listHelp = `List archived settlements, oldest first.

Usage:
  kubectl settlement archive list [-n NS | -A] [--customer ID] [--state STATE]
      [--since T] [--until T] [--by created|settled|archived] [--limit N] [-o yaml|json]

  --limit N                 at most N settlements (default 100; 0 for no limit). When more
                            match, a note on stderr says so
  -o, --output FORMAT       yaml or json: a List of the archived objects
` + filterHelp + cmdline.CommonHelp + `
Examples:
  kubectl settlement archive list -n tenant-a --customer cus_1 --since 2026-11-01 --until 2026-12-01
  kubectl settlement archive list -A --state Failed --since 7d
`

func (c *command) list(ctx context.Context, args []string) error {
	const cmd = "archive list"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var common cmdline.Flags
	common.Register(fs)
	var filters filterFlags
	filters.register(fs)
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
	f, err := filters.filter(cmd, set, time.Now())
	if err != nil {
		return err
	}
	if f.Namespace, err = kube.Namespace(&common, c.env); err != nil {
		return err
	}
	if limit > 0 {
		f.Limit = limit + 1 // one more, to know whether there are more
	}
	store, err := archivedb.Open(ctx, cmd, &common, c.env, c.red)
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
	w := bufio.NewWriter(c.stdout)
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
			fmt.Fprintln(c.stderr, "No archived settlements found.")
		} else {
			fmt.Fprintf(c.stderr, "No archived settlements found in %s namespace.\n", f.Namespace)
		}
	default:
		printers.PrintSettlements(w, got, f.Namespace == "")
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(c.stderr, "More archived settlements match: showing the first %d. Narrow the window (--since, --until), raise --limit, or use 'archive export'.\n", limit)
	}
	return nil
}

var exportHelp = `Write archived settlements to stdout for finance, oldest first, streaming (any
number of rows in bounded memory, from one consistent snapshot).

Usage:
  kubectl settlement archive export --since T [--until T] --format csv|jsonl
      [-n NS | -A] [--customer ID] [--state STATE] [--by created|settled|archived]

  --format csv              a header row, then one row per settlement, columns:
                            ` + csvHeaderText + `
                            (empty for none; times RFC 3339 UTC; amounts in the minor unit;
                            values as stored, never escaped for spreadsheets)
  --format jsonl            one archived BillingSettlement object per line
` + filterHelp + cmdline.CommonHelp + `
Examples:
  kubectl settlement archive export -A --since 2026-11-01 --until 2026-12-01 --format csv > november.csv
  kubectl settlement archive export -A --by archived --since 24h --format jsonl
`

func (c *command) export(ctx context.Context, args []string) error {
	const cmd = "archive export"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var common cmdline.Flags
	common.Register(fs)
	var filters filterFlags
	filters.register(fs)
	var format string
	fs.StringVar(&format, "format", "", "")
	pos, set, err := cmdline.Parse(cmd, fs, args, exportHelp)
	if err != nil {
		return err
	}
	if err := common.Validate(cmd, set); err != nil {
		return err
	}
	if len(pos) > 0 {
		return cmdline.Usagef(cmd, "unexpected argument %q (export takes only flags)", pos[0])
	}
	if !set["since"] {
		return cmdline.Usagef(cmd, "--since is required (e.g. --since 2026-11-01, or --since 24h)")
	}
	var write func(*bufio.Writer, archive.SettlementRow) error
	switch format {
	case "csv":
	case "jsonl":
		write = writeJSONL
	case "":
		return cmdline.Usagef(cmd, "--format is required: csv or jsonl")
	default:
		return cmdline.Usagef(cmd, "--format %q: want csv or jsonl", format)
	}
	f, err := filters.filter(cmd, set, time.Now())
	if err != nil {
		return err
	}
	if f.Namespace, err = kube.Namespace(&common, c.env); err != nil {
		return err
	}
	store, err := archivedb.Open(ctx, cmd, &common, c.env, c.red)
	if err != nil {
		return err
	}
	defer store.Close()
	w := bufio.NewWriterSize(c.stdout, 64<<10)
	var cw *csvWriter
	if format == "csv" {
		cw = newCSVWriter(w)
		if err := cw.header(); err != nil {
			return writeErr(err)
		}
		write = func(_ *bufio.Writer, r archive.SettlementRow) error { return cw.row(r) }
	}
	err = store.ExportSettlements(ctx, f, func(r archive.SettlementRow) error {
		if err := write(w, r); err != nil {
			return writeErr(err)
		}
		return nil
	})
	if err != nil {
		// Whatever was written is whole rows; the error (and exit status 1) says the
		// export stopped before its end.
		if cw != nil {
			_ = cw.flush()
		}
		_ = w.Flush()
		return fmt.Errorf("the export stopped before its end: %w", err)
	}
	if cw != nil {
		if err := cw.flush(); err != nil {
			return writeErr(err)
		}
	}
	if err := w.Flush(); err != nil {
		return writeErr(err)
	}
	return nil
}

type outputError struct{ err error }

func (e *outputError) Error() string { return "write the output: " + e.err.Error() }
func (e *outputError) Unwrap() error { return e.err }

func writeErr(err error) error {
	var o *outputError
	if errors.As(err, &o) {
		return err
	}
	return &outputError{err: err}
}
