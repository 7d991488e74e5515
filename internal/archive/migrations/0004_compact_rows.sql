-- Smaller rows: ≈ 3.1 KB per archived event instead of ≈ 4.9 KB, indexes included
-- (docs/decisions.md "Archive storage"; the row forms: docs/archive.md).
-- Every statement changes the catalog only: columns are added without a default, NOT
-- NULL is dropped, constraints are added NOT VALID (checked for new rows, no existing row
-- read), functions and views are replaced. No row is read or rewritten, so the migration
-- takes moments on an archive of any size. Rows written before keep their form and are
-- read through the same functions as new ones.

SET LOCAL lock_timeout = '60s';

-- Content hashes as their 32 bytes (`content_sha`) instead of 64 hex characters: new rows
-- leave `content_hash` NULL. Readers and the archiver's read-back compare the hex form,
-- coalesce(content_hash, encode(content_sha, 'hex')); the views show it.
ALTER TABLE event_receipts  ALTER COLUMN content_hash DROP NOT NULL, ADD COLUMN content_sha bytea,
    ADD CONSTRAINT event_receipts_content_hash CHECK (content_hash IS NOT NULL OR octet_length(content_sha) = 32) NOT VALID;
ALTER TABLE job_completions ALTER COLUMN content_hash DROP NOT NULL, ADD COLUMN content_sha bytea,
    ADD CONSTRAINT job_completions_content_hash CHECK (content_hash IS NOT NULL OR octet_length(content_sha) = 32) NOT VALID;
ALTER TABLE settlements     ALTER COLUMN content_hash DROP NOT NULL, ADD COLUMN content_sha bytea,
    ADD CONSTRAINT settlements_content_hash CHECK (content_hash IS NOT NULL OR octet_length(content_sha) = 32) NOT VALID;

-- UIDs as uuid (16 bytes instead of 37) where they are one, as Kubernetes writes them
-- (lowercase, with hyphens: uuid's own text form, so they read back the same); anything
-- else stays text. Likewise a payload hash "sha256:<64 lowercase hex>" as its 32 bytes.
ALTER TABLE event_receipts  ALTER COLUMN uid DROP NOT NULL, ADD COLUMN uid_uuid uuid,
    ADD CONSTRAINT event_receipts_uid CHECK (uid IS NOT NULL OR uid_uuid IS NOT NULL) NOT VALID,
    ALTER COLUMN payload_hash DROP NOT NULL, ADD COLUMN payload_sha bytea,
    ADD CONSTRAINT event_receipts_payload_hash CHECK (payload_hash IS NOT NULL OR octet_length(payload_sha) = 32) NOT VALID;
ALTER TABLE job_completions ALTER COLUMN uid DROP NOT NULL, ADD COLUMN uid_uuid uuid,
    ADD CONSTRAINT job_completions_uid CHECK (uid IS NOT NULL OR uid_uuid IS NOT NULL) NOT VALID;
ALTER TABLE settlements     ALTER COLUMN uid DROP NOT NULL, ADD COLUMN uid_uuid uuid,
    ADD CONSTRAINT settlements_uid CHECK (uid IS NOT NULL OR uid_uuid IS NOT NULL) NOT VALID,
    ALTER COLUMN sent_to_provider_uid DROP NOT NULL, ADD COLUMN sent_to_provider_uuid uuid,
    ADD CONSTRAINT settlements_sent_to_provider_uid CHECK (sent_to_provider_uid IS NOT NULL OR sent_to_provider_uuid IS NOT NULL) NOT VALID;

-- Conditions, compact (`conditions_compact`, json): one array per condition,
--   [type, status, reason, message, lastTransitionTime, observedGeneration]
-- (the first condition's time in Unix seconds, every other's in seconds after it) or, for
-- a condition that says what an earlier one says under another type (a settled
-- settlement's Ready repeats its Settled),
--   [type, i]   -- element i (from 0), which is of the first form, under this type.
-- The archiver stores them so only when they read back exactly (second-precision times,
-- as the API server keeps them); otherwise they stay in the object or `rest` as they are.
CREATE FUNCTION archive_conditions(c json) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
            'type', e ->> 0, 'status', f ->> 1, 'reason', f ->> 2, 'message', f ->> 3,
            'lastTransitionTime', to_char(to_timestamp((c -> 0 ->> 4)::bigint
                + CASE WHEN fi = 0 THEN 0 ELSE (f ->> 4)::bigint END) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            'observedGeneration', nullif((f ->> 5)::bigint, 0))) ORDER BY i), '[]'::jsonb)
    FROM json_array_elements(c) WITH ORDINALITY AS x(e, i)
    CROSS JOIN LATERAL (SELECT CASE WHEN json_array_length(e) = 2 THEN (e ->> 1)::int ELSE i::int - 1 END) AS y(fi)
    CROSS JOIN LATERAL (SELECT c -> fi) AS z(f)
