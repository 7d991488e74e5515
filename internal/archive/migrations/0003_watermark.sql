-- The archive's own insert sequence, for the cluster's watermark (docs/archive.md,
-- "An archive behind the cluster"). Every row inserted into a record table from now on
-- gets seq, the next value of a one-row counter taken in the inserting transaction: the
-- counter's row lock is held until that transaction ends, so seq order is commit order,
-- and a database that holds the row with seq N holds every row with a smaller seq that
-- was ever committed. The cluster records the latest row it read back (seq, table,
-- namespace, name); a database that lacks that row is behind the cluster (restored from
-- an older copy, or a standby that had not received it).
--
-- No row is rewritten: the column is added without a default (rows archived before stay
-- NULL), and the indexes cover only rows that have a seq — but building them reads every
-- existing row, under this transaction's locks, so the session's statement_timeout is
-- lifted here (a large archive must not time out and retry this forever) and a lock
-- that cannot be had within a minute fails the migration, to be tried again.

SET LOCAL statement_timeout = 0;
SET LOCAL lock_timeout = '60s';

CREATE TABLE archive_sequence (
    one  boolean PRIMARY KEY DEFAULT true CHECK (one),
    n    bigint  NOT NULL
);
INSERT INTO archive_sequence (one, n) VALUES (true, 0);

-- SECURITY DEFINER: a role with INSERT and SELECT only on the record tables (the schema
-- applied by a DBA) needs no grant on the counter.
CREATE FUNCTION archive_next_seq() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE archive_sequence SET n = n + 1 WHERE one RETURNING n INTO NEW.seq;
    RETURN NEW;
END $$;

-- The counter, for the check against the watermark, readable without a grant on the table.
CREATE FUNCTION archive_insert_counter() RETURNS bigint LANGUAGE sql STABLE
SECURITY DEFINER SET search_path FROM CURRENT AS $$ SELECT n FROM archive_sequence $$;

ALTER TABLE event_receipts  ADD COLUMN seq bigint;
ALTER TABLE job_completions ADD COLUMN seq bigint;
ALTER TABLE settlements     ADD COLUMN seq bigint;

CREATE UNIQUE INDEX event_receipts_seq  ON event_receipts  (seq) WHERE seq IS NOT NULL;
CREATE UNIQUE INDEX job_completions_seq ON job_completions (seq) WHERE seq IS NOT NULL;
CREATE UNIQUE INDEX settlements_seq     ON settlements     (seq) WHERE seq IS NOT NULL;

CREATE TRIGGER event_receipts_seq  BEFORE INSERT ON event_receipts  FOR EACH ROW EXECUTE FUNCTION archive_next_seq();
CREATE TRIGGER job_completions_seq BEFORE INSERT ON job_completions FOR EACH ROW EXECUTE FUNCTION archive_next_seq();
CREATE TRIGGER settlements_seq     BEFORE INSERT ON settlements     FOR EACH ROW EXECUTE FUNCTION archive_next_seq();

