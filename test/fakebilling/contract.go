package fakebilling

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// contractToken is the bearer token the contract fixture's fake requires.
const contractToken = "contract-http-token-4f1e9a"

// contractRetryAfter is the Retry-After of the fixture's rate limit.
const contractRetryAfter = 2 * time.Second

// ContractFixture starts a fake on a free loopback port as the adapter contract's
// fixture for spec.type HTTP (test/adaptercontract): the §6.1 contract's usage charge,
// the fake's fault injection for each adaptercontract.Fault. It stops when t ends.
func ContractFixture(t *testing.T) adaptercontract.Fixture {
	t.Helper()
	s, err := Start(Options{Token: contractToken})
	if err != nil {
		t.Fatalf("start the HTTP billing fake: %v", err)
	}
	f := &contractFixture{s: s}
	t.Cleanup(f.Close)
	return f
}

type contractFixture struct{ s *Server }

var (
	_ adaptercontract.RetryAfterFixture  = (*contractFixture)(nil)
	_ adaptercontract.LookupFaultFixture = (*contractFixture)(nil)
	_ adaptercontract.WindowFixture      = (*contractFixture)(nil)
)

func (f *contractFixture) Type() hooksv1alpha1.BillingProviderType {
	return hooksv1alpha1.BillingProviderHTTP
}

func (f *contractFixture) Provider() (*hooksv1alpha1.BillingProvider, string) {
	return &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{
		Type: hooksv1alpha1.BillingProviderHTTP, Endpoint: f.s.URL()}}, contractToken
}

func (f *contractFixture) Charge(key string) billing.Request {
	return billing.Request{SettlementKey: "contract/inference/" + key, IdempotencyKey: key, Type: billing.TypeCharge,
		Customer: "cus_contract", Usage: &billing.Usage{Meter: "tokens", Quantity: "1500", Unit: "tokens"},
		Metadata: map[string]string{"job": key}, OccurredAt: time.Now().Add(-time.Hour).Truncate(time.Second),
		KeyNamespaced: true}
}

// Effects counts the ledger's entries under key, forgotten keys included.
func (f *contractFixture) Effects(key string) int {
	n := 0
	for _, r := range f.s.Records() {
		if r.IdempotencyKey == key {
			n++
		}
	}
	return n
}

func (f *contractFixture) Fail(fault adaptercontract.Fault, n int) {
	switch fault {
	case adaptercontract.Unavailable:
		f.s.FailNext(n, http.StatusServiceUnavailable)
	case adaptercontract.CommitThenTimeout:
		f.s.CommitThenTimeoutNext(n)
	case adaptercontract.RateLimited:
		f.s.RateLimitNext(n, contractRetryAfter)
	case adaptercontract.Refused:
		f.s.RejectNext(n, http.StatusBadRequest, "invalid_customer")
	default:
		panic(fmt.Sprintf("fake billing: no such contract fault %q", fault))
	}
}

func (f *contractFixture) RetryAfter() time.Duration { return contractRetryAfter }

// FailLookups makes the next n GET /settlements/{key} answer 503.
func (f *contractFixture) FailLookups(n int) { f.s.FailNextLookups(n, http.StatusServiceUnavailable) }

// PassWindow forgets every key for deduplication; lookups still find their records.
func (f *contractFixture) PassWindow() { f.s.ForgetKeys() }

func (f *contractFixture) Close() { _ = f.s.Close() }
