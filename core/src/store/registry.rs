//! Registry versions: every imported registry, kept whole, with who imported it and what it
//! changed.
//!
//! # Invariants
//!
//! * Only a registry that loads ([`Registry::from_yaml_str`]) is stored: an invalid one is
//!   refused with every problem, and nothing is written.
//! * Versions count up from 1 with no gaps; the version is the current maximum + 1, so two
//!   concurrent importers collide on the primary key and one gets [`StoreError::Conflict`].
//! * Importing text byte-identical to the current version stores nothing and returns the
//!   current version.
//! * The text is stored exactly as imported (comments included); `sha256` is the hex SHA-256
//!   of those bytes; `diff` is [`crate::registry::diff`] against the previous version.

use sha2::{Digest, Sha256};

use super::{Store, StoreError, on_pool};
use crate::registry::{LoadError, Registry, diff};

/// Why an import was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The registry breaks the loader's rules; nothing was stored.
    #[error(transparent)]
    Invalid(#[from] LoadError),
    /// `created_by` was empty.
    #[error("an import must name who made it")]
    NoAuthor,
    /// The database refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One stored registry version, without its text.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RegistryVersion {
    /// Version number, from 1.
    pub version: i64,
    /// Hex SHA-256 of the stored text.
    pub sha256: String,
    /// Who imported it.
    pub created_by: String,
    /// When, Unix ms.
    pub created_at: i64,
    /// Readable changes against the previous version.
    pub diff: String,
}

/// Hex SHA-256 of `text`'s bytes.
pub fn registry_sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Store {
    /// Stores `yaml` as the next registry version, after checking it loads. Returns the new
    /// version, or the current one when `yaml` is identical to it.
    pub async fn import_registry(&self, yaml: &str, created_by: &str) -> Result<i64, ImportError> {
        if created_by.trim().is_empty() {
            return Err(ImportError::NoAuthor);
        }
        let new = Registry::from_yaml_str(yaml)?;
        let sha = registry_sha256(yaml);
        let current: Option<(i64, String, String)> = on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT version, sha256, yaml FROM registry_versions ORDER BY version DESC LIMIT 1",
            )
            .fetch_optional(p)
            .await
            .map_err(StoreError::from)?
        });
        let (version, diff_text) = match current {
            Some((v, current_sha, _)) if current_sha == sha => return Ok(v),
            Some((v, _, old_text)) => {
                let text = match Registry::from_yaml_str(&old_text) {
                    Ok(old) => {
                        let d = diff(&old, &new);
                        if d.is_empty() {
                            "no change in content (text only)".to_string()
                        } else {
                            d.to_string()
                        }
                    }
                    Err(e) => format!(
                        "version {v} no longer loads ({} problem(s)); everything is listed as new\n{}",
                        e.problems().len(),
                        diff(&empty()?, &new)
                    ),
                };
                (v + 1, text)
            }
            None => (1, diff(&empty()?, &new).to_string()),
        };
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO registry_versions (version, yaml, sha256, created_by, created_at, diff)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(version)
            .bind(yaml)
            .bind(&sha)
            .bind(created_by)
            .bind(now)
            .bind(&diff_text)
            .execute(p)
            .await
            .map_err(StoreError::from)?
            .rows_affected()
        });
        Ok(version)
    }

    /// The newest registry version and its text, if any was imported.
    pub async fn current_registry(&self) -> Result<Option<(i64, String)>, StoreError> {
        let row: Option<(i64, String)> = on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT version, yaml FROM registry_versions ORDER BY version DESC LIMIT 1",
            )
            .fetch_optional(p)
            .await?
        });
        Ok(row)
    }

    /// The newest registry version number: a cheap poll for servers that reload on change.
    pub async fn registry_version(&self) -> Result<Option<i64>, StoreError> {
        let v: Option<i64> = on_pool!(self, |p| {
            sqlx::query_scalar("SELECT MAX(version) FROM registry_versions")
                .fetch_one(p)
                .await?
        });
        Ok(v)
    }

    /// The newest `limit` versions, newest first, without their text.
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

fn empty() -> Result<Registry, ImportError> {
    Ok(Registry::from_yaml_str("")?)
}
