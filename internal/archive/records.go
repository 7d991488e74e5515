package archive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// Content hashes cover what a record says, not how the cluster stored it: the object's
// UID, its spec and its outcome. Metadata (resourceVersion, finalizers, a deletion
// timestamp) and display-only status (conditions, messages, next-attempt times) are
// left out, so the same record archived again after a crash — or once by the archiver
// and once on its way out through the finalizer — hashes the same.

type eventContent struct {
	UID        string
	Spec       hooksv1alpha1.WebhookEventSpec
	Phase      hooksv1alpha1.EventPhase
	Operations []operationContent
}

type operationContent struct {
	Type    hooksv1alpha1.OperationType    `json:"type"`
	Key     string                         `json:"key"`
	Child   string                         `json:"child,omitempty"`
	Outcome hooksv1alpha1.OperationOutcome `json:"outcome"`
	State   string                         `json:"state,omitempty"`
}

func operationsOf(ev *hooksv1alpha1.WebhookEvent) []operationContent {
	ops := make([]operationContent, 0, len(ev.Status.Operations))
	for _, op := range ev.Status.Operations {
		ops = append(ops, operationContent{Type: op.Type, Key: op.Key, Child: op.Child, Outcome: op.Outcome})
	}
	return ops
}

// EventContentHash is the content hash of an event receipt.
func EventContentHash(ev *hooksv1alpha1.WebhookEvent) string {
	return hashOf(eventContent{UID: string(ev.UID), Spec: ev.Spec, Phase: ev.Status.Phase, Operations: operationsOf(ev)})
}

// receiptContent is what a receipt row written since migration 0002 holds: the UID,
// the spec's columns and spec_extra, the phase and the operations' outcomes. The
// event's proposed facts (spec.jobCompletions, spec.settlements) are not part of it:
// the spec is immutable, so one UID never had other facts, and the facts live on in
// the rows of the job versions and settlements the event created.
type receiptContent struct {
	UID                                       string
	Provider, EventID, EventType, PayloadHash string
	ReceivedAt                                metav1.Time
	Extra                                     eventExtra
	Phase                                     hooksv1alpha1.EventPhase
	Operations                                []operationContent
}

// EventReceiptHash is the content hash of an event receipt row written since
// migration 0002 (rows written before hold EventContentHash).
func EventReceiptHash(ev *hooksv1alpha1.WebhookEvent) string {
	sp := &ev.Spec
	return hashOf(receiptContent{UID: string(ev.UID), Provider: sp.Provider, EventID: sp.EventID, EventType: sp.EventType,
		PayloadHash: sp.PayloadHash, ReceivedAt: metav1.NewTime(sp.ReceivedAt.UTC().Truncate(time.Second)),
		Extra: eventExtra{}.of(sp), Phase: ev.Status.Phase, Operations: operationsOf(ev)})
}

type jobContent struct {
	UID            string
	Spec           hooksv1alpha1.JobCompletionSpec
	State          hooksv1alpha1.JobCompletionState
	AppliedVersion *int64
}

// JobContentHash is the content hash of a job completion: its state as Progress
// gives it (a job applied by its creation has no status written).
func JobContentHash(jc *hooksv1alpha1.JobCompletion) string {
	st := jc.Progress()
	return hashOf(jobContent{UID: string(jc.UID), Spec: jc.Spec, State: st.State, AppliedVersion: st.AppliedVersion})
}

type settlementContent struct {
	UID              string
	Spec             hooksv1alpha1.BillingSettlementSpec
	State            hooksv1alpha1.SettlementState
	Exposure         hooksv1alpha1.Exposure
	Attempts         int32
	ProviderRef      string
	ProviderStatus   string
	ChargedAmount    *hooksv1alpha1.Amount
	SentTo           *hooksv1alpha1.ProviderTarget
	FirstSubmittedAt *metav1.Time
	SettledAt        *metav1.Time
}

