-- Postgres only (the audit head trigger's check rewritten to cost the same whatever the plan;
-- SQLite's head trigger runs per row and needs no change); kept here so both folders carry the
-- same migration versions.
SELECT 1;
