package fakestripe

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// The contract fixtures' key, meter and rate-limit wait.
const (
	contractKey        = "sk_test_contract4f1e9a"
	contractRetryAfter = 2 * time.Second
	meterEventsPath    = "/v1/billing/meter_events"
	invoiceItemsPath   = "/v1/invoiceitems"
)

// UsageContractFixture starts the fake as the adapter contract's fixture for a Stripe
// usage charge (a meter event: no lookup, a resend inside 24 hours is proof). It
// stops when t ends.
func UsageContractFixture(t *testing.T) adaptercontract.Fixture {
	t.Helper()
	return startContract(t, meterEventsPath)
}

// AmountContractFixture starts the fake as the adapter contract's fixture for a
// Stripe amount charge (an invoice item: found by listing the customer's items). It
// stops when t ends.
func AmountContractFixture(t *testing.T) adaptercontract.Fixture {
	t.Helper()
	return startContract(t, invoiceItemsPath)
}

func startContract(t *testing.T, path string) adaptercontract.Fixture {
	t.Helper()
	s, err := Start(Options{APIKey: contractKey, Meters: []Meter{{ID: "mtr_tokens", EventName: "tokens_used"}}})
	if err != nil {
		t.Fatalf("start the Stripe-shaped fake: %v", err)
	}
	f := &contractFixture{s: s, path: path}
	t.Cleanup(f.Close)
	return f
}

// contractFixture is the fake as one shape of Stripe charge: path is the endpoint
// its submissions go to, which the faults aim at.
type contractFixture struct {
	s     *Server
	path  string
	close sync.Once
}

var (
	_ adaptercontract.RetryAfterFixture  = (*contractFixture)(nil)
	_ adaptercontract.LookupFaultFixture = (*contractFixture)(nil)
	_ adaptercontract.WindowFixture      = (*contractFixture)(nil)
)

func (f *contractFixture) Type() hooksv1alpha1.BillingProviderType {
	return hooksv1alpha1.BillingProviderStripe
}

func (f *contractFixture) Provider() (*hooksv1alpha1.BillingProvider, string) {
	return &hooksv1alpha1.BillingProvider{Spec: hooksv1alpha1.BillingProviderSpec{
		Type: hooksv1alpha1.BillingProviderStripe, Endpoint: f.s.URL(),
		Stripe: &hooksv1alpha1.StripeSettings{Meters: []hooksv1alpha1.StripeMeter{
			{Meter: "tokens", EventName: "tokens_used", ID: "mtr_tokens"}}}}}, contractKey
}

func (f *contractFixture) Charge(key string) billing.Request {
	r := billing.Request{SettlementKey: "contract/inference/" + key, IdempotencyKey: key, Type: billing.TypeCharge,
		Customer: "cus_contract", Metadata: map[string]string{"job": key},
		OccurredAt: time.Now().Add(-time.Hour).Truncate(time.Second), KeyNamespaced: true}
	if f.path == meterEventsPath {
		r.Usage = &billing.Usage{Meter: "tokens", Quantity: "1500", Unit: "tokens"}
	} else {
		r.Amount = &billing.Amount{Minor: 1250, Currency: "USD"}
	}
	return r
}

// Effects is Charges: live meter events with key as identifier, live invoice items
// carrying it in their metadata.
func (f *contractFixture) Effects(key string) int { return f.s.Charges(key) }

func (f *contractFixture) Fail(fault adaptercontract.Fault, n int) {
	switch fault {
	case adaptercontract.Unavailable:
		f.s.FailNext(n, f.path, http.StatusInternalServerError, "api_error", "", "")
	case adaptercontract.CommitThenTimeout:
		f.s.CommitThenHangNext(n, f.path)
	case adaptercontract.RateLimited:
		f.s.RateLimitNext(n, contractRetryAfter)
	case adaptercontract.Refused:
		f.s.RefuseNext(n, f.path, http.StatusBadRequest, "resource_missing", "customer")
	default:
		panic(fmt.Sprintf("fake stripe: no such contract fault %q", fault))
	}
}

func (f *contractFixture) RetryAfter() time.Duration { return contractRetryAfter }

// FailLookups makes the next n requests to the charge's endpoint answer Stripe's 500
// api_error: the listing of invoice items (a meter event is never read).
func (f *contractFixture) FailLookups(n int) {
	f.s.FailNext(n, f.path, http.StatusInternalServerError, "api_error", "", "")
}

// PassWindow drops every saved idempotency result, as Stripe does after 24 hours;
// invoice items are still listed.
func (f *contractFixture) PassWindow() { f.s.ForgetKeys() }

func (f *contractFixture) Close() { f.close.Do(func() { _ = f.s.Close() }) }
