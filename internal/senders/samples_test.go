package senders

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/extract"
	"github.com/settlement-operator/settlement-operator/internal/payload"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The preset samples compile once their preset is applied, and extract what their
// comments promise (the CRD suite applies them to a real API server).
func TestPresetSamples(t *testing.T) {
	data := `{"job_id":"job-1","version":1,"state":"succeeded","customer":"cus_1","usage":{"tokens":42}}`
	for _, c := range []struct {
		file, body string
		header     http.Header
		scheme     hooksv1alpha1.SignatureScheme
	}{
		{"hooks_v1alpha1_webhookprovider_svix.yaml", `{"type":"job.completed","data":` + data + `}`,
			http.Header{"Webhook-Id": {"msg_1"}}, hooksv1alpha1.SchemeStandardWebhooks},
		{"hooks_v1alpha1_webhookprovider_eventbridge.yaml",
			`{"version":"0","id":"msg_1","detail-type":"Job Completed","source":"inference","detail":` + data + `}`,
			http.Header{}, hooksv1alpha1.SchemeAPIKey},
		{"hooks_v1alpha1_webhookprovider_cloudevents_preset.yaml", data, nil, hooksv1alpha1.SchemeAPIKey},
	} {
		t.Run(c.file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", c.file))
			if err != nil {
				t.Fatal(err)
			}
			var p hooksv1alpha1.WebhookProvider
			if err := yaml.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			spec := Apply(&p.Spec)
			if spec.Signature.Scheme != c.scheme {
				t.Fatalf("scheme %q, want %q", spec.Signature.Scheme, c.scheme)
			}
			if err := extract.SignatureConfig(&spec.Signature).Validate(); err != nil {
				t.Fatal(err)
			}
			x, err := extract.Compile("tenant-a", p.Name, &spec)
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			doc, err := payload.Decode([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			var ev *extract.Event
			if IsCloudEvents(&spec) {
				ev, err = x.IdentifyAs("msg_1", "job.completed", []byte(c.body), doc)
			} else {
				ev, err = x.Identify(c.header, []byte(c.body), doc)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := x.Facts(ev, doc); err != nil {
				t.Fatal(err)
			}
			if ev.ID != "msg_1" || len(ev.JobCompletions) != 1 || len(ev.Settlements) != 1 || ev.JobCompletions[0].JobID != "job-1" {
				t.Fatalf("event %+v", ev)
			}
		})
	}
}
