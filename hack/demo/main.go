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

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: demo control-plane|wait-http|post|settle|report [flags]")
		os.Exit(2)
	}
	commands := map[string]func([]string) error{
		"control-plane": controlPlane,
		"wait-http":     waitHTTP,
		"post":          post,
		"settle":        settle,
		"report":        report,
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
		if !jobSettled[j.Status.State] {
			out = append(out, fmt.Sprintf("job %s %s", j.Spec.JobID, orNew(string(j.Status.State))))
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
	_ = fs.Parse(args)
	c, err := newClient(*kubeconfig)
	if err != nil {
		return err
	}
	ctx := context.Background()
	w, err := readWorld(ctx, c, *ns)
	if err != nil {
		return err
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
	for _, e := range w.events.Items {
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
		fmt.Sprintf("all %d accepted (2xx) events are Complete or in an explicit state", accepted),
		"events not in a final or explicit state: "+strings.Join(notFinal, ", "))
	if *quarantined >= 0 {
		check(q == *quarantined,
			fmt.Sprintf("%d conflicting reuse(s) answered 409 and kept as %d quarantine record(s), never dispatched", *quarantined, q),
			fmt.Sprintf("expected %d quarantine record(s), found %d", *quarantined, q))
	}

	var notSettled, wrongCount []string
	local := map[string]bool{}
	for _, s := range w.settlements.Items {
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
		fmt.Sprintf("all %d settlements are Settled", len(w.settlements.Items)),
		"settlements not Settled: "+strings.Join(notSettled, ", "))
	check(len(wrongCount) == 0,
		fmt.Sprintf("the provider's ledger holds exactly one charge per settlement key (%d keys, %d records)", len(keys), len(ledger.Records)),
		strings.Join(wrongCount, ", "))
	var unknown []string
	for _, k := range keys {
		if !local[k] {
			unknown = append(unknown, k)
		}
	}
	check(len(unknown) == 0, "no charge at the provider that the operator does not know about",
		"charges at the provider without a local settlement: "+strings.Join(unknown, ", "))
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
