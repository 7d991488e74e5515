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
	"strings"
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

// uidColumns are the values of uid and uid_uuid (or sent_to_provider_uid and
// sent_to_provider_uuid) for a UID: the uuid where it is one in uuid's own text form
// (so it reads back the same), the text otherwise.
func uidColumns(uid string) (text, asUUID any) {
	if isUUIDText(uid) {
		return nil, uid
	}
	return uid, nil
}

// isUUIDText reports whether s is a UUID as PostgreSQL writes one: 8-4-4-4-12
// lowercase hex digits.
func isUUIDText(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// payloadColumns are the values of payload_hash and payload_sha: the 32 bytes of a
// "sha256:<64 lowercase hex>" hash, the text otherwise.
func payloadColumns(h string) (text, sha any) {
	if hexPart, ok := strings.CutPrefix(h, "sha256:"); ok && len(hexPart) == 64 && strings.ToLower(hexPart) == hexPart {
		if b, err := hex.DecodeString(hexPart); err == nil {
			return nil, b
		}
	}
	return h, nil
}

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
// [type, status, reason, message, lastTransitionTime, observedGeneration], or [type, i]
// when it says what element i (of the first form) says. The first condition's time is
// in Unix seconds, every other's in seconds after it.
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
			at := t.Unix() // the first condition's time; every later one's, in seconds after it
			if len(out) > 0 {
				at -= conds[0].LastTransitionTime.Unix()
			}
			out = append(out, []any{c.Type, string(c.Status), c.Reason, c.Message, at, c.ObservedGeneration})
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
		sp["usage"] = usageColumnsObject(c.meter, c.unit, c.qty)
	}
	if c.minor != nil {
		sp["amount"] = map[string]any{"minor": *c.minor, "currency": deref(c.currency)}
	}
	st := map[string]any{"observedGeneration": 1, "state": orNil(c.state), "exposure": c.exposure, "providerRef": orNil(c.providerRef),
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
		"metadata":   metadataColumnsObject(&bs.ObjectMeta),
		"spec":       withoutNils(sp),
		"status":     withoutNils(st),
	}
}

// usageColumnsObject is a usage as the functions build it from usage_meter,
// usage_unit and usage_quantity (numeric, as text: "007.50" reads "7.50"; rest says the
// quantity as received where that differs).
func usageColumnsObject(meter, unit, qty *string) map[string]any {
	u := map[string]any{"meter": *meter, "quantity": numericText(deref(qty))}
	if unit != nil && *unit != "" {
		u["unit"] = *unit
	}
	return u
}

// numericText is a decimal as PostgreSQL's numeric writes it: the integer part without
// leading zeros, the fraction as given (its scale is kept). Anything else is returned as
// is (the insert refuses it).
func numericText(q string) string {
	intPart, frac, hasFrac := strings.Cut(q, ".")
	if intPart == "" || strings.Trim(intPart, "0123456789") != "" || (hasFrac && (frac == "" || strings.Trim(frac, "0123456789") != "")) {
		return q
	}
	intPart = strings.TrimLeft(intPart, "0")
	if intPart == "" {
		intPart = "0"
	}
	if hasFrac {
		return intPart + "." + frac
	}
	return intPart
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
	return compactRest(bs, "BillingSettlement", &bs.ObjectMeta, bs.Status.Conditions, settlementColumnsObject(bs, c))
}

// jobRest is a job completion's rest and conditions_compact, or ok false when its
// columns and rest cannot give its object back exactly (the row then stores the object).
func jobRest(jc *hooksv1alpha1.JobCompletion) (rest, conds []byte, ok bool) {
	return compactRest(jc, "JobCompletion", &jc.ObjectMeta, jc.Status.Conditions, jobColumnsObject(jc))
}

// jobColumnsObject is what job_completion_object builds from a job completion's
// columns alone (rows since migration 0004), before rest is merged in.
func jobColumnsObject(jc *hooksv1alpha1.JobCompletion) map[string]any {
	c := jc.Spec.Completion
	completion := map[string]any{"version": c.Version, "state": string(c.State), "sourceEvent": orNil(c.SourceEvent),
		"completedAt": timeText(ts(c.CompletedAt))}
	if u := c.Usage; u != nil {
		completion["usage"] = usageColumnsObject(&u.Meter, &u.Unit, &u.Quantity)
	}
	st := map[string]any{"observedGeneration": 1, "state": orNil(string(jc.Status.State)), "appliedAt": timeText(ts(jc.Status.AppliedAt))}
	if jc.Status.AppliedVersion != nil {
		st["appliedVersion"] = *jc.Status.AppliedVersion
	}
	if c.SourceEvent != "" {
		st["sourceEvents"] = []any{c.SourceEvent}
	}
	return map[string]any{
		"apiVersion": hooksv1alpha1.GroupVersion.String(),
		"kind":       "JobCompletion",
		"metadata":   metadataColumnsObject(&jc.ObjectMeta),
		"spec": map[string]any{"provider": jc.Spec.Provider, "jobID": jc.Spec.JobID,
			"completion": withoutNils(completion)},
		"status": withoutNils(st),
	}
}

// metadataColumnsObject is the metadata the functions build: from the columns, and
// generation 1 (rest says any other).
func metadataColumnsObject(md *metav1.ObjectMeta) map[string]any {
	return map[string]any{"namespace": md.Namespace, "name": md.Name, "uid": string(md.UID),
		"creationTimestamp": md.CreationTimestamp.UTC().Format("2006-01-02T15:04:05Z"), "generation": 1}
}

// compactRest is what of obj (as objectJSON keeps it) columns does not say, with its
// conditions compact where they read back exactly; ok false when merging rest over
// columns would not give obj back.
func compactRest(obj any, kind string, md *metav1.ObjectMeta, conditions []metav1.Condition, columns map[string]any) (rest, conds []byte, ok bool) {
	m, err := objectMap(obj, kind)
	if err != nil {
		return nil, nil, false
	}
	if md.CreationTimestamp.IsZero() || md.CreationTimestamp.UTC().Year() > 9999 {
		return nil, nil, false
	}
	want, _ := normalized(m).(map[string]any)
	if want == nil {
		return nil, nil, false
	}
	if conds = compactConditions(conditions); conds != nil && conditionsReadBack(conds, conditions) {
		if st, _ := want["status"].(map[string]any); st != nil {
			delete(st, "conditions")
		}
	} else {
		conds = nil
	}
	base, _ := normalized(columns).(map[string]any)
	r := restOf(want, base)
	// status always comes back from the columns: an object without one cannot.
	if _, has := want["status"]; !has || !reflect.DeepEqual(merged(base, r), want) {
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
	var first int64
	for n, e := range elems {
		f, fi := e, n
		if len(e) == 2 {
			if err := json.Unmarshal(e[1], &fi); err != nil || fi < 0 || fi >= len(elems) {
				return nil, errBadCompact
			}
			f = elems[fi]
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
		if n == 0 {
			first = at
		}
		if fi != 0 {
			at += first
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
