-- Countersign schema v19 (postgres dialect): the audit head trigger in linear time.
--
-- Migration 16's `audit_extend_heads` checked each inserted record against the rest of its
-- statement with an anti-join of the transition table with itself. A transition table has no
-- statistics; a plan cached from a small statement (or an estimate of 1,000 rows) is a nested
-- loop, so one INSERT of n records cost n² comparisons: 1,000,000 seeded records ran for
-- more than 18 minutes at 100 % CPU where 28 s had sufficed (issue 34's render bench), and
-- 200,000 did not finish in 15 minutes. The rule is the same; it is now checked in one ordered
-- pass: within a chain, each record follows the record before it in seq order (seq + 1,
-- prev = its hash), and the first follows the chain's head. Sorting is n log n whatever the
-- plan. (Seqs are unique per chain — the primary key — so "the record before it in seq
-- order" is the only candidate the old anti-join could have found.)
CREATE OR REPLACE FUNCTION audit_extend_heads() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    n_chains bigint;
    n_moved bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM added WHERE chain = '_legacy') THEN
        RAISE EXCEPTION 'audit: the _legacy chain is frozen' USING ERRCODE = 'CS004';
    END IF;
    IF EXISTS (
        SELECT 1
          FROM (SELECT chain, seq, prev,
                       lag(seq) OVER w AS before_seq, lag(hash) OVER w AS before_hash
                  FROM added WINDOW w AS (PARTITION BY chain ORDER BY seq)) a
          LEFT JOIN audit_chains h ON a.before_seq IS NULL AND h.chain = a.chain
         WHERE CASE WHEN a.before_seq IS NULL
                    THEN h.chain IS NULL OR h.seq <> a.seq - 1 OR h.hash <> a.prev
                    ELSE a.before_seq <> a.seq - 1 OR a.before_hash <> a.prev
               END
    ) THEN
        RAISE EXCEPTION 'audit: a record does not extend the head of its chain'
            USING ERRCODE = 'CS004';
    END IF;
    SELECT count(DISTINCT chain) INTO n_chains FROM added;
    WITH last AS (
        SELECT DISTINCT ON (chain) chain, seq, hash, at FROM added ORDER BY chain, seq DESC
    )
    UPDATE audit_chains h SET seq = last.seq, hash = last.hash, at = last.at
      FROM last WHERE h.chain = last.chain AND h.seq < last.seq;
    GET DIAGNOSTICS n_moved = ROW_COUNT;
    IF n_moved <> n_chains THEN
        RAISE EXCEPTION 'audit: a chain head moved meanwhile' USING ERRCODE = 'CS004';
    END IF;
    RETURN NULL;
END
$fn$;
-- CREATE OR REPLACE resets the function's attributes: SECURITY DEFINER and the pinned search
-- path are set again, as migration 16 set them (see there for why).
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION audit_extend_heads() SECURITY DEFINER '
                   'SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$do$;
