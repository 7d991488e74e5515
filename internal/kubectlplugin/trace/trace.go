// Package trace is `kubectl settlement trace`: the whole story of an event, a job or a
// settlement (the WebhookEvents, the JobCompletion, the BillingSettlements with the
// refunds and voids that reverse them) followed through the links the operator
// writes, from the cluster and, when one is configured, from the archive. It only
// reads.
package trace

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/archivedb"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
)

const traceHelp = `Print the whole story of an event, a job or a settlement: the WebhookEvent(s), the
JobCompletion, the BillingSettlement(s) including refunds and voids that reverse them,
and the provider's reference, with states, conditions and timestamps. Each record says
whether it came from the cluster or from the archive.

Usage:
  kubectl settlement trace <event-id|job-id|settlement-key|idempotency-key|object-name>
      [-n NS] [--provider NAME] [--database-url URL | --from-secret NS/NAME[/KEY]]

The reference is tried as each of these, with the names derived as the operator derives
them (kubectl settlement keys prints them): an object name; an event ID and a job ID of
each webhook provider; a settlement key; then an idempotency key or settlement key of any
settlement in the namespace; then, when an archive is configured, everything the archive
holds under it. When nothing matches, the message lists what was tried.
` + kube.Help + `
Archive (optional; the same as for 'archive get'):
  --database-url URL, --from-secret NS/NAME[/KEY], or SETTLEMENT_ARCHIVE_URL
  Records no longer in the cluster are read from the archive, read-only.

Examples:
  kubectl settlement trace job-7781 -n tenant-a
  kubectl settlement trace evt_01HZX -n tenant-a --provider inference --from-secret ops/archive-db
`

// source says where a record was read.
type source struct {
	archived   bool
	archivedAt time.Time
}

// String is where the record came from, as its heading in the trace says it.
func (s source) String() string {
	if s.archived {
		return "from the archive, archived " + ts(s.archivedAt)
	}
	return "from the cluster"
}

type tracedEvent struct {
	obj hooksv1alpha1.WebhookEvent
	src source
}
type tracedJob struct {
	obj hooksv1alpha1.JobCompletion
	src source
}
type tracedSettlement struct {
	obj hooksv1alpha1.BillingSettlement
	src source
}

// maxTraced bounds the records one trace follows, so a pathological graph (an event
// with 64 settlements, each refunded many times) still ends.
const maxTraced = 200

// tracer collects the records of one story.
type tracer struct {
	cl    client.Client
	store *archive.Store // nil without an archive
	ns    string

	events      map[string]*tracedEvent
	jobs        map[string]*tracedJob
	settlements map[string]*tracedSettlement
	missing     []string // linked records found nowhere
	seen        map[string]bool
	queue       []string // "kind/name" still to read
}

// Run is `kubectl settlement trace` with its arguments (after "trace"): it finds what
// the reference names, follows every link, and prints the story. red learns the
// archive's URL when an archive is read, so that no message shows it.
func Run(ctx context.Context, c cmdline.Env, red *archivedb.Redactor, args []string) error {
	const cmd = "trace"
	cf, ref, ns, cl, err := kube.Start(c.Getenv, cmd, args, true, traceHelp,
		"an event ID, job ID, settlement key, idempotency key or object name")
	if err != nil {
		return err
	}
	t := &tracer{cl: cl, ns: ns, events: map[string]*tracedEvent{}, jobs: map[string]*tracedJob{},
		settlements: map[string]*tracedSettlement{}, seen: map[string]bool{}}
	if archiveConfigured(cf, c.Getenv) {
		store, err := archivedb.Open(ctx, cmd, &cf.Common, c.Getenv, red)
		if err != nil {
			return err
		}
		defer store.Close()
		t.store = store
	}
	providers, err := kube.WebhookProviders(ctx, cl, ns, cf.Provider)
	if err != nil {
		return err
	}
	matched, tried, err := t.resolve(ctx, ref, providers)
	if err != nil {
		return err
	}
	if len(matched) == 0 {
		where := "the cluster"
		if t.store == nil {
			where += " (no archive configured: records archived after they finished are not searched; give --from-secret or --database-url)"
		} else {
			where += " and the archive"
		}
		return fmt.Errorf("nothing in namespace %q matches %q in %s. Tried:\n  - %s", ns, ref, where, strings.Join(tried, "\n  - "))
	}
	if err := t.follow(ctx); err != nil {
		return err
	}
	w := bufio.NewWriter(c.Stdout)
	fmt.Fprintf(w, "Trace of %q in namespace %s: %s\n", ref, ns, strings.Join(matched, "; "))
	t.print(w)
	return w.Flush()
}

