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

CREATE TRIGGER audit_checkpoints_no_update BEFORE UPDATE ON audit_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'audit_checkpoints is append-only: UPDATE refused');
END;

CREATE TRIGGER audit_checkpoints_no_delete BEFORE DELETE ON audit_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'audit_checkpoints is append-only: DELETE refused');
END;
