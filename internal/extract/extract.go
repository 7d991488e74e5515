// Package extract turns an authenticated delivery into the facts a WebhookEvent
// records: its event ID and type, sequence, canonical payload hash, and, through the
// provider's routes, the job completions and settlements it asks for.
//
// A provider's spec is compiled once (every JSONPath parsed) and evaluated for every
// delivery. The WebhookProvider controller compiles the same spec to report a bad
// configuration as Ready=False before any delivery arrives.
package extract

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/payload"
	"github.com/settlement-operator/settlement-operator/internal/signature"
)

// MaxFactsPerEvent bounds the facts one event may carry, matching the CRD's MaxItems,
// so an oversized forEach is refused with a clear error instead of by the API server.
const MaxFactsPerEvent = 64

// DerivedIDPrefix marks event IDs derived from business fields (eventID.derivedFrom).
const DerivedIDPrefix = "drv_"

// ErrInvalidEvent wraps every problem with a delivery's content (as opposed to its
// signature or our own failures); the receiver answers it with 400.
var ErrInvalidEvent = errors.New("invalid event")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidEvent, fmt.Sprintf(format, args...))
}

// FieldError is a delivery problem at one field: Path is the payload's JSON path (or,
// for a when condition, the spec field holding it) and Problem says what is wrong
// without any value from the payload, so both may be written where on-call looks
// (the provider's status.lastRejection). Error() keeps the full message the sender is
// answered with, which may add detail (a quoted, truncated value; cel-go's error).
// It unwraps to ErrInvalidEvent.
type FieldError struct {
	Path    string
	Problem string
	// Missing: the field is absent. Condition: a when condition could not be evaluated.
	Missing, Condition bool
	message            string
}

func (e *FieldError) Error() string { return ErrInvalidEvent.Error() + ": " + e.message }

func (e *FieldError) Unwrap() error { return ErrInvalidEvent }

// missingField is the FieldError of an absent field; its message is the one the
// receiver always answered with.
func missingField(p fmt.Stringer, what string) error {
	return &FieldError{Path: p.String(), Problem: what + " is missing", Missing: true,
		message: fmt.Sprintf("%s is missing (JSON path %s)", what, p)}
}

// badField is the FieldError of a present field that is not usable; detail (which may
// quote a truncated value) goes only to the sender's answer.
func badField(p fmt.Stringer, problem, detail string) error {
	return &FieldError{Path: p.String(), Problem: problem, message: detail}
}

var (
	quantityPattern = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)
)

// Extractor is a compiled WebhookProvider spec. It is immutable and safe for
// concurrent use.
type Extractor struct {
	namespace     string
	provider      string
	eventIDHeader string
	eventIDPath   *payload.Path
	derivedFrom   []payload.Path
	typeHeader    string
	typePath      *payload.Path
	sequence      *payload.Path
	hashFields    []payload.Path
	storeUnrouted bool
	states        States
	routes        map[string]route
	// spec is the provider spec this was compiled from: held facts are extracted by
	// the same spec with the unmapped states added (heldFacts).
	spec *hooksv1alpha1.WebhookProviderSpec
	// held keeps the extractors heldFacts compiles.
	held *heldCache
}

// route is a compiled Route: its condition (nil: always) and its operations.
type route struct {
	when *condition
	ops  []operation
}

type operation struct {
	typ     hooksv1alpha1.OperationType
	when    *condition
	forEach *payload.Path
	job     *jobMapping
	stl     *settlementMapping
}

type usageMapping struct {
	quantity  payload.Path
	meter     string
	meterPath *payload.Path
	unit      string
}

type jobMapping struct {
	jobID       payload.Path
	version     *payload.Path
	state       *payload.Path
	completedAt *payload.Path
	usage       *usageMapping
	sink        *hooksv1alpha1.JobSink
}

type settlementMapping struct {
	billingProvider string
	jobID           *payload.Path
	keyFrom         []payload.Path
	customer        payload.Path
	usage           *usageMapping
	amountMinor     *payload.Path
	currency        string
	currencyPath    *payload.Path
}

