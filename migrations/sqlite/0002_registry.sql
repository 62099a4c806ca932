-- Countersign schema v2 (sqlite dialect): registry versions. Keep in step with the other dialect.
-- One row per imported registry: the YAML exactly as imported, its SHA-256, who imported it,
-- when (Unix ms), and the readable diff against the previous version. Versions are assigned
-- by the importer as the current maximum + 1; two importers racing collide on the key.

CREATE TABLE registry_versions (
    version     BIGINT PRIMARY KEY NOT NULL CHECK (version >= 1),
    yaml        TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    created_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    diff        TEXT NOT NULL
);