// archiveConfigured reports whether trace should read the archive too: a flag, or the
// environment variable, names one.
func archiveConfigured(cf *kube.Flags, env func(string) string) bool {
	return cf.Common.DatabaseURL != "" || cf.Common.FromSecret != "" || env(archivedb.EnvArchiveURL) != ""
}

// resolve tries every reading of ref and queues what matches. matched says which
// readings matched, tried every reading looked for.
func (t *tracer) resolve(ctx context.Context, ref string, providers []string) (matched, tried []string, err error) {
	check := func(kind, name, reading string, ok func() bool) error {
		tried = append(tried, fmt.Sprintf("%s %s (%s)", kind, name, reading))
		found, err := t.read(ctx, kind, name)
		if err != nil {
			return err
		}
		if found && (ok == nil || ok()) {
			matched = append(matched, reading+" → "+kind+" "+name)
			t.enqueue(kind, name)
		}
		return nil
	}
	for _, kind := range []string{kindEvent, kindJob, kindSettlement} {
		if err := check(kind, ref, "object name", nil); err != nil {
			return nil, nil, err
		}
	}
	for _, p := range providers {
		if err := check(kindEvent, identity.EventName(t.ns, p, ref), "event ID of webhook provider "+p, func() bool {
			return t.events[identity.EventName(t.ns, p, ref)].obj.Spec.EventID == ref
		}); err != nil {
			return nil, nil, err
		}
		jcName := identity.JobCompletionName(p, ref)
		if err := check(kindJob, jcName, "job ID of webhook provider "+p, func() bool {
			return t.jobs[jcName].obj.Spec.JobID == ref
		}); err != nil {
			return nil, nil, err
		}
		stlName := identity.SettlementNameFor(p, identity.JobSettlementKey(t.ns, p, ref))
		if err := check(kindSettlement, stlName, "job ID of webhook provider "+p, func() bool {
			return t.settlements[stlName].obj.Spec.JobID == ref
		}); err != nil {
			return nil, nil, err
		}
		if _, structured := identity.ParseSettlementKey(ref); !structured {
			name := identity.SettlementName(p, ref)
			if err := check(kindSettlement, name, "settlement key, named for webhook provider "+p, func() bool {
				return t.settlements[name].obj.Spec.SettlementKey == ref
			}); err != nil {
				return nil, nil, err
			}
		}
	}
	if k, ok := identity.ParseSettlementKey(ref); ok {
		name := identity.SettlementNameFor(k.Provider, ref)
		if err := check(kindSettlement, name, "settlement key", func() bool {
			key := t.settlements[name].obj.Spec.SettlementKey
			return key == ref || key == k.LegacyKey()
		}); err != nil {
			return nil, nil, err
		}
	}
	if len(matched) == 0 {
		tried = append(tried, "every BillingSettlement of the namespace whose settlement key or idempotency key is the reference")
		found, err := kube.FindSettlements(ctx, t.cl, t.ns, func(bs *hooksv1alpha1.BillingSettlement) bool {
			return bs.Spec.SettlementKey == ref || bs.Spec.IdempotencyKey == ref
		})
		if err != nil {
			return nil, nil, err
		}
		for i := range found {
			bs := found[i]
			t.settlements[bs.Name] = &tracedSettlement{obj: bs}
			t.seen[kindSettlement+"/"+bs.Name] = true
			matched = append(matched, "settlement or idempotency key → BillingSettlement "+bs.Name)
			t.enqueue(kindSettlement, bs.Name)
		}
	}
	if len(matched) == 0 && t.store != nil {
		tried = append(tried, "the archive: settlement key, idempotency key, job ID, event ID or name")
		f, err := t.store.Find(ctx, t.ns, ref)
		if err != nil {
			return nil, nil, fmt.Errorf("read the archive: %w", err)
		}
		t.addArchived(f)
		for _, s := range f.Settlements {
			matched = append(matched, "archived BillingSettlement "+s.Object.Name)
			t.enqueue(kindSettlement, s.Object.Name)
		}
		for _, j := range f.Jobs {
			matched = append(matched, "archived JobCompletion "+j.Object.Name)
			t.enqueue(kindJob, j.Object.Name)
		}
		for _, e := range f.Events {
			matched = append(matched, "archived WebhookEvent "+e.Object.Name)
			t.enqueue(kindEvent, e.Object.Name)
		}
		matched = dedupe(matched)
	}
	return matched, tried, nil
}

