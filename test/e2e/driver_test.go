//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

var jobEvent = fixtures.JobCompletedEvent

// run records what senders saw and which events the operator acknowledged.
type run struct {
	mu       sync.Mutex
	accepted map[string]string // event ID -> job ID, for every 2xx
	versions map[string]int    // job ID -> highest version acknowledged
	statuses map[int]int       // every HTTP status any sender saw, counted
	provider string
	// namespace is the tenant's namespace (the suite's ns unless a spec says).
	namespace string
	next      atomic.Int64
}

func newRun() *run {
	return &run{accepted: map[string]string{}, versions: map[string]int{}, statuses: map[int]int{}, provider: "inference", namespace: ns}
}

// deliver posts a signed event like a real provider: it retries 5xx, 429 and
// connection errors with backoff, across the live replicas, until a final answer
// or the deadline. It returns the final status (0 when the deadline passed).
func (r *run) deliver(id, jobID string, version int, body string, deadline time.Duration) int {
	end := time.Now().Add(deadline)
	wait := 100 * time.Millisecond
	for time.Now().Before(end) {
		live := liveReplicas()
		if len(live) == 0 {
			time.Sleep(wait)
			continue
		}
		rep := live[int(r.next.Add(1))%len(live)]
		resp, err := sender.Send(ctx, &http.Client{Timeout: 20 * time.Second}, sender.Delivery{
			URL: rep.receiverURL + identity.EndpointPath(r.namespace, r.provider), ID: id, Body: []byte(body),
			Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks}, Secret: []byte(swhSecret),
		})
		status := resp.Status
		if err != nil {
			status = -1 // connection refused/reset: the replica died
		}
		r.mu.Lock()
		r.statuses[status]++
		if status >= 200 && status < 300 {
			r.accepted[id] = jobID
			if version > r.versions[jobID] {
				r.versions[jobID] = version
			}
		}
		r.mu.Unlock()
		switch {
		case status >= 200 && status < 300, status == http.StatusConflict:
			return status
		case status > 0 && status < 500 && status != http.StatusTooManyRequests:
			return status
		}
		time.Sleep(wait)
		wait = min(wait*2, 2*time.Second)
	}
	return 0
}

// burst sends n new jobs with `senders` goroutines; f is called after each send (for
// fault injection at a point in the burst).
func (r *run) burst(prefix string, n, senders int, each func(i int)) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer GinkgoRecover()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				job := fmt.Sprintf("%s-%d", prefix, i)
				Expect(r.deliver("msg_"+job, job, 1, jobEvent(job, 1, i+1), 3*time.Minute)).To(Equal(http.StatusOK))
				if each != nil {
					each(i)
				}
			}
		}()
	}
	wg.Wait()
}

// checkInvariants waits for every acknowledged event to finish and then checks, and
// prints, the exactly-once invariants:
//   - every 2xx event is Complete (or in allowed's explicit states) with a Ready
//     condition that says why;
//   - the provider's ledger has exactly one charge per settlement key, and no charge
//     without an acknowledged event;
//   - every job's applied version is the highest acknowledged one, at the operator and
//     at the sink, applied once per version;
//   - no settlement is left non-final without a condition saying why.
func (r *run) checkInvariants(name string, allowed ...hooksv1alpha1.EventPhase) {
	GinkgoHelper()
	remember(r)
	r.mu.Lock()
	accepted := map[string]string{}
	for k, v := range r.accepted {
		accepted[k] = v
	}
	versions := map[string]int{}
	for k, v := range r.versions {
		versions[k] = v
	}
	statuses := fmt.Sprint(r.statuses)
	r.mu.Unlock()

	ok := map[hooksv1alpha1.EventPhase]bool{hooksv1alpha1.EventComplete: true}
	for _, p := range allowed {
		ok[p] = true
	}
	Eventually(func(g Gomega) {
		for id := range accepted {
			ev := &hooksv1alpha1.WebhookEvent{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, r.provider, id)}, ev)).To(Succeed())
			g.Expect(ok[ev.Status.Phase]).To(BeTrue(), "event %s is %s", id, ev.Status.Phase)
			c := apimeta.FindStatusCondition(ev.Status.Conditions, hooksv1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Message).NotTo(BeEmpty())
		}
	}).WithTimeout(4*time.Minute).Should(Succeed(), "%s: every acknowledged event finishes", name)

	keys := map[string]bool{}
	for _, job := range accepted {
		keys[identity.JobSettlementKey(ns, r.provider, job)] = true
	}
	charged := 0
	for _, rec := range billing.Records() {
		if !jobKeyOf(rec.SettlementKey, r.provider) || !keys[rec.SettlementKey] {
			continue
		}
		charged++
		Expect(billing.Charges(rec.SettlementKey)).To(Equal(1), "%s: one charge for %s", name, rec.SettlementKey)
	}
	for _, rec := range billing.Records() {
		if jobKeyOf(rec.SettlementKey, r.provider) {
			Expect(allAccepted(rec.SettlementKey)).To(BeTrue(), "%s: charge %s has an acknowledged event", name, rec.SettlementKey)
		}
	}
	for job, v := range versions {
		jc := &hooksv1alpha1.JobCompletion{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.JobCompletionName(r.provider, job)}, jc)).To(Succeed())
		Expect(jc.Spec.Completion.Version).To(Equal(int64(v)), "%s: job %s at its highest version", name, job)
		Expect(*jc.Progress().AppliedVersion).To(Equal(int64(v)))
		sv, _, _ := sink.Applied(job)
		Expect(sv).To(Equal(int64(v)), "%s: the sink has job %s at version %d", name, job, v)
	}
	var stls hooksv1alpha1.BillingSettlementList
	Expect(k8s.List(ctx, &stls, client.InNamespace(ns))).To(Succeed())
	stuck := 0
	for _, bs := range stls.Items {
		switch bs.Status.State {
		case hooksv1alpha1.SettlementSettled, hooksv1alpha1.SettlementFailed, hooksv1alpha1.SettlementRequiresReconciliation:
		default:
			stuck++
			c := apimeta.FindStatusCondition(bs.Status.Conditions, hooksv1alpha1.ConditionReady)
			Expect(c).NotTo(BeNil(), "%s: settlement %s says why it waits", name, bs.Name)
			Expect(c.Message).NotTo(BeEmpty())
		}
	}
	summary := fmt.Sprintf("%s: %d events acknowledged, %d jobs, %d charges at the provider (one per key), %d settlements waiting; sender saw statuses %s",
		name, len(accepted), len(versions), charged, stuck, statuses)
	AddReportEntry("invariants", summary)
	fmt.Fprintln(GinkgoWriter, "INVARIANTS OK —", summary)
}

// every accepted run so far, for "no charge without an acknowledged event".
var (
	allMu   sync.Mutex
	allKeys = map[string]bool{}
)

func remember(r *run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	allMu.Lock()
	defer allMu.Unlock()
	for _, job := range r.accepted {
		allKeys[identity.JobSettlementKey(ns, r.provider, job)] = true
	}
}

// jobKeyOf reports whether key is the settlement key of a job of provider in the
// suite's namespace.
func jobKeyOf(key, provider string) bool {
	k, ok := identity.ParseSettlementKey(key)
	return ok && k.Kind == identity.KeyKindJob && k.Namespace == ns && k.Provider == provider
}

func allAccepted(key string) bool {
	allMu.Lock()
	defer allMu.Unlock()
	return allKeys[key]
}

func sortedStatuses(m map[int]int) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