// Compile parses every path of a provider's spec. The error lists the first bad path
// with the field it sits in, for the provider's Ready condition. namespace and
// providerName are the WebhookProvider's: settlement keys are derived from both, so
// that the same provider name in two namespaces never shares a key.
func Compile(namespace, providerName string, spec *hooksv1alpha1.WebhookProviderSpec) (*Extractor, error) {
	c := &compiler{}
	c.states = compileStates(c, spec.States)
	x := &Extractor{
		states:        c.states,
		namespace:     namespace,
		provider:      providerName,
		eventIDHeader: spec.EventID.Header,
		eventIDPath:   c.optional("spec.eventID.jsonPath", spec.EventID.JSONPath),
		typeHeader:    spec.EventType.Header,
		typePath:      c.optional("spec.eventType.jsonPath", spec.EventType.JSONPath),
		sequence:      c.optional("spec.sequence", spec.Sequence),
		storeUnrouted: spec.StoreUnroutedEvents,
		routes:        map[string]route{},
		spec:          spec.DeepCopy(),
		held:          &heldCache{},
	}
	for i, p := range spec.EventID.DerivedFrom {
		x.derivedFrom = append(x.derivedFrom, c.required(fmt.Sprintf("spec.eventID.derivedFrom[%d]", i), p))
	}
	for i, p := range spec.HashFields {
		x.hashFields = append(x.hashFields, c.required(fmt.Sprintf("spec.hashFields[%d]", i), p))
	}
	if x.eventIDHeader == "" && x.eventIDPath == nil && len(x.derivedFrom) == 0 {
		c.fail("spec.eventID: set one of header, jsonPath or derivedFrom")
	}
	if x.typeHeader == "" && x.typePath == nil {
		c.fail("spec.eventType: set one of header or jsonPath")
	}
	checkSignedSources(c, spec)
	for ri, r := range spec.Routes {
		if _, dup := x.routes[r.EventType]; dup {
			c.fail("spec.routes[%d]: event type %q has two routes", ri, r.EventType)
		}
		rt := route{when: c.when(fmt.Sprintf("spec.routes[%d].when", ri), r.When, false)}
		for oi, o := range r.Operations {
			at := fmt.Sprintf("spec.routes[%d].operations[%d]", ri, oi)
			op := operation{typ: o.Type, forEach: c.optional(at+".forEach", o.ForEach)}
			op.when = c.when(at+".when", o.When, o.ForEach != "")
			switch o.Type {
			case hooksv1alpha1.OperationJobCompletion:
				if o.JobCompletion == nil {
					c.fail("%s: type JobCompletion needs jobCompletion", at)
					continue
				}
				m := o.JobCompletion
				op.job = &jobMapping{
					jobID:       c.required(at+".jobCompletion.jobID", m.JobID),
					version:     c.optional(at+".jobCompletion.completionVersion", m.CompletionVersion),
					state:       c.optional(at+".jobCompletion.state", m.State),
					completedAt: c.optional(at+".jobCompletion.completedAt", m.CompletedAt),
					usage:       c.usage(at+".jobCompletion.usage", m.Usage),
					sink:        m.Sink,
				}
			case hooksv1alpha1.OperationBillingSettlement:
				if o.Settlement == nil {
					c.fail("%s: type BillingSettlement needs settlement", at)
					continue
				}
				m := o.Settlement
				sm := &settlementMapping{
					billingProvider: m.BillingProviderRef,
					jobID:           c.optional(at+".settlement.jobID", m.JobID),
					customer:        c.required(at+".settlement.customer", m.Customer),
					usage:           c.usage(at+".settlement.usage", m.Usage),
				}
				for i, p := range m.KeyFrom {
					sm.keyFrom = append(sm.keyFrom, c.required(fmt.Sprintf("%s.settlement.keyFrom[%d]", at, i), p))
				}
				if sm.jobID == nil && len(sm.keyFrom) == 0 {
					c.fail("%s.settlement: set keyFrom, or jobID for the job's default key", at)
				}
				if m.Amount != nil {
					sm.amountMinor = c.optional(at+".settlement.amount.minor", m.Amount.Minor)
					sm.currency = m.Amount.Currency
					sm.currencyPath = c.optional(at+".settlement.amount.currencyPath", m.Amount.CurrencyPath)
					if sm.currency == "" && sm.currencyPath == nil {
						c.fail("%s.settlement.amount: set currency or currencyPath", at)
					}
				}
				if sm.usage == nil && sm.amountMinor == nil {
					c.fail("%s.settlement: needs usage, amount or both", at)
				}
				op.stl = sm
			default:
				c.fail("%s: unknown operation type %q", at, o.Type)
			}
			rt.ops = append(rt.ops, op)
		}
		x.routes[r.EventType] = rt
	}
	if c.err != nil {
		return nil, c.err
	}
	return x, nil
}