// SettlementContentHash is the content hash of a settlement.
func SettlementContentHash(bs *hooksv1alpha1.BillingSettlement) string {
	st := &bs.Status
	return hashOf(settlementContent{UID: string(bs.UID), Spec: bs.Spec, State: st.State, Exposure: st.Exposure,
		Attempts: st.Attempts, ProviderRef: st.ProviderRef, ProviderStatus: st.ProviderStatus,
		ChargedAmount: st.ChargedAmount, SentTo: st.SentTo, FirstSubmittedAt: st.FirstSubmittedAt, SettledAt: st.SettledAt})
}

// rehash decodes a stored object and computes its content hash again, next to the
// archived record's.
func rehash[T any](hash func(*T) string, archived *T) func([]byte, bool) (string, string, error) {
	return func(b []byte, _ bool) (string, string, error) {
		var got T
		if err := json.Unmarshal(b, &got); err != nil {
			return "", "", err
		}
		return hash(&got), hash(archived), nil
	}
}

func ts(t *metav1.Time) *time.Time {
	if t == nil || t.IsZero() {
		return nil
	}
	v := t.UTC()
	return &v
}

func condTrue(conds []metav1.Condition, t string) bool {
	return meta.IsStatusConditionTrue(conds, t)
}

// ArchiveEvent archives an event receipt: inserted once, read back and compared. The
// columns are the record (migration 0002): no object is stored; the spec fields that
// have no column and carry information go to spec_extra. The row is read back through
// event_receipt_object, the function that serves every later read, so what is checked
// is what readers get.
func (s *Store) ArchiveEvent(ctx context.Context, ev *hooksv1alpha1.WebhookEvent) error {
	r, err := eventRow(ev)
	if err != nil {
		return err
	}
	return s.insertReadBack(ctx, r)
}

// eventRow is an event receipt's row.
func eventRow(ev *hooksv1alpha1.WebhookEvent) (*row, error) {
	ops := compactOperations(operationsOf(ev))
	extra, err := eventSpecExtra(&ev.Spec)
	if err != nil {
		return nil, err
	}
	uid, uidUUID := uidColumns(string(ev.UID))
	payload, payloadSHA := payloadColumns(ev.Spec.PayloadHash)
	return &row{kind: "WebhookEvent", namespace: ev.Namespace, name: ev.Name, table: "event_receipts",
		columns: []string{"namespace", "name", "uid", "uid_uuid::uuid", "provider", "event_id", "event_type", "payload_hash",
			"payload_sha", "received_at", "phase", "operations_compact::json", "created_at", "content_sha", "spec_extra"},
		values: []any{ev.Namespace, ev.Name, uid, uidUUID, ev.Spec.Provider, ev.Spec.EventID, ev.Spec.EventType, payload, payloadSHA,
			ev.Spec.ReceivedAt.UTC(), string(ev.Status.Phase), string(ops), ev.CreationTimestamp.UTC(), shaOf(EventReceiptHash(ev)), extra},
		readBack: `event_receipt_object(t), ` + contentHashColumn + `, t.object IS NOT NULL, t.seq`,
		check: func(stored []byte, legacy bool) (string, string, error) {
			var got hooksv1alpha1.WebhookEvent
			if err := json.Unmarshal(stored, &got); err != nil {
				return "", "", err
			}
			if legacy { // written under 0001: the whole object, and its hash
				return EventContentHash(&got), EventContentHash(ev), nil
			}
			return EventReceiptHash(&got), EventReceiptHash(ev), nil
		}}, nil
}

// eventExtra is the part of an event's spec a receipt keeps beyond its columns.
type eventExtra struct {
	Sequence            *int64                        `json:"sequence,omitempty"`
	Quarantine          *hooksv1alpha1.QuarantineInfo `json:"quarantine,omitempty"`
	RawPayload          string                        `json:"rawPayload,omitempty"`
	RawPayloadTruncated bool                          `json:"rawPayloadTruncated,omitempty"`
}

