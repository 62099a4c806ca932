//! Signed checkpoints in the C2SP `tlog-checkpoint` form, inside a C2SP `signed-note`:
//!
//! ```text
//! <origin>
//! <size>
//! <root hash, base64>
//! countersign <number> <at ms> <previous checkpoint's hash, base64>
//!
//! — <origin> <base64(key id ‖ Ed25519 signature)>
//! ```
//!
//! The size is the number of leaves (chain heads), the root their RFC 6962 Merkle tree hash
//! ([`super::merkle`]). The extension line makes checkpoints a log of their own: each names
//! its number (1, 2, …) and the SHA-256 of the previous checkpoint's signed text (32 zero
//! bytes for the first), so a checkpoint removed, replaced or rolled back breaks the links.
//!
//! INVARIANTS (fail closed):
//! * The signature covers exactly the note's text (every line above the blank line, each
//!   ending in a newline); a note is accepted only with a signature line whose key name is
//!   the origin, whose key id is that of a trusted key, and whose Ed25519 signature verifies
//!   strictly (RFC 8032) under it.
//! * [`CheckpointNote::parse`] accepts only the exact shape written by
//!   [`CheckpointNote::sign`]: decimal numbers without leading zeros, standard padded base64,
//!   32-byte hashes; anything else is refused, never repaired.

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::merkle::Hash;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The signature algorithm byte of Ed25519 in C2SP signed-note key ids.
const ED25519: u8 = 0x01;

/// The extension line's first word.
const EXTENSION: &str = "countersign";

/// What a checkpoint says (its signed text), without the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointBody {
    /// The log's name (also the signing key's name).
    pub origin: String,
    /// How many chain heads the tree holds.
    pub size: u64,
    /// Their Merkle tree hash.
    pub root: Hash,
    /// This checkpoint's place in the log of checkpoints, from 1.
    pub number: i64,
    /// When it was signed, Unix ms.
    pub at: i64,
    /// SHA-256 of the previous checkpoint's text (zeros for the first).
    pub prev: Hash,
}

/// A signed checkpoint: its text and signature lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointNote {
    /// What it says.
    pub body: CheckpointBody,
    /// The whole note as written (text, blank line, signature lines).
    pub text: String,
}

/// Why a checkpoint note is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    /// Not in the form written here.
    #[error("malformed checkpoint note: {0}")]
    Malformed(String),
    /// No signature by a trusted key.
    #[error("no signature by a trusted key")]
    Untrusted,
    /// A signature line with a trusted key's id does not verify.
    #[error("the signature does not verify: forged or altered")]
    BadSignature,
}

/// The key id of `key` named `name` (C2SP signed-note: the first 4 bytes of SHA-256(name ‖
/// "\n" ‖ 0x01 ‖ public key)).
pub fn key_id(name: &str, key: &VerifyingKey) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([ED25519]);
    h.update(key.as_bytes());
    let d = h.finalize();
    [d[0], d[1], d[2], d[3]]
}

/// The origin a key's checkpoints carry: `countersign/audit/` + 16 hex digits of SHA-256 of
/// the public key, so two deployments' logs never share a name.
pub fn origin_for(key: &VerifyingKey) -> String {
    let d = Sha256::digest(key.as_bytes());
    format!("countersign/audit/{}", crate::keys::hex(&d[..8]))
}

impl CheckpointBody {
    /// The signed text.
    pub fn text(&self) -> String {
        format!(
            "{}\n{}\n{}\n{EXTENSION} {} {} {}\n",
            self.origin,
            self.size,
            B64.encode(self.root),
            self.number,
            self.at,
            B64.encode(self.prev)
        )
    }

    /// SHA-256 of the signed text: what the next checkpoint names as its `prev`.
    pub fn hash(&self) -> Hash {
        Sha256::digest(self.text().as_bytes()).into()
    }
}

impl CheckpointNote {
    /// Signs `body` with `key` (its origin names the key).
    pub fn sign(body: CheckpointBody, key: &SigningKey) -> Self {
        let text = body.text();
        let sig = key.sign(text.as_bytes());
        let mut blob = key_id(&body.origin, &key.verifying_key()).to_vec();
        blob.extend_from_slice(&sig.to_bytes());
        let text = format!("{text}\n\u{2014} {} {}\n", body.origin, B64.encode(blob));
        Self { body, text }
    }