// compiler collects the first error while parsing many paths, so Compile reads as a
// list of fields rather than a ladder of error checks.
type compiler struct {
	err    error
	states States
	// whenEnvs are built on first use for a provider with spec.states (their jobState
	// reads its table); others share the package's.
	whenEnvs *[2]*cel.Env
}

func (c *compiler) envs() ([2]*cel.Env, error) {
	if c.states == nil {
		return whenEnvs()
	}
	if c.whenEnvs == nil {
		envs, err := newWhenEnvs(c.states)
		if err != nil {
			return envs, err
		}
		c.whenEnvs = &envs
	}
	return *c.whenEnvs, nil
}

func (c *compiler) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf(format, args...)
	}
}

func (c *compiler) required(field, text string) payload.Path {
	if text == "" {
		c.fail("%s: a JSON path is required", field)
		return payload.Path{}
	}
	p, err := payload.ParsePath(text)
	if err != nil {
		c.fail("%s: %v", field, err)
	}
	return p
}

func (c *compiler) optional(field, text string) *payload.Path {
	if text == "" {
		return nil
	}
	p := c.required(field, text)
	return &p
}

func (c *compiler) usage(field string, m *hooksv1alpha1.UsageMapping) *usageMapping {
	if m == nil {
		return nil
	}
	u := &usageMapping{
		quantity:  c.required(field+".quantity", m.Quantity),
		meter:     m.Meter,
		meterPath: c.optional(field+".meterPath", m.MeterPath),
		unit:      m.Unit,
	}
	if u.meter == "" && u.meterPath == nil {
		c.fail("%s: set meter or meterPath", field)
	}
	return u
}

// Event is what a delivery says, ready to become a WebhookEvent.
type Event struct {
	ID          string
	Type        string
	Sequence    *int64
	PayloadHash string
	// Routed is false when no route matches the type, or when the route's `when`
	// condition is false for this payload (then Conditional is true).
	Routed bool
	// Conditional is true when a route matches the type but its `when` is false.
	Conditional bool
	// Store is false for an unrouted event the provider does not want stored.
	Store          bool
	JobCompletions []hooksv1alpha1.JobCompletionFacts
	Settlements    []hooksv1alpha1.SettlementFacts
	// UnmappedJobStates are the job completions whose state the provider does not map;
	// nothing is created for them (docs/design.md §5, "Job states").
	UnmappedJobStates []hooksv1alpha1.UnmappedJobState
	// HeldFacts are, with UnmappedJobStates, what the route yields if those states
	// meant Succeeded, Failed or Cancelled, beyond JobCompletions and Settlements: a
	// replay dispatches them once spec.states maps the states (heldFacts).
	HeldFacts []hooksv1alpha1.HeldFacts

	// routeErr is the route's `when` failing to evaluate. Identify keeps it for Facts
	// rather than returning it, so that the receiver answers a redelivery of a stored
	// event as a duplicate before it answers 400 for this payload.
	routeErr error
	// whenCost is what the route's `when` cost, counted against the delivery's limit.
	whenCost uint64
	// routeUnmapped is the route's `when` reading an unmapped job state.
	routeUnmapped *UnmappedError
}

