package adaptercontract_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fakestripe"
)

// fixtures is every adapter's fake, as the contract runs it: a new adapter joins with
// one line here.
var fixtures = []fixture{
	{"http", fakebilling.ContractFixture},
	{"stripe-usage", fakestripe.UsageContractFixture},
	{"stripe-amount", fakestripe.AmountContractFixture},
}

type fixture struct {
	name string
	new  func(t *testing.T) adaptercontract.Fixture
}

// brokenEnv names, in a child test process, the broken fixture TestAdapterContract
// runs instead of the list.
const brokenEnv = "ADAPTERCONTRACT_BROKEN"

func TestAdapterContract(t *testing.T) {
	list := fixtures
	if name := os.Getenv(brokenEnv); name != "" {
		b, ok := broken[name]
		if !ok {
			t.Fatalf("no broken fixture %q", name)
		}
		list = []fixture{{name, b.new}}
	}
	for _, f := range list {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			adaptercontract.Run(t, f.new)
		})
	}
}

// broken are fakes that break the contract on purpose, each as its name says; the
// contract must fail them in the named row, saying so.
var broken = map[string]struct {
	new       func(t *testing.T) adaptercontract.Fixture
	row, says string
}{
	"refusal-answered-as-outage": {wrapHTTP(func(w *wrapped) { w.refusedAs = adaptercontract.Unavailable }),
		"refused", "want Terminal"},
	"reply-lost-before-commit": {wrapHTTP(func(w *wrapped) { w.lostAs = adaptercontract.Unavailable }),
		"billing commits, the reply is lost", "finds nothing, yet the platform committed"},
	"charge-counted-twice": {wrapHTTP(func(w *wrapped) { w.countsTwice = true }),
		"duplicate delivery, sequential", "books hold 2 effects under the key, want 1"},
	"failed-lookup-unseen": {wrapHTTP(func(w *wrapped) { w.lookupFaultsLost = true }),
		"a lookup the platform fails", "without an error"},
	"rate-limit-wait-lost": {wrapHTTP(func(w *wrapped) { w.retryAfter = 30 * time.Second }),
		"rate limited", "carries RetryAfter 2s"},
}

// The contract is no test that cannot fail: run in a child process against each broken
// fixture, the named row fails with the named message.
func TestTheContractFailsBrokenFakes(t *testing.T) {
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pattern := "^TestAdapterContract$/^" + regexp.QuoteMeta(name) + "$/^" + regexp.QuoteMeta(strings.ReplaceAll(b.row, " ", "_")) + "$"
			cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the contract passes %s, which breaks row %q:\n%s", name, b.row, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestAdapterContract/"+name+"/") ||
				!strings.Contains(string(out), b.row+" [HTTP fixture "+name+"]") || !strings.Contains(string(out), b.says) {
				t.Fatalf("the contract fails %s, but not in row %q saying %q:\n%s", name, b.row, b.says, out)
			}
		})
	}
}

// wrapped is the HTTP fixture, broken as its fields say.
type wrapped struct {
	adaptercontract.Fixture
	refusedAs, lostAs adaptercontract.Fault
	countsTwice       bool
	lookupFaultsLost  bool
	retryAfter        time.Duration
}

func wrapHTTP(breakIt func(*wrapped)) func(t *testing.T) adaptercontract.Fixture {
	return func(t *testing.T) adaptercontract.Fixture {
		w := &wrapped{Fixture: fakebilling.ContractFixture(t)}
		breakIt(w)
		return w
	}
}

func (w *wrapped) Fail(f adaptercontract.Fault, n int) {
	switch {
	case f == adaptercontract.Refused && w.refusedAs != "":
		f = w.refusedAs
	case f == adaptercontract.CommitThenTimeout && w.lostAs != "":
		f = w.lostAs
	}
	w.Fixture.Fail(f, n)
}

// Effects of a platform that books every charge twice.
func (w *wrapped) Effects(key string) int {
	n := w.Fixture.Effects(key)
	if w.countsTwice && n > 0 {
		n++
	}
	return n
}

func (w *wrapped) FailLookups(n int) {
	if !w.lookupFaultsLost {
		w.Fixture.(adaptercontract.LookupFaultFixture).FailLookups(n)
	}
}

func (w *wrapped) PassWindow() { w.Fixture.(adaptercontract.WindowFixture).PassWindow() }

func (w *wrapped) RetryAfter() time.Duration {
	if w.retryAfter != 0 {
		return w.retryAfter
	}
	return w.Fixture.(adaptercontract.RetryAfterFixture).RetryAfter()
}
