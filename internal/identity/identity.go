// Package identity derives object names, idempotency keys and payload hashes.
//
// Every function here is a pure function of stable business fields (docs/design.md §1.3):
// the same event, job or settlement always maps to the same name and key, no matter
// which replica computes it, how often a provider redelivers, or when it happens.
// The API server's name uniqueness then acts as our unique constraint, and a
// provider's idempotency-key handling deduplicates retried foreign calls.
//
// Changing any output of this package renames every object the operator has ever
// created and re-keys every settlement, so the tests pin fixed vectors: treat a
// failing vector test as a data migration, not as a test to update.
package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/gowebpki/jcs"
)

// HashPrefix names the algorithm of a canonical payload hash, so that a stored hash
// stays self-describing if the algorithm ever has to change.
const HashPrefix = "sha256:"

// hashLen is the number of hex characters Hash32 keeps: 128 bits keeps collisions
// out of reach while leaving room for a 63-character provider name in a
// 253-character object name.
const hashLen = 32

// quarantineHashLen is how much of the new payload hash a quarantine name carries: it
// only has to tell apart the few conflicting payloads reusing one event ID.
const quarantineHashLen = 8

// Hash32 returns the first 32 lowercase hex characters of the SHA-256 of parts joined
// by a NUL byte. The separator keeps ("a", "bc") and ("ab", "c") apart; NUL cannot
// occur in a Kubernetes name or in the identifiers we hash in practice.
func Hash32(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(sum[:])[:hashLen]
}

// EventName is the name of the WebhookEvent for one delivered event. The namespace is
// part of the hash so that the same provider name in two namespaces never shares an
// identity, and the event ID is hashed because providers' IDs are not valid names.
func EventName(namespace, provider, eventID string) string {
	return provider + "-" + Hash32(namespace+"/"+provider, eventID)
}

// QuarantineName is the name of the quarantine record created when an event ID is
// reused with a different payload (docs/design.md §4 step 9). Deriving it from the new
// payload's hash makes the quarantine record itself idempotent: redeliveries of the
// same conflicting payload hit AlreadyExists instead of piling up records.
//
// payloadHash is expected in the form returned by CanonicalHash ("sha256:<64 hex>").
// Anything else is hashed first, so the result is still a deterministic, valid name.
func QuarantineName(originalEventName, payloadHash string) string {
	digest := strings.TrimPrefix(payloadHash, HashPrefix)
	if len(digest) < quarantineHashLen || !isLowerHex(digest[:quarantineHashLen]) {
		digest = Hash32(payloadHash)
	}
	return originalEventName + "-conflict-" + digest[:quarantineHashLen]
}

// JobCompletionName is the name of the JobCompletion for one job of a provider, so
// that every event about the job converges on the same record.
func JobCompletionName(provider, jobID string) string {
	return provider + "-job-" + Hash32(jobID)
}

// SettlementName is the name of the BillingSettlement for one logical financial
// operation; the API server rejecting a second create with this name is what stops
// a redelivered event from charging twice. For a structured (namespaced) key use
// SettlementNameFor, which keeps a job's charge under this same name.
func SettlementName(provider, settlementKey string) string {
	return provider + "-stl-" + Hash32(settlementKey)
}

// IdempotencyKey is the legacy idempotency key of a settlement, a function of the
// settlement key alone: the key of every settlement created before keys were namespaced, which
// keeps it (spec is immutable, and the controllers use the stored key, never a
// re-derived one). It is not namespaced, so new settlements use
// NamespacedIdempotencyKey.
func IdempotencyKey(settlementKey string) string {
	return "stl_" + Hash32(settlementKey)
}

// DefaultSettlementKey is the legacy settlement key of a job, "<provider>/<jobID>",
// used before keys were namespaced when a route does not configure keyFrom. New events get
// JobSettlementKey; SettlementName(provider, DefaultSettlementKey(provider, jobID)) is
// still the name of a job's settlement, old or new (see SettlementNameFor).
func DefaultSettlementKey(provider, jobID string) string {
	return provider + "/" + jobID
}

// CanonicalHash returns "sha256:" followed by the hex SHA-256 of the RFC 8785 (JCS)
// canonical form of a JSON document. Canonicalising first means a redelivery that
// only differs in key order, whitespace or number spelling counts as a duplicate,
// not as a conflicting reuse of the event ID.
//
// JCS represents numbers as IEEE-754 doubles, so integers beyond ±2^53 that differ
// only below double precision canonicalise (and hash) equal; RFC 8785 expects such
// values to be sent as strings. Duplicate object keys are rejected, as RFC 8785
// requires.
func CanonicalHash(payload []byte) (string, error) {
	canonical, err := jcs.Transform(payload)
	if err != nil {
		// jcs quotes at most 32 bytes of the offending token, so the wrapped error
		// never carries the payload itself.
		return "", fmt.Errorf("canonicalize JSON payload (RFC 8785): %w", err)
	}
	sum := sha256.Sum256(canonical)
	return HashPrefix + hex.EncodeToString(sum[:]), nil
}

