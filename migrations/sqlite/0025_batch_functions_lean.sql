-- Postgres only (its batch functions skip empty steps and take run positions by key); kept
-- here so both folders carry the same migration versions.
SELECT 1;