func (e eventExtra) of(sp *hooksv1alpha1.WebhookEventSpec) eventExtra {
	return eventExtra{Sequence: sp.Sequence, Quarantine: sp.Quarantine, RawPayload: sp.RawPayload, RawPayloadTruncated: sp.RawPayloadTruncated}
}

// eventSpecExtra is spec_extra: nil (NULL) when the event has none of it.
func eventSpecExtra(sp *hooksv1alpha1.WebhookEventSpec) ([]byte, error) {
	e := eventExtra{}.of(sp)
	if e == (eventExtra{}) {
		return nil, nil
	}
	return json.Marshal(e)
}

// ArchiveJobCompletion archives one version of a job's completion. The columns hold
// its facts and rest the remainder of the object (migrations 0002 and 0004); the row is
// read back through job_completion_object, the function every later read goes through.
func (s *Store) ArchiveJobCompletion(ctx context.Context, jc *hooksv1alpha1.JobCompletion) error {
	r, err := jobRow(jc)
	if err != nil {
		return err
	}
	return s.insertReadBack(ctx, r)
}

// jobRow is a job completion version's row: its columns, and (migration 0004) rest and
// conditions_compact wherever job_completion_object gives the object back from them
// exactly; otherwise the whole object.
func jobRow(jc *hooksv1alpha1.JobCompletion) (*row, error) {
	// A job applied by its creation has no status written (Progress): it is archived
	// as every reader sees it, applied, so that its columns, its object and its hash
	// agree.
	if jc.AppliedOnCreation() {
		jc = jc.DeepCopy()
		jc.Status = jc.Progress()
	}
	c := jc.Spec.Completion
	var meter, unit *string
	var qty *string
	if u := c.Usage; u != nil {
		meter, unit, qty = &u.Meter, &u.Unit, &u.Quantity
	}
	var obj []byte
	rest, conds, ok := jobRest(jc)
	if !ok {
		var err error
		if obj, err = objectJSON(jc, "JobCompletion"); err != nil {
			return nil, err
		}
		rest, conds = nil, nil
	} else if string(rest) == "{}" {
		rest = nil // the columns say everything: NULL, which merges as nothing
	}
	uid, uidUUID := uidColumns(string(jc.UID))
	return &row{kind: "JobCompletion", namespace: jc.Namespace, name: jc.Name, table: "job_completions",
		columns: []string{"namespace", "name", "uid", "uid_uuid::uuid", "provider", "job_id", "version", "job_state", "state", "applied_version",
			"completed_at", "applied_at", "usage_meter", "usage_quantity::numeric", "usage_unit", "source_event", "created_at",
			"content_sha", "object", "rest", "conditions_compact::json"},
		values: []any{jc.Namespace, jc.Name, uid, uidUUID, jc.Spec.Provider, jc.Spec.JobID, c.Version, string(c.State),
			string(jc.Status.State), jc.Status.AppliedVersion, ts(c.CompletedAt), ts(jc.Status.AppliedAt), meter, qty, unit,
			c.SourceEvent, jc.CreationTimestamp.UTC(), shaOf(JobContentHash(jc)), obj, rest, textOrNil(conds)},
		readBack: `job_completion_object(t), ` + contentHashColumn + `, false, t.seq`,
		key:      []string{"version"}, keyValues: []any{c.Version},
		check: rehash(JobContentHash, jc)}, nil
}

// ArchiveSettlement archives a settlement.
func (s *Store) ArchiveSettlement(ctx context.Context, bs *hooksv1alpha1.BillingSettlement) error {
	r, err := settlementRow(bs)
	if err != nil {
		return err
	}
	return s.insertReadBack(ctx, r)
}

// settlementColumns are a settlement's column values.
type settlementColumns struct {
	billingProvider, settlementKey, idempotencyKey, typ, reverses, customer string
	jobID, webhookProvider, sourceEvent                                     string
	meter, unit, qty, currency, chargedCurrency                             *string
	minor, chargedMinor                                                     *int64
	state, exposure, providerRef, providerStatus, endpoint, bpUID           string
	attempts                                                                int32
	firstSubmittedAt, settledAt, lastReconciledAt                           *time.Time
}

