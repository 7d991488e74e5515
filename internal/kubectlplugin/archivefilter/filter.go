// Package archivefilter holds the filter flags of the archive commands that select
// settlements (list and export): customer, state and a time window on a chosen time,
// read into an archive.Filter.
package archivefilter

import (
	"flag"
	"strings"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
)

// Flags are the settlement filters of archive list and export, shared so that both
// select settlements alike.
type Flags struct {
	customer, state, since, until, by string
}

// Help is the help text of Flags, shared by the helps of list and export.
const Help = `
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

// Register adds the filter flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.customer, "customer", "", "")
	fs.StringVar(&f.state, "state", "", "")
	fs.StringVar(&f.since, "since", "", "")
	fs.StringVar(&f.until, "until", "", "")
	fs.StringVar(&f.by, "by", string(archive.ByCreated), "")
}

var states = []hooksv1alpha1.SettlementState{hooksv1alpha1.SettlementPending, hooksv1alpha1.SettlementSubmitted,
	hooksv1alpha1.SettlementSettled, hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation}

// Filter is the archive's filter for the flags given (set, from cmdline.Parse), with
// --since and --until read relative to now; a wrong value is a usage error of cmd.
func (f *Flags) Filter(cmd string, set map[string]bool, now time.Time) (archive.Filter, error) {
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
