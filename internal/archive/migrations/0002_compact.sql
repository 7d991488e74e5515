-- Smaller rows (docs/decisions.md "Archive storage"; measured in
-- docs/capacity.md). Every statement here changes the catalog only: no row is read or
-- rewritten, so the migration takes moments on an archive of any size. Rows written
-- under 0001 stay as they are and keep being read (their `object` column is the record);
-- the space they hold is reclaimed only if a DBA rewrites them (docs/archive.md).

-- Event receipts: the columns are the record. New rows store no `object` (NULL); the
-- spec fields without a column that carry information (a sequence, a quarantine record's
-- original, an opt-in raw payload) go to `spec_extra` (NULL when there are none). The
-- event's proposed facts are not kept: each operation's outcome is in `operations`, and
-- the facts of every job version and settlement created are in their own rows.
ALTER TABLE event_receipts ALTER COLUMN object DROP NOT NULL;
ALTER TABLE event_receipts ADD COLUMN spec_extra jsonb;

-- The receipt as an object, for rows of either form: the stored object (0001), or one
-- built from the columns. The archiver reads every new row back through this function
-- and recomputes its content hash from the result, so it is checked on every insert.
CREATE FUNCTION event_receipt_object(e event_receipts) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(e.object, jsonb_build_object(
        'apiVersion', 'hooks.settlement.dev/v1alpha1',
        'kind', 'WebhookEvent',
        'metadata', jsonb_build_object('namespace', e.namespace, 'name', e.name, 'uid', e.uid,
            'creationTimestamp', to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        'spec', coalesce(e.spec_extra, '{}'::jsonb) || jsonb_build_object('provider', e.provider,
            'eventID', e.event_id, 'eventType', e.event_type, 'payloadHash', e.payload_hash,
            'receivedAt', to_char(e.received_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        'status', jsonb_build_object('phase', e.phase, 'operations', e.operations)))
$$;

-- Job completions: the columns hold the record's facts; `rest` holds the rest of the
-- object (metadata, the usage as received, the sink, conditions and the other status
-- fields), so that nothing is stored twice. New rows store no `object` (NULL);
-- job_completion_object builds it, for rows of either form, and the archiver reads every
-- new row back through it. (Settlements keep their whole object: measured, the same
-- split saves them under 100 B a row — docs/decisions.md.)
ALTER TABLE job_completions ALTER COLUMN object DROP NOT NULL;
ALTER TABLE job_completions ADD COLUMN rest jsonb;

CREATE FUNCTION job_completion_object(j job_completions) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(j.object, jsonb_build_object(
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
            'appliedAt', to_char(j.applied_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')))))
$$;

-- Job completions and settlements: `conditions` repeated status.conditions of `object`.
-- Dropping a column only marks it dropped (rows are not rewritten); 0001 rows keep their
-- conditions in `object`. The views below show them as a column again.
ALTER TABLE job_completions DROP COLUMN conditions;
ALTER TABLE settlements DROP COLUMN conditions;

-- Indexes no statement uses: the unique (namespace, provider, job_id, version) index
-- serves every lookup by job (its prefix); nothing selects receipts or job completions
-- by archived_at (a DBA's retention by age reads the table once, in a batch).
DROP INDEX job_completions_job;
DROP INDEX job_completions_archived_at;
DROP INDEX event_receipts_archived_at;

-- For direct SQL: every field `kubectl get` shows, as a column, for rows of either form.
CREATE VIEW archived_event_receipts AS
    SELECT e.namespace, e.name, e.uid, e.provider, e.event_id, e.event_type, e.payload_hash, e.received_at,
           e.phase, e.operations, e.created_at, e.content_hash, e.archived_at, event_receipt_object(e) AS object
    FROM event_receipts e;
CREATE VIEW archived_job_completions AS
    SELECT j.namespace, j.name, j.uid, j.provider, j.job_id, j.version, j.job_state, j.state, j.applied_version,
           j.completed_at, j.applied_at, j.usage_meter, j.usage_quantity, j.usage_unit, j.source_event, j.created_at,
           coalesce(job_completion_object(j) #> '{status,conditions}', '[]'::jsonb) AS conditions,
           j.content_hash, job_completion_object(j) AS object, j.archived_at
    FROM job_completions j;
CREATE VIEW archived_settlements AS
    SELECT s.*, coalesce(s.object -> 'status' -> 'conditions', '[]'::jsonb) AS conditions
    FROM settlements s;
