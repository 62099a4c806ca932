-- The executor's claim (Store::claim_step) as a function whose plan walks the queue in its
-- own order whatever the statistics (issue 34).
--
-- As one statement, Postgres planned the claim from its estimates, and under some statistics
-- (tables analyzed while nearly empty, or grown since) it drove the claim from `runs`: every
-- pending step of every active planned run was read, probed for earlier steps not done, and
-- sorted, to take one. Seen in the executor benchmark (auto_explain, 2026-12-08): 5.6 ms a
-- claim at the median, 1,950 step rows fetched for one claim over 55 active runs, against 2
-- through the `steps_claim` index; the executor ran at ~260 steps/s instead of ~640. Sorting
-- is switched off inside the function (its one plan that needs no sort is the index walk in
-- the ORDER BY's order, stopping at the first claimable step), and the other settings keep
-- the probes on their indexes. A switched-off path the planner cannot avoid would count as
-- its "disable cost" (10^10) and the plan would be compiled by JIT at every claim (1.2 s a
-- claim, seen with bitmap scans off: the stop's two-name lookup needs one); JIT is off.
-- Same rows, same lock (`FOR UPDATE OF s SKIP LOCKED`), same answer: the claimed row as the
-- claim wrote it, or none. The SQLite statement in core/src/store/leases.rs is its twin.
-- It returns `steps`' row type: columns added later follow; a migration that rebuilds `steps`
-- (create, copy, drop, rename) must create this function again after it.
CREATE FUNCTION countersign_claim_step(worker text, lease_to bigint, now_ms bigint,
                                       switch text)
RETURNS SETOF steps LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off SET enable_seqscan = off SET enable_hashjoin = off
SET enable_mergejoin = off SET jit = off
AS $fn$
BEGIN
    RETURN QUERY UPDATE steps SET claimed_by = worker, lease_until = lease_to WHERE id = (
        SELECT s.id FROM steps s JOIN runs r ON r.id = s.run_id
         WHERE s.status = 'pending' AND r.planned AND r.status = 'active'
           AND s.not_before <= now_ms AND (s.lease_until IS NULL OR s.lease_until < now_ms)
           AND NOT EXISTS (SELECT 1 FROM steps e WHERE e.run_id = s.run_id
                            AND e.seq < s.seq AND e.status <> 'done')
           AND NOT EXISTS (SELECT 1 FROM switches
                            WHERE name = switch OR name = switch || ':' || r.tenant)
           AND NOT EXISTS (SELECT 1 FROM step_duties d WHERE d.step_id = s.id
                            AND d.review_required
                            AND (d.reviewed_hash IS NULL OR d.reviewed_hash <> s.inputs_hash))
         ORDER BY s.not_before, s.created_at, s.seq LIMIT 1 FOR UPDATE OF s SKIP LOCKED)
    RETURNING steps.*;
END
$fn$;
