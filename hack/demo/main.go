// Command demo is the toolbox behind hack/demo.sh (`make demo`): it runs a local
// control plane, waits for HTTP endpoints, drives the fake billing provider's admin
// API, waits until the operator has settled everything, and checks the result against
// the provider's ledger. The script stays a readable list of steps; the parts that need
// an API client, JSON or a clock live here.
//
//	demo control-plane -assets DIR -kubeconfig FILE   run etcd + kube-apiserver until SIGINT/SIGTERM
//	demo wait-http -url URL [-timeout 60s]             wait until URL answers 2xx
//	demo post -url URL -data JSON                      POST JSON, print the answer (2xx or exit 1)
//	demo settle -kubeconfig FILE [-namespace NS]       wait until every record is in a final or explicit state
//	demo report -kubeconfig FILE -billing-url URL      print the ledger per settlement key; exit 1 if an invariant broke
//	     [-archive-url-file FILE]                      … counting the records in the cluster and in the archive
//	demo wait-archived -kubeconfig FILE -archive-url-file FILE
//	                                                   wait until the Settled settlements have left the cluster for the archive
//	demo platform-report -kubeconfig FILE -namespace NS -platform TYPE -effects-url URL
//	                                                   DEMO_BILLING: one tenant's settlements next to a platform fake's books
//
// The archive is read directly with SQL (internal/archive/migrations): the demo checks
// the operator, so it does not go through the operator's own archive code.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/confirmation"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: demo control-plane|wait-http|post|settle|report|wait-archived|platform-report [flags]")
		os.Exit(2)
	}
	commands := map[string]func([]string) error{
		"control-plane": controlPlane,
		"wait-http":     waitHTTP,
		"post":          post,
		"settle":        settle,
		"report":        report,
		"wait-archived": waitArchived,
		// The usage-billing platforms variant (platforms.go).
		"platform-report": platformReport,
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "demo: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	if err := cmd(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// controlPlane starts etcd and kube-apiserver with envtest (no CRDs: the script
// installs them the way the README tells users to), writes an admin kubeconfig, and
// stops both processes cleanly on SIGINT/SIGTERM. envtest starts them in their own
// process groups, so it also writes their PIDs next to the kubeconfig: if this process
// were ever killed with SIGKILL, the script can still stop them.
func controlPlane(args []string) error {
	fs := flag.NewFlagSet("control-plane", flag.ExitOnError)
	assets := fs.String("assets", os.Getenv("KUBEBUILDER_ASSETS"), "directory holding etcd, kube-apiserver and kubectl (hack/setup-envtest.sh)")
	kubeconfig := fs.String("kubeconfig", "", "where to write the admin kubeconfig (required)")
	_ = fs.Parse(args)
	if *assets == "" || *kubeconfig == "" {
		return errors.New("control-plane: -assets and -kubeconfig are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	env := &envtest.Environment{
		BinaryAssetsDirectory:    *assets,
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
		Scheme:                   testenv.Scheme(),
	}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer func() {
		_ = os.Remove(*kubeconfig)
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "demo: stop control plane:", err)
		}
		fmt.Println("control plane stopped")
	}()
	writeChildPIDs(filepath.Join(filepath.Dir(*kubeconfig), "control-plane.pids"))
	if err := testenv.WriteKubeconfig(*kubeconfig, cfg, "settlement-demo", ""); err != nil {
		return err
	}
	fmt.Printf("control plane ready: %s (kubeconfig %s)\n", cfg.Host, *kubeconfig)
	<-ctx.Done()
	return nil
}

// writeChildPIDs records this process's children (etcd, kube-apiserver) where Linux
// exposes them; elsewhere it writes nothing and the normal shutdown path is the only one.
func writeChildPIDs(path string) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", os.Getpid()))
	var pids []string
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err == nil {
			pids = append(pids, strings.Fields(string(b))...)
		}
	}
	if len(pids) > 0 {
		_ = os.WriteFile(path, []byte(strings.Join(pids, "\n")+"\n"), 0o600)
	}
}