func settlementColumnsOf(bs *hooksv1alpha1.BillingSettlement) settlementColumns {
	sp, st := &bs.Spec, &bs.Status
	c := settlementColumns{billingProvider: sp.BillingProviderRef, settlementKey: sp.SettlementKey, idempotencyKey: sp.IdempotencyKey,
		typ: string(sp.Type), reverses: sp.Reverses, customer: sp.Customer, jobID: sp.JobID, webhookProvider: sp.WebhookProvider,
		sourceEvent: sp.SourceEvent, state: string(st.State), exposure: string(st.Exposure), attempts: st.Attempts,
		providerRef: st.ProviderRef, providerStatus: st.ProviderStatus,
		firstSubmittedAt: ts(st.FirstSubmittedAt), settledAt: ts(st.SettledAt), lastReconciledAt: ts(st.LastReconciledAt)}
	if u := sp.Usage; u != nil {
		c.meter, c.unit, c.qty = &u.Meter, &u.Unit, &u.Quantity
	}
	if a := sp.Amount; a != nil {
		c.minor, c.currency = &a.Minor, &a.Currency
	}
	if a := st.ChargedAmount; a != nil {
		c.chargedMinor, c.chargedCurrency = &a.Minor, &a.Currency
	}
	if t := st.SentTo; t != nil {
		c.endpoint, c.bpUID = t.Endpoint, t.BillingProviderUID
	}
	if c.typ == "" {
		c.typ = string(hooksv1alpha1.SettlementCharge)
	}
	if c.exposure == "" {
		c.exposure = string(hooksv1alpha1.ExposureNone)
	}
	return c
}

// settlementRow is a settlement's row: its columns, and (migration 0004) rest and
// conditions_compact instead of the object wherever settlement_object gives the object
// back from them exactly; otherwise the whole object, as before. Either way the row is
// read back through settlement_object, the function every reader uses.
func settlementRow(bs *hooksv1alpha1.BillingSettlement) (*row, error) {
	c := settlementColumnsOf(bs)
	var obj, rest, conds []byte
	rest, conds, ok := settlementRest(bs, c)
	if !ok {
		var err error
		if obj, err = objectJSON(bs, "BillingSettlement"); err != nil {
			return nil, err
		}
		rest, conds = nil, nil
	}
	st := &bs.Status
	uid, uidUUID := uidColumns(string(bs.UID))
	bpUID, bpUUID := uidColumns(c.bpUID)
	return &row{kind: "BillingSettlement", namespace: bs.Namespace, name: bs.Name, table: "settlements",
		columns: []string{"namespace", "name", "uid", "uid_uuid::uuid", "billing_provider", "settlement_key", "idempotency_key", "type", "reverses",
			"customer", "job_id", "webhook_provider", "source_event", "usage_meter", "usage_quantity::numeric", "usage_unit", "amount_minor",
			"amount_currency", "charged_minor", "charged_currency", "state", "exposure", "attempts", "provider_ref", "provider_status",
			"sent_to_endpoint", "sent_to_provider_uid", "sent_to_provider_uuid::uuid", "dead_lettered", "reconciled", "first_submitted_at", "settled_at",
			"last_reconciled_at", "created_at", "content_sha", "object", "rest::json", "conditions_compact::json"},
		values: []any{bs.Namespace, bs.Name, uid, uidUUID, c.billingProvider, c.settlementKey, c.idempotencyKey, c.typ, c.reverses,
			c.customer, c.jobID, c.webhookProvider, c.sourceEvent, c.meter, c.qty, c.unit, c.minor, c.currency, c.chargedMinor, c.chargedCurrency,
			c.state, c.exposure, c.attempts, c.providerRef, c.providerStatus, c.endpoint, bpUID, bpUUID,
			condTrue(st.Conditions, hooksv1alpha1.ConditionDeadLettered), condTrue(st.Conditions, hooksv1alpha1.ConditionReconciled),
			c.firstSubmittedAt, c.settledAt, c.lastReconciledAt, bs.CreationTimestamp.UTC(),
			shaOf(SettlementContentHash(bs)), obj, textOrNil(rest), textOrNil(conds)},
		readBack: `settlement_object(t), ` + contentHashColumn + `, t.object IS NOT NULL, t.seq`,
		check:    rehash(SettlementContentHash, bs)}, nil
}

