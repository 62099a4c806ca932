//! Verifying the whole store: the log of checkpoints over every chain, the legacy chain's
//! checkpoints, checkpoint files, then every chain (or one) against what they pin.
//!
//! INVARIANT (fails closed): the first problem is reported — a refused checkpoint before any
//! chain is read, then chains in name order; a chain named by a checkpoint but gone, a chain
//! asked for that does not exist, or records outside every chain are breaks, never skipped.

use super::checkpoint::{Checkpoint, PublicKey, VerifyFailure, VerifyReport, expect_checkpoints};
use super::note::CheckpointNote;
use super::{ChainBreak, ChainVerifier, GENESIS, default_threads};
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

    /// Verifies every stored chain in pages (without checkpoints: see
    /// [`Store::verify_audit_full`]); returns the number of records.
    pub async fn verify_audit(&self) -> Result<Result<i64, ChainBreak>, StoreError> {
        let mut total = 0;
        for chain in self.audit_chain_names().await? {
            let v = ChainVerifier::new(1, GENESIS)
                .chain(&chain)
                .threads(default_threads());
            match self.verify_audit_with(v).await? {
                Ok(n) => total += n,
                Err(b) => return Ok(Err(b)),
            }
        }
        if let Some(b) = self.audit_orphans().await? {
            return Ok(Err(b));
        }
        Ok(Ok(total))
    }

    /// Every chain with a head row, by name (empty chains included).
    pub async fn audit_chain_names(&self) -> Result<Vec<String>, StoreError> {
        let rows: Vec<String> = crate::store::on_pool!(self, |p| {
            sqlx::query_scalar("SELECT chain FROM audit_chains ORDER BY chain")
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// A chain's head row: its last record's `(seq, hash)` (`(0, GENESIS)` while empty), if
    /// it has one.
    pub async fn audit_chain_head(&self, chain: &str) -> Result<Option<(i64, String)>, StoreError> {
        let row: Option<(i64, String)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as("SELECT seq, hash FROM audit_chains WHERE chain = $1")
                .bind(chain)
                .fetch_optional(p)
                .await?
        });
        Ok(row)
    }

    /// A break when records are stored outside every chain's walk: in a chain without a head
    /// row, or below record 1 (the database refuses both; only someone who removed its
    /// constraints could write them, and per-run readers would show them unverified).
    pub(crate) async fn audit_orphans(&self) -> Result<Option<ChainBreak>, StoreError> {
        let row: Option<(String, i64)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT a.chain, a.seq FROM audit a
                  WHERE a.seq < 1
                     OR NOT EXISTS (SELECT 1 FROM audit_chains h WHERE h.chain = a.chain)
                  LIMIT 1",
            )
            .fetch_optional(p)
            .await?
        });
        Ok(row.map(|(chain, seq)| ChainBreak {
            reason: if seq < 1 {
                "a record is stored below record 1, outside the chain".into()
            } else {
                "records are stored in a chain that has no head: outside every verified chain"
                    .into()
            },
            chain,
            seq,
        }))
    }

    /// Feeds the stored records of `v`'s chain from its next `seq` on, in pages, through `v`,
    /// then checks that the chain ends where its head row says.
    pub async fn verify_audit_with(
        &self,
        mut v: ChainVerifier,
    ) -> Result<Result<i64, ChainBreak>, StoreError> {
        const PAGE: i64 = 10_000;
        let chain = v.chain_name().to_string();
        if chain.is_empty() {
            return Err(StoreError::Conflict(
                "verifying the store needs the chain to verify".into(),
            ));
        }
        // The head first: a record and the head move in one transaction, so every record up
        // to the head read here is visible below. Records appended meanwhile (a live chain)
        // are past it and are not part of this verification; read the other way round, they
        // would look like a truncated tail.
        let head = self.audit_chain_head(&chain).await?;
        loop {
            let mut page = self.audit_records(&chain, v.next_seq(), PAGE).await?;
            let full = i64::try_from(page.len()).is_ok_and(|n| n == PAGE);
            if let Some((seq, _)) = &head {
                page.retain(|r| r.seq <= *seq);
            }
            if page.is_empty() {
                break;
            }
            if let Err(b) = v.push_all(&page) {
                return Ok(Err(b));
            }
            if !full || head.as_ref().is_some_and(|(seq, _)| v.next_seq() > *seq) {
                break;
            }
        }
        let mut last = v.next_seq() - 1;
        // Records past the head: appended since it was read (then the head has moved too), or
        // written without moving it — then the head does not name the chain's last record.
        if let Some((seq, hash)) = &head
            && last == *seq
            && let Some(past) = self.audit_records(&chain, seq + 1, 1).await?.first()
            && self.audit_chain_head(&chain).await?.as_ref() == Some(&(*seq, hash.clone()))
        {
            last = past.seq;
        }
        if head.is_none() && last > 0 {
            return Ok(Err(ChainBreak {
                chain,
                seq: last,
                reason: "the chain's records have no head row: it was removed".into(),
            }));
        }
        if let Some((seq, hash)) = head
            && (seq != last || (seq > 0 && hash != v.last_hash()))
        {
            return Ok(Err(ChainBreak {
                chain,
                seq: last + 1,
                reason: if seq > last {
                    format!(
                        "missing: the chain ends at record {last} but its head is record {seq}; the \
                         tail was truncated"
                    )
                } else {
                    format!(
                        "the chain's head says record {seq} ({hash}), not its last record {last}"
                    )
                },
            }));
        }
        Ok(v.finish())
    }
}
