package bench

import (
	"context"
	"net/http"
	"time"
)

// etcd key prefixes of the kinds an event leaves behind in a namespace. Custom
// resources are stored as JSON under /registry/<group>/<resource>/; built-in kinds
// (Events) as protobuf under /registry/<resource>/.
var storedKinds = []struct{ kind, prefix, encoding string }{
	{"WebhookEvent", "/registry/hooks.settlement.dev/webhookevents/", "JSON"},
	{"JobCompletion", "/registry/hooks.settlement.dev/jobcompletions/", "JSON"},
	{"BillingSettlement", "/registry/hooks.settlement.dev/billingsettlements/", "JSON"},
	{"Event", "/registry/events/", "protobuf"},
}

// cost waits until the operator stops writing, then turns the write counters and
// etcd's counters since (w0, e0) into per-event costs over `events` events, and
// reads the live objects' stored sizes.
func (b *run) cost(ctx context.Context, op *operator, w0 writeCounts, e0 etcdStats, events int) error {
	w1, err := b.quietWrites(ctx)
	if err != nil {
		return err
	}
	// CPU up to the quiet moment, before the measurements below (etcd's, the live
	// objects' sizes) add their own.
	cpu1, err := cpuSeconds(nil)
	if err != nil {
		return err
	}
	b.res.Cost.CPUMillisPerEvent = cpuPerEvent(b.cpu0, cpu1, events)
	e1, err := b.probe.etcdStats(ctx)
	if err != nil {
		return err
	}
	d := w1.since(w0)
	c := &b.res.Cost
	c.Events = events
	per := func(v float64) float64 { return round(v/float64(events), 3) }
	c.WritesPerEvent, c.RefusedWritesPerEvent = per(d.total(true)), per(d.total(false))
	c.Writes = d.perEvent(events)
	c.LiveGetsPerEvent = d.gets(events)
	c.EtcdPutsPerEvent = per(e1.Puts - e0.Puts)
	c.EtcdHistoryBytesPerEvent = round((e1.DBInUse-e0.DBInUse)/float64(events), 0)
	c.EtcdReceivedBytesPerEvent = round((e1.ReceivedBytes-e0.ReceivedBytes)/float64(events), 0)

	c.Stored = map[string]StoredKind{}
	var objects int
	for _, k := range storedKinds {
		s, err := b.probe.stored(ctx, k.prefix+latencyNamespace+"/")
		if err != nil {
			return err
		}
		if k.kind == "WebhookEvent" {
			objects = s.Keys
		}
		sk := StoredKind{Objects: s.Keys, MaxValueBytes: s.LargestItem, Encoding: k.encoding}
		if s.Keys > 0 {
			sk.MeanValueBytes = round(float64(s.ValueBytes)/float64(s.Keys), 1)
			sk.MeanKeyBytes = round(float64(s.KeyBytes)/float64(s.Keys), 1)
			sk.MeanManagedFieldsBytes = round(float64(s.ManagedFieldsBytes)/float64(s.Keys), 1)
		}
		c.Stored[k.kind] = sk
		if objects == 0 {
			continue
		}
		perEvent := float64(s.ValueBytes+s.KeyBytes) / float64(objects)
		if k.kind == "Event" {
			c.KubernetesEventBytesPerEvent = round(perEvent, 0)
		} else {
			c.StoredBytesPerEvent += perEvent
		}
	}
	c.StoredBytesPerEvent = round(c.StoredBytesPerEvent, 0)

	// The manager's reconcile counters since it started (it started with this phase).
	if body, err := get(ctx, http.DefaultClient, op.MetricsURL); err == nil {
		c.Controllers = controllerCosts(body, events)
	}
	b.logf("item 4: %.2f writes/event, %.0f stored bytes/event, %.0f history bytes/event", c.WritesPerEvent,
		c.StoredBytesPerEvent, c.EtcdHistoryBytesPerEvent)
	b.logf("item 4: live GETs/event (past the cache) %v", c.LiveGetsPerEvent)
	return nil
}

// quietWrites waits until the API server has taken no write for 3 consecutive
// seconds (bounded: a periodic write, such as a provider's status refresh, must not
// keep the run waiting) and returns its write counters then.
func (b *run) quietWrites(ctx context.Context) (writeCounts, error) {
	var w writeCounts
	last, still := -1.0, 0
	for deadline := time.Now().Add(45 * time.Second); still < 3 && time.Now().Before(deadline); {
		var err error
		if w, err = b.probe.writes(ctx); err != nil {
			return nil, err
		}
		if t := w.total(true) + w.total(false); t == last {
			still++
		} else {
			last, still = t, 0
		}
		time.Sleep(time.Second)
	}
	return w, nil
}

// levelWrites is what the events of one level cost the API server in writes,
// from counters taken while the pipeline was quiet before and after it.
func levelWrites(before, after writeCounts, events int) *LevelWrites {
	d := after.since(before)
	per := func(v float64) float64 { return round(v/float64(events), 3) }
	return &LevelWrites{Events: events, WritesPerEvent: per(d.total(true)), RefusedWritesPerEvent: per(d.total(false)),
		Writes: d.perEvent(events)}
}

// controllerCosts reads controller-runtime's reconcile counters and timings from the
// manager's metrics and divides them by events.
func controllerCosts(metrics []byte, events int) map[string]ControllerCost {
	return controllerCostsOf(parseSamples(metrics, func(n string) bool {
		return n == "controller_runtime_reconcile_total" || n == "controller_runtime_reconcile_time_seconds_sum" ||
			n == "controller_runtime_max_concurrent_reconciles"
	}), events)
}

// controllerCostsOf is controllerCosts from parsed samples (other names are ignored).
func controllerCostsOf(samples []sample, events int) map[string]ControllerCost {
	out := map[string]ControllerCost{}
	for _, s := range samples {
		switch s.name {
		case "controller_runtime_reconcile_total", "controller_runtime_reconcile_time_seconds_sum",
			"controller_runtime_max_concurrent_reconciles":
		default:
			continue
		}
		ctl := s.labels["controller"]
		cc := out[ctl]
		if cc.ReconcilesPerEvent == nil {
			cc.ReconcilesPerEvent = map[string]float64{}
		}
		switch s.name {
		case "controller_runtime_reconcile_total":
			if s.value > 0 {
				cc.ReconcilesPerEvent[s.labels["result"]] = round(s.value/float64(events), 3)
			}
		case "controller_runtime_max_concurrent_reconciles":
			cc.Workers = int(s.value)
		default:
			cc.WorkerMsPerEvent = round(s.value*1000/float64(events), 2)
		}
		out[ctl] = cc
	}
	for ctl, cc := range out {
		n := 0.0
		for _, v := range cc.ReconcilesPerEvent {
			n += v
		}
		if n > 0 {
			cc.MeanReconcileMs = round(cc.WorkerMsPerEvent/n, 2)
		}
		if cc.WorkerMsPerEvent > 0 {
			cc.MaxEventsPerSecond = round(float64(max(cc.Workers, 1))*1000/cc.WorkerMsPerEvent, 1)
		}
		out[ctl] = cc
	}
	return out
}