$$;

-- Objects merged key by key (b wins; nested objects merged in turn): the object of a
-- settlement is what its columns say, merged with `rest`.
CREATE FUNCTION archive_merge(a jsonb, b jsonb) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF b IS NULL THEN
        RETURN a;
    END IF;
    IF a IS NULL OR jsonb_typeof(a) <> 'object' OR jsonb_typeof(b) <> 'object' THEN
        RETURN b;
    END IF;
    RETURN (SELECT coalesce(jsonb_object_agg(k, CASE WHEN b ? k THEN archive_merge(a -> k, b -> k) ELSE a -> k END), '{}'::jsonb)
            FROM (SELECT jsonb_object_keys(a) UNION SELECT jsonb_object_keys(b)) AS ks(k));
END $$;

-- Settlements: the columns are the record's facts; `rest` (json) holds what of the object
-- they do not (annotations, status.lastSubmission, sentTo.credentialsSecret, ...) and the
-- conditions go to `conditions_compact`. The functions take metadata.generation and
-- status.observedGeneration to be 1 (a settlement's and a job completion's spec is
-- rarely changed before it is archived) and usage.quantity to be usage_quantity as text;
-- `rest` says otherwise where they are not. New rows store no `object`: settlement_object builds it, for rows
-- of every form, and the archiver reads every new row back through it. A settlement whose
-- object its columns cannot say exactly (a field the columns hold with a default, such as
-- an empty spec.type) keeps its whole object, as before.
ALTER TABLE settlements ALTER COLUMN object DROP NOT NULL, ADD COLUMN rest json, ADD COLUMN conditions_compact json,
    ADD CONSTRAINT settlements_object_or_rest CHECK (object IS NOT NULL OR rest IS NOT NULL) NOT VALID;

