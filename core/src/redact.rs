//! Redaction of JSON values: what the audit trail stores, and what a role that must not see a
//! field gets back.
//!
//! A tool's registry entry names fields and how to hide them ([`RedactRule`]): `hash` replaces
//! the value with `hmac-sha256:<64 hex>`, a keyed HMAC-SHA256 over the value's RFC 8785
//! canonical JSON (so equal values still compare equal across records, and nobody without
//! the key can test a guess); `drop` removes the member. A rule's field is either a bare
//! member name, matched at any depth (`iban`), or a dotted path from the root (`supplier.iban`).
//! Arrays are transparent to paths: `lines.iban` reaches `lines[0].iban`, `lines[1].iban`, …;
//! the reported paths carry the indices. A member whose own name contains a dot can only be
//! reached by a bare-name rule.
//!
//! INVARIANTS (fail closed):
//! - a matched member's original value never appears in the output, whatever it holds (a
//!   matched object or array is replaced or dropped whole, not descended into);
//! - when two rules match one member, `drop` wins over `hash`;
//! - if a matched value has no canonical form the whole call fails ([`RedactError`]) rather
//!   than returning a partly redacted value;
//! - keys shorter than 32 bytes are refused; the key is only ever held in a [`Secret`], and
//!   the output names the key id so a later rotation can tell which key produced a digest.

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use sha2::Sha256;

use crate::Secret;
use crate::canonical::{CanonicalError, canonicalize};
use crate::keys::hex;

/// The prefix of a hashed value.
pub const HASH_PREFIX: &str = "hmac-sha256:";
/// The label [`RedactionKey::for_agents`] derives the agent-visible key under.
pub const AGENT_LABEL: &str = "countersign.shown-to-agents.v1";

/// What a key's fingerprint is the HMAC of. No redacted value is this text's canonical JSON
/// (a string's canonical form starts with a quote), so the fingerprint is never a digest.
pub const FINGERPRINT_LABEL: &[u8] = b"countersign.redaction-key.fingerprint.v1";

/// The shortest redaction key accepted, in bytes (the digest size of SHA-256).
pub const MIN_KEY_LEN: usize = 32;

/// Why redaction could not be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedactError {
    /// The key is too short to be a sound HMAC key.
    #[error("redaction key must be at least {MIN_KEY_LEN} bytes")]
    KeyTooShort,
    /// A key id is empty or holds characters other than `[A-Za-z0-9._-]`.
    #[error("invalid redaction key id `{0}`")]
    BadKeyId(String),
    /// A rule's field is empty or has an empty segment.
    #[error("invalid redaction field `{0}`")]
    BadField(String),
    /// A matched value has no canonical JSON form, so it cannot be hashed.
    #[error("cannot hash the value at `{path}`: {source}")]
    Canonical {
        /// Where the value sits.
        path: String,
        /// Why it has no canonical form.
        source: CanonicalError,
    },
}

/// The name of a redaction key, recorded next to every digest it produced.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct KeyId(String);

impl KeyId {
    /// Parses a key id: non-empty, `[A-Za-z0-9._-]` only.
    ///
    /// # Errors
    /// [`RedactError::BadKeyId`].
    pub fn parse(s: &str) -> Result<Self, RedactError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(RedactError::BadKeyId(s.to_owned()))
        }
    }

    /// The id text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for KeyId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// An HMAC key for redaction with its id.
#[derive(Debug, Clone)]
pub struct RedactionKey {
    id: KeyId,
    // The keyed HMAC state, ready to clone per digest; never formatted.
    mac: Secret<Hmac<Sha256>>,
}

