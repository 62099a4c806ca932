-- Records live at seq 1 and above: verification walks the chain from record 1, so a row below
-- it would sit beside the chain, unverified, yet shown by every per-run reader.
CREATE TRIGGER audit_seq_positive BEFORE INSERT ON audit
WHEN NEW.seq < 1
BEGIN
    SELECT RAISE(ABORT, 'audit records start at seq 1');
END;

-- `INSERT OR REPLACE` deletes the row it replaces without firing DELETE triggers: refuse an
-- insert over an existing record, so REPLACE cannot rewrite one either.
CREATE TRIGGER audit_no_replace BEFORE INSERT ON audit
WHEN EXISTS (SELECT 1 FROM audit WHERE seq = NEW.seq)
BEGIN
    SELECT RAISE(ABORT, 'audit is append-only: a record exists at this seq');
END;
