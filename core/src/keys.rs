//! Content hashes and idempotency keys: [`InputsHash`] and [`IdemKey`].
//!
//! Owns how a step's inputs become the two digests everything else binds to: approvals bind
//! to the [`InputsHash`] (a changed cent invalidates them), and every call to a target system
//! carries the [`IdemKey`] (two attempts at one step share it, a re-planned step with other
//! inputs gets another).
//!
//! INVARIANTS:
//! - Both are computed only from [`CanonicalJson`], never from raw client text, so spelling
//!   differences (member order, `1.0` vs `1`) cannot change them and a client cannot vary them.
//! - [`IdemKey`] is a pure function of `(run id, step seq, canonical inputs)`; there is no
//!   constructor taking a client-supplied key. Its framing is unambiguous: a domain-separation
//!   tag, then the run id as a u64 big-endian byte length followed by its bytes, then the seq
//!   as a fixed 8-byte big-endian integer, then the inputs as a u64 big-endian byte length
//!   followed by their bytes. No two distinct triples produce the same byte string.
//! - A read's key ([`IdemKey::for_read`]) is the same function of `(step id, 0, inputs)`:
//!   a read has no effect for a key to guard, and positions start at 1, so a read's key never
//!   equals a write's.
//! - Parsing is strict (exact prefix, exactly 64 lower-case hex digits) so one key has exactly
//!   one spelling and can be compared as text.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::canonical::CanonicalJson;

/// Domain-separation tag hashed before an idempotency key's fields. Changing the framing
/// means changing this tag.
pub const IDEM_KEY_DOMAIN: &[u8] = b"countersign.idem-key.v1\0";

const INPUTS_HASH_PREFIX: &str = "sha256:";
const IDEM_KEY_PREFIX: &str = "idem:";

/// Why a digest's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestParseError {
    /// The text does not start with the expected prefix.
    #[error("expected the prefix `{0}`")]
    Prefix(&'static str),
    /// The hex part is not 64 characters.
    #[error("expected 64 hex digits, got {0} characters")]
    Length(usize),
    /// The hex part holds something other than lower-case hex digits.
    #[error("expected lower-case hex digits only")]
    NotHex,
}

/// SHA-256 of a step's canonical inputs, displayed `sha256:<64 lower-case hex>`.
///
/// This is a plain content hash (no tag), so anyone holding the canonical inputs can
/// recompute it with standard tools.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InputsHash([u8; 32]);

impl InputsHash {
    /// Hashes canonical inputs.
    pub fn of(inputs: &CanonicalJson) -> Self {
        Self(Sha256::digest(inputs.as_bytes()).into())
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// A step's idempotency key, displayed `idem:<64 lower-case hex>`.
///
/// `sha256(tag ‖ len(run_id) ‖ run_id ‖ seq ‖ len(inputs) ‖ inputs)`, lengths and seq as
/// u64 big-endian (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdemKey([u8; 32]);

impl IdemKey {
    /// Derives the key of step `seq` of run `run_id` with these canonical inputs.
    pub fn derive(run_id: &str, seq: u64, inputs: &CanonicalJson) -> Self {
        let mut h = Sha256::new();
        h.update(IDEM_KEY_DOMAIN);
        update_framed(&mut h, run_id.as_bytes());
        h.update(seq.to_be_bytes());
        update_framed(&mut h, inputs.as_bytes());
        Self(h.finalize().into())
    }

    /// The key of read step `step_id` (see the module invariants): unique per step, known
    /// before the step has a position.
    pub fn for_read(step_id: &str, inputs: &CanonicalJson) -> Self {
        Self::derive(step_id, 0, inputs)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn update_framed(h: &mut Sha256, field: &[u8]) {
    // usize → u64 never truncates on the platforms Rust supports (usize ≤ 64 bits).
    h.update((field.len() as u64).to_be_bytes());
    h.update(field);
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

fn parse_digest(text: &str, prefix: &'static str) -> Result<[u8; 32], DigestParseError> {
    let hex_part = text
        .strip_prefix(prefix)
        .ok_or(DigestParseError::Prefix(prefix))?;
    if hex_part.len() != 64 {
        return Err(DigestParseError::Length(hex_part.len()));
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(hex_part.as_bytes().chunks_exact(2)) {
        let (Some(hi), Some(lo)) = (nibble(pair[0]), nibble(pair[1])) else {
            return Err(DigestParseError::NotHex);
        };
        *slot = (hi << 4) | lo;
    }
    Ok(out)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

macro_rules! digest_text {
    ($ty:ident, $prefix:expr) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($prefix)?;
                f.write_str(&hex(&self.0))
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($ty), self)
            }
        }

        impl FromStr for $ty {
            type Err = DigestParseError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                parse_digest(s, $prefix).map(Self)
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

digest_text!(InputsHash, INPUTS_HASH_PREFIX);
digest_text!(IdemKey, IDEM_KEY_PREFIX);
