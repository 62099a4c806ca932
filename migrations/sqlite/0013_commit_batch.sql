-- Postgres only (its committer's one-round-trip batch function); kept here so both folders
-- carry the same migration versions.
SELECT 1;