// textOrNil passes JSON for a json column as text (nil: NULL).
func textOrNil(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// EventReceipt is an archived event's identity and outcome.
type EventReceipt struct {
	Namespace, Name, UID, Provider, EventID, EventType, PayloadHash, Phase string
	ReceivedAt, ArchivedAt                                                 time.Time
}

// Event finds the archived receipt of an event ID (nil when the archive has none).
func (s *Store) Event(ctx context.Context, namespace, provider, eventID string) (*EventReceipt, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var e EventReceipt
	err := s.pool.QueryRow(ctx, `SELECT namespace, name, coalesce(uid, uid_uuid::text), provider, event_id, event_type,
		coalesce(payload_hash, 'sha256:' || encode(payload_sha, 'hex')), phase, received_at, archived_at
		FROM event_receipts WHERE namespace = $1 AND provider = $2 AND event_id = $3`, namespace, provider, eventID).
		Scan(&e.Namespace, &e.Name, &e.UID, &e.Provider, &e.EventID, &e.EventType, &e.PayloadHash, &e.Phase, &e.ReceivedAt, &e.ArchivedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up archived event: %w", err)
	}
	return &e, nil
}

// LatestJob is the archived completion of a job with the highest version (nil when
// the archive has none).
func (s *Store) LatestJob(ctx context.Context, namespace, provider, jobID string) (*hooksv1alpha1.JobCompletion, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT job_completion_object(t) FROM job_completions t WHERE namespace = $1 AND provider = $2
		AND job_id = $3 ORDER BY version DESC LIMIT 1`, namespace, provider, jobID).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up archived job: %w", err)
	}
	var jc hooksv1alpha1.JobCompletion
	if err := json.Unmarshal(raw, &jc); err != nil {
		return nil, fmt.Errorf("decode archived job: %w", err)
	}
	return &jc, nil
}

// Settlement finds an archived settlement by object name (nil when the archive has none).
func (s *Store) Settlement(ctx context.Context, namespace, name string) (*hooksv1alpha1.BillingSettlement, error) {
	return s.oneSettlement(ctx, `namespace = $1 AND name = $2`, namespace, name)
}

// SettlementByKey finds an archived settlement by settlement key or idempotency key.
func (s *Store) SettlementByKey(ctx context.Context, namespace, key string) (*hooksv1alpha1.BillingSettlement, error) {
	return s.oneSettlement(ctx, `namespace = $1 AND (settlement_key = $2 OR idempotency_key = $2) ORDER BY archived_at LIMIT 1`, namespace, key)
}

func (s *Store) oneSettlement(ctx context.Context, where string, args ...any) (*hooksv1alpha1.BillingSettlement, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT settlement_object(t) FROM settlements t WHERE `+where, args...).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up archived settlement: %w", err)
	}
	var bs hooksv1alpha1.BillingSettlement
	if err := json.Unmarshal(raw, &bs); err != nil {
		return nil, fmt.Errorf("decode archived settlement: %w", err)
	}
	return &bs, nil
}

