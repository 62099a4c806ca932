//! The signing key of checkpoints, and the checkpoints of the legacy chain: an Ed25519
//! signature over the single chain's head `{seq, hash, at}`, stored in `audit_checkpoints` by
//! releases before chains per tenant (schema < 16) and exportable as a JSON file. They keep
//! pinning the [`super::LEGACY_CHAIN`]; new checkpoints cover every chain
//! ([`super::tree_head`]). Verification of the whole store ([`Store::verify_audit_full`]) is
//! here too.
//!
//! The hash chain alone shows that records were changed in place, but someone able to write
//! the table could rewrite a record and re-hash everything after it, or cut the tail off. A
//! checkpoint pins the hash the chain had at `seq`, signed with a key the database does not
//! hold; an exported checkpoint kept elsewhere pins it even if the table of checkpoints is
//! lost too.
//!
//! INVARIANTS (fail closed):
//! - the signed message is the RFC 8785 canonical JSON of
//!   `{"at":AT,"hash":HASH,"seq":SEQ,"type":"countersign.audit.checkpoint.v1"}`; the domain
//!   tag keeps the signature from being valid for anything else;
//! - [`Checkpoint::check`] accepts a checkpoint only if its key is one of the trusted keys
//!   (when any are given), its signature verifies under that key (strict RFC 8032
//!   verification) and its hash is well-formed; anything else is an error, never a warning;
//! - the signing seed is held in a [`Secret`] and never formatted; only the public key is
//!   shown or stored;
//! - this module only ever INSERTs checkpoints (the table refuses UPDATE and DELETE, and on
//!   Postgres TRUNCATE, like `audit`).

use std::fmt;

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{ChainBreak, ChainVerifier};
use crate::canonical::canonicalize;
use crate::keys::hex;
use crate::secret::Secret;
use crate::store::{Store, StoreError};

/// Domain-separation tag inside every signed checkpoint message.
pub const CHECKPOINT_DOMAIN: &str = "countersign.audit.checkpoint.v1";

/// A key's text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected 32 bytes written as 64 hex digits or as base64 ({0})")]
pub struct KeyTextError(String);

/// Reads 32 bytes from 64 hex digits or base64 (standard or URL-safe, padded or not).
///
/// # Errors
/// [`KeyTextError`] for anything else.
pub fn parse_key_bytes(text: &str) -> Result<[u8; 32], KeyTextError> {
    let text = text.trim();
    let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        decode_hex(text).ok_or_else(|| KeyTextError("bad hex".into()))?
    } else {
        let engines = [
            base64::engine::general_purpose::STANDARD,
            base64::engine::general_purpose::STANDARD_NO_PAD,
            base64::engine::general_purpose::URL_SAFE,
            base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ];
        engines
            .iter()
            .find_map(|e| e.decode(text).ok())
            .ok_or_else(|| {
                KeyTextError(format!("{} characters, neither hex nor base64", text.len()))
            })?
    };
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| KeyTextError(format!("decodes to {} bytes", bytes.len())))
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let nibble = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// An Ed25519 public key, shown as 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// Parses 32 bytes (hex or base64) as a public key.
    ///
    /// # Errors
    /// Not 32 bytes, or not a point on the curve.
    pub fn parse(text: &str) -> Result<Self, KeyTextError> {
        let bytes = parse_key_bytes(text)?;
        VerifyingKey::from_bytes(&bytes)
            .map(Self)
            .map_err(|_| KeyTextError("not an Ed25519 public key".into()))
    }

    /// The key itself.
    pub fn key(&self) -> &VerifyingKey {
        &self.0
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(self.0.as_bytes()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// The key checkpoints are signed with (from config `audit_signing_key`).
#[derive(Clone)]
pub struct CheckpointSigner {
    key: Secret<SigningKey>,
    public: PublicKey,
}

impl fmt::Debug for CheckpointSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointSigner")
            .field("public_key", &self.public)
            .finish_non_exhaustive()
    }
}