const (
	kindEvent      = "WebhookEvent"
	kindJob        = "JobCompletion"
	kindSettlement = "BillingSettlement"
)

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func (t *tracer) enqueue(kind, name string) {
	if name != "" && len(t.queue) < maxTraced {
		t.queue = append(t.queue, kind+"/"+name)
	}
}

// read reads one record, from the cluster, else from the archive; false when it is in
// neither. A record read once is not read again.
func (t *tracer) read(ctx context.Context, kind, name string) (bool, error) {
	key := kind + "/" + name
	if t.seen[key] {
		return t.has(kind, name), nil
	}
	t.seen[key] = true
	var err error
	var ok bool
	switch kind {
	case kindEvent:
		var o hooksv1alpha1.WebhookEvent
		if ok, err = kube.GetIfExists(ctx, t.cl, t.ns, name, &o); ok {
			t.events[name] = &tracedEvent{obj: o}
		}
	case kindJob:
		var o hooksv1alpha1.JobCompletion
		if ok, err = kube.GetIfExists(ctx, t.cl, t.ns, name, &o); ok {
			t.jobs[name] = &tracedJob{obj: o}
		}
	case kindSettlement:
		var o hooksv1alpha1.BillingSettlement
		if ok, err = kube.GetIfExists(ctx, t.cl, t.ns, name, &o); ok {
			t.settlements[name] = &tracedSettlement{obj: o}
		}
	}
	if err != nil || ok || t.store == nil {
		return ok, err
	}
	f, err := t.store.Find(ctx, t.ns, name)
	if err != nil {
		return false, fmt.Errorf("read the archive: %w", err)
	}
	// Find also matches other columns (a job ID that happens to be this name): keep
	// only the record of this kind and name.
	var only archive.Found
	for _, s := range f.Settlements {
		if kind == kindSettlement && s.Object.Name == name {
			only.Settlements = append(only.Settlements, s)
		}
	}
	for _, j := range f.Jobs {
		if kind == kindJob && j.Object.Name == name {
			only.Jobs = append(only.Jobs, j)
		}
	}
	for _, e := range f.Events {
		if kind == kindEvent && e.Object.Name == name {
			only.Events = append(only.Events, e)
		}
	}
	t.addArchived(only)
	return t.has(kind, name), nil
}

func (t *tracer) has(kind, name string) bool {
	switch kind {
	case kindEvent:
		return t.events[name] != nil
	case kindJob:
		return t.jobs[name] != nil
	}
	return t.settlements[name] != nil
}

// addArchived keeps archived records the cluster does not hold; of a job's archived
// versions, the highest.
func (t *tracer) addArchived(f archive.Found) {
	for _, s := range f.Settlements {
		if t.settlements[s.Object.Name] == nil {
			t.settlements[s.Object.Name] = &tracedSettlement{obj: s.Object, src: source{archived: true, archivedAt: s.ArchivedAt}}
			t.seen[kindSettlement+"/"+s.Object.Name] = true
		}
	}
	for _, j := range f.Jobs {
		cur := t.jobs[j.Object.Name]
		if cur == nil || (cur.src.archived && j.Object.Spec.Completion.Version > cur.obj.Spec.Completion.Version) {
			t.jobs[j.Object.Name] = &tracedJob{obj: j.Object, src: source{archived: true, archivedAt: j.ArchivedAt}}
			t.seen[kindJob+"/"+j.Object.Name] = true
		}
	}
	for _, e := range f.Events {
		if t.events[e.Object.Name] == nil {
			t.events[e.Object.Name] = &tracedEvent{obj: e.Object, src: source{archived: true, archivedAt: e.ArchivedAt}}
			t.seen[kindEvent+"/"+e.Object.Name] = true
		}
	}
}

