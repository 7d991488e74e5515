package archive

// The compact forms of migration 0004 (docs/archive.md, "The schema, for direct SQL"):
// conditions and operations as arrays, a settlement's object as its columns plus `rest`.
// Each is written only when the SQL function that reads it gives back exactly what was
// archived; this file builds the compact forms and checks that, the migration's
// functions read them, and TestCompactFormsReadBackExactly holds the two together.

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// shaOf is a hex content hash as the 32 bytes content_sha stores.
func shaOf(hexHash string) []byte {
	b, err := hex.DecodeString(hexHash)
	if err != nil || len(b) != 32 {
		panic("archive: a content hash is 64 hex characters") // hashOf's output
	}
	return b
}

// contentHashColumn reads a row's content hash as hex, of either form.
const contentHashColumn = `coalesce(t.content_hash, encode(t.content_sha, 'hex'))`

// compactOperations is operations_compact: [type, key, child, outcome] per operation.
func compactOperations(ops []operationContent) []byte {
	out := make([][4]string, len(ops))
	for i, op := range ops {
		out[i] = [4]string{string(op.Type), op.Key, op.Child, string(op.Outcome)}
	}
	b, _ := json.Marshal(out)
	return b
}

// compactConditions is conditions_compact for conds (nil when they cannot be said so
// exactly, or there are none: they then stay where they were). A condition is
// [type, status, reason, message, lastTransitionTime in Unix seconds, observedGeneration],
// or [type, i] when it says what element i (of the first form) says.
func compactConditions(conds []metav1.Condition) []byte {
	if len(conds) == 0 {
		return nil
	}
	out := make([][]any, 0, len(conds))
	for i, c := range conds {
		t := c.LastTransitionTime.Time
		if t.IsZero() || t.UTC().Year() < 1970 || t.UTC().Year() > 9999 {
			return nil // a time to_timestamp and to_char may not give back as metav1.Time writes it
		}
		copied := false
		for j := range i {
			if len(out[j]) == 6 && sameBut(conds[j], c) {
				out = append(out, []any{c.Type, j})
				copied = true
				break
			}
		}
		if !copied {
			out = append(out, []any{c.Type, string(c.Status), c.Reason, c.Message, t.Unix(), c.ObservedGeneration})
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil
	}
	return b
}

// sameBut reports whether two conditions differ in their type only.
func sameBut(a, b metav1.Condition) bool {
	a.Type = b.Type
	return a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message &&
		a.ObservedGeneration == b.ObservedGeneration && a.LastTransitionTime.Equal(&b.LastTransitionTime)
}

// normalized is v as JSON decodes it (maps, []any, json.Number, strings, bools, nil).
func normalized(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		return nil
	}
	return out
}

