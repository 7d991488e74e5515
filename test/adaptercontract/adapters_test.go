package adaptercontract_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fakelago"
	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
	"github.com/settlement-operator/settlement-operator/test/fakeopenmeter"
	"github.com/settlement-operator/settlement-operator/test/fakestripe"
)

// fixtures is every adapter's fake, as the contract runs it: a new adapter joins with
// one line here.
var fixtures = []fixture{
	{"http", fakebilling.ContractFixture, nil},
	{"stripe-usage", fakestripe.UsageContractFixture, nil},
	{"stripe-amount", fakestripe.AmountContractFixture, nil},
	{"lago", started(fakelago.Start, fakelago.Options{}), nil},
	{"lago-clickhouse", started(fakelago.Start, fakelago.Options{Pipeline: fakelago.ClickHouse}), nil},
	{"metronome", started(fakemetronome.Start, fakemetronome.Options{}), nil},
	{"openmeter", started(fakeopenmeter.Start, fakeopenmeter.Options{Token: fakeopenmeter.Token}), nil},
	{"openmeter-dedup", started(fakeopenmeter.Start, fakeopenmeter.Options{Token: fakeopenmeter.Token, Deduplication: 24 * time.Hour}), nil},
}

// started adapts a fake whose Start returns the fixture itself to the list.
func started[F adaptercontract.Fixture, O any](start func(O) (F, error), opts O) func(t *testing.T) adaptercontract.Fixture {
	return func(t *testing.T) adaptercontract.Fixture {
		t.Helper()
		f, err := start(opts)
		if err != nil {
			t.Fatalf("start the fake: %v", err)
		}
		t.Cleanup(f.Close)
		return f
	}
}

type fixture struct {
	name string
	new  func(t *testing.T) adaptercontract.Fixture
	// gaps are the rows the adapter fails today (adaptercontract.KnownGap), each saying why.
	gaps []adaptercontract.Option
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
		list = []fixture{{name, b.new, b.gaps}}
	}
	for _, f := range list {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			adaptercontract.Run(t, f.new, f.gaps...)
		})
	}
}

// broken are fakes that break the contract on purpose, each as its name says; the
// contract must fail them in the named row, saying so — or, where the break is listed
// as a known gap (passes), pass.
var broken = map[string]struct {
	new       func(t *testing.T) adaptercontract.Fixture
	row, says string
	gaps      []adaptercontract.Option
	passes    bool
	// kind is the fixture's provider type as the contract names it (HTTP when empty).
	kind string
}{
	"refusal-answered-as-outage-a-known-gap": {new: wrapHTTP(func(w *wrapped) { w.refusedAs = adaptercontract.Unavailable }),
		row: "refused", says: "fails, a known gap: refusals answered as outages",
		gaps: []adaptercontract.Option{adaptercontract.KnownGap("refused", "refusals answered as outages")}, passes: true},
	"known-gap-closed": {new: wrapHTTP(func(*wrapped) {}),
		row: "refused", says: "listed as a known gap (refusals answered as outages), yet the row passes",
		gaps: []adaptercontract.Option{adaptercontract.KnownGap("refused", "refusals answered as outages")}},
	"refusal-answered-as-outage": {new: wrapHTTP(func(w *wrapped) { w.refusedAs = adaptercontract.Unavailable }),
		row: "refused", says: "want Terminal"},
	"reply-lost-before-commit": {new: wrapHTTP(func(w *wrapped) { w.lostAs = adaptercontract.Unavailable }),
		row: "billing commits, the reply is lost", says: "finds nothing, yet the platform committed"},
	"charge-counted-twice": {new: wrapHTTP(func(w *wrapped) { w.countsTwice = true }),
		row: "duplicate delivery, sequential", says: "books hold 2 effects under the key, want 1"},
	"failed-lookup-unseen": {new: wrapHTTP(func(w *wrapped) { w.lookupFaultsLost = true }),
		row: "a lookup the platform fails", says: "without an error"},
	"rate-limit-wait-lost": {new: wrapHTTP(func(w *wrapped) { w.retryAfter = 30 * time.Second }),
		row: "rate limited", says: "carries RetryAfter 2s"},
	"usage-total-misses-the-charge": {new: totalsMissCharges, kind: "Metronome",
		row: "reconciliation finds the charge", says: "want the charge's 1523"},
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
			switch {
			case b.passes && err != nil:
				t.Fatalf("the contract fails %s, whose break in row %q is a known gap:\n%s", name, b.row, out)
			case !b.passes && err == nil:
				t.Fatalf("the contract passes %s, which breaks row %q:\n%s", name, b.row, out)
			case !b.passes && !strings.Contains(string(out), "--- FAIL: TestAdapterContract/"+name+"/"):
				t.Fatalf("the contract fails %s, but not in a subtest of it:\n%s", name, out)
			}
			kind := b.kind
			if kind == "" {
				kind = "HTTP"
			}
			if !strings.Contains(string(out), b.row+" ["+kind+" fixture "+name+"]") || !strings.Contains(string(out), b.says) {
				t.Fatalf("the contract's output for %s does not say, in row %q, %q:\n%s", name, b.row, b.says, out)
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

// missingTotals is the Metronome fake whose usage totals leave out what was charged.
type missingTotals struct{ *fakemetronome.Server }

// Charge makes the next usage answer 0, whatever the events add up to.
func (m missingTotals) Charge(key string) billing.Request {
	m.AnswerUsageValue("0")
	return m.Server.Charge(key)
}

func totalsMissCharges(t *testing.T) adaptercontract.Fixture {
	f, err := fakemetronome.Start(fakemetronome.Options{})
	if err != nil {
		t.Fatalf("start the fake: %v", err)
	}
	t.Cleanup(f.Close)
	return missingTotals{f}
}
