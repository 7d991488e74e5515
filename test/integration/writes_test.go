package integration_test

import (
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// writeCounter counts the write requests (POST, PUT, PATCH, DELETE) a manager sends
// to the API server about the pipeline's records of one namespace, refused ones
// included, by method and resource ("PATCH jobcompletions/status").
type writeCounter struct {
	ns     string
	mu     sync.Mutex
	counts map[string]int
}

var countedResources = map[string]bool{"webhookevents": true, "jobcompletions": true, "billingsettlements": true}

func (c *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		switch req.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
			parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
			for i := 0; i+2 < len(parts); i++ {
				if parts[i] != "namespaces" || parts[i+1] != c.ns || !countedResources[parts[i+2]] {
					continue
				}
				what := req.Method + " " + parts[i+2]
				if i+4 < len(parts) {
					what += "/" + parts[i+4]
				}
				resp, err := rt.RoundTrip(req)
				if err != nil || resp.StatusCode >= 300 {
					// Refused (a conflict from a stale cache) or failed: it cost the API
					// server a request, but is told apart from the writes that happened.
					what += " (refused)"
				}
				c.mu.Lock()
				c.counts[what]++
				c.mu.Unlock()
				return resp, err
			}
		}
		return rt.RoundTrip(req)
	})
}

func (c *writeCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// settleTenant waits until the tenant's BillingProvider has made its first
// reconciliation passes (it makes one as soon as it is created, and the next one in
// 10 minutes): a pass that ran later would mark the event's settlement Reconciled,
// a write of its own that is not the event's.
func settleTenant(ns string) {
	GinkgoHelper()
	reports := func() int {
		var l hooksv1alpha1.ReconciliationReportList
		Expect(k8s.List(ctx, &l, client.InNamespace(ns))).To(Succeed())
		return len(l.Items)
	}
	Eventually(reports).Should(BeNumerically(">", 0))
	Consistently(reports).WithTimeout(3 * time.Second).Should(Equal(reports()))
}

var _ = Describe("the API writes of one event", func() {
	It("are six for a completed, charged job whose completion has no sink", func() {
		counter := &writeCounter{ns: "ops-writes", counts: map[string]int{}}
		mgr.stop()
		mgr = startManager(managerOptions{transport: counter.wrap})
		DeferCleanup(func() {
			mgr.stop()
			mgr = startManager()
		})
		ns := tenantIn(counter.ns, billingToken)
		settleTenant(ns)
		sendOK(ns, "msg_writes", jobEvent("job-writes", 1, 700))
		Eventually(eventPhase(ns, "msg_writes")).Should(Equal(hooksv1alpha1.EventComplete))
		Expect(settlementState(ns, "job-writes")()).To(Equal(hooksv1alpha1.SettlementSettled))
		// Nothing more is coming once the event is Complete.
		Consistently(counter.snapshot).WithTimeout(3 * time.Second).Should(Equal(counter.snapshot()))

		counts, refused := counter.snapshot(), map[string]int{}
		for what, n := range counts {
			if strings.HasSuffix(what, " (refused)") {
				refused[what] = n
				delete(counts, what)
			}
		}
		// A refused write is a stale cache's conflict, redone: reported, not the subject.
		AddReportEntry("refused writes", refused)
		Expect(counts).To(Equal(map[string]int{
			"POST webhookevents":              1, // the receiver stores the delivery
			"POST jobcompletions":             1, // the event controller: the job, applied by its creation
			"POST billingsettlements":         1, // the event controller: the charge
			"PATCH billingsettlements/status": 2, // the bracket before the call, and its result
			"PATCH webhookevents/status":      1, // the event's outcome, once
		}), "refused: %v", refused)

		// Nothing downstream reads it differently: the job is applied, the event
		// mirrors it as such, and the charge went out once.
		jc := jobOf(ns, "job-writes")
		Expect(jc.Status).To(Equal(hooksv1alpha1.JobCompletionStatus{}), "no status was written")
		Expect(jc.Progress().State).To(Equal(hooksv1alpha1.JobCompletionApplied))
		Expect(*jc.Progress().AppliedVersion).To(Equal(int64(1)))
		Expect(jc.Progress().AppliedAt.Time).To(Equal(jc.CreationTimestamp.Time))
		ev := event(ns, "msg_writes")
		Expect(ev.Status.Operations).To(ContainElement(SatisfyAll(
			HaveField("Type", hooksv1alpha1.OperationJobCompletion), HaveField("Outcome", hooksv1alpha1.OutcomeCreated),
			HaveField("State", string(hooksv1alpha1.JobCompletionApplied)))))
		Expect(billing.Charges(key(ns, "job-writes"))).To(Equal(1))
	})
})
