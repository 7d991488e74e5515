package extract

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// States is a provider's job-state table (spec.states), keyed by the normalised
// state: lower case, surrounding space trimmed (docs/design.md §5, "Job states").
type States map[string]hooksv1alpha1.JobStateMeaning

// CompileStates builds the table; two entries for one state are refused (the CRD
// refuses them too; this catches objects stored before that rule).
func compileStates(c *compiler, table []hooksv1alpha1.JobStateMapping) States {
	if len(table) == 0 {
		return nil
	}
	t := make(States, len(table))
	for i, m := range table {
		k := normState(m.State)
		switch {
		case k == "":
			c.fail("spec.states[%d].state: a state is required", i)
		case t[k] != "":
			c.fail("spec.states[%d].state: %q is listed twice (states are compared ignoring case)", i, m.State)
		}
		switch m.As {
		case hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobSucceeded), hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobFailed),
			hooksv1alpha1.JobStateMeaning(hooksv1alpha1.JobCancelled), hooksv1alpha1.JobStateIgnored:
		default:
			c.fail("spec.states[%d].as: %q is not one of Succeeded, Failed, Cancelled, Ignored", i, m.As)
		}
		t[k] = m.As
	}
	return t
}

func normState(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

// Resolve reads a sender's job state: through the table first, then as the operator
// always read states (ParseJobState), so a provider without spec.states means what it
// meant before. ok is false for an unmapped state.
func (t States) Resolve(s string) (meaning hooksv1alpha1.JobStateMeaning, ok bool) {
	if m, found := t[normState(s)]; found {
		return m, true
	}
	st, err := ParseJobState(s)
	if err != nil {
		return "", false
	}
	return hooksv1alpha1.JobStateMeaning(st), true
}

// unmappedPrefix starts the CEL error jobState() raises for an unmapped state, so that
// a condition over such a state is recognised as unmapped rather than as a payload
// that does not fit (a 400).
const unmappedPrefix = "jobState: unmapped job state "

var unmappedPattern = regexp.MustCompile(regexp.QuoteMeta(unmappedPrefix) + `("(?:[^"\\]|\\.)*")`)

// UnmappedError is a condition that read an unmapped job state with jobState().
type UnmappedError struct {
	Field, State string
}

func (e *UnmappedError) Error() string {
	return fmt.Sprintf("%s reads job state %q, which spec.states does not map", e.Field, e.State)
}

// unmappedIn recognises jobState()'s unmapped error in a CEL evaluation error.
func unmappedIn(field string, err error) *UnmappedError {
	m := unmappedPattern.FindStringSubmatch(err.Error())
	if m == nil {
		return nil
	}
	s, uerr := strconv.Unquote(m[1])
	if uerr != nil {
		return nil
	}
	return &UnmappedError{Field: field, State: s}
}

// dedupeUnmapped drops what a when condition's jobState() reported (no job ID) when a
// JobCompletion operation reported the same state for its job, and repeats.
func dedupeUnmapped(list []hooksv1alpha1.UnmappedJobState) []hooksv1alpha1.UnmappedJobState {
	if len(list) < 2 {
		return list
	}
	withJob := map[string]bool{}
	for _, u := range list {
		if u.JobID != "" {
			withJob[u.State] = true
		}
	}
	seen := map[hooksv1alpha1.UnmappedJobState]bool{}
	out := list[:0]
	for _, u := range list {
		if seen[u] || (u.JobID == "" && withJob[u.State]) {
			continue
		}
		seen[u] = true
		out = append(out, u)
	}
	return out
}
