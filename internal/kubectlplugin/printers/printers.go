// Package printers prints what the kubectl plugin reads as kubectl prints it: tables
// spaced as kubectl's, with <none> for an empty cell and a NAMESPACE column for
// --all-namespaces, and objects as -o json|yaml. The archive commands share it so that
// the same record looks the same whichever command shows it.
package printers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
)

// None is what a table shows for an empty cell, as kubectl shows it.
const None = "<none>"

// Table is the tabwriter of every table the plugin prints, spaced as kubectl's.
func Table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0) }

func row(tw io.Writer, all bool, ns string, cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = None
		}
	}
	if all {
		cells = append([]string{ns}, cells...)
	}
	fmt.Fprintln(tw, strings.Join(cells, "\t"))
}

func header(tw io.Writer, all bool, cols ...string) {
	if all {
		cols = append([]string{"NAMESPACE"}, cols...)
	}
	fmt.Fprintln(tw, strings.Join(cols, "\t"))
}

func archivedAt(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// PrintSettlements is the archived settlement table, shared by archive get and list:
// the amount when the settlement has one (in the currency's minor unit, as in kubectl
// get bs), else the usage. all adds a NAMESPACE column.
func PrintSettlements(w io.Writer, ss []archive.ArchivedSettlement, all bool) {
	tw := Table(w)
	header(tw, all, "NAME", "CUSTOMER", "TYPE", "AMOUNT/USAGE", "STATE", "ATTEMPTS", "PROVIDER-REF", "ARCHIVED")
	for _, a := range ss {
		bs := &a.Object
		typ := string(bs.Spec.Type)
		if typ == "" {
			typ = "Charge"
		}
		row(tw, all, bs.Namespace, bs.Name, bs.Spec.Customer, typ, amountOrUsage(a), string(bs.Status.State),
			strconv.Itoa(int(bs.Status.Attempts)), bs.Status.ProviderRef, archivedAt(a.ArchivedAt))
	}
	_ = tw.Flush()
}

func amountOrUsage(a archive.ArchivedSettlement) string {
	sp := &a.Object.Spec
	switch {
	case sp.Amount != nil:
		return fmt.Sprintf("%d %s", sp.Amount.Minor, sp.Amount.Currency)
	case sp.Usage != nil && sp.Usage.Unit != "":
		return sp.Usage.Quantity + " " + sp.Usage.Unit
	case sp.Usage != nil:
		return sp.Usage.Quantity + " " + sp.Usage.Meter
	}
	return ""
}

// PrintJobs is the archived job completion table, one row per archived version; all
// adds a NAMESPACE column.
func PrintJobs(w io.Writer, js []archive.ArchivedJob, all bool) {
	tw := Table(w)
	header(tw, all, "NAME", "JOB", "VERSION", "RESULT", "STATE", "ARCHIVED")
	for _, a := range js {
		jc := &a.Object
		row(tw, all, jc.Namespace, jc.Name, jc.Spec.JobID, strconv.FormatInt(jc.Spec.Completion.Version, 10),
			string(jc.Spec.Completion.State), string(jc.Progress().State), archivedAt(a.ArchivedAt))
	}
	_ = tw.Flush()
}

// PrintEvents is the archived event receipt table; all adds a NAMESPACE column.
func PrintEvents(w io.Writer, es []archive.ArchivedEvent, all bool) {
	tw := Table(w)
	header(tw, all, "NAME", "EVENT-ID", "TYPE", "PHASE", "ARCHIVED")
	for _, a := range es {
		ev := &a.Object
		row(tw, all, ev.Namespace, ev.Name, ev.Spec.EventID, ev.Spec.EventType, string(ev.Status.Phase), archivedAt(a.ArchivedAt))
	}
	_ = tw.Flush()
}

// PrintObjects prints archived objects as kubectl -o json|yaml would: one object, or a
// v1 List of them. Keys come out sorted (as kubectl prints them), numbers exactly as
// archived.
func PrintObjects(w io.Writer, format string, raws [][]byte, asList bool) error {
	var doc any
	if asList {
		items := make([]any, len(raws))
		for i, r := range raws {
			v, err := DecodeJSON(r)
			if err != nil {
				return err
			}
			items[i] = v
		}
		doc = map[string]any{"apiVersion": "v1", "kind": "List", "items": items}
	} else {
		v, err := DecodeJSON(raws[0])
		if err != nil {
			return err
		}
		doc = v
	}
	out, err := json.MarshalIndent(doc, "", "    ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if out, err = yaml.JSONToYAML(out); err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}

// DecodeJSON decodes an archived object keeping its numbers exactly as archived
// (json.Number), so that printing it again changes no amount.
func DecodeJSON(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("an archived object is not JSON: %w", err)
	}
	return v, nil
}

// CheckFormat refuses, as a usage error of cmd, an --output other than yaml or json
// (or none, for a table), before anything is read.
func CheckFormat(cmd, output string) error {
	switch output {
	case "", "yaml", "json":
		return nil
	}
	return cmdline.Usagef(cmd, "--output %q: want yaml or json (or nothing, for a table)", output)
}
