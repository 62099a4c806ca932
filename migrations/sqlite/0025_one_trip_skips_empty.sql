-- Postgres only (the one-trip batch function skips empty steps); kept here so both folders
-- carry the same migration versions.
SELECT 1;
