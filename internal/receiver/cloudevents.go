package receiver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// CloudEvents 1.0 over HTTP (github.com/cloudevents/spec, http-protocol-binding.md),
// read by hand rather than with sdk-go: the receiver needs four attributes and the
// data's bytes, which one json.Unmarshal of the envelope (structured mode) or four
// header reads (binary mode) give, on bytes already read and verified. The SDK's
// HTTP binding builds an event.Event per delivery (measured: about twice the time
// and three to eleven times the bytes of this path, microseconds either way) and
// would add its module to the manager; its errors do not name the attribute a sender
// must fix (decisions.md "Sender presets").
const (
	ceStructuredMediaType = "application/cloudevents+json"
	ceBatchMediaType      = "application/cloudevents-batch+json"
)

// batchRefused tells a sender in batched mode what to do instead.
const batchRefused = "batched CloudEvents (" + ceBatchMediaType + ") are not accepted: send each event in its own " +
	"request, in binary mode (ce-* headers) or structured mode (" + ceStructuredMediaType + "); nothing was stored"

// rejectCloudEvent is status.lastRejection for a verified delivery that is not a
// usable CloudEvent; the sender's 400 answer says which attribute is wrong.
var rejectCloudEvent = &rejection{reason: hooksv1alpha1.RejectionInvalidEvent, signed: true,
	message: "the delivery is not a usable CloudEvent (an attribute is missing, the spec version is not 1.0, or the data is not JSON); the sender's 400 answer names the problem"}

// cloudEvent is what the receiver uses of a CloudEvent.
type cloudEvent struct {
	id, source, eventType string
	// data is the event's data, as sent: the payload routes read, hashed and stored.
	data []byte
}

// eventID is the event's identity: ce-id is unique only within ce-source, so both,
// as a JSON array (unambiguous whatever either holds, and readable on the event).
func (c *cloudEvent) eventID() string {
	b, _ := json.Marshal([2]string{c.source, c.id})
	return string(b)
}

func isCloudEventsBatch(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == ceBatchMediaType
}

// readCloudEvent reads a delivery in structured mode (Content-Type
// application/cloudevents+json: the body is the event) or binary mode (ce-specversion,
// ce-id, ce-source and ce-type headers: the body is the data). Errors say what a
// sender must change, and never quote a value.
func readCloudEvent(h http.Header, body []byte) (*cloudEvent, error) {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	if mt == ceStructuredMediaType {
		return readStructured(body)
	}
	ce := &cloudEvent{id: h.Get("ce-id"), source: h.Get("ce-source"), eventType: h.Get("ce-type"), data: body}
	version := h.Get("ce-specversion")
	if version == "" && ce.id == "" && ce.source == "" && ce.eventType == "" {
		return nil, errors.New("not a CloudEvent: send binary mode (ce-specversion, ce-id, ce-source and ce-type headers, " +
			"the data as a JSON body) or structured mode (Content-Type " + ceStructuredMediaType + ")")
	}
	if err := ce.check(version, "header ce-"); err != nil {
		return nil, err
	}
	return ce, nil
}

func readStructured(body []byte) (*cloudEvent, error) {
	var env struct {
		SpecVersion     string          `json:"specversion"`
		ID              string          `json:"id"`
		Source          string          `json:"source"`
		Type            string          `json:"type"`
		DataContentType string          `json:"datacontenttype"`
		Data            json.RawMessage `json:"data"`
		DataBase64      *string         `json:"data_base64"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("structured-mode CloudEvent is not a JSON object: %w", err)
	}
	ce := &cloudEvent{id: env.ID, source: env.Source, eventType: env.Type, data: env.Data}
	if err := ce.check(env.SpecVersion, "attribute "); err != nil {
		return nil, err
	}
	switch {
	case env.DataBase64 != nil:
		return nil, errors.New("the CloudEvent carries data_base64: only JSON data (the data attribute) is accepted")
	case env.DataContentType != "" && !isJSON(env.DataContentType):
		return nil, errors.New("the CloudEvent's datacontenttype is not JSON: only JSON data is accepted")
	case len(env.Data) == 0 || bytes.Equal(env.Data, []byte("null")):
		return nil, errors.New("the CloudEvent carries no data: its data attribute must hold the JSON payload")
	}
	return ce, nil
}

// check enforces the attributes the receiver relies on (CloudEvents 1.0 "REQUIRED
// attributes"); where names what is missing ("header ce-" or "attribute ").
func (c *cloudEvent) check(version, where string) error {
	if !strings.HasPrefix(version, "1.") {
		return fmt.Errorf("%sspecversion must be 1.0 (CloudEvents 1.0 is accepted)", where)
	}
	for _, a := range []struct{ name, value string }{{"id", c.id}, {"source", c.source}, {"type", c.eventType}} {
		if strings.TrimSpace(a.value) == "" {
			return fmt.Errorf("%s%s is missing or empty: a CloudEvent needs id, source and type", where, a.name)
		}
	}
	return nil
}