// Identify reads the event ID, type and canonical hash: everything needed to answer a
// duplicate, before the (costlier) route extraction. doc is the decoded body.
func (x *Extractor) Identify(h http.Header, body []byte, doc any) (*Event, error) {
	ev := &Event{}
	var err error
	if ev.ID, err = x.eventID(h, doc); err != nil {
		return nil, err
	}
	switch {
	case x.typeHeader != "":
		ev.Type = strings.TrimSpace(h.Get(x.typeHeader))
	default:
		if ev.Type, _, err = x.typePath.LookupString(doc, nil); err != nil {
			return nil, invalid("event type: %v", err)
		}
	}
	if ev.Type == "" {
		return nil, invalid("event type is missing (%s)", x.typeSource())
	}
	return x.identify(ev, body, doc)
}

// IdentifyAs is Identify for a delivery whose event ID and type the receiver read
// from an envelope around the payload (a CloudEvent's attributes): body and doc are
// the payload routes read (the event's data), and the provider's eventID and
// eventType sources are not consulted.
func (x *Extractor) IdentifyAs(id, eventType string, body []byte, doc any) (*Event, error) {
	switch {
	case id == "":
		return nil, invalid("event ID is missing")
	case len(id) > 512:
		return nil, invalid("event ID is %d bytes long; at most 512 are accepted", len(id))
	case eventType == "":
		return nil, invalid("event type is missing")
	}
	return x.identify(&Event{ID: id, Type: eventType}, body, doc)
}

func (x *Extractor) identify(ev *Event, body []byte, doc any) (*Event, error) {
	var err error
	if x.sequence != nil {
		n, found, err := x.sequence.LookupInt64(doc, nil)
		if err != nil {
			return nil, invalid("sequence: %v", err)
		}
		if found {
			ev.Sequence = &n
		}
	}
	if ev.PayloadHash, err = x.hash(body, doc); err != nil {
		return nil, err
	}
	rt, routed := x.routes[ev.Type]
	ev.Routed = routed && len(rt.ops) > 0
	if ev.Routed && rt.when != nil {
		// A false condition makes the event unrouted: answered "ignored", stored only
		// with storeUnroutedEvents. An evaluation error keeps it routed, so it reaches
		// the duplicate check before Facts reports the error.
		holds, err := rt.when.holds(doc, nil, &ev.whenCost)
		var unmapped *UnmappedError
		switch {
		case errors.As(err, &unmapped):
			// The route cannot be decided: the event is stored, shows the state as
			// unmapped and does nothing, rather than being refused (a sender retries a
			// 400 for days) or ignored without a trace.
			ev.routeUnmapped = unmapped
		case err != nil:
			ev.routeErr = err
		case !holds:
			ev.Routed, ev.Conditional = false, true
		}
	}
	ev.Store = ev.Routed || x.storeUnrouted
	return ev, nil
}

func (x *Extractor) typeSource() string {
	if x.typeHeader != "" {
		return "header " + x.typeHeader
	}
	return "JSON path " + x.typePath.String()
}

func (x *Extractor) eventID(h http.Header, doc any) (string, error) {
	var id string
	switch {
	case x.eventIDHeader != "":
		id = strings.TrimSpace(h.Get(x.eventIDHeader))
		if id == "" {
			return "", invalid("event ID is missing (header %s)", x.eventIDHeader)
		}
	case x.eventIDPath != nil:
		v, found, err := lookupIdentity(*x.eventIDPath, doc, nil)
		if err != nil {
			return "", invalid("event ID: %v", err)
		}
		if !found || v == "" {
			return "", missingField(x.eventIDPath, "event ID")
		}
		id = v
	default:
		values := make([]string, 0, len(x.derivedFrom))
		for _, p := range x.derivedFrom {
			v, found, err := lookupIdentity(p, doc, nil)
			if err != nil {
				return "", invalid("event ID field: %v", err)
			}
			if !found || v == "" {
				return "", invalid("event ID field %s is missing", p)
			}
			values = append(values, v)
		}
		id = DerivedIDPrefix + identity.Hash32(values...)
	}
	if len(id) > 512 {
		return "", invalid("event ID is %d bytes long; at most 512 are accepted", len(id))
	}
	return id, nil
}