impl RedactionKey {
    /// A key; refuses secrets shorter than [`MIN_KEY_LEN`].
    ///
    /// # Errors
    /// [`RedactError::KeyTooShort`].
    pub fn new(id: KeyId, secret: Secret<Vec<u8>>) -> Result<Self, RedactError> {
        if secret.expose().len() < MIN_KEY_LEN {
            return Err(RedactError::KeyTooShort);
        }
        let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.expose())
            .map_err(|_| RedactError::KeyTooShort)?;
        Ok(Self {
            id,
            mac: Secret::new(mac),
        })
    }

    /// A key named after its own [`RedactionKey::fingerprint`] (`rk-` + its first 16 hex
    /// digits), so a rotation changes the id recorded next to every digest.
    ///
    /// # Errors
    /// [`RedactError::KeyTooShort`].
    pub fn from_secret(secret: Secret<Vec<u8>>) -> Result<Self, RedactError> {
        let mut key = Self::new(KeyId(String::from("rk")), secret)?;
        let fingerprint = key.fingerprint();
        let hex_part = fingerprint.trim_start_matches(HASH_PREFIX);
        key.id = KeyId(format!("rk-{}", hex_part.get(..16).unwrap_or(hex_part)));
        Ok(key)
    }

    /// `hmac-sha256:<hex>` of the fixed label [`FINGERPRINT_LABEL`] under this key: names the
    /// key (and shows when it changed) without revealing it or any digest it makes.
    pub fn fingerprint(&self) -> String {
        let mut mac = self.mac.expose().clone();
        mac.update(FINGERPRINT_LABEL);
        format!("{HASH_PREFIX}{}", hex(&mac.finalize().into_bytes()))
    }

    /// The key's id.
    pub fn id(&self) -> &KeyId {
        &self.id
    }

    /// A key of fresh random bytes ([`MIN_KEY_LEN`] of them), for a process that has no
    /// configured key: its digests compare equal only among themselves, and nobody can test
    /// guesses against them.
    ///
    /// # Errors
    /// The operating system's random source failed (message).
    pub fn random() -> Result<Self, String> {
        let mut bytes = vec![0u8; MIN_KEY_LEN];
        getrandom::fill(&mut bytes).map_err(|e| e.to_string())?;
        Self::from_secret(Secret::new(bytes)).map_err(|e| e.to_string())
    }

    /// The key for what agents are shown of hashed values, derived from this one under its own
    /// label: the same value shows the agent a digest unrelated to the one the audit stores,
    /// and both stay stable for as long as this key is.
    ///
    /// # Errors
    /// Never for a valid key (the derived secret is 64 hex digits).
    pub fn for_agents(&self) -> Result<Self, RedactError> {
        let label = Value::String(AGENT_LABEL.to_string());
        let derived = self.digest(&label).map_err(|_| RedactError::KeyTooShort)?;
        let hex_part = derived.trim_start_matches(HASH_PREFIX).as_bytes().to_vec();
        Self::from_secret(Secret::new(hex_part))
    }

    /// `hmac-sha256:<hex>` of `value`'s canonical JSON under this key.
    ///
    /// # Errors
    /// The value has no canonical form.
    pub fn digest(&self, value: &Value) -> Result<String, CanonicalError> {
        let canonical = canonicalize(value)?;
        let mut mac = self.mac.expose().clone();
        mac.update(canonical.as_bytes());
        let tag = mac.finalize().into_bytes();
        Ok(format!("{HASH_PREFIX}{}", hex(&tag)))
    }
}

/// How a matched field is hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    /// Replace the value with its keyed digest.
    Hash,
    /// Remove the member.
    Drop,
}

/// Which members a rule matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FieldSelector {
    /// A member name, matched at any depth.
    Name(String),
    /// Member names from the root; arrays on the way are transparent.
    Path(Vec<String>),
}

impl FieldSelector {
    /// `iban` → [`FieldSelector::Name`], `supplier.iban` → [`FieldSelector::Path`].
    ///
    /// # Errors
    /// [`RedactError::BadField`] for an empty field or an empty segment.
    pub fn parse(s: &str) -> Result<Self, RedactError> {
        if s.is_empty() {
            return Err(RedactError::BadField(s.to_owned()));
        }
        if !s.contains('.') {
            return Ok(Self::Name(s.to_owned()));
        }
        let segments: Vec<String> = s.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return Err(RedactError::BadField(s.to_owned()));
        }
        Ok(Self::Path(segments))
    }

    /// Whether this selector picks the member at `key_path` (member names from the root;
    /// array indices left out).
    pub fn matches(&self, key_path: &[&str]) -> bool {
        match self {
            Self::Name(name) => key_path.last().is_some_and(|k| k == name),
            Self::Path(segments) => {
                segments.len() == key_path.len()
                    && segments.iter().zip(key_path).all(|(s, k)| s == k)
            }
        }
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Path(segments) => f.write_str(&segments.join(".")),
        }
    }
}

