-- Countersign schema v3 (sqlite dialect): registry versions become bundle versions. Keep in step
-- with the other dialect. Each version also keeps the Cedar policies and the Cedar entity
-- schema it was imported with, exactly as imported ('' for a registry-only version, which is
-- what every version imported before v3 was). `sha256` of a row written from v3 on covers
-- the three texts (see countersign_core::bundle::BundleSources::sha256).

ALTER TABLE registry_versions ADD COLUMN policies TEXT NOT NULL DEFAULT '';
ALTER TABLE registry_versions ADD COLUMN policy_schema TEXT NOT NULL DEFAULT '';