func (x *Extractor) hash(body []byte, doc any) (string, error) {
	if len(x.hashFields) == 0 {
		h, err := identity.CanonicalHash(body)
		if err != nil {
			return "", invalid("canonical hash: %v", err)
		}
		return h, nil
	}
	fields := make(map[string]any, len(x.hashFields))
	for _, p := range x.hashFields {
		v, found, err := p.Lookup(doc, nil)
		if err != nil {
			return "", invalid("hash field: %v", err)
		}
		if found {
			fields[p.String()] = v
		}
	}
	h, err := identity.CanonicalHashOf(fields)
	if err != nil {
		return "", invalid("canonical hash of hashFields: %v", err)
	}
	return h, nil
}

// Facts runs the event's route over the payload and fills ev's job completions and
// settlements. Every missing or malformed field is an ErrInvalidEvent naming the path.
//
// Two settlements of one event under the same key are refused (ErrInvalidEvent):
// they would silently become one charge. The error names the operations, items and
// key fields involved, and the key, never the payload.
//
// An operation whose `when` is false is not produced (for a forEach operation: for
// that item); one that cannot be evaluated is an ErrInvalidEvent naming its field.
func (x *Extractor) Facts(ev *Event, doc any) error {
	if ev.routeErr != nil {
		return ev.routeErr
	}
	if ev.routeUnmapped != nil {
		ev.UnmappedJobStates = append(ev.UnmappedJobStates, hooksv1alpha1.UnmappedJobState{State: ev.routeUnmapped.State})
		ev.HeldFacts = x.heldFacts(ev, doc)
		return nil
	}
	// skipped are the jobs this event reports in an Ignored or unmapped state: nothing
	// is created for them, and no settlement of the event is charged for them.
	skipped := map[string]bool{}
	origins := map[string]keyOrigin{}
	spent := ev.whenCost
	for oi, op := range x.routes[ev.Type].ops {
		items := []any{nil}
		if op.forEach != nil {
			list, found, err := op.forEach.LookupList(doc, nil)
			if err != nil {
				return invalid("operation %d forEach: %v", oi, err)
			}
			if !found {
				return &FieldError{Path: op.forEach.String(), Problem: fmt.Sprintf("operation %d forEach list is missing", oi), Missing: true,
					message: fmt.Sprintf("operation %d forEach: %s is missing", oi, op.forEach)}
			}
			items = list
		}
		for ii, item := range items {
			if op.when != nil {
				holds, err := op.when.holds(doc, item, &spent)
				var unmapped *UnmappedError
				if errors.As(err, &unmapped) {
					// Not produced: an operation is never decided on a state nobody mapped.
					ev.UnmappedJobStates = append(ev.UnmappedJobStates, hooksv1alpha1.UnmappedJobState{State: unmapped.State})
					continue
				}
				if err != nil && op.forEach != nil {
					return fmt.Errorf("%w (item %d of %s)", err, ii, op.forEach)
				}
				if err != nil {
					return err
				}
				if !holds {
					continue
				}
			}
			switch {
			case op.job != nil:
				f, meaning, raw, err := x.jobFacts(op.job, ev, doc, item)
				if err != nil {
					return err
				}
				switch meaning {
				case "":
					skipped[f.JobID] = true
					ev.UnmappedJobStates = append(ev.UnmappedJobStates, hooksv1alpha1.UnmappedJobState{JobID: f.JobID, State: raw})
				case hooksv1alpha1.JobStateIgnored:
					skipped[f.JobID] = true
				default:
					ev.JobCompletions = append(ev.JobCompletions, f)
				}
			case op.stl != nil:
				f, err := x.settlementFacts(op.stl, doc, item)
				if err != nil {
					return err
				}
				here := keyOrigin{operation: oi, item: ii, op: &op}
				if first, dup := origins[f.SettlementKey]; dup {
					return keyCollision(first, here, f.SettlementKey)
				}
				origins[f.SettlementKey] = here
				ev.Settlements = append(ev.Settlements, f)
			}
		}
	}
	if len(skipped) > 0 {
		kept := ev.Settlements[:0]
		for _, f := range ev.Settlements {
			if f.JobID == "" || !skipped[f.JobID] {
				kept = append(kept, f)
			}
		}
		ev.Settlements = kept
	}
	ev.UnmappedJobStates = dedupeUnmapped(ev.UnmappedJobStates)
	if n := len(ev.UnmappedJobStates); n > MaxFactsPerEvent {
		ev.UnmappedJobStates = ev.UnmappedJobStates[:MaxFactsPerEvent]
	}
	if n := len(ev.JobCompletions); n > MaxFactsPerEvent {
		return invalid("the event yields %d job completions; at most %d per event", n, MaxFactsPerEvent)
	}
	if n := len(ev.Settlements); n > MaxFactsPerEvent {
		return invalid("the event yields %d settlements; at most %d per event", n, MaxFactsPerEvent)
	}
	ev.HeldFacts = x.heldFacts(ev, doc)
	return nil
}