impl Serialize for FieldSelector {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FieldSelector {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl FromStr for FieldSelector {
    type Err = RedactError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// One redaction rule: `{field, how}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RedactRule {
    /// The member(s) it matches.
    pub field: FieldSelector,
    /// What happens to them.
    pub how: How,
}

/// One member that was redacted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RedactedPath {
    /// Where it was, e.g. `supplier.iban` or `lines[1].iban`.
    pub path: String,
    /// What was done.
    pub how: How,
}

/// A redacted value and the record of what was hidden.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Redacted {
    /// The value with matched members hashed or removed.
    pub value: Value,
    /// Every member that was hashed or removed, in document order (members sorted by name).
    pub paths: Vec<RedactedPath>,
    /// The key the digests were made with.
    pub key_id: KeyId,
}

/// Applies `rules` to `value` with `key`.
///
/// # Errors
/// [`RedactError::Canonical`] when a value to be hashed has no canonical form; no partial
/// output is returned.
pub fn redact(
    value: &Value,
    rules: &[RedactRule],
    key: &RedactionKey,
) -> Result<Redacted, RedactError> {
    let mut walker = Walker {
        rules,
        key,
        key_path: Vec::new(),
        display_path: String::new(),
        paths: Vec::new(),
    };
    let value = walker.value(value)?;
    Ok(Redacted {
        value,
        paths: walker.paths,
        key_id: key.id.clone(),
    })
}

struct Walker<'a> {
    rules: &'a [RedactRule],
    key: &'a RedactionKey,
    key_path: Vec<&'a str>,
    display_path: String,
    paths: Vec<RedactedPath>,
}

impl<'a> Walker<'a> {
    fn value(&mut self, value: &'a Value) -> Result<Value, RedactError> {
        match value {
            Value::Object(map) => self.object(map).map(Value::Object),
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let restore = self.display_path.len();
                    self.display_path.push_str(&format!("[{i}]"));
                    out.push(self.value(item)?);
                    self.display_path.truncate(restore);
                }
                Ok(Value::Array(out))
            }
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => Ok(value.clone()),
        }
    }

    fn object(&mut self, map: &'a Map<String, Value>) -> Result<Map<String, Value>, RedactError> {
        let mut out = Map::new();
        let mut names: Vec<&'a String> = map.keys().collect();
        names.sort();
        for name in names {
            let Some(member) = map.get(name) else {
                continue;
            };
            let restore = self.display_path.len();
            if !self.display_path.is_empty() {
                self.display_path.push('.');
            }
            self.display_path.push_str(name);
            self.key_path.push(name);

            let how = self.how_for_current();
            match how {
                Some(How::Drop) => {
                    self.record(How::Drop);
                }
                Some(How::Hash) => {
                    let digest =
                        self.key
                            .digest(member)
                            .map_err(|source| RedactError::Canonical {
                                path: self.display_path.clone(),
                                source,
                            })?;
                    self.record(How::Hash);
                    out.insert(name.clone(), Value::String(digest));
                }
                None => {
                    let inner = self.value(member)?;
                    out.insert(name.clone(), inner);
                }
            }

            self.key_path.pop();
            self.display_path.truncate(restore);
        }
        Ok(out)
    }

    fn how_for_current(&self) -> Option<How> {
        let mut found = None;
        for rule in self.rules {
            if rule.field.matches(&self.key_path) {
                match rule.how {
                    How::Drop => return Some(How::Drop),
                    How::Hash => found = Some(How::Hash),
                }
            }
        }
        found
    }

    fn record(&mut self, how: How) {
        self.paths.push(RedactedPath {
            path: self.display_path.clone(),
            how,
        });
    }
}
