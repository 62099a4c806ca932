-- Countersign schema v9: the executor's queue index in the claim's own order. The claim
-- (Store::claim_step) takes the first pending, due, unleased step whose earlier steps are all
-- done, ORDER BY not_before, created_at, seq LIMIT 1: with seq in the index the scan stops at
-- the first claimable row. steps_queue lacked seq, so every claim sorted (and probed) at least
-- a group of 32 candidates, and without statistics the planner sorted every pending step.
CREATE INDEX steps_claim ON steps (not_before, created_at, seq) WHERE status = 'pending';
DROP INDEX steps_queue;
-- steps_run (run_id, seq) repeated the index of UNIQUE (run_id, seq): one index fewer to
-- maintain on every status change.
DROP INDEX steps_run;
