-- Postgres only (the one-trip batch also writes reads' rows); kept here so both folders carry
-- the same migration versions.
SELECT 1;
