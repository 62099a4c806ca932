-- Separation of duties (issue 29).
--
-- Who an agent acts for is a credential's own column, set by an operator (CLI, API, admin
-- page) and audited: the interim bindings in `demo_objects` (system `countersign`, kind
-- `acts_for`, data `{"party": ...}`) move here and are removed there.
ALTER TABLE agent_credentials ADD COLUMN acts_for TEXT;
-- Where the tasks of this credential come from, as the operator declares it (policy reads it
-- as `context.call.task_origin`); the model cannot set it.
ALTER TABLE agent_credentials ADD COLUMN origin TEXT NOT NULL DEFAULT 'user'
    CHECK (origin IN ('user', 'schedule', 'monitor', 'external'));
-- An execution credential is minted for one run's steps of one role: it names that run and
-- ends with it. NULL for the credentials operators create.
ALTER TABLE agent_credentials ADD COLUMN run_id TEXT REFERENCES runs (id);
CREATE INDEX agent_credentials_run ON agent_credentials (run_id) WHERE run_id IS NOT NULL;

UPDATE agent_credentials
   SET acts_for = (SELECT json_extract(d.data, '$.party') FROM demo_objects d
                    WHERE d.system = 'countersign' AND d.kind = 'acts_for'
                      AND d.id = agent_credentials.id AND d.tenant = agent_credentials.tenant);
DELETE FROM demo_objects WHERE system = 'countersign' AND kind = 'acts_for';

-- What separation of duties asks of a planned step, beside its row (the step row and its hot
-- statements stay as they are): whether a model reviewer must approve its exact inputs first,
-- which inputs hash a reviewer approved and who, and the execution credential it is assigned
-- to (minted for its run and role at plan.submit). A step without a row here needs no review
-- and runs on its run's agent credential, when that credential's role is the step's.
CREATE TABLE step_duties (
    step_id          TEXT PRIMARY KEY NOT NULL REFERENCES steps (id),
    review_required  BOOLEAN NOT NULL DEFAULT FALSE,
    reviewed_hash    TEXT,
    reviewed_by      TEXT REFERENCES agent_credentials (id),
    reviewed_at      BIGINT,
    assignee         TEXT REFERENCES agent_credentials (id)
);
CREATE INDEX step_duties_assignee ON step_duties (assignee) WHERE assignee IS NOT NULL;

-- A run that ends ends its execution credentials with it. A failed run keeps them until its
-- compensations have run (the executor revokes them then, Store::end_execution_credentials).
CREATE TRIGGER runs_end_revokes_execution_credentials AFTER UPDATE OF status ON runs
WHEN OLD.status = 'active' AND NEW.status IN ('done', 'cancelled', 'stopped')
BEGIN
    UPDATE agent_credentials SET revoked_at = NEW.updated_at
     WHERE run_id = NEW.id AND revoked_at IS NULL;
END;
