-- Postgres only (its executor claim becomes a function planned in queue order); kept here so
-- both folders carry the same migration versions.
SELECT 1;
