-- The multi-statement batch's bulk INSERT of reads' rows as a function (issue 34).
-- `countersign_insert_moved` writes read rows already moved, guarded by their run's status
-- and the stop switches, and returns the ids it wrote (core/src/store/bulk.rs). It was
-- written to let the one-trip batch write reads too; measured, that did not pay (reads no
-- faster, writes at half their rate in the same runs: docs/performance.md), so the one-trip
-- batch stays as migration 17 left it, and only the multi-statement path calls this. The rows come as one JSON array (their column set is wide; one parameter, not
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

-- Generic plans, as migration 17 set for the other batch functions (core/tests/it/catalog.rs
-- checks every one).
ALTER FUNCTION countersign_insert_moved(bigint, json) SET plan_cache_mode = force_generic_plan;
