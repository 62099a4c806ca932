//! Checkpoints over every chain: the chains' heads as the leaves of an RFC 6962 Merkle tree,
//! its root signed as a C2SP checkpoint note ([`super::note`]), stored with its leaves.
//!
//! INVARIANTS (fail closed):
//! * A checkpoint's leaves are every non-empty chain's head `{chain, seq, hash}` read in one
//!   statement (one snapshot), sorted by chain; leaf `i` is stored with `idx = i`, so the tree
//!   is rebuilt from the database exactly as it was signed.
//! * Checkpoints form a log: number `n` names the hash of number `n − 1`'s signed text (the
//!   first names zeros). [`check_log`] refuses a gap, a wrong link, a signature that does not
//!   verify under a trusted key, leaves that do not hash to the signed root, and a chain that
//!   shrinks or disappears from one checkpoint to the next (named as truncated).
//! * Every checkpoint's leaves become expectations on their chains: the chain must still
//!   hold that hash at that seq ([`super::ChainVerifier::expect`]), so a rewritten or cut
//!   chain is caught even where it links perfectly.
//! * A checkpoint read from a file must be in the stored log, byte for byte; a database whose
//!   log ends before it was rolled back.
//! * Rows are only INSERTed (the tables refuse UPDATE, DELETE and TRUNCATE); two replicas
//!   signing at once collide on `number` and one keeps the other's.

use std::collections::BTreeMap;

use ed25519_dalek::VerifyingKey;
use serde_json::json;

use super::checkpoint::{CheckpointSigner, PublicKey, VerifyFailure};
use super::merkle::{self, Hash};
use super::note::{CheckpointBody, CheckpointNote};
use crate::canonical::canonicalize;
use crate::store::{Store, StoreError};

/// One chain's head as a checkpoint covers it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, sqlx::FromRow)]
#[serde(deny_unknown_fields)]
pub struct Leaf {
    /// The chain.
    pub chain: String,
    /// Its last record's `seq`.
    pub seq: i64,
    /// Its last record's hash.
    pub hash: String,
}

impl Leaf {
    /// The leaf's bytes in the tree: the canonical JSON `{"chain":…,"hash":…,"seq":…}`.
    ///
    /// # Errors
    /// Never for stored values (strings and an integer); kept so nothing is swallowed.
    pub fn data(&self) -> Result<String, StoreError> {
        canonicalize(&json!({"chain": self.chain, "seq": self.seq, "hash": self.hash}))
            .map_err(|e| StoreError::Conflict(format!("checkpoint leaf: {e}")))
    }

    /// Its RFC 6962 leaf hash.
    ///
    /// # Errors
    /// See [`Leaf::data`].
    pub fn hash(&self) -> Result<Hash, StoreError> {
        Ok(merkle::leaf_hash(self.data()?.as_bytes()))
    }
}

/// The leaf hashes of `leaves`, in order.
///
/// # Errors
/// See [`Leaf::data`].
pub fn leaf_hashes(leaves: &[Leaf]) -> Result<Vec<Hash>, StoreError> {
    leaves.iter().map(Leaf::hash).collect()
}

/// A stored checkpoint: its note, the key that signed it (as stored) and its leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeHead {
    /// The signed note.
    pub note: CheckpointNote,
    /// The signer's public key, hex, as stored beside it.
    pub public_key: String,
    /// The chain heads it covers, in tree order.
    pub leaves: Vec<Leaf>,
}

impl TreeHead {
    /// Its number in the log of checkpoints.
    pub fn number(&self) -> i64 {
        self.note.body.number
    }

    /// The inclusion proof of chain `chain`'s leaf: `(index, leaf, proof)`; `None` when the
    /// checkpoint does not cover that chain.
    ///
    /// # Errors
    /// See [`Leaf::data`].
    pub fn proof_for(&self, chain: &str) -> Result<Option<(usize, Leaf, Vec<Hash>)>, StoreError> {
        let Some(index) = self.leaves.iter().position(|l| l.chain == chain) else {
            return Ok(None);
        };
        let hashes = leaf_hashes(&self.leaves)?;
        Ok(merkle::inclusion_proof(&hashes, index)
            .map(|proof| (index, self.leaves[index].clone(), proof)))
    }
}

/// What a chain must hold, by chain: `(seq, hash, which checkpoint says so)`.
pub type Expectations = BTreeMap<String, Vec<(i64, String, String)>>;

