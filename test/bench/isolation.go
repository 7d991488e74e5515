package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
)

// Item 7, outbound isolation: one tenant's billing provider accepts connections and
// never answers (a tarpit), and another tenant's request→Settled latency is measured
// with and without it, in the same run, on the same manager (docs/design.md §5.4).

const (
	// isolationNamespace is the tenant whose latency is measured; its provider (the
	// fake) answers at once.
	isolationNamespace = "bench-isolation"
	// tarpitNamespace is the tenant whose provider never answers.
	tarpitNamespace = "bench-tarpit"
	// isolationGoal is the target ratio of the measured tenant's p99 with the tarpit
	// to its p99 alone (reported, never asserted).
	isolationGoal = 1.5
)

// Isolation is item 7's result.
type Isolation struct {
	// Events is how many charges of the measured tenant each measurement sends, at
	// RatePerSecond, open loop.
	Events        int     `json:"events"`
	RatePerSecond float64 `json:"ratePerSecond"`
	// TarpitCharges are sent to the tarpit's tenant before the second measurement;
	// TarpitRequestTimeoutSeconds is its BillingProvider's requestTimeout (the most
	// the CRD allows). TarpitSubmitted is how many of them were in a call when the
	// second measurement began.
	TarpitCharges               int     `json:"tarpitCharges"`
	TarpitRequestTimeoutSeconds float64 `json:"tarpitRequestTimeoutSeconds"`
	TarpitSubmitted             int     `json:"tarpitSubmittedAtStart"`
	// Alone and WithTarpit are the measured tenant's scheduled → Settled latencies.
	Alone      Percentiles `json:"alone"`
	WithTarpit Percentiles `json:"withTarpit"`
	// UnsettledAlone and UnsettledWithTarpit are its charges not settled when the wait
	// (settle-timeout) ended.
	UnsettledAlone      int `json:"unsettledAlone"`
	UnsettledWithTarpit int `json:"unsettledWithTarpit"`
	// P99Ratio is WithTarpit.P99 ÷ Alone.P99; Goal is isolationGoal, Met whether the
	// ratio is at most the goal and every charge settled.
	P99Ratio float64 `json:"p99WithTarpitToAlone"`
	Goal     float64 `json:"goal"`
	Met      bool    `json:"met"`
	// TarpitReady is the tarpit BillingProvider's Ready reason at the end.
	TarpitReady     string  `json:"tarpitReadyReason"`
	DurationSeconds float64 `json:"durationSeconds"`
}

