package adaptercontract_test

import (
	"testing"

	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fakestripe"
)

// fixtures is every adapter's fake, as the contract runs it: a new adapter joins with
// one line here.
var fixtures = []struct {
	name string
	new  func(t *testing.T) adaptercontract.Fixture
}{
	{"http", fakebilling.ContractFixture},
	{"stripe-usage", fakestripe.UsageContractFixture},
	{"stripe-amount", fakestripe.AmountContractFixture},
}

func TestAdapterContract(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			adaptercontract.Run(t, f.new)
		})
	}
}
