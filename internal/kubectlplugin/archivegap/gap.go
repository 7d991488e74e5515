// Package archivegap is `kubectl settlement archive gap`: what an archive restored
// from an older copy may have lost. It compares the archive with the cluster's
// watermark (the latest archived row the operator read back, in the archive's identity
// ConfigMap), says where the archive now ends, and, given the provider's records since
// then, lists the idempotency keys the provider holds and the archive does not. It
// reads the archive read-only and the cluster only for the ConfigMap.
package archivegap

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
)

// watermarkKey is the ConfigMap key the operator keeps the watermark under
// (internal/archivewatermark.Key; not imported: the plugin needs no controller code).
const watermarkKey = "archiveWatermark"

const gapHelp = `Show what an archive restored from an older copy may have lost.

Usage:
  kubectl settlement archive gap [--watermark-from NS/CONFIGMAP | --watermark JSON]
      [--provider-records FILE [--key-field NAME]] [-n NS | -A]

  --watermark-from NS/NAME  read the watermark from the operator's archive ConfigMap
                            (<leader-election-id>-archive in its namespace)
  --watermark JSON          the watermark as that ConfigMap holds it
  --provider-records FILE   the provider's records since the archive's end (below), one
                            JSON object a line, or CSV with a header row: the keys the
                            provider holds that the archive does not are listed
  --key-field NAME          the field or column holding the idempotency key (default:
                            the first of idempotency_key, idempotencyKey, key)

It says whether the archive holds the row the watermark names (if not, the archive is
behind the cluster: docs/runbook.md, "An archive behind the cluster"), the archive's
insert counter, and its latest row and when it was archived: records archived after
that moment and since deleted from the cluster may be in neither place. It reads the
archive, not the cluster's settlements: a key not in the archive may still be in the
cluster (kubectl get billingsettlements -A).
` + cmdline.CommonHelp + `
Examples:
  kubectl settlement archive gap --watermark-from settlement-system/settlement-operator.hooks.settlement.dev-archive
  kubectl settlement archive gap -A --provider-records charges-since-restore.jsonl --from-secret settlement-system/archive
`

