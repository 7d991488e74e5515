// Package archiveexport is `kubectl settlement archive export`: the archived
// settlements a time window selects, streamed to stdout as CSV (stable columns) or JSON
// Lines, for finance. It reads the archive read-only, from one consistent snapshot.
package archiveexport

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivefilter"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
)

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
` + archivefilter.Help + cmdline.CommonHelp + `
Examples:
  kubectl settlement archive export -A --since 2026-11-01 --until 2026-12-01 --format csv > november.csv
  kubectl settlement archive export -A --by archived --since 24h --format jsonl
`

// Run is `kubectl settlement archive export` with its arguments (after "export"): it
// streams the archived settlements the filters select to stdout as CSV or JSON Lines,
// from one snapshot, in bounded memory. red learns the archive's URL, so that no
// message shows it.
func Run(ctx context.Context, c cmdline.Env, red *archivedb.Redactor, args []string) error {
	const cmd = "archive export"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var common cmdline.Flags
	common.Register(fs)
	var filters archivefilter.Flags
	filters.Register(fs)
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
	f, err := filters.Filter(cmd, set, time.Now())
	if err != nil {
		return err
	}
	if f.Namespace, err = kube.Namespace(&common, c.Getenv); err != nil {
		return err
	}
	store, err := archivedb.Open(ctx, cmd, &common, c.Getenv, red)
	if err != nil {
		return err
	}
	defer store.Close()
	w := bufio.NewWriterSize(c.Stdout, 64<<10)
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

// outputError is a failure to write the output (a closed pipe, a full disk), told
// apart from a failure to read the archive.
type outputError struct{ err error }

// Error says the output could not be written, so the message is not read as the
// archive's failure.
func (e *outputError) Error() string { return "write the output: " + e.err.Error() }

// Unwrap is the write's own error, for errors.Is and errors.As.
func (e *outputError) Unwrap() error { return e.err }

func writeErr(err error) error {
	var o *outputError
	if errors.As(err, &o) {
		return err
	}
	return &outputError{err: err}
}
