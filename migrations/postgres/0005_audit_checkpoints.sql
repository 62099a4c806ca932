-- Countersign schema v5: signed checkpoints of the audit chain.
-- Same table in both dialects. A checkpoint is an Ed25519 signature over the chain head
-- {seq, hash, at}; verify checks that the chain still holds that hash at that seq, so
-- rewriting a signed record, or truncating the chain below it, is caught.
CREATE TABLE audit_checkpoints (
    seq         BIGINT PRIMARY KEY NOT NULL,
    hash        TEXT NOT NULL,
    at          BIGINT NOT NULL,
    public_key  TEXT NOT NULL,
    signature   TEXT NOT NULL
);

CREATE TRIGGER audit_checkpoints_no_update BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_checkpoints_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();

-- Beyond the triggers: no privilege through PUBLIC to change either table. The owner (the
-- role that ran the migrations) keeps its rights; run `serve` as a role granted only
-- SELECT and INSERT on these tables to make the triggers the second line, not the only one.
REVOKE UPDATE, DELETE, TRUNCATE ON audit FROM PUBLIC;
REVOKE UPDATE, DELETE, TRUNCATE ON audit_checkpoints FROM PUBLIC;
