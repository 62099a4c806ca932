-- Postgres only (reads in the one-trip batch function); kept here so both folders carry the
-- same migration versions.
SELECT 1;
