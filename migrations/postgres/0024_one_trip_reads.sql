-- Reads in the one-trip batch (issue 34). A read's step row is written with its outcome (it has
-- no effect to guard, so nothing is written before its call); until now a batch holding one
-- could not go in one trip, so every read paid the multi-statement path (BEGIN, head lock,
-- step INSERT, audit INSERT, COMMIT). Tried once before (migration 18's first form) beside the
-- pipelined commit, whose unflushed multi-statement path it could not beat; that pipeline is
-- gone (every batch commits durably), and it is measured again (docs/performance.md).
--
-- Additive, as docs/deploy.md asks of a migration during a rolling upgrade: the function with
-- the new `t_inserts` parameter is a new overload beside migration 17's (which replicas still
-- running the previous release keep calling with their 36 arguments). A later migration may
-- drop the old overload once no release calls it.
--
-- `t_inserts`: read rows written already moved (`countersign_insert_moved`, migration 18, the
-- multi-statement path's INSERT too, so both paths write the same rows). Every one must be
-- written: a guard that refuses one (a cancel or a stop raced it) raises CS002 and nothing of
-- the batch is written; the multi-statement path then keeps that read's row as prepared. A
-- read whose run position another step took meanwhile fails on the unique key, writes nothing,
-- and the multi-statement path numbers it again.
CREATE FUNCTION countersign_commit_batch(
    chain_id text, last_seq bigint, last_hash text, now_ms bigint, durable boolean,
    t_id text[], t_status text[], t_decision text[], t_rule text[], t_outcome text[],
    t_expires_at int8[], t_approval text[], t_bump int8[], t_not_before int8[],
    t_from text[], t_guard_run text[], t_guard_failed text[], t_guard_switch text[],
    t_key_state text[], t_key_result text[], t_release text[],
    k_step text[], k_key text[], k_hash text[], k_owner text[],
    r_seq int8[], r_at int8[], r_event text[], r_run_id text[], r_step_id text[],
    r_tool text[], r_actor text[], r_rule text[], r_record text[], r_prev text[],
    r_hash text[], t_inserts json)
RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    seen_seq bigint;
    seen_hash text;
    seen_at bigint;
    n_moved bigint;
    n_inserted bigint;
    n_reserved bigint;
BEGIN
    IF durable THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    SELECT h.seq, h.hash, h.at INTO seen_seq, seen_hash, seen_at FROM audit_chains h
     WHERE h.chain = chain_id FOR UPDATE;
    IF seen_seq IS DISTINCT FROM last_seq OR seen_hash IS DISTINCT FROM last_hash THEN
        -- The head it found, so that the caller can seal the batch again on it.
        RAISE EXCEPTION 'countersign: the audit head moved' USING ERRCODE = 'CS001',
            DETAIL = COALESCE(seen_seq || ' ' || seen_at || ' ' || seen_hash, '');
    END IF;
    SELECT count(*) INTO n_moved FROM countersign_move_steps(now_ms, t_id, t_status,
        t_decision, t_rule, t_outcome, t_expires_at, t_approval, t_bump, t_not_before, t_from,
        t_guard_run, t_guard_failed, t_guard_switch, t_key_state, t_key_result, t_release);
    IF n_moved <> COALESCE(cardinality(t_id), 0) THEN
        RAISE EXCEPTION 'countersign: a transition did not move' USING ERRCODE = 'CS002';
    END IF;
    IF t_inserts IS NOT NULL AND json_array_length(t_inserts) > 0 THEN
        SELECT count(*) INTO n_inserted FROM countersign_insert_moved(now_ms, t_inserts);
        IF n_inserted <> json_array_length(t_inserts) THEN
            RAISE EXCEPTION 'countersign: a read was refused' USING ERRCODE = 'CS002';
        END IF;
    END IF;
    INSERT INTO idempotency (tenant, idem_key, step_id, inputs_hash, state, result, owner,
                             created_at, updated_at)
    SELECT (SELECT s.tenant FROM steps s WHERE s.id = k.step), k.idem, k.step, k.inputs,
           'in_flight', NULL, k.who, now_ms, now_ms
      FROM UNNEST(k_key, k_step, k_hash, k_owner) AS k(idem, step, inputs, who)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n_reserved = ROW_COUNT;
    IF n_reserved <> COALESCE(cardinality(k_key), 0) THEN
        RAISE EXCEPTION 'countersign: a key exists already' USING ERRCODE = 'CS003';
    END IF;
    INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, rule, record, prev,
                       hash)
    SELECT chain_id, r.* FROM UNNEST(r_seq, r_at, r_event, r_run_id, r_step_id, r_tool,
                                     r_actor, r_rule, r_record, r_prev, r_hash) AS r;
    RETURN current_setting('synchronous_commit');
END
$fn$;

-- Generic plans, as migration 17 set (core/tests/it/catalog.rs checks every batch function).
ALTER FUNCTION countersign_commit_batch(text, bigint, text, bigint, boolean, text[], text[],
    text[], text[], text[], int8[], text[], int8[], int8[], text[], text[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[], int8[], int8[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[], json)
    SET plan_cache_mode = force_generic_plan;

-- Index paths for the batch functions' statements, whatever the statistics were when a session
-- first planned them. Their plans are generic (above) and a session keeps them until the
-- tables' statistics are next invalidated: a session whose first batch ran on a near-empty
-- `steps` table planned the batch UPDATE as a hash join over a sequential scan of `steps`,
-- and kept scanning the whole table for every batch as it grew (measured: a demo ERP write's
-- one-trip batch took 30–46 ms of Postgres time once the table had grown, and writes fell from
-- 359 to 165 and from 167 to 43 per second within five minutes; docs/performance.md). Every statement in them
-- reaches its rows by key — a handful of steps by id, a run's last position, a key by step —
-- so a nested loop over index lookups is the right plan at any size.
ALTER FUNCTION countersign_move_steps(bigint, text[], text[], text[], text[], text[], int8[],
    text[], int8[], int8[], text[], text[], text[], text[], text[], text[], text[])
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;
ALTER FUNCTION countersign_insert_moved(bigint, json)
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;
ALTER FUNCTION countersign_commit_batch(text, bigint, text, bigint, boolean, text[], text[],
    text[], text[], text[], int8[], text[], int8[], int8[], text[], text[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[], int8[], int8[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[], json)
    SET enable_seqscan = off;