// keyOrigin is where in a route a settlement key came from.
type keyOrigin struct {
	operation, item int
	op              *operation
}

// keySource names the fields a settlement operation derives its key from.
func (o keyOrigin) keySource() string {
	m := o.op.stl
	if len(m.keyFrom) == 0 {
		return "default key from jobID " + m.jobID.String()
	}
	paths := make([]string, len(m.keyFrom))
	for i, p := range m.keyFrom {
		paths[i] = p.String()
	}
	return "keyFrom " + strings.Join(paths, ", ")
}

func (o keyOrigin) String() string {
	if o.op.forEach == nil {
		return fmt.Sprintf("operation %d (%s)", o.operation, o.keySource())
	}
	return fmt.Sprintf("operation %d item %d (forEach %s, %s)", o.operation, o.item, o.op.forEach, o.keySource())
}

func keyCollision(first, second keyOrigin, key string) error {
	where := first.String() + " and " + second.String()
	if first.operation == second.operation && first.op.forEach != nil {
		where = fmt.Sprintf("operation %d (forEach %s, %s): items %d and %d",
			first.operation, first.op.forEach, first.keySource(), first.item, second.item)
	}
	return invalid("%s yield the same settlement key %s, which would silently make them one charge; "+
		"each charge needs a key of its own (add a field that tells them apart to keyFrom)", where, truncateKey(key))
}

func truncateKey(key string) string {
	if len(key) > 160 {
		return key[:160] + "…"
	}
	return key
}

// lookupIdentity reads a field an identity is keyed on (an event ID, a job ID, a
// keyFrom value) as text. A JSON number is spelled canonically (identity.
// CanonicalNumber), so that 42, 42.0 and 4.2e1 are the same job, as they are the same
// payload for the hash.
func lookupIdentity(p payload.Path, doc, item any) (string, bool, error) {
	v, found, err := p.Lookup(doc, item)
	if err != nil || !found {
		return "", false, err
	}
	if n, ok := v.(json.Number); ok {
		s, err := identity.CanonicalNumber(n.String())
		if err != nil {
			return "", false, fmt.Errorf("evaluate JSONPath %s: %v", p, err)
		}
		return s, true, nil
	}
	return p.LookupString(doc, item)
}

// requiredIdentity is requiredString for a field an identity is keyed on.
func requiredIdentity(p payload.Path, doc, item any, what string, maxLen int) (string, error) {
	v, found, err := lookupIdentity(p, doc, item)
	return present(p, what, maxLen, v, found, err)
}

func requiredString(p payload.Path, doc, item any, what string, maxLen int) (string, error) {
	v, found, err := p.LookupString(doc, item)
	return present(p, what, maxLen, v, found, err)
}

// present turns a lookup's result into a present, bounded value or an
// ErrInvalidEvent naming the field.
func present(p payload.Path, what string, maxLen int, v string, found bool, err error) (string, error) {
	if err != nil {
		return "", badField(p, what+" cannot be read as text", fmt.Sprintf("%s: %v", what, err))
	}
	if !found || v == "" {
		return "", missingField(p, what)
	}
	if len(v) > maxLen {
		return "", badField(p, fmt.Sprintf("%s is longer than %d bytes", what, maxLen),
			fmt.Sprintf("%s is %d bytes long; at most %d are accepted", what, len(v), maxLen))
	}
	return v, nil
}

