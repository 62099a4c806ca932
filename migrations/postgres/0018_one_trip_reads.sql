-- Reads on the one-trip path (issue 34). A read's step row is written with its outcome (it has
-- no effect to guard, so it is not taken before its call); until now such a batch could not go
-- in one trip, so every read paid the multi-statement path (BEGIN, head lock, step INSERT,
-- audit INSERT, COMMIT, then a flush barrier).
--
-- `countersign_insert_moved` writes read rows already moved, guarded by their run's status
-- and the stop switches, and returns the ids it wrote: the multi-statement path's bulk INSERT
-- (core/src/store/bulk.rs) and the one-trip batch call the same function, so both write the
-- same rows. The rows come as one JSON array (their column set is wide; one parameter, not
-- twenty-five). Rows of one run take consecutive positions after its last step, in `ord`
-- order.
CREATE FUNCTION countersign_insert_moved(now_ms bigint, rows_json json)
RETURNS SETOF text LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY INSERT INTO steps (tenant, id, run_id, seq, role, tool, effect, inputs,
        inputs_hash, idem_key, status, attempts, reason, evidence, observed, trace_id,
        not_before, created_at, updated_at, agent_id, decision, rule, outcome, expires_at,
        approval)
     SELECT (SELECT runs.tenant FROM runs WHERE runs.id = v.run_id), v.id, v.run_id,
        (SELECT COALESCE(MAX(s.seq), 0) FROM steps s WHERE s.run_id = v.run_id)
          + row_number() OVER (PARTITION BY v.run_id ORDER BY v.ord),
        v.role, v.tool, v.effect, v.inputs, v.inputs_hash, v.idem_key, v.status, v.attempts,
        v.reason, v.evidence, v.observed, v.trace_id, v.not_before, v.created_at, now_ms,
        v.agent_id, v.decision, v.rule, v.outcome, v.expires_at, v.approval
     FROM json_to_recordset(rows_json) AS v(ord bigint, id text, run_id text, role text,
          tool text, effect text, inputs text, inputs_hash text, idem_key text, status text,
          attempts bigint, reason text, evidence text, observed text, trace_id text,
          not_before bigint, created_at bigint, agent_id text, decision text, rule text,
          outcome text, expires_at bigint, approval text, guard_run text, guard_failed text,
          guard_switch text)
     WHERE (v.guard_run IS NULL OR EXISTS (SELECT 1 FROM runs
               WHERE runs.id = v.guard_run
                 AND (runs.status = 'active' OR runs.status = v.guard_failed)))
       AND (v.guard_switch IS NULL OR NOT EXISTS (SELECT 1 FROM switches
               WHERE name = v.guard_switch
                  OR name = v.guard_switch || ':'
                            || (SELECT runs.tenant FROM runs WHERE runs.id = v.run_id)))
     RETURNING steps.id;
END
$fn$;

-- The one-trip batch as in migration 17, plus `t_inserts`: read rows written with their
-- outcome (countersign_insert_moved). Every one must be written (a guard that refuses one —
-- a cancel or a stop raced it — raises CS002 and writes nothing: the multi-statement path then
-- keeps that read's row as prepared). A new parameter is a new signature, so the old function
-- goes.
DROP FUNCTION countersign_commit_batch(text, bigint, text, bigint, boolean, text[], text[],
    text[], text[], text[], int8[], text[], int8[], int8[], text[], text[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[], int8[], int8[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[]);
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

-- Generic plans, as migration 17 set for the other batch functions (core/tests/it/catalog.rs
-- checks every one).
ALTER FUNCTION countersign_insert_moved(bigint, json) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION countersign_commit_batch(text, bigint, text, bigint, boolean, text[], text[],
    text[], text[], text[], int8[], text[], int8[], int8[], text[], text[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[], int8[], int8[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[], json)
    SET plan_cache_mode = force_generic_plan;
