//! Bundle versions: every imported bundle (registry, Cedar policies, Cedar entity schema),
//! kept whole, with who imported it and what it changed. The table is still called
//! `registry_versions`: a version is a registry plus the policies checked against it.
//!
//! # Invariants
//!
//! * Only a bundle that loads ([`Bundle::load`]: registry, policies and their consistency)
//!   is stored: an invalid one is refused with every problem, and nothing is written.
//! * Versions count up from 1 with no gaps; the version is the current maximum + 1, so two
//!   concurrent importers collide on the primary key and one gets [`StoreError::Conflict`].
//! * Importing texts identical to the current version's (all three) stores nothing and
//!   returns the current version.
//! * The texts are stored exactly as imported (comments included); `sha256` is
//!   [`BundleSources::sha256`]; `diff` lists the registry changes
//!   ([`crate::registry::diff`]) against the previous version, then `~ policies changed`
//!   and `~ policy schema changed` when those texts differ.

use super::{Store, StoreError, on_pool};
use crate::bundle::{Bundle, BundleError, BundleSources};
use crate::registry::{Registry, diff};

/// Why an import was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The bundle breaks a rule; nothing was stored.
    #[error(transparent)]
    Invalid(#[from] BundleError),
    /// `created_by` was empty.
    #[error("an import must name who made it")]
    NoAuthor,
    /// The database refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One stored version, without its texts.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RegistryVersion {
    /// Version number, from 1.
    pub version: i64,
    /// [`BundleSources::sha256`] of the stored texts.
    pub sha256: String,
    /// Who imported it.
    pub created_by: String,
    /// When, Unix ms.
    pub created_at: i64,
    /// Readable changes against the previous version.
    pub diff: String,
}