// Reversing lists the archived compensations of a settlement.
func (s *Store) Reversing(ctx context.Context, namespace, name string) ([]hooksv1alpha1.BillingSettlement, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT settlement_object(t) FROM settlements t WHERE namespace = $1 AND reverses = $2`, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("list archived compensations: %w", err)
	}
	return collectSettlements(rows)
}

func collectSettlements(rows pgx.Rows) ([]hooksv1alpha1.BillingSettlement, error) {
	raws, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, fmt.Errorf("read archived settlements: %w", err)
	}
	out := make([]hooksv1alpha1.BillingSettlement, 0, len(raws))
	for _, raw := range raws {
		var bs hooksv1alpha1.BillingSettlement
		if err := json.Unmarshal(raw, &bs); err != nil {
			return nil, fmt.Errorf("decode archived settlement: %w", err)
		}
		out = append(out, bs)
	}
	return out, nil
}

// KnownIdempotencyKeys returns which of keys belong to archived settlements of a namespace.
func (s *Store) KnownIdempotencyKeys(ctx context.Context, namespace string, keys []string) (map[string]bool, error) {
	return s.known(ctx, `SELECT idempotency_key FROM settlements WHERE namespace = $1 AND idempotency_key = ANY($2)`, namespace, keys)
}

// KnownSettlementNames returns which of names are archived settlements of a namespace.
func (s *Store) KnownSettlementNames(ctx context.Context, namespace string, names []string) (map[string]bool, error) {
	return s.known(ctx, `SELECT name FROM settlements WHERE namespace = $1 AND name = ANY($2)`, namespace, names)
}

// KnownJobNames returns which of names are archived job completions of a namespace.
func (s *Store) KnownJobNames(ctx context.Context, namespace string, names []string) (map[string]bool, error) {
	return s.known(ctx, `SELECT DISTINCT name FROM job_completions WHERE namespace = $1 AND name = ANY($2)`, namespace, names)
}

func (s *Store) known(ctx context.Context, q, namespace string, keys []string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(keys) == 0 {
		return out, nil
	}
	if err := s.ready(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, q, namespace, keys)
	if err != nil {
		return nil, fmt.Errorf("look up archived records: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("look up archived records: %w", err)
	}
	for _, k := range found {
		out[k] = true
	}
	return out, nil
}

// SettlementMatching finds an archived settlement of a namespace under any of names,
// or whose settlement key or idempotency key is any of keys (nil when none): one
// logical operation may have been stored under its legacy name and keys.
func (s *Store) SettlementMatching(ctx context.Context, namespace string, names, keys []string) (*hooksv1alpha1.BillingSettlement, error) {
	return s.oneSettlement(ctx, `namespace = $1 AND (name = ANY($2) OR settlement_key = ANY($3) OR idempotency_key = ANY($3))
		ORDER BY archived_at LIMIT 1`, namespace, names, keys)
}

// SettlementsByIdempotencyKey returns the archived settlements of a namespace whose
// idempotency key is one of keys, by key.
func (s *Store) SettlementsByIdempotencyKey(ctx context.Context, namespace string, keys []string) (map[string]*hooksv1alpha1.BillingSettlement, error) {
	out := map[string]*hooksv1alpha1.BillingSettlement{}
	if len(keys) == 0 {
		return out, nil
	}
	if err := s.ready(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT settlement_object(t) FROM settlements t WHERE namespace = $1 AND idempotency_key = ANY($2)`, namespace, keys)
	if err != nil {
		return nil, fmt.Errorf("look up archived settlements: %w", err)
	}
	list, err := collectSettlements(rows)
	if err != nil {
		return nil, err
	}
	for i := range list {
		out[list[i].Spec.IdempotencyKey] = &list[i]
	}
	return out, nil
}

// UsageRow is an archived, settled usage charge, as reconciliation adds it to the
// totals it compares with a provider that totals usage (Stripe's meter event
// summaries, docs/design.md §13).
type UsageRow struct {
	Name, UID, Customer, Meter string
	// Quantity is spec.usage.quantity as decimal text, exactly as archived.
	Quantity string
	// FirstSubmittedAt and SettledAt bound when the provider received it.
	FirstSubmittedAt, SettledAt time.Time
	// Reversed says an archived Void, or Refund without an amount, that may have moved
	// money reverses it (a provider cancels the usage then; a refund of an amount is a
	// credit of its own and leaves the usage).
	Reversed bool
	// SentTo is where it was sent (status.sentTo; empty when an older operator did not
	// record it).
	SentTo hooksv1alpha1.ProviderTarget
}

