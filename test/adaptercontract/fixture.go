// Package adaptercontract is the one contract every billing adapter is held to
// (docs/design.md §13, §14): each provider type's adapter, built through the registry
// exactly as the operator builds it, runs the same suite against a fake of its
// platform — the billing rows of the failure matrix, one effect per key, and lookups
// and resends classified the same way whatever the platform's wire says.
//
// How a new adapter joins:
//
//  1. Its fake (test/fake<name>) exports a constructor func(t *testing.T) Fixture that
//     starts the fake on a free loopback port and stops it when t ends (see
//     test/fakebilling/contract.go, test/fakestripe/contract.go). Effects counts the
//     platform's own books, never the calls the fake saw; Fail shows each Fault as the
//     platform documents it.
//  2. If the adapter declares a lookup (billing.LookupByKey or LookupByListing), the
//     fixture also implements LookupFaultFixture and WindowFixture; if the platform's
//     rate limit sends no wait, or another than the suite would find, RetryAfterFixture.
//  3. One line in the list of fixtures in adapters_test.go; one per shape of request
//     when the capabilities differ between them (Stripe: usage and amount). A row the
//     adapter fails today is listed on that line as KnownGap(row, why), never skipped.
//
// Then go test ./test/adaptercontract/ runs every row (suite.go) against it. A row that
// does not apply to the adapter's declared capabilities asserts the capability that
// excludes it; nothing is skipped.
package adaptercontract

import (
	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// Fault is a behaviour of the platform that a fixture shows on request, each as the
// platform documents it (status code, error body, headers).
type Fault string

const (
	// Unavailable: the platform answers a server error (5xx) and commits nothing.
	Unavailable Fault = "unavailable"
	// CommitThenTimeout: the platform commits the request, then sends no reply before
	// the client gives up (the client's timeout, or the connection is dropped).
	CommitThenTimeout Fault = "commit-then-timeout"
	// RateLimited: the platform refuses with its documented rate-limit status and
	// headers, committing nothing.
	RateLimited Fault = "rate-limited"
	// Refused: the platform refuses the request as invalid with its documented 4xx and
	// error body, committing nothing; sending it again is refused again.
	Refused Fault = "refused"
)

// Fixture is a fake of one platform as the suite drives it. A fake's package exports
// a constructor that starts the fake on a free loopback port and returns it.
type Fixture interface {
	// Type is the BillingProvider.spec.type whose adapter this fake serves.
	Type() hooksv1alpha1.BillingProviderType
	// Provider is a BillingProvider of that type pointed at the fake (spec.endpoint
	// and the type's own settings), and the credential the adapter is given; the
	// suite builds the client with the registry (adapters.New), as the operator does.
	Provider() (*hooksv1alpha1.BillingProvider, string)
	// Charge is a charge the platform accepts under key (IdempotencyKey; the
	// settlement key is derived from it): usage where the platform bills usage, an
	// amount where it bills amounts. KeyNamespaced is true, as for every settlement
	// the operator creates today. The suite sends it unchanged on every attempt.
	Charge(key string) billing.Request
	// Effects is how many times the platform has billed the customer for a request
	// under key, as its own books say: 0 before anything committed, 1 after, 2 if a
	// resend was counted again (a platform that does not deduplicate).
	Effects(key string) int
	// Fail makes the platform show f on the next n submissions.
	Fail(f Fault, n int)
	// Close stops the fake.
	Close()
}
