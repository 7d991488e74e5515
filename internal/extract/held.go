package extract

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// heldMeanings are the meanings a replay can find an unmapped state mapped to that
// create something: Ignored creates nothing, so nothing is held for it.
var heldMeanings = []hooksv1alpha1.JobStateMeaning{
	hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded),
	hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobFailed),
	hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobCancelled),
}

// heldFacts runs the event's route again, once per meaning, with every unmapped
// state of the event added to spec.states as that meaning, and keeps what that run
// yields beyond ev's own facts (docs/design.md §5.1, "Replay"). The payload is not
// kept, so this is the only time the route can be read for those states: a `when`
// over jobState() is decided here exactly as a delivery would decide it once the
// state is mapped, and a replay dispatches the facts held for the meaning it finds.
//
// Only events with unmapped states pay for it: a compile per meaning the first time a
// set of unmapped states is seen by this compiled spec (heldCache), a run of the route
// per meaning every time. A meaning
// whose run fails (a state cut at 64 bytes, a field that only then is read and is
// bad) holds nothing, and a replay to it says so.
func (x *Extractor) heldFacts(ev *Event, doc any) []hooksv1alpha1.HeldFacts {
	if len(ev.UnmappedJobStates) == 0 || x.spec == nil {
		return nil
	}
	var held []hooksv1alpha1.HeldFacts
	for _, as := range heldMeanings {
		h, err := x.heldFor(ev, doc, as)
		if err != nil {
			continue
		}
		held = append(held, h)
	}
	return held
}

func (x *Extractor) heldFor(ev *Event, doc any, as hooksv1alpha1.JobStateMeaning) (hooksv1alpha1.HeldFacts, error) {
	h := hooksv1alpha1.HeldFacts{As: as}
	spec := x.spec.DeepCopy()
	added := map[string]bool{}
	for _, u := range ev.UnmappedJobStates {
		if k := normState(u.State); !added[k] {
			added[k] = true
			spec.States = append(spec.States, hooksv1alpha1.JobStateMapping{State: u.State, As: as})
		}
	}
	hx, err := x.held.extractor(as, added, func() (*Extractor, error) {
		hx, err := Compile(x.namespace, x.provider, spec)
		if err != nil {
			return nil, err
		}
		hx.spec = nil // no held facts of held facts
		return hx, nil
	})
	if err != nil {
		return h, err
	}
	hev := &Event{ID: ev.ID, Type: ev.Type, Sequence: ev.Sequence, PayloadHash: ev.PayloadHash}
	rt := hx.routes[ev.Type]
	if rt.when != nil {
		holds, err := rt.when.holds(doc, nil, &hev.whenCost)
		if err != nil {
			return h, err
		}
		if !holds {
			return h, nil // the route's condition is false then: nothing to hold
		}
	}
	if err := hx.Facts(hev, doc); err != nil {
		return h, err
	}
	if len(hev.UnmappedJobStates) > 0 {
		return h, fmt.Errorf("still unmapped: %s", hev.UnmappedJobStates[0].State)
	}
	jobs := map[string]bool{}
	for _, f := range ev.JobCompletions {
		jobs[fmt.Sprintf("%s\x00%d", f.JobID, f.Version)] = true
	}
	for _, f := range hev.JobCompletions {
		if !jobs[fmt.Sprintf("%s\x00%d", f.JobID, f.Version)] {
			h.JobCompletions = append(h.JobCompletions, f)
		}
	}
	keys := map[string]bool{}
	for _, f := range ev.Settlements {
		keys[f.SettlementKey] = true
	}
	for _, f := range hev.Settlements {
		if !keys[f.SettlementKey] {
			h.Settlements = append(h.Settlements, f)
		}
	}
	return h, nil
}

// StateTable is a provider's job-state table, for reading a state outside a delivery
// (a replay, docs/design.md §5.1). Unlike Compile it refuses nothing: an entry listed
// twice keeps its first meaning, as the CRD allows only one.
func StateTable(mappings []hooksv1alpha1.JobStateMapping) States {
	t := make(States, len(mappings))
	for _, m := range mappings {
		if k := normState(m.State); k != "" && t[k] == "" {
			t[k] = m.As
		}
	}
	return t
}

// heldCache keeps the extractors heldFacts compiled, by meaning and set of unmapped
// states, for as long as the Extractor (one generation of the provider's spec): a
// sender that keeps writing a state nobody mapped (RunPod's IN_PROGRESS, before it is
// in spec.states) costs a compile per meaning once, not on every delivery. At most
// heldCacheSize entries; beyond, a set is compiled each time and not kept, so a sender
// cannot grow it without bound.
type heldCache struct {
	mu       sync.Mutex
	byKey    map[string]*Extractor
	compiles int // for tests: how many extractors were compiled
}

const heldCacheSize = 64

func (c *heldCache) extractor(as hooksv1alpha1.JobStateMeaning, states map[string]bool,
	compile func() (*Extractor, error)) (*Extractor, error) {
	if c == nil {
		return compile()
	}
	words := make([]string, 0, len(states))
	for w := range states {
		words = append(words, w)
	}
	slices.Sort(words)
	key := string(as) + "\x00" + strings.Join(words, "\x00")
	c.mu.Lock()
	defer c.mu.Unlock() // a compile is milliseconds; deliveries of one provider wait for it at most once
	if x, ok := c.byKey[key]; ok {
		return x, nil
	}
	x, err := compile()
	c.compiles++
	if err != nil {
		return nil, err
	}
	if c.byKey == nil {
		c.byKey = map[string]*Extractor{}
	}
	if len(c.byKey) < heldCacheSize {
		c.byKey[key] = x
	}
	return x, nil
}
