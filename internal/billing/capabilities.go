package billing

import "time"

// Lookup is how a provider can be asked whether it holds a record under a key.
type Lookup int

const (
	// LookupByKey: the provider answers by key, authoritatively — found or not found
	// (the HTTP contract's GET, docs/design.md §6.1).
	LookupByKey Lookup = iota
	// LookupByListing: the provider has no lookup by key, but a record can be found by
	// listing what it holds and matching our metadata, within bounds the adapter states
	// in its errors (Stripe's invoice items: the customer's items since the first
	// submission).
	LookupByListing
	// LookupNone: nothing the provider offers can say whether it holds the record
	// (Stripe's meter events cannot be read back); a lookup answers Unanswerable.
	LookupNone
)

// String names the lookup for conditions and tests.
func (l Lookup) String() string {
	switch l {
	case LookupByKey:
		return "by key"
	case LookupByListing:
		return "by listing"
	}
	return "none"
}

// Capabilities is what a provider can answer about one request (docs/design.md §14).
// Each adapter declares it in one place (Capable); the settlement decision takes it as
// input and names no adapter. What a lookup's record carries per settlement type is
// Match's business; how amounts are converted is the adapter's, before anything is sent.
type Capabilities struct {
	// Lookup is how the provider can be asked whether it holds the request's record.
	Lookup Lookup
	// Window is how long the provider deduplicates a resend of the request under the
	// same key, when the provider fixes it (Stripe: 24 hours); 0 when the
	// BillingProvider's spec.idempotencyWindow says (the HTTP contract). The shorter of
	// the two applies.
	Window time.Duration
	// ResendIsProof: inside the window, sending the request again under its key is
	// itself an authoritative answer. The provider either carries it out (nothing was
	// there), replays its first answer, or answers that it already holds the key — and
	// since only this settlement ever sends that key (derived from its immutable,
	// namespaced spec: docs/decisions.md "Resend as the lookup"), what it holds is this
	// request. Where it is true, a resend inside the window replaces a lookup the
	// provider could not answer.
	ResendIsProof bool
	// NoDeduplication: the provider does not deduplicate at all — a resend under the
	// same key is counted again as new usage (OpenMeter without deduplication). The key
	// window is zero whatever Window and spec.idempotencyWindow say: nothing is ever
	// sent again after an attempt that may have reached the provider, and only a
	// lookup that finds the record resolves it (docs/design.md §14).
	NoDeduplication bool
	// AbsenceUnproven: a lookup that finds the record proves it is there; one that does
	// not find it proves nothing, because the provider ingests asynchronously and its
	// lookup may not show a record it already holds (Metronome's events search). Such a
	// "not found" after an attempt that may have reached the provider is decided as a
	// lookup the provider cannot answer: inside the key window a resend under the key is
	// the answer where the provider deduplicates, otherwise a human looks; it never
	// lowers the exposure (docs/design.md §14). NoDeduplication implies it (its lookup
	// is an asynchronous listing too).
	AbsenceUnproven bool
}

// ProvesAbsence reports whether a lookup's "not found" proves the provider holds
// nothing under the key (see AbsenceUnproven).
func (c Capabilities) ProvesAbsence() bool { return !c.AbsenceUnproven && !c.NoDeduplication }

// Capable is a Client that says what its provider can answer for each request.
type Capable interface {
	Capabilities(r Request) Capabilities
}

// CapabilitiesOf is what c's provider can answer for r, under any wrappers. An
// adapter that declares nothing follows the HTTP contract (ContractCapabilities).
func CapabilitiesOf(c Client, r Request) Capabilities {
	if c == nil {
		return Capabilities{}
	}
	if d, ok := Unwrap(c).(Capable); ok {
		return d.Capabilities(r)
	}
	return ContractCapabilities(r)
}

// ContractCapabilities is what a provider that follows the HTTP contract (docs/design.md
// §6.1) can answer about any request: lookup by key, the BillingProvider's
// spec.idempotencyWindow, and a resend that proves nothing by itself.
func ContractCapabilities(Request) Capabilities { return Capabilities{Lookup: LookupByKey} }
