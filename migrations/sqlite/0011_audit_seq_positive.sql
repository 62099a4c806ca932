-- Records live at seq 1 and above: verification walks the chain from record 1, so a row below
-- it would sit beside the chain, unverified, yet shown by every per-run reader.
CREATE TRIGGER audit_seq_positive BEFORE INSERT ON audit
WHEN NEW.seq < 1
BEGIN
    SELECT RAISE(ABORT, 'audit records start at seq 1');
END;
