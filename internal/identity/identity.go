// Package identity derives object names, idempotency keys and payload hashes.
//
// Every function here is a pure function of stable business fields (DESIGN §1.3):
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
	"fmt"
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
// reused with a different payload (DESIGN §4 step 6). Deriving it from the new
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
// a redelivered event from charging twice.
func SettlementName(provider, settlementKey string) string {
	return provider + "-stl-" + Hash32(settlementKey)
}

// IdempotencyKey is the key sent to the billing provider for one settlement. It is a
// function of the settlement key alone, so every retry, every replica and every
// reconciliation pass presents the same key for the same operation (DESIGN §1.5).
func IdempotencyKey(settlementKey string) string {
	return "stl_" + Hash32(settlementKey)
}

// DefaultSettlementKey is the settlement key used when a route does not configure
// one: a job is billed once per provider, whatever event reports its completion.
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