// CanonicalHashOf is CanonicalHash of the JSON encoding of v. It hashes the subset of
// fields a provider configures as hashFields, so that fields a provider changes on
// every redelivery (attempt counters, delivery timestamps) do not turn a duplicate
// into a conflict.
func CanonicalHashOf(v any) (string, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode value as JSON for hashing: %w", err)
	}
	return CanonicalHash(payload)
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// EndpointPathPrefix is where the receiver serves: EndpointPathPrefix + "{namespace}/{provider}".
const EndpointPathPrefix = "/webhooks/"

// EndpointPath is the receiver path a WebhookProvider's senders post to; it is derived
// from the provider's identity like every other name, and shown in its status.
func EndpointPath(namespace, provider string) string {
	return EndpointPathPrefix + namespace + "/" + provider
}

// Namespaced keys (decisions.md "Keys"). The derivations above are the legacy ones: their outputs are stored
// in existing settlements and are kept so that those settlements, and the
// reconciliation pass that finds them, keep working. Every key minted from now on is
// derived below: from the namespace as well as the provider, with every part encoded
// unambiguously (an RFC 8785 JSON array of strings, never parts joined by a separator)
// and a tag that keeps each kind of key in its own space.

// Kinds of structured settlement key: the first element of the key's array.
const (
	// KeyKindJob is a job's default settlement key: one charge per job.
	KeyKindJob = "job"
	// KeyKindFields is a settlement key built from a route's keyFrom fields.
	KeyKindFields = "key"
)

// Tags of the hashed keys, so that a settlement's idempotency key and a job sink's key
// can never be the hash of the same input.
const (
	tagSettlement = "settlement"
	tagJobSink    = "job-sink"
)

// JobSettlementKey is the settlement key of a job's charge when a route does not
// configure keyFrom: `["job","<namespace>","<provider>","<jobID>"]`. A job is billed
// once per provider and namespace, whatever event reports its completion; the same
// provider name in another namespace is another tenant and never shares the key.
func JobSettlementKey(namespace, provider, jobID string) string {
	return EncodeParts(KeyKindJob, namespace, provider, jobID)
}

// FieldsSettlementKey is the settlement key of a route with keyFrom:
// `["key","<namespace>","<provider>","<value 1>",…]`. Values containing "/" or any
// other character stay apart (["a/b","c"] is not ["a","b/c"]), and the "key" tag
// keeps these keys out of the space of job keys.
func FieldsSettlementKey(namespace, provider string, values ...string) string {
	return EncodeParts(append([]string{KeyKindFields, namespace, provider}, values...)...)
}

// StructuredKey is a settlement key minted by JobSettlementKey or FieldsSettlementKey,
// taken apart.
type StructuredKey struct {
	// Kind is KeyKindJob or KeyKindFields.
	Kind      string
	Namespace string
	Provider  string
	// Values holds the job ID (KeyKindJob) or the keyFrom values (KeyKindFields).
	Values []string
}

// ParseSettlementKey takes a structured settlement key apart. ok is false for any
// other key: a legacy key ("<provider>/<jobID>", "<provider>/<v1>/<v2>"), a key written
// by hand, or a JSON array that is not exactly what the functions above produce (a
// non-canonical spelling is not a structured key, so it can never alias one).
func ParseSettlementKey(key string) (k StructuredKey, ok bool) {
	if !strings.HasPrefix(key, `["`) {
		return StructuredKey{}, false
	}
	var parts []string
	if err := json.Unmarshal([]byte(key), &parts); err != nil || len(parts) < 4 || EncodeParts(parts...) != key {
		return StructuredKey{}, false
	}
	k = StructuredKey{Kind: parts[0], Namespace: parts[1], Provider: parts[2], Values: parts[3:]}
	switch {
	case k.Kind != KeyKindJob && k.Kind != KeyKindFields,
		k.Kind == KeyKindJob && len(k.Values) != 1,
		k.Namespace == "", k.Provider == "", strings.Contains(k.Provider, "/"):
		return StructuredKey{}, false
	}
	return k, true
}

// JobID is the job of a KeyKindJob key, "" otherwise.
func (k StructuredKey) JobID() string {
	if k.Kind != KeyKindJob {
		return ""
	}
	return k.Values[0]
}

// LegacyKey is the key the same operation had before keys were namespaced
// ("<provider>/<jobID>", or "<provider>/<v1>/<v2>…" for keyFrom): a settlement created
// before keys were namespaced under that key is the same logical operation and must be found, or
// the same charge would be made twice under two keys.
func (k StructuredKey) LegacyKey() string {
	return k.Provider + "/" + strings.Join(k.Values, "/")
}

// SettlementNameFor is the name of the BillingSettlement for a settlement key.
//
// A job's charge keeps the name it always had, SettlementName(provider,
// DefaultSettlementKey(provider, jobID)): a name is unique within its namespace, so it
// needs no namespace, and keeping it means a job charged before the upgrade and
// reported again after it converges on the same object (the API server's name
// uniqueness is what stops a second charge). A keyFrom key gets the name of its own
// structured key, away from the job names; any other key (legacy, hand-made) keeps
// SettlementName(provider, key).
func SettlementNameFor(provider, settlementKey string) string {
	if k, ok := ParseSettlementKey(settlementKey); ok && k.Kind == KeyKindJob {
		return SettlementName(k.Provider, DefaultSettlementKey(k.Provider, k.JobID()))
	}
	return SettlementName(provider, settlementKey)
}

