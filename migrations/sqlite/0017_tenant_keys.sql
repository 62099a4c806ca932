-- Countersign schema v17 (sqlite dialect): every tenant-scoped table carries its tenant. Keep
-- in step with migrations/postgres/0017_tenant_keys.sql, which also makes every primary and
-- unique key start with the tenant (to distribute by tenant). SQLite keeps its keys: one file
-- has nothing to distribute, and rebuilding tables that foreign keys point at cannot be done
-- inside a migration's transaction.
--
-- `steps`, `idempotency`, `approvals`, `step_duties` and `stop_revocations` gain `tenant`,
-- filled from their parent row; writers derive it the same way in the statement that writes
-- the row. A row written without it is refused (the triggers below; the column cannot be
-- NOT NULL here, as SQLite adds columns only with a default).

ALTER TABLE steps ADD COLUMN tenant TEXT;
UPDATE steps SET tenant = (SELECT runs.tenant FROM runs WHERE runs.id = steps.run_id);
ALTER TABLE idempotency ADD COLUMN tenant TEXT;
UPDATE idempotency SET tenant = (SELECT steps.tenant FROM steps WHERE steps.id = idempotency.step_id);
ALTER TABLE approvals ADD COLUMN tenant TEXT;
UPDATE approvals SET tenant = (SELECT steps.tenant FROM steps WHERE steps.id = approvals.step_id);
ALTER TABLE step_duties ADD COLUMN tenant TEXT;
UPDATE step_duties SET tenant = (SELECT steps.tenant FROM steps WHERE steps.id = step_duties.step_id);
ALTER TABLE stop_revocations ADD COLUMN tenant TEXT;
UPDATE stop_revocations SET tenant = (SELECT agent_credentials.tenant
    FROM agent_credentials WHERE agent_credentials.id = stop_revocations.agent_id);
-- The upsert of a revocation names the same key on both dialects.
CREATE UNIQUE INDEX stop_revocations_tenant_key ON stop_revocations (tenant, switch, agent_id);

CREATE TRIGGER steps_tenant_required BEFORE INSERT ON steps WHEN NEW.tenant IS NULL
BEGIN SELECT RAISE(ABORT, 'countersign: steps.tenant is required'); END;
CREATE TRIGGER idempotency_tenant_required BEFORE INSERT ON idempotency WHEN NEW.tenant IS NULL
BEGIN SELECT RAISE(ABORT, 'countersign: idempotency.tenant is required'); END;
CREATE TRIGGER approvals_tenant_required BEFORE INSERT ON approvals WHEN NEW.tenant IS NULL
BEGIN SELECT RAISE(ABORT, 'countersign: approvals.tenant is required'); END;
CREATE TRIGGER step_duties_tenant_required BEFORE INSERT ON step_duties WHEN NEW.tenant IS NULL
BEGIN SELECT RAISE(ABORT, 'countersign: step_duties.tenant is required'); END;
CREATE TRIGGER stop_revocations_tenant_required BEFORE INSERT ON stop_revocations WHEN NEW.tenant IS NULL
BEGIN SELECT RAISE(ABORT, 'countersign: stop_revocations.tenant is required'); END;

-- An active credential's name is unique within its tenant (as on Postgres), not across tenants.
DROP INDEX agent_credentials_active_name;
CREATE UNIQUE INDEX agent_credentials_active_name ON agent_credentials (tenant, name)
 WHERE revoked_at IS NULL;

-- A revocation of a credential that no longer exists could never be restored (as on Postgres,
-- where a foreign key now refuses such rows).
DELETE FROM stop_revocations WHERE tenant IS NULL;