// CancelledAmong returns which of the named settlements of a namespace an archived
// Void, or Refund without an amount, that may have moved money reverses: their usage
// may be cancelled at the provider.
func (s *Store) CancelledAmong(ctx context.Context, namespace string, names []string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(names) == 0 {
		return out, nil
	}
	if err := s.ready(); err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT reverses FROM settlements
		WHERE namespace = $1 AND reverses <> '' AND reverses = ANY($2) AND exposure <> 'None'
			AND (type = 'Void' OR (type = 'Refund' AND amount_minor IS NULL))`, namespace, names)
	if err != nil {
		return nil, fmt.Errorf("list archived cancellations: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list archived cancellations: %w", err)
	}
	for _, n := range got {
		out[n] = true
	}
	return out, nil
}

// SettledUsage calls fn with each archived Settled usage charge of billingProvider in
// namespace whose time at the provider may fall in [since, until): settled at or
// after since and first submitted before until. Archived settlements are final and
// never hold money unresolved, so Settled ones are all a total can include. The rows
// come from the archived_at index (a row is archived after it settled; an hour allows
// for the database's clock being behind the operator's).
func (s *Store) SettledUsage(ctx context.Context, namespace, billingProvider string, since, until time.Time, fn func(UsageRow) error) error {
	if err := s.ready(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	// A usage charge dated at its usage time (status.usageDatedAt) is in Stripe's totals
	// at that time, which may be before its first attempt.
	// status.usageDatedAt has no column: it is in the object (rows before migration
	// 0004) or in rest.
	rows, err := s.pool.Query(ctx, `SELECT s.name, coalesce(s.uid, s.uid_uuid::text), s.customer, s.usage_meter, s.usage_quantity::text,
			LEAST(COALESCE(s.first_submitted_at, s.created_at), COALESCE((COALESCE(s.object->'status'->>'usageDatedAt',
				s.rest->'status'->>'usageDatedAt'))::timestamptz, 'infinity')),
			s.settled_at,
			EXISTS (SELECT 1 FROM settlements r WHERE r.namespace = s.namespace AND r.reverses <> '' AND r.reverses = s.name
				AND r.exposure <> 'None' AND (r.type = 'Void' OR (r.type = 'Refund' AND r.amount_minor IS NULL))),
			COALESCE(settlement_object(s)->'status'->'sentTo', '{}'::jsonb)
		FROM settlements s
		WHERE s.archived_at >= $3::timestamptz - interval '1 hour' AND s.namespace = $1 AND s.billing_provider = $2
			AND s.type = 'Charge' AND s.usage_meter IS NOT NULL AND s.usage_quantity IS NOT NULL AND s.state = 'Settled'
			AND s.settled_at >= $3 AND LEAST(COALESCE(s.first_submitted_at, s.created_at),
				COALESCE((COALESCE(s.object->'status'->>'usageDatedAt', s.rest->'status'->>'usageDatedAt'))::timestamptz, 'infinity')) < $4
		ORDER BY s.name`, namespace, billingProvider, since.UTC(), until.UTC())
	if err != nil {
		return fmt.Errorf("list archived usage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var u UsageRow
		var sentTo []byte
		if err := rows.Scan(&u.Name, &u.UID, &u.Customer, &u.Meter, &u.Quantity, &u.FirstSubmittedAt, &u.SettledAt, &u.Reversed, &sentTo); err != nil {
			return fmt.Errorf("read archived usage: %w", err)
		}
		if err := json.Unmarshal(sentTo, &u.SentTo); err != nil {
			return fmt.Errorf("read archived usage %s: status.sentTo: %w", u.Name, err)
		}
		if err := fn(u); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list archived usage: %w", err)
	}
	return nil
}