// NamespacedIdempotencyKey is the idempotency key of every settlement created from now
// on: "stl_" + the first 32 hex of SHA-256 over the RFC 8785 array
// `["settlement","<namespace>","<settlementKey>"]`. Two tenants sharing a billing
// account never present the same key, even for the same settlement key written by
// hand. Existing settlements keep the key stored in their spec (IdempotencyKey, the
// legacy derivation); nothing re-derives it.
func NamespacedIdempotencyKey(namespace, settlementKey string) string {
	return "stl_" + HashParts(tagSettlement, namespace, settlementKey)
}

// JobSinkKey is the idempotency key of one completion version at a job sink: "job_"
// + the first 32 hex of SHA-256 over `["job-sink","<namespace>","<provider>","<jobID>",
// "<version>"]`. One application per version, and per tenant.
func JobSinkKey(namespace, provider, jobID string, version int64) string {
	return "job_" + HashParts(tagJobSink, namespace, provider, jobID, strconv.FormatInt(version, 10))
}

// LegacyJobSinkKey is the job sink key used before keys were namespaced, "job_" +
// Hash32(provider, jobID, version): not namespaced. Kept for its test vector and for
// anyone matching a sink's old records; nothing sends it any more.
func LegacyJobSinkKey(provider, jobID string, version int64) string {
	return "job_" + Hash32(provider, jobID, strconv.FormatInt(version, 10))
}

// HashParts returns the first 32 lowercase hex characters of the SHA-256 of
// EncodeParts(parts...). Unlike Hash32 no part can contain its separator, so the
// encoding of a list of parts is unambiguous whatever bytes the parts hold.
func HashParts(parts ...string) string {
	sum := sha256.Sum256([]byte(EncodeParts(parts...)))
	return hex.EncodeToString(sum[:])[:hashLen]
}

// EncodeParts encodes parts as a JSON array of strings in its RFC 8785 (JCS) form:
// no whitespace, and only '"', '\' and control characters escaped, as JCS (and
// ECMAScript's JSON.stringify) writes them. Two different lists never encode the same,
// so the result can be hashed or used as a key as it is. It is byte-exact for any
// input: bytes that are not valid UTF-8 are copied, not replaced (API strings are
// always valid UTF-8, where this is exactly JCS).
func EncodeParts(parts ...string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJCSString(&b, p)
	}
	b.WriteByte(']')
	return b.String()
}

func writeJCSString(b *strings.Builder, s string) {
	const hexDigits = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hexDigits[c>>4])
				b.WriteByte(hexDigits[c&0xf])
				continue
			}
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// maxNumberText bounds the JSON number text CanonicalNumber accepts, and
// maxNumberExponent its exponent, so that an attacker's "1e999999999" cannot make it
// build a huge exact value. Identity fields are at most 256 characters anyway.
const (
	maxNumberText     = 400
	maxNumberExponent = 1000
)

// CanonicalNumber returns the spelling of a JSON number an identity field (a job ID, a
// keyFrom value, an event ID) is keyed on: its RFC 8785 form, as in the payload hash,
// so that 42, 42.0 and 4.2e1 are the same job. RFC 8785 goes through an IEEE double,
// which would make different numbers one identity (9007199254740993 and
// 9007199254740992 are one double): where the RFC 8785 form does not have exactly the
// number's value, an integer keeps its exact decimal digits instead, and a fraction is
// refused (the sender must send it as a string). Different numbers therefore never
// share an identity, and equal numbers always do.
func CanonicalNumber(text string) (string, error) {
	if len(text) > maxNumberText {
		return "", fmt.Errorf("number is %d characters long; at most %d are accepted", len(text), maxNumberText)
	}
	if !isJSONNumber(text) {
		return "", errors.New("not a JSON number")
	}
	exact, ok := new(big.Rat).SetString(text)
	if !ok {
		return "", errors.New("not a JSON number")
	}
	if f, err := strconv.ParseFloat(text, 64); err == nil {
		if s, err := jcs.NumberToJSON(f); err == nil {
			if back, ok := new(big.Rat).SetString(s); ok && back.Cmp(exact) == 0 {
				return s, nil
			}
		}
	}
	if exact.IsInt() {
		if digits := exact.Num().String(); len(digits) <= maxNumberText {
			return digits, nil
		}
		return "", fmt.Errorf("number has more than %d digits", maxNumberText)
	}
	return "", errors.New("number has more precision than a double; send it as a string")
}

// isJSONNumber checks the RFC 8259 number grammar, with the exponent bounded.
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i - start
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		start := i
		if digits() == 0 {
			return false
		}
		if exp, err := strconv.Atoi(s[start:i]); err != nil || exp > maxNumberExponent {
			return false
		}
	}
	return i == len(s)
}
