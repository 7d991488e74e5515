package extract

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/payload"
)

func testSpec() *hooksv1alpha1.WebhookProviderSpec {
	return &hooksv1alpha1.WebhookProviderSpec{
		Signature: hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeStandardWebhooks},
		EventID:   hooksv1alpha1.EventIDSource{Header: "webhook-id"},
		EventType: hooksv1alpha1.FieldSource{JSONPath: ".type"},
		Sequence:  ".seq",
		Routes: []hooksv1alpha1.Route{{
			EventType: "job.completed",
			Operations: []hooksv1alpha1.RouteOperation{
				{Type: hooksv1alpha1.OperationJobCompletion, JobCompletion: &hooksv1alpha1.JobCompletionMapping{
					JobID: ".job.id", State: ".job.state",
					Usage: &hooksv1alpha1.UsageMapping{Quantity: ".job.tokens", MeterPath: ".job.model"},
				}},
				{Type: hooksv1alpha1.OperationBillingSettlement, Settlement: &hooksv1alpha1.SettlementMapping{
					BillingProviderRef: "billing", JobID: ".job.id", Customer: ".customer",
					Amount: &hooksv1alpha1.AmountMapping{Minor: ".cents", Currency: "USD"},
				}},
			},
		}},
	}
}

func run(t *testing.T, body string) (*Event, error) {
	t.Helper()
	x, err := Compile("ns", "inference", testSpec())
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	doc, err := payload.Decode([]byte(body))
	if err != nil {
		return nil, err
	}
	ev, err := x.Identify(http.Header{"Webhook-Id": {"msg_1"}}, []byte(body), doc)
	if err != nil {
		return nil, err
	}
	return ev, x.Facts(ev, doc)
}

func TestFacts(t *testing.T) {
	ev, err := run(t, `{"type":"job.completed","seq":7,"customer":"c1","cents":1250,
		"job":{"id":"j1","state":"Canceled","tokens":"42.5","model":"m-large"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID != "msg_1" || ev.Type != "job.completed" || *ev.Sequence != 7 || !ev.Routed || !ev.Store {
		t.Fatalf("identity: %+v", ev)
	}
	jc := ev.JobCompletions[0]
	if jc.JobID != "j1" || jc.Version != 7 || jc.State != hooksv1alpha1.JobCancelled ||
		jc.Usage.Meter != "m-large" || jc.Usage.Quantity != "42.5" {
		t.Fatalf("job facts: %+v", jc)
	}
	st := ev.Settlements[0]
	if st.SettlementKey != `["job","ns","inference","j1"]` || st.Customer != "c1" || st.Amount.Minor != 1250 || st.Amount.Currency != "USD" {
		t.Fatalf("settlement facts: %+v", st)
	}
}

func TestFactsErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"missing job", `{"type":"job.completed","customer":"c","cents":1,"job":{"tokens":1,"model":"m"}}`, "job ID is missing (JSON path .job.id)"},
		{"float amount", `{"type":"job.completed","customer":"c","cents":1.5,"job":{"id":"j","state":"failed","tokens":1,"model":"m"}}`, "amount"},
		{"negative amount", `{"type":"job.completed","customer":"c","cents":-1,"job":{"id":"j","state":"failed","tokens":1,"model":"m"}}`, "negative"},
		{"exponent quantity", `{"type":"job.completed","customer":"c","cents":1,"job":{"id":"j","state":"failed","tokens":1e3,"model":"m"}}`, "non-negative decimal"},
		{"object as id", `{"type":"job.completed","customer":"c","cents":1,"job":{"id":{"a":1},"tokens":1,"model":"m"}}`, "want a string"},
		{"missing type", `{"customer":"c"}`, "event type is missing"},
		{"bad sequence", `{"type":"job.completed","seq":"x"}`, "sequence"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, tc.body)
			if err == nil || !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidEvent containing %q", err, tc.want)
			}
		})
	}
}

func TestUnroutedAndDerivedID(t *testing.T) {
	spec := testSpec()
	spec.EventID = hooksv1alpha1.EventIDSource{DerivedFrom: []string{".job.id", ".seq"}}
	x, err := Compile("ns", "p", spec)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"job.started","seq":1,"job":{"id":"j"}}`)
	doc, _ := payload.Decode(body)
	ev, err := x.Identify(http.Header{}, body, doc)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Routed || ev.Store || !strings.HasPrefix(ev.ID, DerivedIDPrefix) {
		t.Fatalf("unrouted event: %+v", ev)
	}
	ev2, _ := x.Identify(http.Header{}, []byte(`{"seq":1,"job":{"id":"j"},"type":"job.started"}`), doc)
	if ev2.ID != ev.ID {
		t.Fatal("derived IDs must depend only on the listed fields")
	}
}

func TestCompileErrors(t *testing.T) {
	spec := testSpec()
	spec.Routes[0].Operations[0].JobCompletion.JobID = "job.id" // not a path
	if _, err := Compile("ns", "p", spec); err == nil || !strings.Contains(err.Error(), "spec.routes[0].operations[0].jobCompletion.jobID") {
		t.Fatalf("want an error naming the field, got %v", err)
	}
	spec = testSpec()
	spec.Routes[0].Operations[1].Settlement.JobID = ""
	if _, err := Compile("ns", "p", spec); err == nil || !strings.Contains(err.Error(), "keyFrom") {
		t.Fatalf("want a key source error, got %v", err)
	}
}

func TestParseJobState(t *testing.T) {
	for in, want := range map[string]hooksv1alpha1.JobState{
		"succeeded": hooksv1alpha1.JobSucceeded, "COMPLETED": hooksv1alpha1.JobSucceeded,
		"error": hooksv1alpha1.JobFailed, "canceled": hooksv1alpha1.JobCancelled, " Cancelled ": hooksv1alpha1.JobCancelled,
	} {
		if got, err := ParseJobState(in); err != nil || got != want {
			t.Errorf("ParseJobState(%q) = %v, %v", in, got, err)
		}
	}
}

