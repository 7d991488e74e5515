// Package cloudevents is the operator's one model of a CloudEvent 1.0 (github.com/
// cloudevents/spec, json-format.md and http-protocol-binding.md), read by hand: the
// receiver reads deliveries with it (binary and structured mode) and the OpenMeter
// adapter writes its usage events with it, so both ends agree on every attribute.
//
// It is hand-written rather than sdk-go: the receiver needs four attributes and the
// data's bytes, which one json.Unmarshal of the envelope (structured mode) or four
// header reads (binary mode) give, on bytes already read and verified. The SDK's HTTP
// binding builds an event.Event per delivery (measured: about twice the time and three
// to eleven times the bytes of this path, microseconds either way) and would add its
// module to the manager; its errors do not name the attribute a sender must fix
// (decisions.md "Sender presets").
package cloudevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// Media types of the JSON event format.
const (
	// StructuredMediaType is one event in structured mode: the body is the event.
	StructuredMediaType = "application/cloudevents+json"
	// BatchMediaType is a JSON array of events in structured mode.
	BatchMediaType = "application/cloudevents-batch+json"
)

// SpecVersion is the CloudEvents version written and read.
const SpecVersion = "1.0"

// Event is what the operator uses of a CloudEvent.
type Event struct {
	// ID is unique within Source: (Source, ID) is the event's identity.
	ID string
	// Source names the context the event happened in, a URI-reference.
	Source string
	// Type is the kind of event, e.g. "prompt.tokens".
	Type string
	// Subject is what the event is about within Source (OpenMeter: the metered
	// customer); "" when absent.
	Subject string
	// Time is when it happened, RFC 3339 as on the wire; "" when absent. It is not
	// checked on reading: the receiver does not use it.
	Time string
	// Data is the event's JSON data, as sent.
	Data json.RawMessage
}

// Identity is the event's identity: id is unique only within source, so both, as a
// JSON array (unambiguous whatever either holds, and readable on the event).
func (e *Event) Identity() string {
	b, _ := json.Marshal([2]string{e.Source, e.ID})
	return string(b)
}

// IsBatch reports whether contentType is the batched JSON format.
func IsBatch(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == BatchMediaType
}

// envelope is the structured-mode JSON of one event.
type envelope struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            string          `json:"time,omitempty"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
	DataBase64      *string         `json:"data_base64,omitempty"`
}

// Read reads an HTTP message in structured mode (Content-Type
// application/cloudevents+json: the body is the event) or binary mode (ce-specversion,
// ce-id, ce-source and ce-type headers: the body is the data). Errors say what a
// sender must change, and never quote a value.
func Read(h http.Header, body []byte) (*Event, error) {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	if mt == StructuredMediaType {
		return ReadStructured(body)
	}
	e := &Event{ID: h.Get("ce-id"), Source: h.Get("ce-source"), Type: h.Get("ce-type"), Subject: h.Get("ce-subject"),
		Time: h.Get("ce-time"), Data: body}
	version := h.Get("ce-specversion")
	if version == "" && e.ID == "" && e.Source == "" && e.Type == "" {
		return nil, errors.New("not a CloudEvent: send binary mode (ce-specversion, ce-id, ce-source and ce-type headers, " +
			"the data as a JSON body) or structured mode (Content-Type " + StructuredMediaType + ")")
	}
	if err := e.check(version, "header ce-"); err != nil {
		return nil, err
	}
	return e, nil
}

// ReadStructured reads one event in structured mode. Only JSON data is accepted.
func ReadStructured(body []byte) (*Event, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("structured-mode CloudEvent is not a JSON object: %w", err)
	}
	return fromEnvelope(env)
}

// ReadBatch reads a batch (application/cloudevents-batch+json): a JSON array of
// structured-mode events, each held to what ReadStructured requires.
func ReadBatch(body []byte) ([]Event, error) {
	var envs []envelope
	if err := json.Unmarshal(body, &envs); err != nil {
		return nil, fmt.Errorf("batched CloudEvents are not a JSON array of events: %w", err)
	}
	out := make([]Event, 0, len(envs))
	for i, env := range envs {
		e, err := fromEnvelope(env)
		if err != nil {
			return nil, fmt.Errorf("event %d of the batch: %w", i, err)
		}
		out = append(out, *e)
	}
	return out, nil
}

func fromEnvelope(env envelope) (*Event, error) {
	e := &Event{ID: env.ID, Source: env.Source, Type: env.Type, Subject: env.Subject, Time: env.Time, Data: env.Data}
	if err := e.check(env.SpecVersion, "attribute "); err != nil {
		return nil, err
	}
	switch {
	case env.DataBase64 != nil:
		return nil, errors.New("the CloudEvent carries data_base64: only JSON data (the data attribute) is accepted")
	case env.DataContentType != "" && !IsJSON(env.DataContentType):
		return nil, errors.New("the CloudEvent's datacontenttype is not JSON: only JSON data is accepted")
	case len(env.Data) == 0 || bytes.Equal(env.Data, []byte("null")):
		return nil, errors.New("the CloudEvent carries no data: its data attribute must hold the JSON payload")
	}
	return e, nil
}

// MarshalStructured writes e in structured mode (StructuredMediaType), JSON data
// inline, in the same envelope Read and ReadStructured read. e must hold what a reader
// requires (id, source, type and JSON data): an event this package would refuse to
// read is refused here, before anything is sent.
func (e *Event) MarshalStructured() ([]byte, error) {
	if err := e.check(SpecVersion, "attribute "); err != nil {
		return nil, err
	}
	if len(e.Data) == 0 || !json.Valid(e.Data) || bytes.Equal(e.Data, []byte("null")) {
		return nil, errors.New("the CloudEvent's data must be a JSON value")
	}
	return json.Marshal(envelope{SpecVersion: SpecVersion, ID: e.ID, Source: e.Source, Type: e.Type, Subject: e.Subject,
		Time: e.Time, DataContentType: "application/json", Data: e.Data})
}

// check enforces the attributes the operator relies on (CloudEvents 1.0 "REQUIRED
// attributes"); where names what is missing ("header ce-" or "attribute ").
func (e *Event) check(version, where string) error {
	if !strings.HasPrefix(version, "1.") {
		return fmt.Errorf("%sspecversion must be 1.0 (CloudEvents 1.0 is accepted)", where)
	}
	for _, a := range []struct{ name, value string }{{"id", e.ID}, {"source", e.Source}, {"type", e.Type}} {
		if strings.TrimSpace(a.value) == "" {
			return fmt.Errorf("%s%s is missing or empty: a CloudEvent needs id, source and type", where, a.name)
		}
	}
	return nil
}

// IsJSON reports whether a media type is JSON (application/json or application/*+json).
func IsJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
