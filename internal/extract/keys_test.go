package extract

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/payload"
)

// keySpec has a per-job route (default key) and a per-line route (keyFrom .a, .b).
func keySpec() *hooksv1alpha1.WebhookProviderSpec {
	spec := testSpec()
	spec.Routes = append(spec.Routes, hooksv1alpha1.Route{EventType: "invoice.paid",
		Operations: []hooksv1alpha1.RouteOperation{{Type: hooksv1alpha1.OperationBillingSettlement,
			ForEach: ".lines", Settlement: &hooksv1alpha1.SettlementMapping{
				BillingProviderRef: "billing", KeyFrom: []string{".a", ".b"}, Customer: "$.customer",
				Amount: &hooksv1alpha1.AmountMapping{Minor: ".cents", Currency: "USD"}}}}})
	return spec
}

func facts(t *testing.T, namespace, body string) (*Event, error) {
	t.Helper()
	x, err := Compile(namespace, "inference", keySpec())
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	doc, err := payload.Decode([]byte(body))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	ev, err := x.Identify(http.Header{"Webhook-Id": {"msg_1"}}, []byte(body), doc)
	if err != nil {
		return nil, err
	}
	return ev, x.Facts(ev, doc)
}

func mustFacts(t *testing.T, namespace, body string) *Event {
	t.Helper()
	ev, err := facts(t, namespace, body)
	if err != nil {
		t.Fatalf("facts of %s: %v", body, err)
	}
	return ev
}

func jobBody(id string) string {
	return `{"type":"job.completed","seq":1,"customer":"c1","cents":1,"job":{"id":` + id + `,"state":"succeeded","tokens":"1","model":"m"}}`
}

func lines(items string) string {
	return `{"type":"invoice.paid","customer":"c1","lines":[` + items + `]}`
}

func TestSettlementKeysAreNamespaced(t *testing.T) {
	a := mustFacts(t, "team-a", jobBody(`"j1"`))
	b := mustFacts(t, "team-b", jobBody(`"j1"`))
	if a.Settlements[0].SettlementKey == b.Settlements[0].SettlementKey {
		t.Errorf("job j1 of provider inference has key %q in two namespaces", a.Settlements[0].SettlementKey)
	}
	la := mustFacts(t, "team-a", lines(`{"a":"x","b":"y","cents":1}`))
	lb := mustFacts(t, "team-b", lines(`{"a":"x","b":"y","cents":1}`))
	if la.Settlements[0].SettlementKey == lb.Settlements[0].SettlementKey {
		t.Errorf("keyFrom key %q is the same in two namespaces", la.Settlements[0].SettlementKey)
	}
}

func TestSettlementKeysDoNotCollide(t *testing.T) {
	slash := mustFacts(t, "ns", lines(`{"a":"a/b","b":"c","cents":1},{"a":"a","b":"b/c","cents":1}`))
	if k0, k1 := slash.Settlements[0].SettlementKey, slash.Settlements[1].SettlementKey; k0 == k1 {
		t.Errorf(`keyFrom ["a/b","c"] and ["a","b/c"] share key %q`, k0)
	}
	job := mustFacts(t, "ns", jobBody(`"x/y"`))
	fields := mustFacts(t, "ns", lines(`{"a":"x","b":"y","cents":1}`))
	if jk, fk := job.Settlements[0].SettlementKey, fields.Settlements[0].SettlementKey; jk == fk {
		t.Errorf("the default key of job x/y and keyFrom [x, y] share key %q", jk)
	}
}

func TestItemsWithTheSameKeyAreRefused(t *testing.T) {
	_, err := facts(t, "ns", lines(`{"a":"x","b":"1","cents":1},{"a":"y","b":"1","cents":2},{"a":"x","b":"1","cents":3}`))
	if err == nil || !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("got %v, want ErrInvalidEvent", err)
	}
	for _, want := range []string{"same settlement key", "items 0 and 2", ".lines", ".a", ".b"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "c1") {
		t.Errorf("error %q echoes the payload", err)
	}
}

func TestNumericIdentityIsCanonical(t *testing.T) {
	same := []string{`42`, `42.0`, `4.2e1`, `420e-1`}
	first := mustFacts(t, "ns", jobBody(same[0]))
	for _, id := range same[1:] {
		ev := mustFacts(t, "ns", jobBody(id))
		if ev.JobCompletions[0].JobID != first.JobCompletions[0].JobID {
			t.Errorf("job ID %s is %q, want %q as for %s", id, ev.JobCompletions[0].JobID, first.JobCompletions[0].JobID, same[0])
		}
		if ev.Settlements[0].SettlementKey != first.Settlements[0].SettlementKey {
			t.Errorf("job %s has settlement key %q, want %q", id, ev.Settlements[0].SettlementKey, first.Settlements[0].SettlementKey)
		}
	}
	if first.JobCompletions[0].JobID != "42" {
		t.Errorf("job ID 42 is %q", first.JobCompletions[0].JobID)
	}
	k1 := mustFacts(t, "ns", lines(`{"a":1.50,"b":"x","cents":1}`)).Settlements[0].SettlementKey
	k2 := mustFacts(t, "ns", lines(`{"a":15e-1,"b":"x","cents":1}`)).Settlements[0].SettlementKey
	if k1 != k2 {
		t.Errorf("keyFrom value 1.50 and 15e-1 give keys %q and %q", k1, k2)
	}

	// Different numbers stay different, even where a double cannot tell them apart.
	big1 := mustFacts(t, "ns", jobBody(`9007199254740993`)).JobCompletions[0].JobID
	big2 := mustFacts(t, "ns", jobBody(`9007199254740992`)).JobCompletions[0].JobID
	if big1 == big2 || big1 != "9007199254740993" {
		t.Errorf("job IDs 2^53+1 and 2^53 are %q and %q, want their exact digits", big1, big2)
	}
	if _, err := facts(t, "ns", jobBody(`0.10000000000000001`)); err == nil || !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("a fractional job ID beyond double precision: got %v, want ErrInvalidEvent", err)
	}
}
