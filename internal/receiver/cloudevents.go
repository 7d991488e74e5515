package receiver

import (
	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/cloudevents"
)

// CloudEvents 1.0 over HTTP are read with internal/cloudevents, the operator's one
// CloudEvents model (the OpenMeter adapter writes its events with it).

// batchRefused tells a sender in batched mode what to do instead.
const batchRefused = "batched CloudEvents (" + cloudevents.BatchMediaType + ") are not accepted: send each event in its own " +
	"request, in binary mode (ce-* headers) or structured mode (" + cloudevents.StructuredMediaType + "); nothing was stored"

// rejectCloudEvent is status.lastRejection for a verified delivery that is not a
// usable CloudEvent; the sender's 400 answer says which attribute is wrong.
var rejectCloudEvent = &rejection{reason: hooksv1alpha1.RejectionInvalidEvent, signed: true,
	message: "the delivery is not a usable CloudEvent (an attribute is missing, the spec version is not 1.0, or the data is not JSON); the sender's 400 answer names the problem"}
