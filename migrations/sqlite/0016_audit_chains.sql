-- Countersign schema v16 (sqlite dialect): one audit chain per tenant. Keep in step with
-- migrations/postgres/0016_audit_chains.sql, which explains the design. Differences: `pos` is
-- the rowid (assigned in write order: one writer) and the chain key (chain, seq) is UNIQUE;
-- the head trigger runs per row (records are inserted in chain order).
CREATE TABLE audit_v16 (
    pos      INTEGER PRIMARY KEY,
    chain    TEXT NOT NULL,
    seq      BIGINT NOT NULL CHECK (seq >= 1),
    at       BIGINT NOT NULL,
    event    TEXT NOT NULL,
    run_id   TEXT,
    step_id  TEXT,
    tool     TEXT,
    actor    TEXT,
    rule     TEXT,
    record   TEXT NOT NULL,
    prev     TEXT NOT NULL,
    hash     TEXT NOT NULL,
    UNIQUE (chain, seq)
);
INSERT INTO audit_v16 (pos, chain, seq, at, event, run_id, step_id, tool, actor, rule, record,
                       prev, hash)
SELECT seq, '_legacy', seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash
  FROM audit ORDER BY seq;

CREATE TABLE audit_chains (
    chain  TEXT PRIMARY KEY NOT NULL,
    seq    BIGINT NOT NULL CHECK (seq >= 0),
    hash   TEXT NOT NULL,
    at     BIGINT NOT NULL
);
INSERT INTO audit_chains (chain, seq, hash, at)
SELECT '_legacy', seq, hash, at FROM audit_v16 ORDER BY seq DESC LIMIT 1;

DROP TABLE audit;
ALTER TABLE audit_v16 RENAME TO audit;
CREATE INDEX audit_run ON audit (run_id, pos);
CREATE INDEX audit_at ON audit (at);
CREATE INDEX audit_tool_pos ON audit (tool, pos);
CREATE INDEX audit_actor_pos ON audit (actor, pos);
CREATE INDEX audit_event_pos ON audit (event, pos);
CREATE INDEX audit_rule_pos ON audit (rule, pos);
CREATE INDEX audit_step_pos ON audit (step_id, pos);

CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit is append-only: UPDATE refused');
END;

CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit is append-only: DELETE refused');
END;

CREATE TRIGGER audit_extend_head AFTER INSERT ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit: the _legacy chain is frozen') WHERE NEW.chain = '_legacy';
    SELECT RAISE(ABORT, 'audit: a record does not extend the head of its chain')
     WHERE NOT EXISTS (SELECT 1 FROM audit_chains h
                        WHERE h.chain = NEW.chain AND h.seq = NEW.seq - 1 AND h.hash = NEW.prev);
    UPDATE audit_chains SET seq = NEW.seq, hash = NEW.hash, at = NEW.at WHERE chain = NEW.chain;
END;

CREATE TRIGGER audit_chains_forward_only BEFORE UPDATE ON audit_chains
WHEN NEW.seq <= OLD.seq OR NEW.chain <> OLD.chain
BEGIN
    SELECT RAISE(ABORT, 'audit_chains: a head only moves forward, with its records');
END;

CREATE TRIGGER audit_chains_no_delete BEFORE DELETE ON audit_chains
BEGIN
    SELECT RAISE(ABORT, 'audit_chains: a head is never deleted');
END;

-- Signed checkpoints over every chain (see the postgres file): `audit_tree_heads` holds
-- each checkpoint's signed note (C2SP tlog-checkpoint form; `number` counts checkpoints, each
-- naming the hash of the one before), `audit_tree_leaves` the chain heads it covers, keyed by
-- chain first, in tree order (`idx`). Both append-only. The checkpoints of schema < 16
-- (`audit_checkpoints`) keep pinning the legacy chain.
CREATE TABLE audit_tree_heads (
    number      BIGINT PRIMARY KEY NOT NULL CHECK (number >= 1),
    at          BIGINT NOT NULL,
    note        TEXT NOT NULL,
    public_key  TEXT NOT NULL
);
CREATE TABLE audit_tree_leaves (
    chain   TEXT NOT NULL,
    number  BIGINT NOT NULL,
    idx     BIGINT NOT NULL,
    seq     BIGINT NOT NULL,
    hash    TEXT NOT NULL,
    PRIMARY KEY (chain, number)
);
CREATE INDEX audit_tree_leaves_number ON audit_tree_leaves (number, idx);

CREATE TRIGGER audit_tree_heads_no_update BEFORE UPDATE ON audit_tree_heads
BEGIN
    SELECT RAISE(ABORT, 'audit_tree_heads is append-only: UPDATE refused');
END;

CREATE TRIGGER audit_tree_heads_no_delete BEFORE DELETE ON audit_tree_heads
BEGIN
    SELECT RAISE(ABORT, 'audit_tree_heads is append-only: DELETE refused');
END;

CREATE TRIGGER audit_tree_leaves_no_update BEFORE UPDATE ON audit_tree_leaves
BEGIN
    SELECT RAISE(ABORT, 'audit_tree_leaves is append-only: UPDATE refused');
END;

CREATE TRIGGER audit_tree_leaves_no_delete BEFORE DELETE ON audit_tree_leaves
BEGIN
    SELECT RAISE(ABORT, 'audit_tree_leaves is append-only: DELETE refused');
END;