// FuzzExtract feeds arbitrary bodies and header values through identification and
// route extraction: it must never panic, and every refusal must be ErrInvalidEvent
// (a 400), never something the receiver would misreport.
func FuzzExtract(f *testing.F) {
	f.Add(`{"type":"job.completed","seq":7,"customer":"c1","cents":1250,"job":{"id":"j1","state":"failed","tokens":"42","model":"m"}}`, "msg_1")
	f.Add(`{"type":"job.completed","job":{"id":[1,2]}}`, "")
	f.Add(`{"type":1e400}`, "x")
	x, err := Compile("ns", "inference", testSpec())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body, id string) {
		doc, err := payload.Decode([]byte(body))
		if err != nil {
			return
		}
		ev, err := x.Identify(http.Header{"Webhook-Id": {id}}, []byte(body), doc)
		if err != nil {
			if !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Identify: unexpected error class: %v", err)
			}
			return
		}
		if err := x.Facts(ev, doc); err != nil && !errors.Is(err, ErrInvalidEvent) {
			t.Fatalf("Facts: unexpected error class: %v", err)
		}
	})
}

// TestSignedSources: a spec stored before the CRD's signed-source rules that takes a field
// from an unsigned header, or accepts an HMAC with no timestamp without saying so, is
// not served.
func TestSignedSources(t *testing.T) {
	hmac := func(ts string, allow bool) hooksv1alpha1.SignatureSpec {
		return hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeHMACSHA256, Header: "X-Signature",
			TimestampHeader: ts, InsecureAllowReplay: allow}
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*hooksv1alpha1.WebhookProviderSpec)
		wantErr string
	}{
		{"StandardWebhooks webhook-id is signed", func(*hooksv1alpha1.WebhookProviderSpec) {}, ""},
		{"webhook-id in any case", func(s *hooksv1alpha1.WebhookProviderSpec) { s.EventID.Header = "Webhook-ID" }, ""},
		{"another header under StandardWebhooks", func(s *hooksv1alpha1.WebhookProviderSpec) {
			s.EventID.Header = "X-Event-Id"
		}, "spec.eventID.header: header X-Event-Id is not covered by the StandardWebhooks signature"},
		{"type from a header", func(s *hooksv1alpha1.WebhookProviderSpec) {
			s.EventType = hooksv1alpha1.FieldSource{Header: "X-Event-Type"}
		}, "spec.eventType.header"},
		{"Stripe signs no header", func(s *hooksv1alpha1.WebhookProviderSpec) {
			s.Signature = hooksv1alpha1.SignatureSpec{Scheme: hooksv1alpha1.SchemeStripe}
		}, "spec.eventID.header: header webhook-id is not covered by the Stripe signature"},
		{"HMAC with a signed timestamp, ID from the payload", func(s *hooksv1alpha1.WebhookProviderSpec) {
			s.Signature, s.EventID = hmac("X-Timestamp", false), hooksv1alpha1.EventIDSource{JSONPath: ".id"}
		}, ""},
		{"HMAC timestamp header as event ID", func(s *hooksv1alpha1.WebhookProviderSpec) {
			s.Signature, s.EventID = hmac("X-Timestamp", false), hooksv1alpha1.EventIDSource{Header: "X-Timestamp"}
		}, "spec.eventID.header"},
		{"HMAC without a timestamp", func(s *hooksv1alpha1.WebhookProviderSpec) {
			s.Signature, s.EventID = hmac("", false), hooksv1alpha1.EventIDSource{JSONPath: ".id"}
		}, "insecureAllowReplay"},
		{"HMAC without a timestamp, opted out", func(s *hooksv1alpha1.WebhookProviderSpec) {
			s.Signature, s.EventID = hmac("", true), hooksv1alpha1.EventIDSource{JSONPath: ".id"}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec()
			tc.mutate(spec)
			_, err := Compile("ns", "p", spec)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("want no error, got %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("want an error containing %q, got %v", tc.wantErr, err)
			}
		})
	}
}

// TestFieldError: a missing or unusable field is a FieldError naming the path and the
// problem, never the value; its message to the sender is unchanged.
func TestFieldError(t *testing.T) {
	const value = "cus_value_that_must_not_leak"
	tests := []struct {
		name, body, path, problem, message string
		missing                            bool
	}{
		{"missing customer", `{"type":"job.completed","cents":1,"job":{"id":"j1","state":"Succeeded","tokens":"1","model":"m"}}`,
			".customer", "customer is missing", "customer is missing (JSON path .customer)", true},
		{"customer too long", `{"type":"job.completed","cents":1,"customer":"` + value + strings.Repeat("x", 300) + `","job":{"id":"j1","state":"Succeeded","tokens":"1","model":"m"}}`,
			".customer", "customer is longer than 256 bytes", "customer is 328 bytes long", false},
		{"missing job ID", `{"type":"job.completed","cents":1,"customer":"` + value + `","job":{"state":"Succeeded","tokens":"1","model":"m"}}`,
			".job.id", "job ID is missing", "job ID is missing (JSON path .job.id)", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := run(t, tt.body)
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("want a FieldError wrapping ErrInvalidEvent, got %v", err)
			}
			if fe.Path != tt.path || fe.Problem != tt.problem || fe.Missing != tt.missing {
				t.Fatalf("got %+v", fe)
			}
			if strings.Contains(fe.Path+fe.Problem, value) {
				t.Fatalf("the path or problem holds a value: %+v", fe)
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Fatalf("message %q lacks %q", err.Error(), tt.message)
			}
		})
	}
}