// follow reads every record linked to the queued ones: an event's children, a job's
// events and settlements, a settlement's event, job, the charge it reverses and the
// compensations that reverse it. Links are the spec fields and status lists the
// operator writes (docs/design.md §3 Links), never ownerReferences.
func (t *tracer) follow(ctx context.Context) error {
	done := map[string]bool{}
	for len(t.queue) > 0 {
		key := t.queue[0]
		t.queue = t.queue[1:]
		if done[key] || len(done) >= maxTraced {
			continue
		}
		done[key] = true
		kind, name, _ := strings.Cut(key, "/")
		ok, err := t.read(ctx, kind, name)
		if err != nil {
			return err
		}
		if !ok {
			t.missing = append(t.missing, kind+" "+name)
			continue
		}
		switch kind {
		case kindEvent:
			ev := &t.events[name].obj
			for _, op := range ev.Status.Operations {
				t.enqueue(string(op.Type), op.Child)
			}
			for _, jf := range ev.Spec.JobCompletions {
				t.enqueue(kindJob, identity.JobCompletionName(ev.Spec.Provider, jf.JobID))
			}
		case kindJob:
			jc := &t.jobs[name].obj
			t.enqueue(kindEvent, jc.Spec.Completion.SourceEvent)
			for _, e := range jc.Progress().SourceEvents {
				t.enqueue(kindEvent, e)
			}
			t.enqueue(kindSettlement, identity.SettlementNameFor(jc.Spec.Provider, identity.JobSettlementKey(t.ns, jc.Spec.Provider, jc.Spec.JobID)))
			if !t.jobs[name].src.archived {
				// Other settlements of the job (keyFrom routes) carry its label.
				var list hooksv1alpha1.BillingSettlementList
				if err := t.cl.List(ctx, &list, client.InNamespace(t.ns), client.MatchingLabels{
					hooksv1alpha1.LabelJob: identity.Hash32(jc.Spec.JobID), hooksv1alpha1.LabelProvider: jc.Spec.Provider}); err == nil {
					for _, bs := range list.Items {
						t.enqueue(kindSettlement, bs.Name)
					}
				}
			}
		case kindSettlement:
			bs := &t.settlements[name].obj
			t.enqueue(kindEvent, bs.Spec.SourceEvent)
			if bs.Spec.JobID != "" && bs.Spec.WebhookProvider != "" {
				t.enqueue(kindJob, identity.JobCompletionName(bs.Spec.WebhookProvider, bs.Spec.JobID))
			}
			t.enqueue(kindSettlement, bs.Spec.Reverses)
			for _, r := range bs.Status.ReversedBy {
				t.enqueue(kindSettlement, r)
			}
		}
	}
	return nil
}

