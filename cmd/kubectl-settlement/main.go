// Command kubectl-settlement is a kubectl plugin for settlement-operator. Installed on
// the PATH it runs as `kubectl settlement …`:
//
//	go install github.com/settlement-operator/settlement-operator/cmd/kubectl-settlement@latest
//	kubectl settlement trace <event-id|job-id|settlement-key|idempotency-key|name> [-n NS] [--provider P]
//	kubectl settlement replay <settlement-name|settlement-key|idempotency-key> [-n NS]
//	kubectl settlement replay event <event-name|event-id> [-n NS] [--provider NAME]
//	kubectl settlement refund <charge> (--amount DECIMAL | --full) [--refund-id ID] [-n NS]
//	kubectl settlement keys <event-id|job-id|settlement-key> [-n NS] [--provider P]
//	kubectl settlement archive get <settlement-key|idempotency-key|job-id|event-id|name>
//	kubectl settlement archive list [--customer C] [--state S] [--since T] [--until T] [--limit N]
//	kubectl settlement archive export --since T [--until T] --format csv|jsonl
//
// trace and keys only read; replay patches one annotation, nothing else; refund
// creates one compensating settlement, which the operator checks before it sends it. The archive
// commands (and trace, when an archive is given) read the operator's PostgreSQL archive
// of finished records (docs/archive.md) through a read-only session, and never write
// to it. Exit status: 0 done, 1 nothing
// found or the archive (or the cluster) could not be read, 2 the command line or the
// configuration is wrong.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archiveexport"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivegap"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archiveget"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivelist"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/keys"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/refund"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/replay"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/trace"
)

const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is the whole command: arguments in, output out, exit status back. env stands for
// os.Getenv, so tests choose the environment.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) int {
	// Whatever fails, an error message never repeats the archive's URL or password:
	// every message passes through the redactor once the URL is known.
	red := &archivedb.Redactor{}
	err := dispatch(ctx, args, stdout, stderr, env, red)
	var help *cmdline.HelpRequested
	var usage *cmdline.UsageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &help):
		fmt.Fprint(stdout, help.Text)
		return exitOK
	case errors.As(err, &usage):
		fmt.Fprintln(stderr, "error: "+red.Clean(usage.Error()))
		fmt.Fprintf(stderr, "See '%s --help' for usage.\n", strings.TrimSpace("kubectl settlement "+usage.Cmd))
		return exitUsage
	default:
		fmt.Fprintln(stderr, "error: "+red.Clean(err.Error()))
		return exitFail
	}
}

const topHelp = `kubectl settlement: tools for settlement-operator.

Commands:
  trace <ref>         the whole story of an event, job or settlement: event, job
                      completion, settlements and their refunds, provider reference,
                      with conditions and timestamps, from the cluster and the archive
  replay <settlement> replay a dead-lettered settlement (sets its replay annotation)
  replay event <ev>   replay an event whose job states were unmapped, once spec.states
                      maps them
  refund <charge>     refund a settled charge (--amount DECIMAL or --full): creates the
                      compensating settlement with its derived name and keys
  keys <id>           the names and keys the operator derives from an event ID, job ID
                      or settlement key
  archive get <ref>   find archived records by settlement key, idempotency key, job ID,
                      event ID or object name
  archive list        list archived settlements (by customer, state, time)
  archive export      stream archived settlements as CSV or JSON Lines, for finance

Run 'kubectl settlement <command> --help' for a command's flags.
`

const archiveHelp = `kubectl settlement archive: read the operator's PostgreSQL archive of finished
event receipts, job completions and settlements (docs/archive.md).

Commands:
  get <ref>   every archived record a reference names
  list        archived settlements, oldest first
  export      archived settlements as CSV or JSON Lines on stdout
  gap         what an archive restored from an older copy may have lost

Run 'kubectl settlement archive <command> --help' for a command's flags.
`

// dispatch picks the command the arguments name and runs it; each command's logic is in
// its package under internal/kubectlplugin.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string, red *archivedb.Redactor) error {
	e := cmdline.Env{Stdout: stdout, Stderr: stderr, Getenv: env}
	if len(args) == 0 {
		return cmdline.Usagef("", "no command given (try 'kubectl settlement archive get <ref>')")
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		return &cmdline.HelpRequested{Text: topHelp}
	case "archive":
	case "keys":
		return keys.Run(ctx, e, args[1:])
	case "trace":
		return trace.Run(ctx, e, red, args[1:])
	case "replay":
		return replay.Run(ctx, e, args[1:])
	case "refund":
		return refund.Run(ctx, e, args[1:])
	default:
		return cmdline.Usagef("", "unknown command %q: want trace, replay, refund, keys or archive", args[0])
	}
	args = args[1:]
	if len(args) == 0 {
		return cmdline.Usagef("archive", "no archive command given: get, list, export or gap")
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		return &cmdline.HelpRequested{Text: archiveHelp}
	case "get":
		return archiveget.Run(ctx, e, red, args[1:])
	case "list":
		return archivelist.Run(ctx, e, red, args[1:])
	case "export":
		return archiveexport.Run(ctx, e, red, args[1:])
	case "gap":
		return archivegap.Run(ctx, e, red, args[1:])
	}
	return cmdline.Usagef("archive", "unknown archive command %q: want get, list, export or gap", args[0])
}