// jobFacts reads one job completion. meaning is the state's meaning, "" when it is
// unmapped (then raw is the state as the sender wrote it, truncated).
func (x *Extractor) jobFacts(m *jobMapping, ev *Event, doc, item any) (f hooksv1alpha1.JobCompletionFacts,
	meaning hooksv1alpha1.JobStateMeaning, raw string, err error) {
	f = hooksv1alpha1.JobCompletionFacts{State: hooksv1alpha1.JobSucceeded, Sink: m.sink.DeepCopy()}
	meaning = hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded)
	if f.JobID, err = requiredIdentity(m.jobID, doc, item, "job ID", 256); err != nil {
		return f, meaning, raw, err
	}
	switch {
	case m.version != nil:
		v, found, err := m.version.LookupInt64(doc, item)
		if err != nil {
			return f, meaning, raw, invalid("completion version: %v", err)
		}
		if !found {
			return f, meaning, raw, missingField(m.version, "completion version")
		}
		f.Version = v
	case ev.Sequence != nil:
		f.Version = *ev.Sequence
	default:
		f.Version = 1
	}
	if f.Version < 0 {
		return f, meaning, raw, invalid("completion version %d is negative", f.Version)
	}
	if m.state != nil {
		s, err := requiredString(*m.state, doc, item, "job state", 64)
		if err != nil {
			return f, meaning, raw, err
		}
		var ok bool
		if meaning, ok = x.states.Resolve(s); !ok {
			return f, "", truncate(s), nil
		}
		if meaning != hooksv1alpha1.JobStateIgnored {
			f.State = hooksv1alpha1.JobState(meaning)
		}
	}
	if m.completedAt != nil {
		s, found, err := m.completedAt.LookupString(doc, item)
		if err != nil {
			return f, meaning, raw, invalid("completedAt: %v", err)
		}
		if found {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return f, meaning, raw, invalid("completedAt %q is not an RFC 3339 time", truncate(s))
			}
			mt := metav1.NewTime(t.UTC())
			f.CompletedAt = &mt
		}
	}
	if m.usage != nil {
		if f.Usage, err = usageFacts(m.usage, doc, item); err != nil {
			return f, meaning, raw, err
		}
	}
	return f, meaning, raw, nil
}

func (x *Extractor) settlementFacts(m *settlementMapping, doc, item any) (hooksv1alpha1.SettlementFacts, error) {
	f := hooksv1alpha1.SettlementFacts{BillingProviderRef: m.billingProvider}
	var err error
	if m.jobID != nil {
		if f.JobID, err = requiredIdentity(*m.jobID, doc, item, "job ID", 256); err != nil {
			return f, err
		}
	}
	// Keys are namespaced and unambiguously encoded (identity: Keys; decisions.md "Keys"); a
	// keyFrom key and a job's default key never share a key space.
	if len(m.keyFrom) > 0 {
		values := make([]string, 0, len(m.keyFrom))
		for _, p := range m.keyFrom {
			v, err := requiredIdentity(p, doc, item, "settlement key field", 256)
			if err != nil {
				return f, err
			}
			values = append(values, v)
		}
		f.SettlementKey = identity.FieldsSettlementKey(x.namespace, x.provider, values...)
	} else {
		f.SettlementKey = identity.JobSettlementKey(x.namespace, x.provider, f.JobID)
	}
	if len(f.SettlementKey) > 512 {
		return f, invalid("settlement key is %d bytes long; at most 512 are accepted", len(f.SettlementKey))
	}
	if f.Customer, err = requiredString(m.customer, doc, item, "customer", 256); err != nil {
		return f, err
	}
	if m.usage != nil {
		if f.Usage, err = usageFacts(m.usage, doc, item); err != nil {
			return f, err
		}
	}
	if m.amountMinor != nil {
		minor, found, err := m.amountMinor.LookupInt64(doc, item)
		if err != nil {
			return f, invalid("amount: %v", err)
		}
		if !found {
			return f, missingField(m.amountMinor, "amount")
		}
		if minor < 0 {
			return f, invalid("amount %d is negative; refunds are settlements of type Refund", minor)
		}
		currency := m.currency
		if m.currencyPath != nil {
			if currency, err = requiredString(*m.currencyPath, doc, item, "currency", 3); err != nil {
				return f, err
			}
			currency = strings.ToUpper(currency)
		}
		if !currencyPattern.MatchString(currency) {
			return f, invalid("currency %q is not an ISO 4217 code", truncate(currency))
		}
		f.Amount = &hooksv1alpha1.Amount{Minor: minor, Currency: currency}
	}
	return f, nil
}