/// Hex SHA-256 of one text's bytes (e.g. a registry file, to compare with `sha256sum`).
pub fn registry_sha256(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The current row: version and texts.
type Current = (i64, String, String, String);

impl Store {
    /// Stores `sources` as the next version, after checking the bundle loads. Returns the
    /// new version, or the current one when all three texts are identical to it.
    pub async fn import_bundle(
        &self,
        sources: &BundleSources,
        created_by: &str,
    ) -> Result<i64, ImportError> {
        if created_by.trim().is_empty() {
            return Err(ImportError::NoAuthor);
        }
        let new = Bundle::load(sources.clone())?;
        let current = self.current_row().await?;
        let (version, diff_text) = match current {
            Some((v, registry_yaml, policies, policy_schema)) => {
                let old = BundleSources {
                    registry_yaml,
                    policies,
                    policy_schema,
                };
                if old == *sources {
                    return Ok(v);
                }
                (v + 1, changes(Some((v, &old)), &new.registry, sources)?)
            }
            None => (1, changes(None, &new.registry, sources)?),
        };
        self.insert_version(version, sources, created_by, &diff_text)
            .await?;
        Ok(version)
    }

    /// Stores `sources` as version 1, only if the database holds no version: a concurrent
    /// import that stored one first makes this a [`StoreError::Conflict`] (the primary key),
    /// never a version 2.
    pub(super) async fn import_first(
        &self,
        sources: &BundleSources,
        created_by: &str,
    ) -> Result<(), ImportError> {
        if created_by.trim().is_empty() {
            return Err(ImportError::NoAuthor);
        }
        let new = Bundle::load(sources.clone())?;
        let diff_text = changes(None, &new.registry, sources)?;
        self.insert_version(1, sources, created_by, &diff_text)
            .await?;
        Ok(())
    }

    async fn insert_version(
        &self,
        version: i64,
        sources: &BundleSources,
        created_by: &str,
        diff_text: &str,
    ) -> Result<(), StoreError> {
        let sha = sources.sha256();
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO registry_versions
                   (version, yaml, policies, policy_schema, sha256, created_by, created_at, diff)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(version)
            .bind(&sources.registry_yaml)
            .bind(&sources.policies)
            .bind(&sources.policy_schema)
            .bind(&sha)
            .bind(created_by)
            .bind(now)
            .bind(diff_text)
            .execute(p)
            .await
            .map_err(StoreError::from)?
            .rows_affected()
        });
        Ok(())
    }

    /// Replaces only the registry: stores `yaml` with the current version's policies and
    /// entity schema (none when nothing was imported yet), checked together like any
    /// bundle. Keeping the policies means a registry edit never silently drops a forbid.
    pub async fn import_registry(&self, yaml: &str, created_by: &str) -> Result<i64, ImportError> {
        let (policies, policy_schema) = match self.current_row().await? {
            Some((_, _, policies, schema)) => (policies, schema),
            None => (String::new(), String::new()),
        };
        let sources = BundleSources {
            registry_yaml: yaml.to_owned(),
            policies,
            policy_schema,
        };
        self.import_bundle(&sources, created_by).await
    }

    /// The newest version and its three texts, if any was imported.
    pub async fn current_bundle(&self) -> Result<Option<(i64, BundleSources)>, StoreError> {
        Ok(self
            .current_row()
            .await?
            .map(|(v, registry_yaml, policies, policy_schema)| {
                (
                    v,
                    BundleSources {
                        registry_yaml,
                        policies,
                        policy_schema,
                    },
                )
            }))
    }

    /// The newest version and its registry text, if any was imported.
    pub async fn current_registry(&self) -> Result<Option<(i64, String)>, StoreError> {
        Ok(self
            .current_row()
            .await?
            .map(|(v, registry_yaml, _, _)| (v, registry_yaml)))
    }

    async fn current_row(&self) -> Result<Option<Current>, StoreError> {
        let row: Option<Current> = on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT version, yaml, policies, policy_schema FROM registry_versions
                 ORDER BY version DESC LIMIT 1",
            )
            .fetch_optional(p)
            .await?
        });
        Ok(row)
    }

    /// The newest version number: a cheap poll for servers that reload on change.
    pub async fn registry_version(&self) -> Result<Option<i64>, StoreError> {
        let v: Option<i64> = on_pool!(self, |p| {
            sqlx::query_scalar("SELECT MAX(version) FROM registry_versions")
                .fetch_one(p)
                .await?
        });
        Ok(v)
    }

    /// The newest `limit` versions, newest first, without their texts.
    pub async fn registry_versions(&self, limit: i64) -> Result<Vec<RegistryVersion>, StoreError> {
        let rows: Vec<RegistryVersion> = on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT version, sha256, created_by, created_at, diff FROM registry_versions
                 ORDER BY version DESC LIMIT $1",
            )
            .bind(limit)
            .fetch_all(p)
            .await?
        });
        Ok(rows)
    }
}

/// The readable changes from `old` (version and texts; `None` before the first version) to
/// `new`.
pub(super) fn changes(
    old: Option<(i64, &BundleSources)>,
    new_registry: &Registry,
    new: &BundleSources,
) -> Result<String, ImportError> {
    let empty_sources = BundleSources::default();
    let (registry_lines, old) = match old {
        None => (diff(&empty()?, new_registry).to_string(), &empty_sources),
        Some((v, old)) => {
            let lines = match Registry::from_sources(&old.registry_sources()) {
                Ok(old_registry) => diff(&old_registry, new_registry).to_string(),
                Err(e) => format!(
                    "version {v} no longer loads ({} problem(s)); everything is listed as new\n{}",
                    e.problems().len(),
                    diff(&empty()?, new_registry)
                ),
            };
            (lines, old)
        }
    };
    let mut lines: Vec<String> = registry_lines
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if old.policies != new.policies {
        lines.push("~ policies changed".to_owned());
    }
    if old.policy_schema != new.policy_schema {
        lines.push("~ policy schema changed".to_owned());
    }
    if lines.is_empty() {
        return Ok("no change in content (text only)".to_owned());
    }
    Ok(lines.join("\n"))
}

fn empty() -> Result<Registry, ImportError> {
    Registry::from_yaml_str("").map_err(|e| ImportError::Invalid(e.into()))
}
