package extract

import (
	"net/http"
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
