package extract

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/payload"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// The CloudEvents samples extract what their comments promise from a delivery of
// each mode (the CRD suite applies them; this runs them).
func TestCloudEventsSamples(t *testing.T) {
	data := `{"job_id":"job-ce","version":1,"state":"succeeded","customer":"cus_1","usage":{"tokens":42}}`
	for _, c := range []struct {
		file   string
		header http.Header
		body   string
	}{
		{"hooks_v1alpha1_webhookprovider_cloudevents_structured.yaml", http.Header{},
			`{"specversion":"1.0","id":"ce-evt-1","source":"/inference","type":"job.completed","data":` + data + `}`},
		{"hooks_v1alpha1_webhookprovider_cloudevents_binary.yaml",
			http.Header{"Ce-Id": {"ce-evt-1"}, "Ce-Type": {"job.completed"}, "Ce-Specversion": {"1.0"}}, data},
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
			x, err := Compile("tenant-a", p.Name, &p.Spec)
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			doc, err := payload.Decode([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			ev, err := x.Identify(c.header, []byte(c.body), doc)
			if err != nil {
				t.Fatal(err)
			}
			if err := x.Facts(ev, doc); err != nil {
				t.Fatal(err)
			}
			if ev.ID != "ce-evt-1" || ev.Type != "job.completed" || len(ev.JobCompletions) != 1 || len(ev.Settlements) != 1 {
				t.Fatalf("event %+v", ev)
			}
			if jc := ev.JobCompletions[0]; jc.JobID != "job-ce" || jc.Usage.Quantity != "42" {
				t.Fatalf("job completion %+v", jc)
			}
			if st := ev.Settlements[0]; st.Customer != "cus_1" {
				t.Fatalf("settlement %+v", st)
			}
		})
	}
}
