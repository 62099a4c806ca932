-- Postgres only (the batch INSERT of reads' rows as a function); kept here so both folders carry
-- the same migration versions.
SELECT 1;
