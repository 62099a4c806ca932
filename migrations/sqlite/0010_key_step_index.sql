-- Countersign schema v10: the idempotency keys of a step, by step. A step's closing
-- transition records its key's state (`UPDATE idempotency … WHERE step_id = …`, in the group
-- committer, under the audit append lock); with only the idem_key primary key that statement
-- read the whole key table, once per finished write, for ever longer as keys accumulate.
CREATE INDEX idempotency_step ON idempotency (step_id);