func waitHTTP(args []string) error {
	fs := flag.NewFlagSet("wait-http", flag.ExitOnError)
	url := fs.String("url", "", "URL to GET until it answers 2xx (required)")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	_ = fs.Parse(args)
	deadline := time.Now().Add(*timeout)
	c := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := c.Get(*url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 2xx within %s: %w", *url, *timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func post(args []string) error {
	fs := flag.NewFlagSet("post", flag.ExitOnError)
	url := fs.String("url", "", "URL to POST to (required)")
	data := fs.String("data", "{}", "JSON body")
	_ = fs.Parse(args)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Post(*url, "application/json", strings.NewReader(*data))
	if err != nil {
		return fmt.Errorf("POST %s: %w", *url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	fmt.Printf("%d %s\n", resp.StatusCode, bytes.TrimSpace(b))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s answered %d", *url, resp.StatusCode)
	}
	return nil
}

// Final or explicit states: nothing more happens without new input, or the object
// says plainly that a person or the reconciliation pass has to look at it.
var (
	eventSettled = map[hooksv1alpha1.EventPhase]bool{
		hooksv1alpha1.EventComplete: true, hooksv1alpha1.EventIgnored: true,
		hooksv1alpha1.EventQuarantined: true, hooksv1alpha1.EventRequiresReconciliation: true,
	}
	jobSettled = map[hooksv1alpha1.JobCompletionState]bool{
		hooksv1alpha1.JobCompletionApplied: true, hooksv1alpha1.JobCompletionSuperseded: true,
		hooksv1alpha1.JobCompletionFailed: true, hooksv1alpha1.JobCompletionRequiresReconciliation: true,
	}
	settlementSettled = map[hooksv1alpha1.SettlementState]bool{
		hooksv1alpha1.SettlementSettled: true, hooksv1alpha1.SettlementFailed: true,
		hooksv1alpha1.SettlementRequiresReconciliation: true,
	}
)

type world struct {
	events      hooksv1alpha1.WebhookEventList
	jobs        hooksv1alpha1.JobCompletionList
	settlements hooksv1alpha1.BillingSettlementList
}

func newClient(kubeconfig string) (client.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return c, nil
}

func readWorld(ctx context.Context, c client.Client, ns string) (world, error) {
	var w world
	for _, l := range []client.ObjectList{&w.events, &w.jobs, &w.settlements} {
		if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
			return w, fmt.Errorf("list: %w", err)
		}
	}
	return w, nil
}

// unsettled names every object still on its way, with its current state.
func (w world) unsettled() []string {
	var out []string
	for _, e := range w.events.Items {
		if !eventSettled[e.Status.Phase] {
			out = append(out, fmt.Sprintf("event %s %s", e.Spec.EventID, orNew(string(e.Status.Phase))))
		}
	}
	for _, j := range w.jobs.Items {
		if st := j.Progress().State; !jobSettled[st] {
			out = append(out, fmt.Sprintf("job %s %s", j.Spec.JobID, orNew(string(st))))
		}
	}
	for _, s := range w.settlements.Items {
		if !settlementSettled[s.Status.State] {
			st := orNew(string(s.Status.State))
			if s.Status.LastError != nil {
				st += " (retrying)"
			}
			out = append(out, fmt.Sprintf("settlement %s %s", s.Spec.SettlementKey, st))
		}
	}
	sort.Strings(out)
	return out
}

// summarize turns "event msg_1 Dispatching" lines into "2 events Dispatching, …".
func summarize(pending []string) string {
	type group struct{ kind, state string }
	counts, order := map[group]int{}, []group{}
	for _, p := range pending {
		kind, rest, _ := strings.Cut(p, " ")
		_, state, _ := strings.Cut(rest, " ")
		g := group{kind, state}
		if counts[g] == 0 {
			order = append(order, g)
		}
		counts[g]++
	}
	parts := make([]string, len(order))
	for i, g := range order {
		kind := g.kind
		if counts[g] > 1 {
			kind += "s"
		}
		parts[i] = fmt.Sprintf("%d %s %s", counts[g], kind, g.state)
	}
	return strings.Join(parts, ", ")
}

func orNew(s string) string {
	if s == "" {
		return "New"
	}
	return s
}

func settle(args []string) error {
	fs := flag.NewFlagSet("settle", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig (required)")
	ns := fs.String("namespace", "default", "namespace of the demo's objects")
	timeout := fs.Duration("timeout", 90*time.Second, "give up after this long")
	_ = fs.Parse(args)
	c, err := newClient(*kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	lastPrint := time.Time{}
	for {
		w, err := readWorld(ctx, c, *ns)
		if err != nil {
			return err
		}
		pending := w.unsettled()
		if len(pending) == 0 {
			fmt.Printf("settled: %d events, %d jobs, %d settlements, all in a final or explicit state (%.1fs)\n",
				len(w.events.Items), len(w.jobs.Items), len(w.settlements.Items), time.Since(start).Seconds())
			return nil
		}
		if time.Since(start) > *timeout {
			return fmt.Errorf("not settled after %s: %s", *timeout, strings.Join(pending, "; "))
		}
		if time.Since(lastPrint) >= 3*time.Second {
			fmt.Printf("  waiting (%2.0fs): %s\n", time.Since(start).Seconds(), summarize(pending))
			lastPrint = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// report prints the provider's ledger per settlement key and checks the demo's
// invariants: every accepted event reached a final or explicit state, every settlement
// is Settled, and the provider holds exactly one charge for each of them and nothing
// the operator does not know about.
func report(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig (required)")
	ns := fs.String("namespace", "default", "namespace of the demo's objects")
	billingURL := fs.String("billing-url", "", "fake billing provider base URL (required)")
	quarantined := fs.Int("expect-quarantined", -1, "number of quarantine records expected (one per 409); -1 = do not check")
	archiveURLFile := fs.String("archive-url-file", "", "file holding the archive's PostgreSQL URL: count the records it holds as well (empty = no archive)")
	_ = fs.Parse(args)
	archiveURL, err := readURLFile(*archiveURLFile)
	if err != nil {
		return err
	}
	c, err := newClient(*kubeconfig)
	if err != nil {
		return err
	}
	ctx := context.Background()
	w, err := readWorld(ctx, c, *ns)
	if err != nil {
		return err
	}
	// With an archive, finished records leave the cluster: every check below runs on
	// cluster ∪ archive (the cluster's copy where both hold one). The cluster is read
	// first: the archiver deletes a record only after writing it, so one that moves
	// between the two reads is in the second.
	var arch archived
	if archiveURL != "" {
		conn, err := connectArchive(ctx, archiveURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		if arch, err = readArchive(ctx, conn, *ns); err != nil {
			return err
		}
	}
	events, eventsArchivedOnly := unionByName(w.events.Items, arch.events)
	settlements, settlementsArchivedOnly := unionByName(w.settlements.Items, arch.settlements)
	where := func(n int) string {
		if archiveURL == "" {
			return ""
		}
		return fmt.Sprintf(" (%d of them only in the archive)", n)
	}
	ledger, err := fetchLedger(*billingURL)
	if err != nil {
		return err
	}

	byKey := map[string][]fakebilling.WireRecord{}
	for _, r := range ledger.Records {
		byKey[r.SettlementKey] = append(byKey[r.SettlementKey], r)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTLEMENT KEY\tCHARGES\tPROVIDER ID\tSTATUS\tCUSTOMER\tUSAGE")
	for _, k := range keys {
		r := byKey[k][0]
		usage := ""
		if r.Usage != nil {
			usage = r.Usage.Quantity.String() + " " + r.Usage.Unit
		} else if r.Amount != nil {
			usage = strconv.FormatInt(r.Amount.Minor, 10) + " " + r.Amount.Currency + " (minor)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", k, len(byKey[k]), r.ID, r.Status, r.Customer, usage)
	}
	_ = tw.Flush()
	cl := ledger.Calls
	fmt.Printf("provider calls: %d POST /settlements (%d answered with an injected fault), %d GET by key, %d list\n",
		cl.Posts, cl.Faults, cl.Gets, cl.Lists)

	var broken []string
	check := func(ok bool, pass, fail string) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
			broken = append(broken, fail)
		}
		msg := pass
		if !ok {
			msg = fail
		}
		fmt.Printf("  [%s] %s\n", mark, msg)
	}
	fmt.Println()
	fmt.Println("invariants:")

	accepted, notFinal, q := 0, []string{}, 0
	for _, e := range events {
		if e.Status.Phase == hooksv1alpha1.EventQuarantined {
			q++
			continue
		}
		accepted++
		if !eventSettled[e.Status.Phase] {
			notFinal = append(notFinal, fmt.Sprintf("%s is %s", e.Spec.EventID, orNew(string(e.Status.Phase))))
		}
	}
	check(len(notFinal) == 0,
		fmt.Sprintf("all %d accepted (2xx) events are Complete or in an explicit state%s", accepted, where(eventsArchivedOnly)),
		"events not in a final or explicit state: "+strings.Join(notFinal, ", "))
	if *quarantined >= 0 {
		check(q == *quarantined,
			fmt.Sprintf("%d conflicting reuse(s) answered 409 and kept as %d quarantine record(s), never dispatched", *quarantined, q),
			fmt.Sprintf("expected %d quarantine record(s), found %d", *quarantined, q))
	}

	var notSettled, wrongCount []string
	local := map[string]bool{}
	for _, s := range settlements {
		local[s.Spec.SettlementKey] = true
		if s.Status.State != hooksv1alpha1.SettlementSettled {
			why := orNew(string(s.Status.State))
			if cond := apimeta.FindStatusCondition(s.Status.Conditions, hooksv1alpha1.ConditionDeadLettered); cond != nil && cond.Status == metav1.ConditionTrue {
				why += ", dead-lettered"
			}
			notSettled = append(notSettled, fmt.Sprintf("%s is %s", s.Spec.SettlementKey, why))
		}
		if n := len(byKey[s.Spec.SettlementKey]); n != 1 {
			wrongCount = append(wrongCount, fmt.Sprintf("%s has %d charges", s.Spec.SettlementKey, n))
		} else if s.Status.ProviderRef != "" && byKey[s.Spec.SettlementKey][0].ID != s.Status.ProviderRef {
			wrongCount = append(wrongCount, fmt.Sprintf("%s points at %s but the provider holds %s",
				s.Spec.SettlementKey, s.Status.ProviderRef, byKey[s.Spec.SettlementKey][0].ID))
		}
	}
	check(len(notSettled) == 0,
		fmt.Sprintf("all %d settlements are Settled%s", len(settlements), where(settlementsArchivedOnly)),
		"settlements not Settled: "+strings.Join(notSettled, ", "))
	if archiveURL != "" {
		var early []string
		for _, s := range arch.settlements {
			if s.Status.State != hooksv1alpha1.SettlementSettled || !arch.reconciled[s.Name] {
				early = append(early, fmt.Sprintf("%s (%s, reconciled=%t)", s.Spec.SettlementKey, orNew(string(s.Status.State)), arch.reconciled[s.Name]))
			}
		}
		check(len(early) == 0,
			fmt.Sprintf("the archive holds %d settlements, each Settled and confirmed by a reconciliation pass", len(arch.settlements)),
			"archived before they were Settled and reconciled: "+strings.Join(early, ", "))
	}
	check(len(wrongCount) == 0,
		fmt.Sprintf("the provider's ledger holds exactly one charge per settlement key (%d keys, %d records)", len(keys), len(ledger.Records)),
		strings.Join(wrongCount, ", "))
	var unknown []string
	for _, k := range keys {
		if !local[k] {
			unknown = append(unknown, k)
		}
	}
	known := "no charge at the provider that the operator does not know about"
	if archiveURL != "" {
		known += " (in the cluster or in the archive)"
	}
	check(len(unknown) == 0, known,
		"charges at the provider without a settlement in the cluster or the archive: "+strings.Join(unknown, ", "))
	if len(broken) > 0 {
		return fmt.Errorf("%d invariant(s) broken", len(broken))
	}
	return nil
}

func fetchLedger(base string) (fakebilling.Ledger, error) {
	var l fakebilling.Ledger
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(strings.TrimRight(base, "/") + "/_admin/ledger")
	if err != nil {
		return l, fmt.Errorf("read the provider's ledger: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return l, fmt.Errorf("read the provider's ledger: status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return l, fmt.Errorf("decode the provider's ledger: %w", err)
	}
	return l, nil
}

// --- the archive ---------------------------------------------------------------------

// archived is what the archive holds for a namespace: each row's object column, the
// record as the cluster held it when it was archived.
type archived struct {
	events      []hooksv1alpha1.WebhookEvent
	jobs        []hooksv1alpha1.JobCompletion
	settlements []hooksv1alpha1.BillingSettlement
	// reconciled is the settlements' reconciled column, by name.
	reconciled map[string]bool
}

// readURLFile reads a URL kept in a file, as the demo keeps every secret (a password
// in a URL on a command line would show in ps). An empty path is no URL.
func readURLFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func connectArchive(ctx context.Context, url string) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to the archive: %w", err)
	}
	return conn, nil
}

func readArchive(ctx context.Context, conn *pgx.Conn, ns string) (archived, error) {
	var a archived
	var err error
	if a.events, err = archivedObjects[hooksv1alpha1.WebhookEvent](ctx, conn,
		`SELECT event_receipt_object(t) FROM event_receipts t WHERE namespace = $1 ORDER BY name`, ns); err != nil {
		return a, err
	}
	if a.jobs, err = archivedObjects[hooksv1alpha1.JobCompletion](ctx, conn,
		`SELECT job_completion_object(t) FROM job_completions t WHERE namespace = $1 ORDER BY name, version`, ns); err != nil {
		return a, err
	}
	if a.settlements, err = archivedObjects[hooksv1alpha1.BillingSettlement](ctx, conn,
		`SELECT settlement_object(t) FROM settlements t WHERE namespace = $1 ORDER BY name`, ns); err != nil {
		return a, err
	}
	rows, err := conn.Query(ctx, `SELECT name, reconciled FROM settlements WHERE namespace = $1`, ns)
	if err != nil {
		return a, fmt.Errorf("read the archive: %w", err)
	}
	a.reconciled = map[string]bool{}
	var name string
	var reconciled bool
	_, err = pgx.ForEachRow(rows, []any{&name, &reconciled}, func() error {
		a.reconciled[name] = reconciled
		return nil
	})
	if err != nil {
		return a, fmt.Errorf("read the archive: %w", err)
	}
	return a, nil
}

func archivedObjects[T any](ctx context.Context, conn *pgx.Conn, query, ns string) ([]T, error) {
	rows, err := conn.Query(ctx, query, ns)
	if err != nil {
		return nil, fmt.Errorf("read the archive (has the manager migrated its schema?): %w", err)
	}
	raws, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, fmt.Errorf("read the archive: %w", err)
	}
	out := make([]T, len(raws))
	for i, raw := range raws {
		if err := json.Unmarshal(raw, &out[i]); err != nil {
			return nil, fmt.Errorf("decode an archived record: %w", err)
		}
	}
	return out, nil
}

// unionByName is cluster ∪ archive by object name (the cluster's copy where both
// hold one: the archiver writes and reads back before it deletes), and how many
// records only the archive holds.
func unionByName[T any, P interface {
	*T
	client.Object
}](cluster, archive []T) ([]T, int) {
	out := append([]T(nil), cluster...)
	seen := map[string]bool{}
	for i := range cluster {
		seen[P(&cluster[i]).GetName()] = true
	}
	only := 0
	for i := range archive {
		if !seen[P(&archive[i]).GetName()] {
			out = append(out, archive[i])
			only++
		}
	}
	return out, only
}

// waitArchived waits until the archiver has taken every Settled settlement out of
// the cluster (each must be in the archive), writes one archived settlement's key for
// the script to look up, then waits for a reconciliation pass that started after the
// last one left and checks that it found no discrepancy but the quarantined event:
// reconciliation must count the archive, or every archived charge would look unknown
// to it and every applied job would look unbilled.
func waitArchived(args []string) error {
	fs := flag.NewFlagSet("wait-archived", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig (required)")
	ns := fs.String("namespace", "default", "namespace of the demo's objects")
	archiveURLFile := fs.String("archive-url-file", "", "file holding the archive's PostgreSQL URL (required)")
	timeout := fs.Duration("timeout", 90*time.Second, "give up after this long")
	keyOut := fs.String("key-out", "", "write the settlement key of one settlement that left the cluster to this file")
	_ = fs.Parse(args)
	archiveURL, err := readURLFile(*archiveURLFile)
	if err != nil {
		return err
	}
	if *kubeconfig == "" || archiveURL == "" {
		return errors.New("wait-archived: -kubeconfig and -archive-url-file are required")
	}
	c, err := newClient(*kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	conn, err := connectArchive(ctx, archiveURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)

	start := time.Now()
	lastPrint := time.Time{}
	var w world
	var a archived
	var gone []hooksv1alpha1.BillingSettlement
	for {
		if w, err = readWorld(ctx, c, *ns); err != nil {
			return err
		}
		if a, err = readArchive(ctx, conn, *ns); err != nil {
			return err
		}
		inCluster := map[string]bool{}
		var waiting []string
		unconfirmed := 0
		// With the archive on, a pass confirms in its report, not on the settlement.
		var reports hooksv1alpha1.ReconciliationReportList
		if err := c.List(ctx, &reports, client.InNamespace(*ns)); err != nil {
			return err
		}
		var bps hooksv1alpha1.BillingProviderList
		if err := c.List(ctx, &bps, client.InNamespace(*ns)); err != nil {
			return err
		}
		providers := map[string]types.UID{}
		for _, bp := range bps.Items {
			providers[bp.Name] = bp.UID
		}
		for _, s := range w.settlements.Items {
			inCluster[s.Name] = true
			if s.Status.State == hooksv1alpha1.SettlementSettled {
				why := "Reconciled"
				_, _, inReport := confirmation.Find(reports.Items, providers[s.Spec.BillingProviderRef], &s)
				if !inReport && !apimeta.IsStatusConditionTrue(s.Status.Conditions, hooksv1alpha1.ConditionReconciled) {
					why = "not Reconciled yet"
					unconfirmed++
				}
				waiting = append(waiting, s.Spec.SettlementKey+" ("+why+")")
			}
		}
		gone = gone[:0]
		for _, s := range a.settlements {
			if !inCluster[s.Name] {
				gone = append(gone, s)
			}
		}
		if len(waiting) == 0 && len(gone) > 0 {
			break
		}
		if time.Since(start) > *timeout {
			return fmt.Errorf("after %s, %d Settled settlement(s) are still in the cluster: %s",
				*timeout, len(waiting), strings.Join(waiting, ", "))
		}
		if time.Since(lastPrint) >= 3*time.Second {
			fmt.Printf("  waiting (%2.0fs): %d Settled settlement(s) in the cluster (%d not confirmed by a reconciliation pass yet), %d archived and gone\n",
				time.Since(start).Seconds(), len(waiting), unconfirmed, len(gone))
			lastPrint = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	done := time.Now()
	fmt.Printf("every Settled settlement has left the cluster (%.1fs); the archive holds %d event receipts, %d job completions, %d settlements\n",
		done.Sub(start).Seconds(), len(a.events), len(a.jobs), len(a.settlements))
	fmt.Printf("still in the cluster: %d events, %d jobs, %d settlements\n",
		len(w.events.Items), len(w.jobs.Items), len(w.settlements.Items))
	sort.Slice(gone, func(i, j int) bool {
		if gone[i].Spec.JobID != gone[j].Spec.JobID {
			return gone[i].Spec.JobID < gone[j].Spec.JobID
		}
		return gone[i].Spec.SettlementKey < gone[j].Spec.SettlementKey
	})
	if *keyOut != "" {
		if err := os.WriteFile(*keyOut, []byte(gone[0].Spec.SettlementKey+"\n"), 0o600); err != nil {
			return err
		}
	}

	// A pass whose window ends (it started) after the last settlement left.
	after := done.Add(time.Second).Truncate(time.Second)
	for {
		var reports hooksv1alpha1.ReconciliationReportList
		if err := c.List(ctx, &reports, client.InNamespace(*ns)); err != nil {
			return fmt.Errorf("list reconciliation reports: %w", err)
		}
		for _, r := range reports.Items {
			if r.Status.Phase != hooksv1alpha1.ReportCompleted || r.Spec.WindowEnd.Time.Before(after) {
				continue
			}
			// A quarantine record is reported for a person to look at by design (the
			// demo's 409); anything else means a pass mistook archived records for
			// missing ones.
			var unexpected, items []string
			for _, t := range r.Status.ByType {
				if t.Type != hooksv1alpha1.DiscrepancyEventQuarantined && t.Count > 0 {
					unexpected = append(unexpected, fmt.Sprintf("%d %s", t.Count, t.Type))
				}
			}
			if len(unexpected) == 0 {
				fmt.Printf("reconciliation pass %s, after the settlements left: no discrepancy but the quarantined event (a person reviews it, by design)\n", r.Name)
				return nil
			}
			for _, d := range r.Status.Items {
				if d.Type != hooksv1alpha1.DiscrepancyEventQuarantined {
					items = append(items, strings.TrimSpace(fmt.Sprintf("%s %s %s", d.Type, d.Object, d.ProviderRef)))
				}
			}
			if len(items) > 4 {
				items = append(items[:4], "…")
			}
			return fmt.Errorf("reconciliation pass %s, after the settlements left, reports %s (does it count the archive?): %s",
				r.Name, strings.Join(unexpected, ", "), strings.Join(items, "; "))
		}
		if time.Since(done) > *timeout {
			return fmt.Errorf("no reconciliation pass completed within %s after the settlements left", *timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