    /// Reads a note (the shape [`CheckpointNote::sign`] writes) without checking signatures.
    ///
    /// # Errors
    /// [`NoteError::Malformed`].
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let bad = |why: &str| NoteError::Malformed(why.to_string());
        let (signed, sigs) = text
            .split_once("\n\n")
            .ok_or_else(|| bad("no blank line before the signatures"))?;
        if sigs.is_empty() || !sigs.ends_with('\n') {
            return Err(bad("no signature line"));
        }
        let lines: Vec<&str> = signed.split('\n').collect();
        let [origin, size, root, ext] = lines.as_slice() else {
            return Err(bad(
                "expected four lines: origin, size, root hash, extension",
            ));
        };
        if origin.is_empty() || origin.contains(char::is_whitespace) {
            return Err(bad("origin"));
        }
        let words: Vec<&str> = ext.split(' ').collect();
        let [EXTENSION, number, at, prev] = words.as_slice() else {
            return Err(bad("extension line"));
        };
        let body = CheckpointBody {
            origin: (*origin).to_string(),
            size: decimal(size).ok_or_else(|| bad("size"))?,
            root: hash32(root).ok_or_else(|| bad("root hash"))?,
            number: decimal(number)
                .and_then(|n| i64::try_from(n).ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad("number"))?,
            at: decimal(at)
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| bad("time"))?,
            prev: hash32(prev).ok_or_else(|| bad("previous hash"))?,
        };
        if format!("{signed}\n") != body.text() {
            return Err(bad("not in canonical form"));
        }
        Ok(Self {
            body,
            text: text.to_string(),
        })
    }

    /// Checks that one of `trusted` signed the note under its origin.
    ///
    /// # Errors
    /// [`NoteError`].
    pub fn verify(&self, trusted: &[VerifyingKey]) -> Result<(), NoteError> {
        let signed = self.body.text();
        let Some((_, sigs)) = self.text.split_once("\n\n") else {
            return Err(NoteError::Malformed("no signatures".into()));
        };
        for line in sigs.lines() {
            let Some(rest) = line.strip_prefix("\u{2014} ") else {
                return Err(NoteError::Malformed("signature line".into()));
            };
            let Some((name, blob)) = rest.rsplit_once(' ') else {
                return Err(NoteError::Malformed("signature line".into()));
            };
            if name != self.body.origin {
                continue;
            }
            let Ok(blob) = B64.decode(blob) else {
                return Err(NoteError::Malformed("signature encoding".into()));
            };
            let Some((id, sig)) = blob.split_first_chunk::<4>() else {
                return Err(NoteError::Malformed("signature length".into()));
            };
            for key in trusted {
                if key_id(name, key) != *id {
                    continue;
                }
                let sig = <[u8; 64]>::try_from(sig).map_err(|_| NoteError::BadSignature)?;
                key.verify_strict(signed.as_bytes(), &Signature::from_bytes(&sig))
                    .map_err(|_| NoteError::BadSignature)?;
                return Ok(());
            }
        }
        Err(NoteError::Untrusted)
    }
}

/// A decimal number as written by `format!`: digits, no sign, no leading zero.
fn decimal(text: &str) -> Option<u64> {
    let ok = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    ok.then(|| text.parse().ok()).flatten()
}

/// 32 bytes in standard padded base64, exactly as written.
fn hash32(text: &str) -> Option<Hash> {
    let bytes = B64.decode(text).ok()?;
    let h = Hash::try_from(bytes.as_slice()).ok()?;
    (B64.encode(h) == text).then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(key: &SigningKey) -> CheckpointBody {
        CheckpointBody {
            origin: origin_for(&key.verifying_key()),
            size: 3,
            root: [7; 32],
            number: 2,
            at: 1_700_000_000_000,
            prev: [9; 32],
        }
    }

    #[test]
    fn a_signed_note_reads_back_and_verifies_only_under_its_key() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let other = SigningKey::from_bytes(&[2; 32]);
        let note = CheckpointNote::sign(body(&key), &key);
        let read = CheckpointNote::parse(&note.text).unwrap();
        assert_eq!(read, note);
        read.verify(&[key.verifying_key()]).unwrap();
        assert_eq!(
            read.verify(&[other.verifying_key()]),
            Err(NoteError::Untrusted)
        );
        assert!(note.text.starts_with("countersign/audit/"));
        assert!(note.text.contains("\n\n\u{2014} countersign/audit/"));
    }

    #[test]
    fn any_changed_byte_is_refused() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let note = CheckpointNote::sign(body(&key), &key);
        let trusted = [key.verifying_key()];
        for i in 0..note.text.len() {
            let mut bytes = note.text.clone().into_bytes();
            bytes[i] ^= 0x01;
            let Ok(text) = String::from_utf8(bytes) else {
                continue;
            };
            let verdict = CheckpointNote::parse(&text).and_then(|n| n.verify(&trusted));
            assert!(verdict.is_err(), "byte {i} changed yet accepted:\n{text}");
        }
    }
}
