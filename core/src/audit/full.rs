//! Verifying the whole store: the log of checkpoints over every chain, the legacy chain's
//! checkpoints, checkpoint files, then every chain (or one) against what they pin.
//!
//! INVARIANT (fails closed): the first problem is reported — a refused checkpoint before any
//! chain is read, then chains in name order; a chain named by a checkpoint but gone, a chain
//! asked for that does not exist, or records outside every chain are breaks, never skipped.

use super::checkpoint::{Checkpoint, PublicKey, VerifyFailure, VerifyReport, expect_checkpoints};
use super::note::CheckpointNote;
use super::{ChainBreak, ChainVerifier};
use crate::store::{Store, StoreError};

impl Store {
    /// Verifies every chain (or only `only`) against the stored log of checkpoints, the
    /// legacy chain's checkpoints, and the checkpoints read from files (`external` notes,
    /// `external_legacy` legacy ones, with a label each), whose signatures must verify under
    /// `trusted` (or, when it is empty, under the key each names).
    pub async fn verify_audit_full(
        &self,
        trusted: &[PublicKey],
        external_legacy: &[(Checkpoint, String)],
        external: &[(CheckpointNote, String)],
        only: Option<&str>,
    ) -> Result<Result<VerifyReport, VerifyFailure>, StoreError> {
        let heads = self.tree_heads().await?;
        let mut expect = match super::tree_head::check_log(&heads, external, trusted) {
            Ok(e) => e,
            Err(f) => return Ok(Err(f)),
        };
        let legacy = self.audit_checkpoints().await?;
        let mut chains: std::collections::BTreeSet<String> =
            self.audit_chain_names().await?.into_iter().collect();
        chains.extend(expect.keys().cloned());
        if !legacy.is_empty() || !external_legacy.is_empty() {
            chains.insert(super::LEGACY_CHAIN.to_string());
        }
        if let Some(only) = only {
            if !chains.contains(only) {
                return Ok(Err(VerifyFailure::Chain(ChainBreak {
                    chain: only.to_string(),
                    seq: 1,
                    reason: "no such chain: no record was ever written to it and no \
                             checkpoint covers it"
                        .into(),
                })));
            }
            chains.retain(|c| c == only);
        }
        let mut report = VerifyReport {
            records: 0,
            chains: 0,
            checkpoints: heads.len(),
            skipped: 0,
        };
        for chain in &chains {
            let mut v = ChainVerifier::new(1, super::GENESIS)
                .chain(chain)
                .threads(super::default_threads());
            if chain == super::LEGACY_CHAIN {
                let all = legacy
                    .iter()
                    .map(|c| (c, format!("the stored checkpoint for record {}", c.seq)))
                    .chain(external_legacy.iter().map(|(c, s)| (c, s.clone())));
                match expect_checkpoints(&mut v, all, trusted) {
                    Ok(n) => report.checkpoints += n,
                    Err(f) => return Ok(Err(f)),
                }
            }
            for (seq, hash, source) in expect.remove(chain).unwrap_or_default() {
                if let Err(b) = v.expect(seq, &hash, source) {
                    return Ok(Err(b.into()));
                }
            }
            match self.verify_audit_with(v).await? {
                Ok(n) => report.records += n,
                Err(b) => return Ok(Err(b.into())),
            }
            report.chains += 1;
        }
        if only.is_none()
            && let Some(b) = self.audit_orphans().await?
        {
            return Ok(Err(b.into()));
        }
        Ok(Ok(report))
    }
}