impl CheckpointSigner {
    /// The signer for a 32-byte seed.
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        let key = SigningKey::from_bytes(seed);
        let public = PublicKey(key.verifying_key());
        Self {
            key: Secret::new(key),
            public,
        }
    }

    /// Reads a seed written as 64 hex digits or base64.
    ///
    /// # Errors
    /// [`KeyTextError`]; the message never contains the text.
    pub fn parse(text: &str) -> Result<Self, KeyTextError> {
        parse_key_bytes(text).map(|seed| Self::from_seed(&seed))
    }

    /// The public key that verifies this signer's checkpoints.
    pub fn public_key(&self) -> PublicKey {
        self.public
    }

    /// The origin (log and key name) of this signer's checkpoint notes.
    pub fn origin(&self) -> String {
        super::note::origin_for(&self.public.0)
    }

    /// Signs a checkpoint note over every chain ([`super::tree_head`]).
    pub fn sign_note(&self, body: super::note::CheckpointBody) -> super::note::CheckpointNote {
        super::note::CheckpointNote::sign(body, self.key.expose())
    }

    /// Signs the chain head `seq`/`hash` at time `at` (Unix ms).
    ///
    /// # Errors
    /// Never for a well-formed hash (the message is plain strings and integers); the
    /// `Result` keeps canonicalisation failures from being swallowed.
    pub fn sign(&self, seq: i64, hash: &str, at: i64) -> Result<Checkpoint, StoreError> {
        let message = Checkpoint::message(seq, hash, at)?;
        let signature = self.key.expose().sign(message.as_bytes());
        Ok(Checkpoint {
            seq,
            hash: hash.to_string(),
            at,
            public_key: self.public.to_string(),
            signature: hex(&signature.to_bytes()),
        })
    }
}

/// A signed checkpoint, as stored and as exported (`audit checkpoint --out FILE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// The chain head's `seq`.
    pub seq: i64,
    /// Its hash, `sha256:<hex>`.
    pub hash: String,
    /// When it was signed, Unix ms.
    pub at: i64,
    /// The signer's public key, hex.
    pub public_key: String,
    /// Ed25519 signature over [`Checkpoint::message`], hex.
    pub signature: String,
}

/// Why a checkpoint is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// A field does not parse.
    #[error("malformed checkpoint: {0}")]
    Malformed(String),
    /// Signed by a key that is not trusted.
    #[error("signed by key {0}, which is not a trusted key")]
    UntrustedKey(String),
    /// The signature does not verify.
    #[error("the signature does not verify: forged or altered")]
    BadSignature,
}

impl Checkpoint {
    /// The exact text that is signed.
    ///
    /// # Errors
    /// Never in practice (see [`CheckpointSigner::sign`]).
    pub fn message(seq: i64, hash: &str, at: i64) -> Result<String, StoreError> {
        canonicalize(&json!({"type": CHECKPOINT_DOMAIN, "seq": seq, "hash": hash, "at": at}))
            .map_err(|e| StoreError::Conflict(format!("checkpoint message: {e}")))
    }

    /// Checks the signature; when `trusted` is not empty the key must be one of them.
    ///
    /// # Errors
    /// [`CheckpointError`].
    pub fn check(&self, trusted: &[PublicKey]) -> Result<(), CheckpointError> {
        let well_formed_hash = self.hash.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
        if !well_formed_hash || self.seq < 1 {
            return Err(CheckpointError::Malformed("seq or hash".into()));
        }
        let key = PublicKey::parse(&self.public_key)
            .map_err(|e| CheckpointError::Malformed(format!("public_key: {e}")))?;
        if !trusted.is_empty() && !trusted.contains(&key) {
            return Err(CheckpointError::UntrustedKey(key.to_string()));
        }
        let sig_bytes = decode_hex(&self.signature)
            .and_then(|b| <[u8; 64]>::try_from(b.as_slice()).ok())
            .ok_or_else(|| {
                CheckpointError::Malformed("signature: expected 128 hex digits".into())
            })?;
        let message = Self::message(self.seq, &self.hash, self.at)
            .map_err(|e| CheckpointError::Malformed(e.to_string()))?;
        key.0
            .verify_strict(message.as_bytes(), &Signature::from_bytes(&sig_bytes))
            .map_err(|_| CheckpointError::BadSignature)
    }
}