// Run is `kubectl settlement archive gap` with its arguments (after "gap").
func Run(ctx context.Context, c cmdline.Env, red *archivedb.Redactor, args []string) error {
	const cmd = "archive gap"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var common cmdline.Flags
	common.Register(fs)
	var from, wmJSON, records, keyField string
	fs.StringVar(&from, "watermark-from", "", "")
	fs.StringVar(&wmJSON, "watermark", "", "")
	fs.StringVar(&records, "provider-records", "", "")
	fs.StringVar(&keyField, "key-field", "", "")
	pos, set, err := cmdline.Parse(cmd, fs, args, gapHelp)
	if err != nil {
		return err
	}
	if err := common.Validate(cmd, set); err != nil {
		return err
	}
	if len(pos) > 0 {
		return cmdline.Usagef(cmd, "unexpected argument %q (gap takes only flags)", pos[0])
	}
	if from != "" && wmJSON != "" {
		return cmdline.Usagef(cmd, "give --watermark-from or --watermark, not both")
	}
	var cmRef cmdline.SecretRef
	if from != "" {
		if cmRef, err = cmdline.ParseSecretRef(from); err != nil {
			return cmdline.Usagef(cmd, "--watermark-from needs <namespace>/<configmap>")
		}
	}
	var wm archive.Mark
	if wmJSON != "" {
		if err := json.Unmarshal([]byte(wmJSON), &wm); err != nil {
			return cmdline.Usagef(cmd, "--watermark: %v", err)
		}
	}
	var keys []string
	if records != "" {
		if keys, err = readKeys(records, keyField); err != nil {
			return cmdline.Usagef(cmd, "--provider-records: %v", err)
		}
	}
	ns, err := kube.Namespace(&common, c.Getenv)
	if err != nil {
		return err
	}
	source := "--watermark"
	if from != "" {
		source = "ConfigMap " + cmRef.Namespace + "/" + cmRef.Name
		cl, err := kube.Client(&common, c.Getenv)
		if err != nil {
			return err
		}
		var cm corev1.ConfigMap
		if err := cl.Get(ctx, client.ObjectKey{Namespace: cmRef.Namespace, Name: cmRef.Name}, &cm); err != nil {
			return fmt.Errorf("read the watermark from %s: %w", source, err)
		}
		if v := cm.Data[watermarkKey]; v != "" {
			if err := json.Unmarshal([]byte(v), &wm); err != nil {
				return fmt.Errorf("the watermark in %s does not decode: %w", source, err)
			}
		}
	}
	store, err := archivedb.Open(ctx, cmd, &common, c.Getenv, red)
	if err != nil {
		return err
	}
	defer store.Close()

	w := bufio.NewWriter(c.Stdout)
	defer w.Flush()
	switch {
	case from == "" && wmJSON == "":
		fmt.Fprintln(w, "Watermark:               not given (--watermark-from): whether the archive is behind is not checked")
	case wm.IsZero():
		fmt.Fprintf(w, "Watermark (%s): none (nothing archived since it was set, or removed by a person)\n", source)
	default:
		held, why, err := store.CheckMark(ctx, wm)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "Watermark (%s): %s\n", source, wm)
		if held {
			fmt.Fprintln(w, "  The archive holds it: not behind the cluster as far as the watermark shows.")
		} else {
			fmt.Fprintf(w, "  BEHIND: %s.\n", why)
		}
	}
	p, err := store.ArchivePosition(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Archive insert counter:  %d\n", p.Counter)
	if p.Latest.IsZero() {
		fmt.Fprintln(w, "Latest row:              none with a sequence (nothing archived since migration 0003)")
	} else {
		fmt.Fprintf(w, "Latest row:              %s, archived %s\n", p.Latest, p.LatestArchivedAt.UTC().Format(time.RFC3339))
		fmt.Fprintln(w, "  Records archived after that moment and since deleted from the cluster may be in neither place;")
		fmt.Fprintln(w, "  list the provider's records since then and pass them with --provider-records.")
	}
	if records == "" {
		return nil
	}
	held, err := store.ArchivedIdempotencyKeys(ctx, ns, keys)
	if err != nil {
		return err
	}
	var missing []string
	for _, k := range keys {
		if !held[k] {
			missing = append(missing, k)
		}
	}
	where := "namespace " + ns
	if ns == "" {
		where = "any namespace"
	}
	fmt.Fprintf(w, "Provider records:        %d keys read, %d in the archive (%s), %d not:\n", len(keys), len(keys)-len(missing), where, len(missing))
	for _, k := range missing {
		fmt.Fprintf(w, "  %s\n", k)
	}
	if len(missing) > 0 {
		fmt.Fprintln(w, "  A key not in the archive is a lost record, or a settlement still in the cluster")
		fmt.Fprintln(w, "  (kubectl get billingsettlements -A), or a charge this operator did not make.")
	}
	return nil
}

// readKeys reads the idempotency keys of the provider's records, once each, in order.
func readKeys(path, field string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	first, err := br.Peek(1)
	if err != nil && err != io.EOF {
		return nil, err
	}
	fields := []string{"idempotency_key", "idempotencyKey", "key"}
	if field != "" {
		fields = []string{field}
	}
	seen := map[string]bool{}
	var keys []string
	add := func(k string) {
		if k != "" && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if len(first) == 1 && first[0] == '{' {
		dec := json.NewDecoder(br)
		for n := 1; ; n++ {
			var rec map[string]any
			if err := dec.Decode(&rec); err == io.EOF {
				break
			} else if err != nil {
				return nil, fmt.Errorf("record %d: %w", n, err)
			}
			k, ok := pick(rec, fields)
			if !ok {
				return nil, fmt.Errorf("record %d has none of the fields %s", n, strings.Join(fields, ", "))
			}
			add(k)
		}
		return keys, nil
	}
	r := csv.NewReader(br)
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("read the CSV header: %w", err)
	}
	col := -1
	for _, name := range fields {
		for i, h := range header {
			if strings.TrimSpace(h) == name && col < 0 {
				col = i
			}
		}
	}
	if col < 0 {
		sort.Strings(fields)
		return nil, fmt.Errorf("the CSV header has none of the columns %s", strings.Join(fields, ", "))
	}
	for {
		row, err := r.Read()
		if err == io.EOF {
			return keys, nil
		}
		if err != nil {
			return nil, err
		}
		if col < len(row) {
			add(strings.TrimSpace(row[col]))
		}
	}
}

func pick(rec map[string]any, fields []string) (string, bool) {
	for _, f := range fields {
		if s, ok := rec[f].(string); ok && s != "" {
			return s, true
		}
	}
	return "", false
}
