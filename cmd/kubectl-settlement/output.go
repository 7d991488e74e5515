package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/settlement-operator/settlement-operator/internal/archive"
)

const none = "<none>"

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0) }

func row(tw io.Writer, all bool, ns string, cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = none
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

// printSettlements is the settlement table: the amount when the settlement has one (in
// the currency's minor unit, as in kubectl get bs), else the usage.
func printSettlements(w io.Writer, ss []archive.ArchivedSettlement, all bool) {
	tw := table(w)
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

func printJobs(w io.Writer, js []archive.ArchivedJob, all bool) {
	tw := table(w)
	header(tw, all, "NAME", "JOB", "VERSION", "RESULT", "STATE", "ARCHIVED")
	for _, a := range js {
		jc := &a.Object
		row(tw, all, jc.Namespace, jc.Name, jc.Spec.JobID, strconv.FormatInt(jc.Spec.Completion.Version, 10),
			string(jc.Spec.Completion.State), string(jc.Status.State), archivedAt(a.ArchivedAt))
	}
	_ = tw.Flush()
}

func printEvents(w io.Writer, es []archive.ArchivedEvent, all bool) {
	tw := table(w)
	header(tw, all, "NAME", "EVENT-ID", "TYPE", "PHASE", "ARCHIVED")
	for _, a := range es {
		ev := &a.Object
		row(tw, all, ev.Namespace, ev.Name, ev.Spec.EventID, ev.Spec.EventType, string(ev.Status.Phase), archivedAt(a.ArchivedAt))
	}
	_ = tw.Flush()
}

// printObjects prints archived objects as kubectl -o json|yaml would: one object, or a
// v1 List of them. Keys come out sorted (as kubectl prints them), numbers exactly as
// archived.
func printObjects(w io.Writer, format string, raws [][]byte, asList bool) error {
	var doc any
	if asList {
		items := make([]any, len(raws))
		for i, r := range raws {
			v, err := decodeJSON(r)
			if err != nil {
				return err
			}
			items[i] = v
		}
		doc = map[string]any{"apiVersion": "v1", "kind": "List", "items": items}
	} else {
		v, err := decodeJSON(raws[0])
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

func decodeJSON(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("an archived object is not JSON: %w", err)
	}
	return v, nil
}

// writeJSONL writes one archived object on one line, keys sorted.
func writeJSONL(w *bufio.Writer, r archive.SettlementRow) error {
	v, err := decodeJSON(r.Object)
	if err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	return w.WriteByte('\n')
}

// csvColumns are the export's columns, in order. They are stable: a new column is only
// ever added at the end.
var csvColumns = []string{"namespace", "name", "settlement_key", "idempotency_key", "type", "reverses", "customer", "job_id",
	"usage_meter", "usage_quantity", "usage_unit", "amount_minor", "amount_currency", "charged_minor", "charged_currency",
	"state", "provider_ref", "billing_provider", "sent_to_endpoint", "first_submitted_at", "settled_at", "archived_at",
	"created_at"}

var csvHeaderText = wrap(strings.Join(csvColumns, ", "), 62, "                            ")

func wrap(s string, width int, indent string) string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	lines = append(lines, line)
	return strings.Join(lines, "\n"+indent)
}

type csvWriter struct{ w *csv.Writer }

func newCSVWriter(w io.Writer) *csvWriter { return &csvWriter{w: csv.NewWriter(w)} }

func (c *csvWriter) header() error { return c.w.Write(csvColumns) }

func (c *csvWriter) row(r archive.SettlementRow) error {
	return c.w.Write([]string{r.Namespace, r.Name, r.SettlementKey, r.IdempotencyKey, r.Type, r.Reverses, r.Customer, r.JobID,
		r.UsageMeter, r.UsageQuantity, r.UsageUnit, optInt(r.AmountMinor), r.AmountCurrency, optInt(r.ChargedMinor), r.ChargedCurrency,
		r.State, r.ProviderRef, r.BillingProvider, r.SentToEndpoint, optTime(r.FirstSubmittedAt), optTime(r.SettledAt),
		optTime(&r.ArchivedAt), optTime(&r.CreatedAt)})
}

func (c *csvWriter) flush() error {
	c.w.Flush()
	return c.w.Error()
}

func optInt(p *int64) string {
	if p == nil {
		return ""
	}
	return strconv.FormatInt(*p, 10)
}

func optTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
