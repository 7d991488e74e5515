package v1alpha1

import (
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HasSink reports whether the completion is applied anywhere but in the record
// itself (an HTTP sink). No sink, or a sink of type None, means the JobCompletion is
// the record of completion.
func (s *JobCompletionSpec) HasSink() bool {
	return s.Sink != nil && s.Sink.Type != "" && s.Sink.Type != JobSinkNone
}

// AppliedOnCreation reports whether the record is applied by being created: it has
// no sink (nothing to call), it is still at its first version, and no status was ever
// written for it. Its status stays empty; every reader takes its state from Progress
// (docs/design.md §6.2).
func (jc *JobCompletion) AppliedOnCreation() bool {
	return !jc.Spec.HasSink() && jc.Generation <= 1 &&
		jc.Status.ObservedGeneration == 0 && jc.Status.State == ""
}

// Progress is where the job's completion stands, as every reader must see it: the
// written status, or, for a record applied by its creation, what its controller would
// have written — Applied, the spec's version, at the record's creation. It never
// changes the object.
func (jc *JobCompletion) Progress() JobCompletionStatus {
	if !jc.AppliedOnCreation() {
		return jc.Status
	}
	st := *jc.Status.DeepCopy()
	v := jc.Spec.Completion.Version
	at := jc.CreationTimestamp
	msg := "version " + strconv.FormatInt(v, 10) + " applied at creation: no sink"
	st.ObservedGeneration, st.State, st.AppliedVersion, st.AppliedAt = jc.Generation, JobCompletionApplied, &v, &at
	if src := jc.Spec.Completion.SourceEvent; src != "" {
		st.SourceEvents = []string{src}
	}
	st.Conditions = []metav1.Condition{
		{Type: ConditionApplied, Status: metav1.ConditionTrue, ObservedGeneration: jc.Generation,
			LastTransitionTime: at, Reason: ReasonVersionApplied, Message: msg},
		{Type: ConditionReady, Status: metav1.ConditionTrue, ObservedGeneration: jc.Generation,
			LastTransitionTime: at, Reason: ReasonVersionApplied, Message: msg},
	}
	return st
}
