-- Records live at seq 1 and above: verification walks the chain from record 1, so a row below
-- it would sit beside the chain, unverified, yet shown by every per-run reader.
ALTER TABLE audit ADD CONSTRAINT audit_seq_positive CHECK (seq >= 1);
