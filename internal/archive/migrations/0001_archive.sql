-- The archive of finished records (docs/design.md §12). Every table is append-only: a
-- row is inserted once, read back, and never updated or deleted by the operator (the
-- trigger below refuses it). Unique constraints mirror the objects' names and keys, so
-- the archive refuses a second record of one fact exactly as the API server does.

CREATE TABLE event_receipts (
    namespace     text        NOT NULL,
    name          text        NOT NULL,
    uid           text        NOT NULL,
    provider      text        NOT NULL,
    event_id      text        NOT NULL,
    event_type    text        NOT NULL,
    payload_hash  text        NOT NULL,
    received_at   timestamptz NOT NULL,
    phase         text        NOT NULL,
    -- per-operation outcomes: [{"type","key","child","outcome"}]
    operations    jsonb       NOT NULL,
    created_at    timestamptz NOT NULL,
    content_hash  text        NOT NULL,
    object        jsonb       NOT NULL,
    archived_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, name),
    UNIQUE (namespace, provider, event_id)
);
CREATE INDEX event_receipts_archived_at ON event_receipts (archived_at);

-- One row per archived version of a job: a job whose v2 was archived may come back
-- as v3 (a new JobCompletion), archived in turn as a second row.
CREATE TABLE job_completions (
    namespace        text        NOT NULL,
    name             text        NOT NULL,
    uid              text        NOT NULL,
    provider         text        NOT NULL,
    job_id           text        NOT NULL,
    version          bigint      NOT NULL,
    job_state        text        NOT NULL,
    state            text        NOT NULL,
    applied_version  bigint,
    completed_at     timestamptz,
    applied_at       timestamptz,
    usage_meter      text,
    usage_quantity   numeric,
    usage_unit       text,
    source_event     text        NOT NULL,
    created_at       timestamptz NOT NULL,
    conditions       jsonb       NOT NULL,
    content_hash     text        NOT NULL,
    object           jsonb       NOT NULL,
    archived_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, name, version),
    UNIQUE (namespace, provider, job_id, version)
);
CREATE INDEX job_completions_job ON job_completions (namespace, provider, job_id);
CREATE INDEX job_completions_archived_at ON job_completions (archived_at);

CREATE TABLE settlements (
    namespace            text        NOT NULL,
    name                 text        NOT NULL,
    uid                  text        NOT NULL,
    billing_provider     text        NOT NULL,
    settlement_key       text        NOT NULL,
    idempotency_key      text        NOT NULL,
    type                 text        NOT NULL,
    reverses             text        NOT NULL,
    customer             text        NOT NULL,
    job_id               text        NOT NULL,
    webhook_provider     text        NOT NULL,
    source_event         text        NOT NULL,
    usage_meter          text,
    usage_quantity       numeric,
    usage_unit           text,
    amount_minor         bigint,
    amount_currency      text,
    charged_minor        bigint,
    charged_currency     text,
    state                text        NOT NULL,
    exposure             text        NOT NULL,
    attempts             integer     NOT NULL,
    provider_ref         text        NOT NULL,
    provider_status      text        NOT NULL,
    sent_to_endpoint     text        NOT NULL,
    sent_to_provider_uid text        NOT NULL,
    dead_lettered        boolean     NOT NULL,
    reconciled           boolean     NOT NULL,
    first_submitted_at   timestamptz,
    settled_at           timestamptz,
    last_reconciled_at   timestamptz,
    created_at           timestamptz NOT NULL,
    conditions           jsonb       NOT NULL,
    content_hash         text        NOT NULL,
    object               jsonb       NOT NULL,
    archived_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, name),
    UNIQUE (namespace, settlement_key),
    UNIQUE (namespace, idempotency_key)
);
CREATE INDEX settlements_customer ON settlements (namespace, customer, archived_at);
CREATE INDEX settlements_archived_at ON settlements (archived_at);
CREATE INDEX settlements_job ON settlements (namespace, webhook_provider, job_id) WHERE job_id <> '';
CREATE INDEX settlements_reverses ON settlements (namespace, reverses) WHERE reverses <> '';

-- The archive's identity: the cluster remembers which archive it archived to, so that an
-- empty or other database (a typo in its name, a new database in its place) is never
-- taken for "nothing archived yet" — which would let archived events and keys be
-- dispatched and charged again. A restore or a lagging standby of this archive keeps
-- this row, so it is not told apart (docs/archive-operations.md).
CREATE TABLE archive_identity (
    id         text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO archive_identity (id) VALUES (gen_random_uuid()::text);

CREATE FUNCTION archive_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the settlement archive is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER event_receipts_append_only BEFORE UPDATE OR DELETE ON event_receipts
    FOR EACH ROW EXECUTE FUNCTION archive_append_only();
CREATE TRIGGER job_completions_append_only BEFORE UPDATE OR DELETE ON job_completions
    FOR EACH ROW EXECUTE FUNCTION archive_append_only();
CREATE TRIGGER settlements_append_only BEFORE UPDATE OR DELETE ON settlements
    FOR EACH ROW EXECUTE FUNCTION archive_append_only();
CREATE TRIGGER archive_identity_append_only BEFORE UPDATE OR DELETE ON archive_identity
    FOR EACH ROW EXECUTE FUNCTION archive_append_only();
CREATE FUNCTION archive_no_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the settlement archive is append-only: TRUNCATE on % refused', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER event_receipts_no_truncate BEFORE TRUNCATE ON event_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION archive_no_truncate();
CREATE TRIGGER job_completions_no_truncate BEFORE TRUNCATE ON job_completions
    FOR EACH STATEMENT EXECUTE FUNCTION archive_no_truncate();
CREATE TRIGGER settlements_no_truncate BEFORE TRUNCATE ON settlements
    FOR EACH STATEMENT EXECUTE FUNCTION archive_no_truncate();
