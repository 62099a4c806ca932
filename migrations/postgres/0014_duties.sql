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
   SET acts_for = (SELECT CAST(d.data AS jsonb) ->> 'party' FROM demo_objects d
                    WHERE d.system = 'countersign' AND d.kind = 'acts_for'
                      AND d.id = agent_credentials.id AND d.tenant = agent_credentials.tenant);
DELETE FROM demo_objects WHERE system = 'countersign' AND kind = 'acts_for';