// timeText is a timestamptz column as settlement_object writes it (nil when NULL).
func timeText(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

func orNil(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// withoutNils drops nil values, as jsonb_strip_nulls does at one level.
func withoutNils(m map[string]any) map[string]any {
	for k, v := range m {
		if v == nil {
			delete(m, k)
		}
	}
	return m
}

// settlementColumnsObject is what settlement_object builds from a settlement's columns
// alone, before rest is merged in: the same keys and values.
func settlementColumnsObject(bs *hooksv1alpha1.BillingSettlement, c settlementColumns) map[string]any {
	sp := map[string]any{"billingProviderRef": c.billingProvider, "settlementKey": c.settlementKey,
		"idempotencyKey": c.idempotencyKey, "type": c.typ, "reverses": orNil(c.reverses), "customer": c.customer,
		"jobID": orNil(c.jobID), "webhookProvider": orNil(c.webhookProvider), "sourceEvent": orNil(c.sourceEvent)}
	if c.meter != nil {
		u := map[string]any{"meter": *c.meter}
		if c.unit != nil && *c.unit != "" {
			u["unit"] = *c.unit
		}
		sp["usage"] = u
	}
	if c.minor != nil {
		sp["amount"] = map[string]any{"minor": *c.minor, "currency": deref(c.currency)}
	}
	st := map[string]any{"state": orNil(c.state), "exposure": c.exposure, "providerRef": orNil(c.providerRef),
		"providerStatus": orNil(c.providerStatus), "firstSubmittedAt": timeText(c.firstSubmittedAt),
		"settledAt": timeText(c.settledAt), "lastReconciledAt": timeText(c.lastReconciledAt)}
	if c.attempts != 0 {
		st["attempts"] = c.attempts
	}
	if c.endpoint != "" || c.bpUID != "" {
		st["sentTo"] = map[string]any{"endpoint": c.endpoint, "billingProviderUID": c.bpUID}
	}
	if c.chargedMinor != nil {
		st["chargedAmount"] = map[string]any{"minor": *c.chargedMinor, "currency": deref(c.chargedCurrency)}
	}
	return map[string]any{
		"apiVersion": hooksv1alpha1.GroupVersion.String(),
		"kind":       "BillingSettlement",
		"metadata": map[string]any{"namespace": bs.Namespace, "name": bs.Name, "uid": string(bs.UID),
			"creationTimestamp": bs.CreationTimestamp.UTC().Format("2006-01-02T15:04:05Z")},
		"spec":   withoutNils(sp),
		"status": withoutNils(st),
	}
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// restOf is what of obj base does not say: every key whose value base holds the same
// is left out (objects are compared key by key).
func restOf(obj, base map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range obj {
		bv, ok := base[k]
		if ok && reflect.DeepEqual(v, bv) {
			continue
		}
		vm, isMap := v.(map[string]any)
		bm, baseMap := bv.(map[string]any)
		if ok && isMap && baseMap {
			if d := restOf(vm, bm); len(d) > 0 || len(vm) == 0 {
				out[k] = d
			}
			continue
		}
		out[k] = v
	}
	return out
}

// merged is archive_merge: b's keys over a's, nested objects merged in turn.
func merged(a, b any) any {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		if b == nil {
			return a
		}
		return b
	}
	out := make(map[string]any, len(am)+len(bm))
	for k, v := range am {
		out[k] = v
	}
	for k, v := range bm {
		if av, ok := am[k]; ok {
			out[k] = merged(av, v)
		} else {
			out[k] = v
		}
	}
	return out
}

// settlementRest is a settlement's rest and conditions_compact, or ok false when its
// columns and rest cannot give its object back exactly (the row then stores the object).
func settlementRest(bs *hooksv1alpha1.BillingSettlement, c settlementColumns) (rest, conds []byte, ok bool) {
	m, err := objectMap(bs, "BillingSettlement")
	if err != nil {
		return nil, nil, false
	}
	if bs.CreationTimestamp.IsZero() || bs.CreationTimestamp.UTC().Year() > 9999 {
		return nil, nil, false
	}
	obj, _ := normalized(m).(map[string]any)
	if obj == nil {
		return nil, nil, false
	}
	if conds = compactConditions(bs.Status.Conditions); conds != nil {
		if st, _ := obj["status"].(map[string]any); st != nil {
			delete(st, "conditions")
		}
	}
	base, _ := normalized(settlementColumnsObject(bs, c)).(map[string]any)
	r := restOf(obj, base)
	// status always comes back (exposure is a column): an object without one cannot.
	if _, has := obj["status"]; !has || !reflect.DeepEqual(merged(base, r), obj) {
		return nil, nil, false
	}
	if conds != nil && !conditionsReadBack(conds, bs.Status.Conditions) {
		return nil, nil, false
	}
	rest, err = json.Marshal(r)
	if err != nil {
		return nil, nil, false
	}
	return rest, conds, true
}

// conditionsReadBack reports whether compact decodes, as archive_conditions does, to conds.
func conditionsReadBack(compact []byte, conds []metav1.Condition) bool {
	got, err := expandConditions(compact)
	if err != nil {
		return false
	}
	return reflect.DeepEqual(normalized(got), normalized(conds))
}

// expandConditions is archive_conditions in Go.
func expandConditions(compact []byte) ([]map[string]any, error) {
	var elems [][]json.RawMessage
	if err := json.Unmarshal(compact, &elems); err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(elems))
	for _, e := range elems {
		f := e
		if len(e) == 2 {
			var i int
			if err := json.Unmarshal(e[1], &i); err != nil || i < 0 || i >= len(elems) {
				return nil, errBadCompact
			}
			f = elems[i]
		}
		if len(f) != 6 {
			return nil, errBadCompact
		}
		var typ, status, reason, message string
		var at, gen int64
		for i, dst := range []any{&status, &reason, &message, &at, &gen} {
			if err := json.Unmarshal(f[i+1], dst); err != nil {
				return nil, err
			}
		}
		if err := json.Unmarshal(e[0], &typ); err != nil {
			return nil, err
		}
		c := map[string]any{"type": typ, "status": status, "reason": reason, "message": message,
			"lastTransitionTime": time.Unix(at, 0).UTC().Format("2006-01-02T15:04:05Z")}
		if gen != 0 {
			c["observedGeneration"] = gen
		}
		out = append(out, c)
	}
	return out, nil
}

var errBadCompact = jsonError("a compact condition refers to no condition of the full form")

type jsonError string

func (e jsonError) Error() string { return string(e) }
