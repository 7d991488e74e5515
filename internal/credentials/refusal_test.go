package credentials

import (
	"strings"
	"testing"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/conditions"
)

// TestCredentialRefusal pins when a Secret may be sent for a use to a destination
// (decisions.md "Credentials").
func TestCredentialRefusal(t *testing.T) {
	billing := map[string]string{hooksv1alpha1.LabelCredentialFor: hooksv1alpha1.CredentialForBilling}
	dest := func(v string) map[string]string {
		return map[string]string{hooksv1alpha1.AnnotationCredentialDestinations: v}
	}
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		use, to     string
		refused     string // substring of the refusal; "" = allowed
	}{
		{"no label", nil, dest("https://b.example.com"), "billing", "https://b.example.com", "no label"},
		{"other use", map[string]string{hooksv1alpha1.LabelCredentialFor: "job-sink"}, dest("https://b.example.com"),
			"billing", "https://b.example.com", `is "job-sink", not "billing"`},
		{"no destinations", billing, nil, "billing", "https://b.example.com", "no annotation"},
		{"empty destinations", billing, dest(" "), "billing", "https://b.example.com", "no annotation"},
		{"exact", billing, dest("https://b.example.com/v1"), "billing", "https://b.example.com/v1", ""},
		{"trailing slash", billing, dest("https://b.example.com/v1/"), "billing", "https://b.example.com/v1", ""},
		{"below the prefix", billing, dest("https://b.example.com/v1"), "billing", "https://b.example.com/v1/eu", ""},
		{"host only covers every path", billing, dest("https://b.example.com"), "billing", "https://b.example.com/x/y", ""},
		{"default port", billing, dest("https://b.example.com:443"), "billing", "https://B.Example.com/v1", ""},
		{"one of several", billing, dest("https://a.example.com, http://127.0.0.1:8091\nhttps://c.example.com"),
			"billing", "http://127.0.0.1:8091", ""},
		{"not at a segment boundary", billing, dest("https://b.example.com/v1"), "billing", "https://b.example.com/v10", "does not list"},
		{"dot-dot out of the prefix", billing, dest("https://b.example.com/v1"), "billing", "https://b.example.com/v1/../admin", "plain path"},
		{"dot-dot-semicolon (Tomcat, Spring)", billing, dest("https://b.example.com/v1"), "billing", "https://b.example.com/v1/..;/admin", "plain path"},
		{"backslashes (IIS)", billing, dest("https://b.example.com/v1"), "billing", `https://b.example.com/v1/..\..\admin`, "plain path"},
		{"encoded slash", billing, dest("https://b.example.com/v1"), "billing", "https://b.example.com/v1%2F..%2Fadmin", "plain path"},
		{"encoded dots", billing, dest("https://b.example.com/v1"), "billing", "https://b.example.com/v1/%2e%2e/admin", "plain path"},
		{"double slash", billing, dest("https://b.example.com/v1"), "billing", "https://b.example.com/v1//x", "plain path"},
		{"a prefix with dot-dot lists nothing", billing, dest("https://b.example.com/v1/../v2"), "billing", "https://b.example.com/v2", "does not list"},
		{"other host", billing, dest("https://b.example.com"), "billing", "https://evil.example.net", "does not list"},
		{"suffix host", billing, dest("https://b.example.com"), "billing", "https://b.example.com.evil.net", "does not list"},
		{"user info", billing, dest("https://b.example.com"), "billing", "https://b.example.com@evil.net", "not an absolute"},
		{"other port", billing, dest("https://b.example.com"), "billing", "https://b.example.com:8443", "does not list"},
		{"plain http not covered by https", billing, dest("https://b.example.com"), "billing", "http://b.example.com", "does not list"},
		{"query", billing, dest("https://b.example.com"), "billing", "https://b.example.com/?x=1", "not an absolute"},
		{"unusable prefix ignored", billing, dest("b.example.com"), "billing", "https://b.example.com", "does not list"},
		{"job sink", map[string]string{hooksv1alpha1.LabelCredentialFor: "job-sink"}, dest("https://jobs.example.com"),
			"job-sink", "https://jobs.example.com", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Refusal(tc.labels, tc.annotations, tc.use, tc.to)
			switch {
			case tc.refused == "" && got != "":
				t.Errorf("refused (%s), want allowed", got)
			case tc.refused != "" && !strings.Contains(got, tc.refused):
				t.Errorf("got %q, want a refusal containing %q", got, tc.refused)
			}
		})
	}
}

// TestCredentialRefusedErrorSaysWhatToDo: the message names the label and annotation
// with the values to set, and never anything the Secret holds.
func TestCredentialRefusedErrorSaysWhatToDo(t *testing.T) {
	err := &RefusedError{Namespace: "team-a", Secret: "billing-token", Use: "billing",
		Destination: "https://b.example.com/v1", Reason: "it has no label " + hooksv1alpha1.LabelCredentialFor}
	msg := err.Error()
	for _, want := range []string{
		"kubectl label secret billing-token -n team-a hooks.settlement.dev/credential-for=billing",
		"kubectl annotate secret billing-token -n team-a hooks.settlement.dev/credential-destinations=https://b.example.com/v1",
		"Nothing is sent until then",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if len(conditions.TruncateMessage(msg)) != len(msg) {
		t.Errorf("message is %d bytes: it would be truncated in a condition", len(msg))
	}
}
