package integration_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/controllers/billingsettlement"
	billingapi "github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
	"github.com/settlement-operator/settlement-operator/internal/providerclient"
)

// Two processes guarding the compensations of one charge: two replicas without leader
// election, a rolling update's surge pod, or two deployments whose --watch-namespaces
// overlap. Each has its own in-process lock, so only what they write to the API server
// can keep them from both passing the guard (docs/design.md §16).

// laneLabel gives each of the two managers below its own compensation: each caches only
// the settlements of its lane, as two replicas that each picked one of them would.
const laneLabel = "test.settlement.dev/lane"

// guardLists counts the live lists of settlements (the compensation guard's read) one
// manager made.
type guardLists struct {
	client.Reader
	n atomic.Int32
}

func (g *guardLists) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	err := g.Reader.List(ctx, list, opts...)
	if _, ok := list.(*hooksv1alpha1.BillingSettlementList); ok && err == nil {
		g.n.Add(1)
	}
	return err
}

// bracketAfterOtherGuard holds a compensation's first submission bracket (the status
// write that makes it "sent" for every other guard) until the other manager has run its
// guard's read at least once: the widest window two processes can have, made certain.
type bracketAfterOtherGuard struct {
	client.Client
	other *guardLists
}

func (b *bracketAfterOtherGuard) Status() client.SubResourceWriter {
	return &bracketStatus{SubResourceWriter: b.Client.Status(), other: b.other}
}

type bracketStatus struct {
	client.SubResourceWriter
	other *guardLists
}

func (b *bracketStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if bs, ok := obj.(*hooksv1alpha1.BillingSettlement); ok && bs.Spec.Reverses != "" && bs.Status.Attempts == 1 && bs.Status.SentTo != nil {
		deadline := time.Now().Add(20 * time.Second)
		for b.other.n.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return b.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// startLaneManager starts a manager with only the settlement controller, caching only
// the settlements of its lane; its guard's reads are counted in mine, and its brackets
// wait for theirs.
func startLaneManager(lane string, mine, theirs *guardLists) {
	GinkgoHelper()
	m, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&hooksv1alpha1.BillingSettlement{}: {Label: labels.SelectorFromSet(labels.Set{laneLabel: lane})},
		}},
	})
	Expect(err).NotTo(HaveOccurred())
	mine.Reader = m.GetAPIReader()
	Expect((&billingsettlement.Reconciler{Client: &bracketAfterOtherGuard{Client: m.GetClient(), other: theirs},
		NewClient: func(s adapters.Settings) (billingapi.Client, error) {
			c, err := adapters.New(s)
			return cancelsSettled{c}, err
		},
		APIReader: mine, Recorder: m.GetEventRecorder("billingsettlement-" + lane), Health: providerclient.NewHealth(),
		CredentialRecheckInterval: time.Second}).SetupWithManager(m)).To(Succeed())
	mctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(m.Start(mctx)).To(Succeed())
	}()
	DeferCleanup(func() { stop(); Eventually(done).WithTimeout(time.Minute).Should(BeClosed()) })
}

// cancelsSettled is the fake provider as one that can still cancel a settled charge
// (Stripe, billing.VoidsSettled): then a Void and a Refund of one settled charge are
// each allowed alone, and only the guard's exclusivity keeps them from both going.
type cancelsSettled struct{ billingapi.Client }

func (cancelsSettled) VoidsSettled() bool { return true }

// compensationsAt lists what the provider holds against the charge with settlement key
// orig, by type.
func compensationsAt(orig string) func() []string {
	return func() []string {
		var out []string
		for _, r := range billing.Records() {
			if r.Type != billingapi.TypeCharge && strings.HasPrefix(r.SettlementKey, orig) {
				out = append(out, r.Type)
			}
		}
		return out
	}
}

var _ = Describe("the compensation guard across processes", func() {
	It("never sends a Void and a Refund of one charge from two managers: one goes, the other is held", func() {
		ns := newTenant()
		orig := handMade(ns, "race/charge", "cus_1", 1000, "USD")
		settleByHand(orig) // by the suite's manager, which then gives way to the two below
		mgr.stop()
		DeferCleanup(func() { mgr = startManager() })

		var lanes [2]guardLists
		startLaneManager("1", &lanes[0], &lanes[1])
		startLaneManager("2", &lanes[1], &lanes[0])

		void := compensation(ns, "race/void", hooksv1alpha1.SettlementVoid, orig, "cus_1", 1000, "USD")
		void.Labels = map[string]string{laneLabel: "1"}
		refund := compensation(ns, "race/refund", hooksv1alpha1.SettlementRefund, orig, "cus_1", 600, "USD")
		refund.Labels = map[string]string{laneLabel: "2"}
		Expect(k8s.Create(ctx, void)).To(Succeed())
		Expect(k8s.Create(ctx, refund)).To(Succeed())

		// One of them reaches the provider, the other is held; never both.
		Eventually(compensationsAt("race/")).WithTimeout(time.Minute).ShouldNot(BeEmpty(), func() string {
			return fmt.Sprintf("void: %+v\nrefund: %+v\nprovider: %+v", get(void).Status.Conditions, get(refund).Status.Conditions, billing.Records())
		})
		Consistently(compensationsAt("race/")).WithTimeout(5*time.Second).Should(HaveLen(1), "a Void and a Refund of one charge both reached the provider")
		states := []hooksv1alpha1.SettlementState{get(void).Status.State, get(refund).Status.State}
		Expect(states).To(ConsistOf(hooksv1alpha1.SettlementSettled, hooksv1alpha1.SettlementPending))
		for _, bs := range []*hooksv1alpha1.BillingSettlement{void, refund} {
			if get(bs).Status.State == hooksv1alpha1.SettlementPending {
				Expect(readyReason(bs)()).To(Equal(hooksv1alpha1.ReasonCompensationNotAllowed))
			}
		}
	})
})