fn log_failure(number: i64, reason: impl Into<String>) -> VerifyFailure {
    VerifyFailure::Log {
        number,
        reason: reason.into(),
    }
}

/// The keys a checkpoint may be signed by: `trusted`, or when none are given, the key stored
/// beside it.
fn keys_for(head_key: &str, trusted: &[PublicKey]) -> Result<Vec<VerifyingKey>, String> {
    if trusted.is_empty() {
        let key = PublicKey::parse(head_key).map_err(|e| format!("its stored key: {e}"))?;
        return Ok(vec![*key.key()]);
    }
    Ok(trusted.iter().map(|k| *k.key()).collect())
}

/// Checks the stored log of checkpoints `heads` (by number) and the checkpoints read from
/// files (`external`, with a label each), and returns what each chain must hold.
///
/// # Errors
/// The first problem, as a [`VerifyFailure::Log`] naming the checkpoint.
pub fn check_log(
    heads: &[TreeHead],
    external: &[(CheckpointNote, String)],
    trusted: &[PublicKey],
) -> Result<Expectations, VerifyFailure> {
    let mut expect = Expectations::new();
    let mut prev: Option<&TreeHead> = None;
    for (i, th) in heads.iter().enumerate() {
        let body = &th.note.body;
        let n = body.number;
        let wanted = i64::try_from(i).unwrap_or(i64::MAX).saturating_add(1);
        if n != wanted {
            return Err(log_failure(
                wanted,
                format!(
                    "missing: the stored checkpoints go from {} to {n}",
                    wanted - 1
                ),
            ));
        }
        let keys = keys_for(&th.public_key, trusted).map_err(|e| log_failure(n, e))?;
        th.note
            .verify(&keys)
            .map_err(|e| log_failure(n, e.to_string()))?;
        let link = prev.map_or([0; 32], |p| p.note.body.hash());
        if body.prev != link {
            return Err(log_failure(
                n,
                "it does not name the checkpoint before it: the log was rewritten",
            ));
        }
        let hashes = leaf_hashes(&th.leaves).map_err(|e| log_failure(n, e.to_string()))?;
        if u64::try_from(hashes.len()).ok() != Some(body.size) || merkle::root(&hashes) != body.root
        {
            return Err(log_failure(
                n,
                "its stored chain heads do not hash to the signed root",
            ));
        }
        if let Some(p) = prev {
            for old in &p.leaves {
                match th.leaves.iter().find(|l| l.chain == old.chain) {
                    None => {
                        return Err(log_failure(
                            n,
                            format!(
                                "chain {} (at record {} in checkpoint {}) is missing: it was \
                                 dropped",
                                old.chain,
                                old.seq,
                                p.number()
                            ),
                        ));
                    }
                    Some(new) if new.seq < old.seq => {
                        return Err(log_failure(
                            n,
                            format!(
                                "chain {} went back from record {} to {}: it was truncated",
                                old.chain, old.seq, new.seq
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        for leaf in &th.leaves {
            expect.entry(leaf.chain.clone()).or_default().push((
                leaf.seq,
                leaf.hash.clone(),
                format!("checkpoint {n}"),
            ));
        }
        prev = Some(th);
    }
    for (note, label) in external {
        let n = note.body.number;
        match heads.get(usize::try_from(n - 1).unwrap_or(usize::MAX)) {
            Some(th) if th.note.body == note.body => {}
            Some(_) => {
                return Err(log_failure(
                    n,
                    format!("{label} differs from the stored checkpoint {n}: the log was forked"),
                ));
            }
            None => {
                return Err(log_failure(
                    n,
                    format!(
                        "{label} is checkpoint {n} but the stored log ends at {}: the database \
                         was rolled back",
                        heads.len()
                    ),
                ));
            }
        }
        let keys: Vec<VerifyingKey> = trusted.iter().map(|k| *k.key()).collect();
        if !keys.is_empty() {
            note.verify(&keys)
                .map_err(|e| log_failure(n, format!("{label}: {e}")))?;
        }
    }
    Ok(expect)
}

const TH_COLUMNS: &str = "number, note, public_key";

impl Store {
    /// Every non-empty chain's head, by chain (one statement: one snapshot).
    pub async fn chain_heads(&self) -> Result<Vec<Leaf>, StoreError> {
        let rows: Vec<Leaf> = crate::store::on_pool!(self, |p| {
            sqlx::query_as("SELECT chain, seq, hash FROM audit_chains WHERE seq > 0 ORDER BY chain")
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// Every stored checkpoint with its leaves, by number.
    pub async fn tree_heads(&self) -> Result<Vec<TreeHead>, StoreError> {
        self.tree_heads_from(1, i64::MAX).await
    }

    /// The newest stored checkpoint, if any.
    pub async fn latest_tree_head(&self) -> Result<Option<TreeHead>, StoreError> {
        let newest: Option<i64> = crate::store::on_pool!(self, |p| {
            sqlx::query_scalar("SELECT MAX(number) FROM audit_tree_heads")
                .fetch_one(p)
                .await?
        });
        let Some(n) = newest else {
            return Ok(None);
        };
        Ok(self.tree_heads_from(n, 1).await?.pop())
    }

    async fn tree_heads_from(&self, from: i64, limit: i64) -> Result<Vec<TreeHead>, StoreError> {
        let sql = format!(
            "SELECT {TH_COLUMNS} FROM audit_tree_heads WHERE number >= $1 ORDER BY number LIMIT $2"
        );
        let rows: Vec<(i64, String, String)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(from)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        // Every leaf of those checkpoints in one query, in tree order.
        let leaves: Vec<(i64, String, i64, String)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT number, chain, seq, hash FROM audit_tree_leaves
                  WHERE number >= $1 AND number < $2 ORDER BY number, idx",
            )
            .bind(from)
            .bind(from.saturating_add(limit))
            .fetch_all(p)
            .await?
        });
        let mut by_number: BTreeMap<i64, Vec<Leaf>> = BTreeMap::new();
        for (number, chain, seq, hash) in leaves {
            by_number
                .entry(number)
                .or_default()
                .push(Leaf { chain, seq, hash });
        }
        let mut out = Vec::with_capacity(rows.len());
        for (number, note, public_key) in rows {
            let note = CheckpointNote::parse(&note)
                .map_err(|e| StoreError::Conflict(format!("stored checkpoint {number}: {e}")))?;
            if note.body.number != number {
                return Err(StoreError::Conflict(format!(
                    "stored checkpoint {number} says it is number {}",
                    note.body.number
                )));
            }
            out.push(TreeHead {
                note,
                public_key,
                leaves: by_number.remove(&number).unwrap_or_default(),
            });
        }
        Ok(out)
    }

    /// Stores `th` with its leaves in one transaction; `false` when a checkpoint with its
    /// number exists already (another replica signed first; nothing written).
    async fn insert_tree_head(&self, th: &TreeHead) -> Result<bool, StoreError> {
        macro_rules! run_in {
            ($pool:expr) => {{
                let mut tx = $pool.begin().await?;
                let n = sqlx::query(
                    "INSERT INTO audit_tree_heads (number, at, note, public_key)
                     VALUES ($1, $2, $3, $4) ON CONFLICT (number) DO NOTHING",
                )
                .bind(th.number())
                .bind(th.note.body.at)
                .bind(&th.note.text)
                .bind(&th.public_key)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n != 1 {
                    tx.rollback().await?;
                    false
                } else {
                    for (i, leaf) in th.leaves.iter().enumerate() {
                        sqlx::query(
                            "INSERT INTO audit_tree_leaves (chain, number, idx, seq, hash)
                             VALUES ($1, $2, $3, $4, $5)",
                        )
                        .bind(&leaf.chain)
                        .bind(th.number())
                        .bind(i64::try_from(i).unwrap_or(i64::MAX))
                        .bind(leaf.seq)
                        .bind(&leaf.hash)
                        .execute(&mut *tx)
                        .await?;
                    }
                    tx.commit().await?;
                    true
                }
            }};
        }
        Ok(crate::store::on_pool!(self, |p| run_in!(p)))
    }

    /// Signs and stores a checkpoint over every chain's head. With a `policy`, only when it is
    /// due (enough records unsigned across chains, or the oldest unsigned one old enough);
    /// without, always — unless nothing moved since the newest checkpoint (then that one is
    /// returned). `None` when there are no records or nothing is due.
    ///
    /// # Errors
    /// The newest stored checkpoint is not this signer's, or covers a chain further than its
    /// head now is (the tail was cut): run `countersign audit verify`.
    pub async fn checkpoint_audit(
        &self,
        signer: &CheckpointSigner,
        policy: Option<super::checkpoint::CheckpointPolicy>,
    ) -> Result<Option<TreeHead>, StoreError> {
        let leaves = self.chain_heads().await?;
        if leaves.is_empty() {
            return Ok(None);
        }
        let last = self.latest_tree_head().await?;
        if let Some(last) = &last {
            let keys = [*signer.public_key().key()];
            if last.note.verify(&keys).is_err() {
                return Err(StoreError::Conflict(format!(
                    "the newest stored checkpoint ({}) is not this key's signature; run \
                     `countersign audit verify`",
                    last.number()
                )));
            }
            for old in &last.leaves {
                if !leaves
                    .iter()
                    .any(|l| l.chain == old.chain && l.seq >= old.seq)
                {
                    return Err(StoreError::Conflict(format!(
                        "checkpoint {} covers chain {} up to record {}, which it no longer \
                         reaches: run `countersign audit verify`",
                        last.number(),
                        old.chain,
                        old.seq
                    )));
                }
            }
            if last.leaves == leaves {
                return Ok(if policy.is_some() {
                    None
                } else {
                    Some(last.clone())
                });
            }
        }
        let now = self.clock().now_ms();
        if let Some(policy) = policy
            && !self
                .checkpoint_due(last.as_ref(), &leaves, policy, now)
                .await?
        {
            return Ok(None);
        }
        let body = CheckpointBody {
            origin: signer.origin(),
            size: u64::try_from(leaves.len()).unwrap_or(u64::MAX),
            root: merkle::root(&leaf_hashes(&leaves)?),
            number: last.as_ref().map_or(1, |l| l.number() + 1),
            at: now,
            prev: last.as_ref().map_or([0; 32], |l| l.note.body.hash()),
        };
        let th = TreeHead {
            note: signer.sign_note(body),
            public_key: signer.public_key().to_string(),
            leaves,
        };
        if self.insert_tree_head(&th).await? {
            return Ok(Some(th));
        }
        // Another replica signed this number first: theirs stands (verify checks it).
        self.latest_tree_head().await
    }

    /// Whether a checkpoint is due: `policy.every` records unsigned across chains, or the
    /// oldest unsigned record `policy.max_age_ms` old.
    async fn checkpoint_due(
        &self,
        last: Option<&TreeHead>,
        leaves: &[Leaf],
        policy: super::checkpoint::CheckpointPolicy,
        now: i64,
    ) -> Result<bool, StoreError> {
        let signed = |chain: &str| {
            last.and_then(|l| l.leaves.iter().find(|x| x.chain == chain))
                .map_or(0, |x| x.seq)
        };
        let unsigned: i64 = leaves
            .iter()
            .map(|l| (l.seq - signed(&l.chain)).max(0))
            .sum();
        if unsigned >= policy.every {
            return Ok(true);
        }
        // The oldest first unsigned record of the chains that moved: one query per 250 chains
        // (the checkpointer asks every second).
        let moved: Vec<(&str, i64)> = leaves
            .iter()
            .filter(|l| l.seq > signed(&l.chain))
            .map(|l| (l.chain.as_str(), signed(&l.chain) + 1))
            .collect();
        // One whole-key look-up per chain, joined by UNION ALL, so that every plan reaches each
        // record by the key: ORs of keys can be planned generically (Postgres keeps such a plan
        // for the session) as a scan of the whole log, every second. 250 arms a query: SQLite
        // allows 500 in one compound SELECT.
        for part in moved.chunks(250) {
            let arms: Vec<String> = (0..part.len())
                .map(|i| {
                    format!(
                        "SELECT at FROM audit WHERE chain = ${} AND seq = ${}",
                        2 * i + 1,
                        2 * i + 2
                    )
                })
                .collect();
            let sql = format!(
                "SELECT MIN(at) FROM ({}) AS firsts",
                arms.join(" UNION ALL ")
            );
            let oldest: Option<i64> = crate::store::on_pool!(self, |p| {
                let mut q = sqlx::query_scalar(&sql);
                for (chain, seq) in part {
                    q = q.bind(*chain).bind(*seq);
                }
                q.fetch_one(p).await?
            });
            if oldest.is_some_and(|at| now - at >= policy.max_age_ms) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// The checkpoint note an export carries, its signature checked under `trusted` (or, when none
/// are given, the key the export names).
fn export_note(
    text: &str,
    public_key: &str,
    trusted: &[PublicKey],
) -> Result<CheckpointNote, VerifyFailure> {
    let note = CheckpointNote::parse(text)
        .map_err(|e| log_failure(0, format!("the export's checkpoint: {e}")))?;
    let n = note.body.number;
    let keys = keys_for(public_key, trusted).map_err(|e| log_failure(n, e))?;
    note.verify(&keys)
        .map_err(|e| log_failure(n, format!("the export's checkpoint: {e}")))?;
    Ok(note)
}

/// What a tenant's export opens with: the newest checkpoint that covers its chain, and the
/// inclusion proof of its chain's leaf — enough for its auditor to check, with nothing but the
/// export and the public key, that the signed checkpoint covers exactly this chain up to
/// `leaf.seq`, without seeing any other chain.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InclusionProof {
    /// The checkpoint note, as signed.
    pub checkpoint: String,
    /// The signer's public key, hex, as stored (trust it only if it is the one you hold).
    pub public_key: String,
    /// The chain's head the checkpoint covers.
    pub leaf: Leaf,
    /// Its index among the checkpoint's leaves.
    pub index: u64,
    /// The audit path, base64.
    pub proof: Vec<String>,
}

impl InclusionProof {
    /// The proof of chain `chain`'s leaf in `th`; `None` when `th` does not cover it.
    ///
    /// # Errors
    /// See [`Leaf::data`].
    pub fn of(th: &TreeHead, chain: &str) -> Result<Option<Self>, StoreError> {
        use base64::Engine;
        let Some((index, leaf, proof)) = th.proof_for(chain)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            checkpoint: th.note.text.clone(),
            public_key: th.public_key.clone(),
            leaf,
            index: u64::try_from(index).unwrap_or(u64::MAX),
            proof: proof
                .iter()
                .map(|h| base64::engine::general_purpose::STANDARD.encode(h))
                .collect(),
        }))
    }

    /// Checks the note's signature (under `trusted`, or when none are given, the key the
    /// proof names) and that the proof puts the leaf in the signed tree; returns the note.
    ///
    /// # Errors
    /// The first thing wrong, as a [`VerifyFailure::Log`].
    pub fn verify(&self, trusted: &[PublicKey]) -> Result<CheckpointNote, VerifyFailure> {
        use base64::Engine;
        let note = export_note(&self.checkpoint, &self.public_key, trusted)?;
        let n = note.body.number;
        let proof: Option<Vec<Hash>> = self
            .proof
            .iter()
            .map(|p| {
                base64::engine::general_purpose::STANDARD
                    .decode(p)
                    .ok()
                    .and_then(|b| Hash::try_from(b.as_slice()).ok())
            })
            .collect();
        let leaf = self
            .leaf
            .hash()
            .map_err(|e| log_failure(n, e.to_string()))?;
        let included = proof.is_some_and(|proof| {
            merkle::verify_inclusion(self.index, note.body.size, &leaf, &proof, &note.body.root)
        });
        if !included {
            return Err(log_failure(
                n,
                format!(
                    "the inclusion proof of chain {}'s head (record {}) does not lead to the \
                     signed root",
                    self.leaf.chain, self.leaf.seq
                ),
            ));
        }
        Ok(note)
    }
}

/// What a whole export opens with: the newest checkpoint and every leaf it covers, so that an
/// auditor holding the public key checks each chain of the export against it offline, and
/// notices a chain missing from the export.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointLeaves {
    /// The checkpoint note, as signed.
    pub checkpoint: String,
    /// The signer's public key, hex, as stored (trust it only if it is the one you hold).
    pub public_key: String,
    /// Every chain head it covers, in tree order.
    pub leaves: Vec<Leaf>,
}

impl CheckpointLeaves {
    /// The header of a whole export under `th`.
    pub fn of(th: &TreeHead) -> Self {
        Self {
            checkpoint: th.note.text.clone(),
            public_key: th.public_key.clone(),
            leaves: th.leaves.clone(),
        }
    }

    /// Checks the note's signature (under `trusted`, or when none are given, the key it names)
    /// and that the leaves, in order and each chain once, hash to the signed root; returns the
    /// note.
    ///
    /// # Errors
    /// The first thing wrong, as a [`VerifyFailure::Log`].
    pub fn verify(&self, trusted: &[PublicKey]) -> Result<CheckpointNote, VerifyFailure> {
        let note = export_note(&self.checkpoint, &self.public_key, trusted)?;
        let n = note.body.number;
        let sorted = self.leaves.windows(2).all(|w| w[0].chain < w[1].chain);
        let hashes = leaf_hashes(&self.leaves).map_err(|e| log_failure(n, e.to_string()))?;
        if !sorted
            || u64::try_from(hashes.len()).ok() != Some(note.body.size)
            || merkle::root(&hashes) != note.body.root
        {
            return Err(log_failure(
                n,
                "the export's chain heads do not hash to the signed root",
            ));
        }
        Ok(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(chain: &str, seq: i64) -> Leaf {
        Leaf {
            chain: chain.into(),
            seq,
            hash: format!("sha256:{chain}{seq}"),
        }
    }

    /// A log of checkpoints over `sets` of leaves, each linked to the one before.
    fn log(signer: &CheckpointSigner, sets: &[Vec<Leaf>]) -> Vec<TreeHead> {
        let mut out: Vec<TreeHead> = Vec::new();
        for (i, leaves) in sets.iter().enumerate() {
            let body = CheckpointBody {
                origin: signer.origin(),
                size: leaves.len() as u64,
                root: merkle::root(&leaf_hashes(leaves).unwrap()),
                number: i as i64 + 1,
                at: 1_000 + i as i64,
                prev: out.last().map_or([0; 32], |p| p.note.body.hash()),
            };
            out.push(TreeHead {
                note: signer.sign_note(body),
                public_key: signer.public_key().to_string(),
                leaves: leaves.clone(),
            });
        }
        out
    }

    fn refused(heads: &[TreeHead], signer: &CheckpointSigner) -> (i64, String) {
        match check_log(heads, &[], &[signer.public_key()]) {
            Err(VerifyFailure::Log { number, reason }) => (number, reason),
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn a_sound_log_becomes_expectations_on_every_chain() {
        let s = CheckpointSigner::from_seed(&[3; 32]);
        let heads = log(&s, &[vec![leaf("a", 2)], vec![leaf("a", 5), leaf("b", 1)]]);
        let expect = check_log(&heads, &[], &[s.public_key()]).unwrap();
        assert_eq!(expect["a"].len(), 2);
        assert_eq!(expect["b"][0].0, 1);
    }

    #[test]
    fn a_chain_that_shrinks_or_disappears_between_checkpoints_is_named() {
        let s = CheckpointSigner::from_seed(&[3; 32]);
        let back = log(&s, &[vec![leaf("a", 5)], vec![leaf("a", 4)]]);
        let (n, why) = refused(&back, &s);
        assert_eq!(n, 2);
        assert!(
            why.contains("chain a") && why.contains("truncated"),
            "{why}"
        );
        let gone = log(&s, &[vec![leaf("a", 5), leaf("b", 1)], vec![leaf("a", 6)]]);
        let (n, why) = refused(&gone, &s);
        assert_eq!(n, 2);
        assert!(why.contains("chain b") && why.contains("dropped"), "{why}");
    }

    #[test]
    fn a_gap_a_broken_link_or_leaves_off_the_root_are_refused() {
        let s = CheckpointSigner::from_seed(&[3; 32]);
        let sets = [vec![leaf("a", 1)], vec![leaf("a", 2)], vec![leaf("a", 3)]];
        let heads = log(&s, &sets);
        let mut gap = heads.clone();
        gap.remove(1);
        assert_eq!(refused(&gap, &s).0, 2, "number 2 is missing");
        // Checkpoint 2 re-signed (by the same key) over another predecessor.
        let mut relinked = heads.clone();
        let mut body = relinked[1].note.body.clone();
        body.prev = [1; 32];
        relinked[1].note = s.sign_note(body);
        let (n, why) = refused(&relinked, &s);
        assert_eq!(n, 2);
        assert!(why.contains("rewritten"), "{why}");
        // Stored leaves changed under a signed root.
        let mut moved = heads.clone();
        moved[2].leaves[0].seq = 9;
        let (n, why) = refused(&moved, &s);
        assert_eq!(n, 3);
        assert!(why.contains("root"), "{why}");
        // Another key's log.
        let other = CheckpointSigner::from_seed(&[4; 32]);
        assert_eq!(refused(&heads, &other).0, 1);
    }
}
