package main

// The platforms variant (DEMO_BILLING=Lago|Metronome|OpenMeter|platforms, hack/demo/platforms.sh):
// after the operator settled a tenant's jobs through a usage-billing platform's fake,
// platform-report prints the settlements and the platform's books and checks that each
// settlement key was billed exactly once there.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// platformReport prints one tenant's jobs and settlements next to the platform fake's
// books (GET /_admin/effects: each idempotency key's billed events) and checks: every
// job Applied, the expected number of settlements, each Settled, each key billed
// exactly once, and nothing billed that the operator does not know about.
func platformReport(args []string) error {
	fs := flag.NewFlagSet("platform-report", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig (required)")
	ns := fs.String("namespace", "", "the platform tenant's namespace (required)")
	platform := fs.String("platform", "", "the BillingProvider type, for the headings (required)")
	effectsURL := fs.String("effects-url", "", "the fake's GET /_admin/effects (required)")
	settlements := fs.Int("expect-settlements", -1, "number of settlements expected (one per charged job); -1 = do not check")
	_ = fs.Parse(args)
	if *kubeconfig == "" || *ns == "" || *platform == "" || *effectsURL == "" {
		return errors.New("platform-report: -kubeconfig, -namespace, -platform and -effects-url are required")
	}
	c, err := newClient(*kubeconfig)
	if err != nil {
		return err
	}
	w, err := readWorld(context.Background(), c, *ns)
	if err != nil {
		return err
	}
	books, err := fetchEffects(*effectsURL)
	if err != nil {
		return err
	}

	// A job with no sink is applied by its record's creation and its status stays
	// empty (docs/design.md §6.2): its state is read through Progress, as every reader must.
	jobState := map[string]string{}
	for _, j := range w.jobs.Items {
		jobState[j.Spec.JobID] = orNew(string(j.Progress().State))
	}
	ss := w.settlements.Items
	sort.Slice(ss, func(i, j int) bool { return ss[i].Spec.JobID < ss[j].Spec.JobID })
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "JOB\tJOB STATE\tSETTLEMENT STATE\tEVENTS IN %s\tATTEMPTS\tCUSTOMER\tUSAGE\tSETTLEMENT\tPROVIDER REF\n", strings.ToUpper(*platform))
	for _, s := range ss {
		usage := ""
		if u := s.Spec.Usage; u != nil {
			usage = u.Quantity + " " + u.Meter
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", s.Spec.JobID, orNone(jobState[s.Spec.JobID]),
			orNew(string(s.Status.State)), books[s.Spec.IdempotencyKey], s.Status.Attempts, s.Spec.Customer, usage,
			s.Name, orNone(s.Status.ProviderRef))
	}
	_ = tw.Flush()
	fmt.Printf("\n%s's books (GET %s), billed events per idempotency key:\n", *platform, *effectsURL)
	keys := make([]string, 0, len(books))
	for k := range books {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	tw = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	for _, k := range keys {
		fmt.Fprintf(tw, "  %s\t%d\n", k, books[k])
	}
	_ = tw.Flush()
	if len(keys) == 0 {
		fmt.Println("  (nothing billed)")
	}

	var broken []string
	check := func(ok bool, pass, fail string) {
		mark, msg := "ok  ", pass
		if !ok {
			mark, msg = "FAIL", fail
			broken = append(broken, fail)
		}
		fmt.Printf("  [%s] %s\n", mark, msg)
	}
	fmt.Println()
	fmt.Printf("invariants (%s, namespace %s):\n", *platform, *ns)

	var notApplied []string
	for _, j := range w.jobs.Items {
		if st := j.Progress().State; st != hooksv1alpha1.JobCompletionApplied {
			notApplied = append(notApplied, fmt.Sprintf("%s v%d is %s", j.Spec.JobID, j.Spec.Completion.Version, orNew(string(st))))
		}
	}
	check(len(w.jobs.Items) > 0 && len(notApplied) == 0,
		fmt.Sprintf("all %d jobs are Applied, once each whatever the deliveries", len(w.jobs.Items)),
		"jobs not Applied: "+orNone(strings.Join(notApplied, ", ")))
	if *settlements >= 0 {
		check(len(ss) == *settlements,
			fmt.Sprintf("%d settlements, one per charged job (the duplicate and the redelivery made none)", len(ss)),
			fmt.Sprintf("expected %d settlements, found %d", *settlements, len(ss)))
	}
	var notSettled, wrong []string
	local := map[string]bool{}
	for _, s := range ss {
		local[s.Spec.IdempotencyKey] = true
		if s.Status.State != hooksv1alpha1.SettlementSettled {
			notSettled = append(notSettled, fmt.Sprintf("%s is %s", s.Spec.SettlementKey, orNew(string(s.Status.State))))
		}
		if n := books[s.Spec.IdempotencyKey]; n != 1 {
			wrong = append(wrong, fmt.Sprintf("%s has %d events in %s's books", s.Spec.SettlementKey, n, *platform))
		}
	}
	check(len(ss) > 0 && len(notSettled) == 0,
		fmt.Sprintf("all %d settlements are Settled", len(ss)),
		"settlements not Settled: "+orNone(strings.Join(notSettled, ", ")))
	check(len(wrong) == 0,
		fmt.Sprintf("%s's books hold exactly one billed event per settlement key (%d keys)", *platform, len(ss)),
		strings.Join(wrong, ", "))
	var unknown []string
	for _, k := range keys {
		if !local[k] {
			unknown = append(unknown, k)
		}
	}
	check(len(unknown) == 0,
		fmt.Sprintf("nothing in %s's books that the operator does not know about", *platform),
		fmt.Sprintf("billed in %s without a settlement in %s: %s", *platform, *ns, strings.Join(unknown, ", ")))
	if len(broken) > 0 {
		return fmt.Errorf("%s: %d invariant(s) broken", *platform, len(broken))
	}
	return nil
}

// fetchEffects reads a platform fake's books: GET /_admin/effects, a JSON object
// from each idempotency key to the number of effects the platform holds for it.
func fetchEffects(url string) (map[string]int, error) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return nil, fmt.Errorf("read the platform's books: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read the platform's books: GET %s answered %d", url, resp.StatusCode)
	}
	books := map[string]int{}
	if err := json.NewDecoder(resp.Body).Decode(&books); err != nil {
		return nil, fmt.Errorf("decode the platform's books from %s: %w", url, err)
	}
	return books, nil
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