func (t *tracer) print(w io.Writer) {
	evs := make([]*tracedEvent, 0, len(t.events))
	for _, e := range t.events {
		evs = append(evs, e)
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].obj.Spec.ReceivedAt.Before(&evs[j].obj.Spec.ReceivedAt) })
	for _, e := range evs {
		ev := &e.obj
		fmt.Fprintf(w, "\nWebhookEvent %s (%s)\n", ev.Name, e.src)
		kv(w, "provider", ev.Spec.Provider, "event ID", ev.Spec.EventID, "type", ev.Spec.EventType)
		kv(w, "received", ts(ev.Spec.ReceivedAt.Time), "phase", string(ev.Status.Phase))
		for _, op := range ev.Status.Operations {
			line := fmt.Sprintf("%s %s: %s", op.Type, op.Child, op.Outcome)
			if op.State != "" {
				line += ", " + op.State
			}
			if op.Message != "" {
				line += " (" + op.Message + ")"
			}
			fmt.Fprintf(w, "  operation  %s\n", line)
		}
		conditions(w, ev.Status.Conditions)
	}
	jobs := make([]*tracedJob, 0, len(t.jobs))
	for _, j := range t.jobs {
		jobs = append(jobs, j)
	}
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].obj.Name < jobs[j].obj.Name })
	for _, j := range jobs {
		jc := &j.obj
		fmt.Fprintf(w, "\nJobCompletion %s (%s)\n", jc.Name, j.src)
		kv(w, "provider", jc.Spec.Provider, "job ID", jc.Spec.JobID)
		kv(w, "completion", fmt.Sprintf("version %d %s", jc.Spec.Completion.Version, jc.Spec.Completion.State),
			"completed", optTS(jc.Spec.Completion.CompletedAt), "source event", jc.Spec.Completion.SourceEvent)
		applied := ""
		st := jc.Progress() // a job without a sink is applied by its creation, no status written
		if st.AppliedVersion != nil {
			applied = fmt.Sprintf("version %d at %s", *st.AppliedVersion, optTS(st.AppliedAt))
		}
		kv(w, "state", string(st.State), "applied", applied, "last error", st.LastError)
		conditions(w, st.Conditions)
	}
	stls := make([]*tracedSettlement, 0, len(t.settlements))
	for _, s := range t.settlements {
		stls = append(stls, s)
	}
	// Charges first, then the compensations, each by creation.
	sort.Slice(stls, func(i, j int) bool {
		a, b := &stls[i].obj, &stls[j].obj
		if (a.Spec.Reverses == "") != (b.Spec.Reverses == "") {
			return a.Spec.Reverses == ""
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	for _, s := range stls {
		bs := &s.obj
		typ := string(bs.Spec.Type)
		if typ == "" {
			typ = string(hooksv1alpha1.SettlementCharge)
		}
		fmt.Fprintf(w, "\nBillingSettlement %s: %s (%s)\n", bs.Name, typ, s.src)
		if bs.Spec.Reverses != "" {
			kv(w, "reverses", bs.Spec.Reverses)
		}
		kv(w, "customer", bs.Spec.Customer, "charge", charge(bs), "billing provider", bs.Spec.BillingProviderRef)
		kv(w, "settlement key", bs.Spec.SettlementKey)
		kv(w, "idempotency key", bs.Spec.IdempotencyKey)
		kv(w, "state", string(bs.Status.State), "exposure", string(bs.Status.Exposure), "attempts", fmt.Sprint(bs.Status.Attempts))
		kv(w, "provider ref", bs.Status.ProviderRef, "provider status", bs.Status.ProviderStatus)
		kv(w, "created", ts(bs.CreationTimestamp.Time), "first submitted", optTS(bs.Status.FirstSubmittedAt),
			"settled", optTS(bs.Status.SettledAt), "next attempt", optTS(bs.Status.NextAttemptAt))
		if st := bs.Status.SentTo; st != nil {
			kv(w, "sent to", st.Endpoint)
		}
		if e := bs.Status.LastError; e != nil {
			kv(w, "last error", strings.TrimSpace(e.Class+" "+e.Code))
		}
		if d := bs.Status.Disagreement; d != nil {
			kv(w, "disagreement", fmt.Sprintf("%s (field %s)", d.Reason, d.Field))
		}
		if r := bs.Status.Replay; r != nil {
			kv(w, "replays", fmt.Sprintf("%d, last %q at %s", r.Count, r.LastToken, optTS(r.LastAt)))
		}
		if len(bs.Status.ReversedBy) > 0 {
			kv(w, "reversed by", strings.Join(bs.Status.ReversedBy, ", "))
		}
		conditions(w, bs.Status.Conditions)
	}
	if len(t.missing) > 0 {
		sort.Strings(t.missing)
		where := "the cluster"
		if t.store != nil {
			where += " or the archive"
		} else {
			where += " (no archive configured)"
		}
		fmt.Fprintf(w, "\nLinked but not found in %s:\n", where)
		for _, m := range t.missing {
			fmt.Fprintf(w, "  %s\n", m)
		}
	}
}

// kv prints "  key  value" pairs on one line, leaving out empty values.
func kv(w io.Writer, pairs ...string) {
	var parts []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			parts = append(parts, pairs[i]+": "+pairs[i+1])
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "  %s\n", strings.Join(parts, "   "))
	}
}

func conditions(w io.Writer, cs []metav1.Condition) {
	for _, c := range cs {
		fmt.Fprintf(w, "  condition  %s=%s  %s  %s  (since %s)\n", c.Type, c.Status, c.Reason, c.Message, ts(c.LastTransitionTime.Time))
	}
}

func charge(bs *hooksv1alpha1.BillingSettlement) string {
	if bs.Status.Charge != "" {
		return bs.Status.Charge
	}
	var parts []string
	if a := bs.Spec.Amount; a != nil {
		parts = append(parts, fmt.Sprintf("%d %s (minor units)", a.Minor, a.Currency))
	}
	if u := bs.Spec.Usage; u != nil {
		parts = append(parts, strings.TrimSpace(u.Quantity+" "+u.Unit)+" of "+u.Meter)
	}
	return strings.Join(parts, ", ")
}

func ts(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func optTS(t *metav1.Time) string {
	if t == nil {
		return ""
	}
	return ts(t.Time)
}
