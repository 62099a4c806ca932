-- Countersign schema v6: indexes behind the dashboard's audit search, run list and gate
-- metrics. Same indexes in both dialects. The audit search pages newest first by keyset on
-- seq (WHERE seq < cursor ORDER BY seq DESC), so each filter column is indexed together
-- with seq: a filtered page reads only its own rows, however long the chain.
CREATE INDEX audit_tool_seq ON audit (tool, seq);
CREATE INDEX audit_actor_seq ON audit (actor, seq);
CREATE INDEX audit_event_seq ON audit (event, seq);
CREATE INDEX audit_rule_seq ON audit (rule, seq);
CREATE INDEX audit_step_seq ON audit (step_id, seq);
-- "What did this person approve": the approver filter goes through the approvals table.
CREATE INDEX approvals_approver ON approvals (approver_sub, step_id);
