package cloudevents

import (
	"net/http"
	"strings"
	"testing"
)

// TestWrittenEventsReadBack: what MarshalStructured writes, Read (structured mode)
// and ReadBatch read back attribute for attribute; the one model serves both ends.
func TestWrittenEventsReadBack(t *testing.T) {
	in := Event{ID: "sk_1", Source: "settlement-operator/ns", Type: "tokens", Subject: "cus_1",
		Time: "2026-12-01T09:00:00Z", Data: []byte(`{"tokens":"12.5"}`)}
	b, err := in.MarshalStructured()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Read(http.Header{"Content-Type": {StructuredMediaType}}, b)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != in.ID || got.Source != in.Source || got.Type != in.Type || got.Subject != in.Subject || got.Time != in.Time ||
		string(got.Data) != string(in.Data) {
		t.Fatalf("read back %+v, want %+v", got, in)
	}
	batch, err := ReadBatch([]byte("[" + string(b) + "," + string(b) + "]"))
	if err != nil || len(batch) != 2 || batch[1].Identity() != in.Identity() {
		t.Fatalf("batch: %v, %+v", err, batch)
	}
}

// TestRefusedBeforeSending: an event a reader would refuse is never written.
func TestRefusedBeforeSending(t *testing.T) {
	for name, e := range map[string]Event{
		"no id":       {Source: "s", Type: "t", Data: []byte(`{}`)},
		"no source":   {ID: "i", Type: "t", Data: []byte(`{}`)},
		"no type":     {ID: "i", Source: "s", Data: []byte(`{}`)},
		"no data":     {ID: "i", Source: "s", Type: "t"},
		"null data":   {ID: "i", Source: "s", Type: "t", Data: []byte(`null`)},
		"broken data": {ID: "i", Source: "s", Type: "t", Data: []byte(`{`)},
	} {
		if _, err := e.MarshalStructured(); err == nil {
			t.Errorf("%s: written", name)
		}
	}
	if _, err := ReadBatch([]byte(`[{"specversion":"1.0","id":"i","source":"s","type":"t"}]`)); err == nil ||
		!strings.Contains(err.Error(), "event 0") {
		t.Errorf("a batch event without data: %v", err)
	}
}