// isolation runs item 7 on a control plane and a manager of its own.
func (b *run) isolation(ctx context.Context, bin string) error {
	cfg := b.cfg
	iso := &Isolation{Events: cfg.IsolationEvents, RatePerSecond: cfg.IsolationRate, TarpitCharges: cfg.TarpitCharges,
		TarpitRequestTimeoutSeconds: time.Minute.Seconds(), Goal: isolationGoal}
	b.res.Isolation = iso
	started := time.Now()
	defer func() { iso.DurationSeconds = round(time.Since(started).Seconds(), 1) }()

	stopCP, err := b.startControlPlane(ctx)
	if err != nil {
		return err
	}
	defer stopCP()
	billing, err := fakebilling.Start(fakebilling.Options{Token: billingToken})
	if err != nil {
		return err
	}
	defer func() { _ = billing.Close() }()
	pit, err := fakebilling.StartTarpit()
	if err != nil {
		return err
	}
	defer pit.Close()
	b.logf("item 7: starting the manager process")
	op, err := startOperator(ctx, b.env, bin, b.dir, "isolation-manager", cfg.ManagerArgs, nil)
	if err != nil {
		return err
	}
	defer op.stop()

	if err := tenant(ctx, b.k, isolationNamespace, billing.URL()); err != nil {
		return err
	}
	if err := b.waitProviderReady(ctx, op, isolationNamespace); err != nil {
		return err
	}
	t := newTracker()
	stopWatch, err := b.watch(ctx, t, isolationNamespace)
	if err != nil {
		return err
	}
	defer stopWatch()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024}, Timeout: time.Minute}
	url := endpoint(op.ReceiverURL, isolationNamespace)

	warm := b.openLoop(ctx, t, hc, url, "iso-warm", 20, 40)
	if n := t.waitAll(ctx, warm.deliveries, time.Minute); n > 0 {
		return fmt.Errorf("%d warm-up events did not settle within a minute; see %s", n, op.LogPath)
	}
	measure := func(prefix string) (Percentiles, int) {
		lr := b.openLoop(ctx, t, hc, url, prefix, cfg.IsolationRate, cfg.IsolationEvents)
		unsettled := t.waitAll(ctx, lr.deliveries, cfg.SettleTimeout)
		var lv LoadLevel
		b.summarize(t, &lv, lr)
		return lv.Settled, unsettled
	}
	b.logf("item 7: %d charges at %.0f/s, alone", cfg.IsolationEvents, cfg.IsolationRate)
	iso.Alone, iso.UnsettledAlone = measure("iso-alone")

	// The tarpit's tenant exists only from here: alone means alone.
	if err := tenant(ctx, b.k, tarpitNamespace, pit.URL(), func(bp *hooksv1alpha1.BillingProvider) {
		bp.Spec.RequestTimeout = &metav1.Duration{Duration: time.Minute}
	}); err != nil {
		return err
	}
	if err := b.waitProviderReady(ctx, op, tarpitNamespace); err != nil {
		return err
	}
	b.logf("item 7: %d charges to a provider that never answers (requestTimeout 1m)", cfg.TarpitCharges)
	pitLoop := b.openLoop(ctx, newTracker(), hc, endpoint(op.ReceiverURL, tarpitNamespace), "pit", 50, cfg.TarpitCharges)
	for _, d := range pitLoop.deliveries {
		if d.failed {
			return fmt.Errorf("a tarpit charge was not accepted; see %s", op.LogPath)
		}
	}
	// What is measured is a tarpit in the cluster, not its tenant's own deliveries
	// arriving: every tarpit charge has its settlement, and the events' delayed status
	// writes (--event-status-delay, 5s) are done, before the second measurement.
	if err := waitFor(ctx, time.Minute, "every tarpit charge's settlement, one in a call", func() (bool, error) {
		all, err := b.countState(ctx, tarpitNamespace, "")
		if err != nil {
			return false, err
		}
		iso.TarpitSubmitted, err = b.countState(ctx, tarpitNamespace, hooksv1alpha1.SettlementSubmitted)
		return all == cfg.TarpitCharges && iso.TarpitSubmitted > 0, err
	}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(6 * time.Second):
	}
	if iso.TarpitSubmitted, err = b.countState(ctx, tarpitNamespace, hooksv1alpha1.SettlementSubmitted); err != nil {
		return err
	}
	b.logf("item 7: %d tarpit charges in a call; %d charges at %.0f/s beside them", iso.TarpitSubmitted,
		cfg.IsolationEvents, cfg.IsolationRate)
	iso.WithTarpit, iso.UnsettledWithTarpit = measure("iso-tarpit")
	iso.P99Ratio = ratio(iso.WithTarpit.P99, iso.Alone.P99)
	iso.Met = iso.P99Ratio > 0 && iso.P99Ratio <= isolationGoal && iso.UnsettledAlone == 0 && iso.UnsettledWithTarpit == 0

	// The tarpit's first calls end at its requestTimeout: its BillingProvider says so then.
	_ = waitFor(ctx, 90*time.Second, "the tarpit's BillingProvider to say it does not answer", func() (bool, error) {
		var bp hooksv1alpha1.BillingProvider
		if err := b.k.Get(ctx, client.ObjectKey{Namespace: tarpitNamespace, Name: fixtures.BillingProviderName}, &bp); err != nil {
			return false, nil
		}
		for _, c := range bp.Status.Conditions {
			if c.Type == hooksv1alpha1.ConditionReady {
				iso.TarpitReady = c.Reason
			}
		}
		return iso.TarpitReady == hooksv1alpha1.ReasonProviderNotAnswering, nil
	})
	b.logf("item 7: p99 alone %.0f ms, with a tarpit %.0f ms (%.2f×, goal ≤ %.1f×); tarpit Ready reason %q",
		iso.Alone.P99, iso.WithTarpit.P99, iso.P99Ratio, isolationGoal, iso.TarpitReady)
	return op.exited()
}

// waitProviderReady waits until the WebhookProvider of ns is Ready.
func (b *run) waitProviderReady(ctx context.Context, op *operator, ns string) error {
	return waitFor(ctx, 60*time.Second, "the WebhookProvider of "+ns+" to be Ready", func() (bool, error) {
		if err := op.exited(); err != nil {
			return false, err
		}
		var p hooksv1alpha1.WebhookProvider
		if err := b.k.Get(ctx, client.ObjectKey{Namespace: ns, Name: providerName}, &p); err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == hooksv1alpha1.ConditionReady && c.Status == metav1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// countState counts the settlements of ns in state ("": all of them).
func (b *run) countState(ctx context.Context, ns string, state hooksv1alpha1.SettlementState) (int, error) {
	var l hooksv1alpha1.BillingSettlementList
	if err := b.k.List(ctx, &l, client.InNamespace(ns)); err != nil {
		return 0, err
	}
	n := 0
	for _, bs := range l.Items {
		if state == "" || bs.Status.State == state {
			n++
		}
	}
	return n, nil
}

// print prints item 7.
func (iso *Isolation) print(w io.Writer) {
	fmt.Fprintf(w, "7. OUTBOUND ISOLATION (%d charges at %s/s; beside %d charges to a provider that never answers, requestTimeout %.0fs)\tsettled p50 ms\tp99 ms\tunsettled\n",
		iso.Events, f1(iso.RatePerSecond), iso.TarpitCharges, iso.TarpitRequestTimeoutSeconds)
	fmt.Fprintf(w, "  alone\t%s\t%s\t%d\n", f1(iso.Alone.P50), f1(iso.Alone.P99), iso.UnsettledAlone)
	fmt.Fprintf(w, "  with the tarpit (%d of its charges in a call at the start)\t%s\t%s\t%d\n", iso.TarpitSubmitted,
		f1(iso.WithTarpit.P50), f1(iso.WithTarpit.P99), iso.UnsettledWithTarpit)
	fmt.Fprintf(w, "  p99 with ÷ alone\t%.2f×\tgoal ≤ %.1f×\tmet: %v\n", iso.P99Ratio, iso.Goal, iso.Met)
	fmt.Fprintf(w, "  tarpit BillingProvider Ready reason\t%s\n\n", iso.TarpitReady)
}