func usageFacts(m *usageMapping, doc, item any) (*hooksv1alpha1.Usage, error) {
	q, err := requiredString(m.quantity, doc, item, "usage quantity", 40)
	if err != nil {
		return nil, err
	}
	if !quantityPattern.MatchString(q) {
		return nil, invalid("usage quantity %q is not a non-negative decimal (no sign, no exponent)", truncate(q))
	}
	u := &hooksv1alpha1.Usage{Quantity: q, Meter: m.meter, Unit: m.unit}
	if m.meterPath != nil {
		if u.Meter, err = requiredString(*m.meterPath, doc, item, "meter", 128); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// ParseJobState maps what senders write to a JobState: the three names in any case,
// plus the common spellings "success", "completed", "error" and "canceled".
func ParseJobState(s string) (hooksv1alpha1.JobState, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "succeeded", "success", "successful", "completed", "complete":
		return hooksv1alpha1.JobSucceeded, nil
	case "failed", "failure", "error", "errored":
		return hooksv1alpha1.JobFailed, nil
	case "cancelled", "canceled":
		return hooksv1alpha1.JobCancelled, nil
	}
	return "", invalid("job state %q is not one of Succeeded, Failed, Cancelled", truncate(s))
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// checkSignedSources refuses a spec that would take a field deciding an effect from
// bytes the signature does not cover, or that accepts a generic HMAC with no signed
// timestamp without saying so. The CRD refuses the same (CEL on WebhookProviderSpec and
// SignatureSpec); this check catches objects stored before those rules existed, so the
// receiver never serves them (503, the Ready condition says why) instead of trusting
// an unsigned header (decisions.md "Signed fields").
func checkSignedSources(c *compiler, spec *hooksv1alpha1.WebhookProviderSpec) {
	scheme := string(spec.Signature.Scheme)
	covered := func(header string) bool {
		if id := signature.SignedIDHeader(scheme); id != "" && strings.EqualFold(header, id) {
			return true
		}
		if scheme == signature.SchemeAPIKey {
			// Nothing is signed: the credential vouches for the whole request, headers
			// and body alike (decisions.md "Sender presets").
			return true
		}
		if scheme != signature.SchemeHMACSHA256 {
			return false
		}
		for _, h := range spec.Signature.SignedHeaders {
			if strings.EqualFold(header, h) {
				return true
			}
		}
		return false
	}
	for _, f := range []struct{ field, header string }{
		{"spec.eventID.header", spec.EventID.Header}, {"spec.eventType.header", spec.EventType.Header},
	} {
		if f.header != "" && !covered(f.header) {
			c.fail("%s: header %s is not covered by the %s signature, so a captured delivery could be replayed with another value; take it from the payload (jsonPath)",
				f.field, f.header, scheme)
		}
	}
	if scheme == signature.SchemeHMACSHA256 && spec.Signature.TimestampHeader == "" && !spec.Signature.InsecureAllowReplay {
		c.fail("spec.signature: scheme HMACSHA256 without timestampHeader signs no timestamp, so a captured delivery could be replayed forever; set timestampHeader, or insecureAllowReplay: true to accept that")
	}
}

// SignatureConfig maps a provider's signature spec to the verifier's configuration.
func SignatureConfig(s *hooksv1alpha1.SignatureSpec) signature.Config {
	cfg := signature.Config{
		Scheme: string(s.Scheme), Header: s.Header, Prefix: s.Prefix,
		Encoding: string(s.Encoding), TimestampHeader: s.TimestampHeader, SignedHeaders: s.SignedHeaders,
	}
	if s.Tolerance != nil {
		cfg.Tolerance = s.Tolerance.Duration
	}
	return cfg
}