CREATE FUNCTION settlement_object(s settlements) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(s.object, (SELECT CASE WHEN s.conditions_compact IS NULL THEN o
                                           ELSE jsonb_set(o, '{status,conditions}', archive_conditions(s.conditions_compact)) END
        FROM archive_merge(jsonb_build_object(
            'apiVersion', 'hooks.settlement.dev/v1alpha1',
            'kind', 'BillingSettlement',
            'metadata', jsonb_build_object('namespace', s.namespace, 'name', s.name, 'uid', coalesce(s.uid, s.uid_uuid::text),
                'creationTimestamp', to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), 'generation', 1),
            'spec', jsonb_strip_nulls(jsonb_build_object('billingProviderRef', s.billing_provider,
                'settlementKey', s.settlement_key, 'idempotencyKey', s.idempotency_key, 'type', s.type,
                'reverses', nullif(s.reverses, ''), 'customer', s.customer, 'jobID', nullif(s.job_id, ''),
                'webhookProvider', nullif(s.webhook_provider, ''), 'sourceEvent', nullif(s.source_event, ''),
                'usage', CASE WHEN s.usage_meter IS NOT NULL THEN jsonb_build_object('meter', s.usage_meter,
                    'quantity', s.usage_quantity::text, 'unit', nullif(s.usage_unit, '')) END,
                'amount', CASE WHEN s.amount_minor IS NOT NULL THEN jsonb_build_object('minor', s.amount_minor, 'currency', s.amount_currency) END)),
            'status', jsonb_strip_nulls(jsonb_build_object('observedGeneration', 1, 'state', nullif(s.state, ''), 'exposure', s.exposure,
                'attempts', nullif(s.attempts, 0), 'providerRef', nullif(s.provider_ref, ''),
                'providerStatus', nullif(s.provider_status, ''),
                'sentTo', CASE WHEN s.sent_to_endpoint <> '' OR coalesce(s.sent_to_provider_uid, s.sent_to_provider_uuid::text) <> '' THEN
                    jsonb_build_object('endpoint', s.sent_to_endpoint,
                        'billingProviderUID', coalesce(s.sent_to_provider_uid, s.sent_to_provider_uuid::text)) END,
                'chargedAmount', CASE WHEN s.charged_minor IS NOT NULL THEN jsonb_build_object('minor', s.charged_minor, 'currency', s.charged_currency) END,
                'firstSubmittedAt', to_char(s.first_submitted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                'settledAt', to_char(s.settled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                'lastReconciledAt', to_char(s.last_reconciled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')))),
            s.rest::jsonb) AS m(o)))
$$;

-- Job completions written from now on (they have a content_sha) are settlements' way:
-- the columns merged with `rest`, which holds only what they do not say (the usage
-- quantity as received where numeric writes it otherwise, the sink, annotations, ...),
-- conditions in `conditions_compact`; or, where that cannot give the object back
-- exactly, the whole object. Rows written before read as they did (0002's function).
ALTER TABLE job_completions ADD COLUMN conditions_compact json;

CREATE OR REPLACE FUNCTION job_completion_object(j job_completions) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT CASE
    WHEN j.object IS NOT NULL THEN j.object
    WHEN j.content_sha IS NULL THEN jsonb_build_object(
        'apiVersion', 'hooks.settlement.dev/v1alpha1',
        'kind', 'JobCompletion',
        'metadata', coalesce(j.rest -> 'metadata', '{}'::jsonb) || jsonb_build_object('namespace', j.namespace,
            'name', j.name, 'uid', j.uid,
            'creationTimestamp', to_char(j.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        'spec', coalesce(j.rest -> 'spec', '{}'::jsonb) || jsonb_build_object('provider', j.provider, 'jobID', j.job_id,
            'completion', coalesce(j.rest #> '{spec,completion}', '{}'::jsonb) || jsonb_strip_nulls(jsonb_build_object(
                'version', j.version, 'state', j.job_state,
                'completedAt', to_char(j.completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                'sourceEvent', nullif(j.source_event, '')))),
        'status', coalesce(j.rest -> 'status', '{}'::jsonb) || jsonb_strip_nulls(jsonb_build_object('state', nullif(j.state, ''),
            'appliedVersion', j.applied_version,
            'appliedAt', to_char(j.applied_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))))
    ELSE (SELECT CASE WHEN j.conditions_compact IS NULL THEN o
                      ELSE jsonb_set(o, '{status,conditions}', archive_conditions(j.conditions_compact)) END
        FROM archive_merge(jsonb_build_object(
            'apiVersion', 'hooks.settlement.dev/v1alpha1',
            'kind', 'JobCompletion',
            'metadata', jsonb_build_object('namespace', j.namespace, 'name', j.name, 'uid', coalesce(j.uid, j.uid_uuid::text),
                'creationTimestamp', to_char(j.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), 'generation', 1),
            'spec', jsonb_build_object('provider', j.provider, 'jobID', j.job_id,
                'completion', jsonb_strip_nulls(jsonb_build_object('version', j.version, 'state', j.job_state,
                    'completedAt', to_char(j.completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                    'sourceEvent', nullif(j.source_event, ''),
                    'usage', CASE WHEN j.usage_meter IS NOT NULL THEN jsonb_build_object('meter', j.usage_meter,
                        'quantity', j.usage_quantity::text, 'unit', nullif(j.usage_unit, '')) END))),
            'status', jsonb_strip_nulls(jsonb_build_object('observedGeneration', 1, 'state', nullif(j.state, ''), 'appliedVersion', j.applied_version,
                'appliedAt', to_char(j.applied_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                'sourceEvents', CASE WHEN j.source_event <> '' THEN jsonb_build_array(j.source_event) END))),
            j.rest) AS m(o))
    END
$$;

-- Event receipts: the operations' outcomes, compact (`operations_compact`, json): one
-- array [type, key, child, outcome] per operation ("" for no child). `operations` stays
-- for rows written before.
ALTER TABLE event_receipts ALTER COLUMN operations DROP NOT NULL, ADD COLUMN operations_compact json,
    ADD CONSTRAINT event_receipts_operations CHECK (operations IS NOT NULL OR operations_compact IS NOT NULL) NOT VALID;

CREATE FUNCTION archive_operations(c json) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object('type', e ->> 0, 'key', e ->> 1,
            'child', nullif(e ->> 2, ''), 'outcome', e ->> 3)) ORDER BY i), '[]'::jsonb)
    FROM json_array_elements(c) WITH ORDINALITY AS x(e, i)
$$;

CREATE OR REPLACE FUNCTION event_receipt_object(e event_receipts) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(e.object, jsonb_build_object(
        'apiVersion', 'hooks.settlement.dev/v1alpha1',
        'kind', 'WebhookEvent',
        'metadata', jsonb_build_object('namespace', e.namespace, 'name', e.name, 'uid', coalesce(e.uid, e.uid_uuid::text),
            'creationTimestamp', to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        'spec', coalesce(e.spec_extra, '{}'::jsonb) || jsonb_build_object('provider', e.provider,
            'eventID', e.event_id, 'eventType', e.event_type,
            'payloadHash', coalesce(e.payload_hash, 'sha256:' || encode(e.payload_sha, 'hex')),
            'receivedAt', to_char(e.received_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        'status', jsonb_build_object('phase', e.phase,
            'operations', coalesce(e.operations, archive_operations(e.operations_compact)))))
$$;

-- The views keep their columns (a DBA's views on them keep working); each now reads rows
-- of every form.
CREATE OR REPLACE VIEW archived_event_receipts AS
    SELECT e.namespace, e.name, coalesce(e.uid, e.uid_uuid::text) AS uid, e.provider, e.event_id, e.event_type,
           coalesce(e.payload_hash, 'sha256:' || encode(e.payload_sha, 'hex')) AS payload_hash, e.received_at,
           e.phase, coalesce(e.operations, archive_operations(e.operations_compact)) AS operations, e.created_at,
           coalesce(e.content_hash, encode(e.content_sha, 'hex')) AS content_hash, e.archived_at,
           event_receipt_object(e) AS object
    FROM event_receipts e;
CREATE OR REPLACE VIEW archived_job_completions AS
    SELECT j.namespace, j.name, coalesce(j.uid, j.uid_uuid::text) AS uid, j.provider, j.job_id, j.version, j.job_state, j.state, j.applied_version,
           j.completed_at, j.applied_at, j.usage_meter, j.usage_quantity, j.usage_unit, j.source_event, j.created_at,
           coalesce(job_completion_object(j) #> '{status,conditions}', '[]'::jsonb) AS conditions,
           coalesce(j.content_hash, encode(j.content_sha, 'hex')) AS content_hash, job_completion_object(j) AS object, j.archived_at
    FROM job_completions j;
CREATE OR REPLACE VIEW archived_settlements AS
    SELECT s.namespace, s.name, coalesce(s.uid, s.uid_uuid::text) AS uid, s.billing_provider, s.settlement_key, s.idempotency_key, s.type, s.reverses,
           s.customer, s.job_id, s.webhook_provider, s.source_event, s.usage_meter, s.usage_quantity, s.usage_unit,
           s.amount_minor, s.amount_currency, s.charged_minor, s.charged_currency, s.state, s.exposure, s.attempts,
           s.provider_ref, s.provider_status, s.sent_to_endpoint,
           coalesce(s.sent_to_provider_uid, s.sent_to_provider_uuid::text) AS sent_to_provider_uid, s.dead_lettered, s.reconciled,
           s.first_submitted_at, s.settled_at, s.last_reconciled_at, s.created_at,
           coalesce(s.content_hash, encode(s.content_sha, 'hex')) AS content_hash, settlement_object(s) AS object,
           s.archived_at, coalesce(settlement_object(s) #> '{status,conditions}', '[]'::jsonb) AS conditions
    FROM settlements s;