/// A failed verification: a broken chain, or a checkpoint that is not to be believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyFailure {
    /// The chain is broken (or does not match a checkpoint) at a record.
    #[error(transparent)]
    Chain(#[from] ChainBreak),
    /// The log of checkpoints over every chain is broken at a checkpoint.
    #[error("checkpoint {number} refused: {reason}")]
    Log {
        /// The checkpoint's number.
        number: i64,
        /// What is wrong.
        reason: String,
    },
    /// A legacy checkpoint was refused.
    #[error("checkpoint for record {seq} ({origin}) refused: {error}")]
    Checkpoint {
        /// Its `seq`.
        seq: i64,
        /// Where it came from.
        origin: String,
        /// Why.
        error: CheckpointError,
    },
}

/// Checks each checkpoint's signature against `trusted` and registers its hash with `v`.
///
/// # Errors
/// The first refused checkpoint, or one that contradicts the `prev` `v` starts from.
pub fn expect_checkpoints<'a>(
    v: &mut ChainVerifier,
    checkpoints: impl IntoIterator<Item = (&'a Checkpoint, String)>,
    trusted: &[PublicKey],
) -> Result<usize, VerifyFailure> {
    let mut n = 0;
    for (cp, source) in checkpoints {
        cp.check(trusted)
            .map_err(|error| VerifyFailure::Checkpoint {
                seq: cp.seq,
                origin: source.clone(),
                error,
            })?;
        v.expect(cp.seq, &cp.hash, source)?;
        n += 1;
    }
    Ok(n)
}

/// When the background task signs a new checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Sign once this many records are unsigned.
    pub every: i64,
    /// Sign once the oldest unsigned record is this old (ms).
    pub max_age_ms: i64,
}

/// What a full verification covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyReport {
    /// Records verified.
    pub records: i64,
    /// Chains verified.
    pub chains: usize,
    /// Checkpoints whose signatures verified and whose hashes were required.
    pub checkpoints: usize,
    /// Checkpoints that could not be compared (outside the records verified).
    pub skipped: usize,
}

const CP_COLUMNS: &str = "seq, hash, at, public_key, signature";

impl Store {
    /// Every stored legacy checkpoint (of the [`super::LEGACY_CHAIN`]), by `seq`.
    pub async fn audit_checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError> {
        let sql = format!("SELECT {CP_COLUMNS} FROM audit_checkpoints ORDER BY seq");
        let rows: Vec<Checkpoint> =
            crate::store::on_pool!(self, |p| { sqlx::query_as(&sql).fetch_all(p).await? });
        Ok(rows)
    }

    /// The newest stored checkpoint at or below `seq` (any, without `seq`).
    pub async fn audit_checkpoint_at_or_before(
        &self,
        seq: Option<i64>,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let sql = format!(
            "SELECT {CP_COLUMNS} FROM audit_checkpoints WHERE seq <= $1 ORDER BY seq DESC LIMIT 1"
        );
        let row: Option<Checkpoint> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(seq.unwrap_or(i64::MAX))
                .fetch_optional(p)
                .await?
        });
        Ok(row)
    }

    /// Stores a checkpoint; `false` when one for that `seq` already exists (left as it is).
    pub async fn insert_audit_checkpoint(&self, cp: &Checkpoint) -> Result<bool, StoreError> {
        let n = crate::store::on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO audit_checkpoints (seq, hash, at, public_key, signature)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (seq) DO NOTHING",
            )
            .bind(cp.seq)
            .bind(&cp.hash)
            .bind(cp.at)
            .bind(&cp.public_key)
            .bind(&cp.signature)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(n == 1)
    }
}
