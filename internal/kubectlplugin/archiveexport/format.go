package archiveexport

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/printers"
)

// writeJSONL writes one archived object on one line, keys sorted.
func writeJSONL(w *bufio.Writer, r archive.SettlementRow) error {
	v, err := printers.DecodeJSON(r.Object)
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
