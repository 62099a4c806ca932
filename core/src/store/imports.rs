//! `countersign registry import`: the very first registry of an empty database applies at
//! once; any later bundle is a proposal a second admin applies.
//!
//! Invariants:
//! * A bundle is checked to load before anything is stored or proposed.
//! * Only a database with no registry version takes a bundle directly (version 1); on any
//!   other, the bundle is filed as a proposal against the version in force
//!   ([`Change::Bundle`]), never stored as a version here. Identical texts change nothing.

use super::proposals::{BundleChange, Change, NewProposal, Proposal, ProposalError};
use super::registry::{ImportError, changes};
use super::{Store, StoreError};
use crate::bundle::{Bundle, BundleSources};

/// What `registry import` did.
#[derive(Debug, Clone)]
pub enum BundleImport {
    /// The database held no registry: this is version 1, in force now.
    Applied(i64),
    /// Identical to the version in force: nothing stored.
    Unchanged(i64),
    /// Filed for a second admin's approval.
    Proposed(Box<Proposal>),
}

impl Store {
    /// What `countersign registry import` does: on a database with no registry, stores
    /// `sources` as version 1 (nothing to protect yet); identical texts change nothing;
    /// otherwise files a proposal of the whole bundle against the version in force, which
    /// only another admin's approval applies ([`Store::approve_proposal`]). The bundle is
    /// checked to load first either way.
    pub async fn import_or_propose(
        &self,
        sources: &BundleSources,
        by: &str,
        note: &str,
    ) -> Result<BundleImport, ProposalError> {
        if by.trim().is_empty() {
            return Err(ProposalError::Invalid(ImportError::NoAuthor.to_string()));
        }
        let new =
            Bundle::load(sources.clone()).map_err(|e| ProposalError::Invalid(e.one_line()))?;
        if self.current_bundle().await?.is_none() {
            // Version 1 or nothing: if another import stored one meanwhile, this bundle is
            // proposed against it like any other (never stored as version 2 unseen).
            match self.import_first(sources, by).await {
                Ok(()) => return Ok(BundleImport::Applied(1)),
                Err(ImportError::Store(StoreError::Conflict(_))) => {}
                Err(ImportError::Store(e)) => return Err(e.into()),
                Err(e) => return Err(ProposalError::Invalid(e.to_string())),
            }
        }
        let Some((version, current)) = self.current_bundle().await? else {
            return Err(ProposalError::Invalid(
                "the registry version stored meanwhile is gone".into(),
            ));
        };
        if current == *sources {
            return Ok(BundleImport::Unchanged(version));
        }
        let summary = changes(Some((version, &current)), &new.registry, sources)
            .map_err(|e| ProposalError::Invalid(e.to_string()))?;
        let change = BundleChange {
            registry_yaml: sources.registry_yaml.clone(),
            policies: sources.policies.clone(),
            policy_schema: sources.policy_schema.clone(),
            sha256: sources.sha256(),
            summary,
        };
        let proposal = self
            .propose(&NewProposal {
                proposer: by.to_string(),
                proposer_name: by.to_string(),
                base_version: version,
                changes: vec![Change::Bundle(change)],
                note: note.to_string(),
            })
            .await?;
        Ok(BundleImport::Proposed(Box::new(proposal)))
    }
}
