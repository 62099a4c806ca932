//! Agent credentials: the bearer tokens MCP clients present, one per agent and role.
//!
//! Invariants:
//! * A token is 256 bits from the operating system's CSPRNG, shown once at creation
//!   (`cs_agent_` + 64 hex digits) and never stored: the database keeps only its SHA-256.
//!   A plain hash is enough because the token is uniformly random, not a password.
//! * Tokens live in [`Secret`] so they never reach a log or an audit record in clear.
//! * Authentication fails closed: an unknown, malformed, revoked or expired token is refused,
//!   and the caller learns only "unauthorized" (the reason is for the server's log).

use sha2::{Digest, Sha256};

use crate::secret::Secret;

/// The prefix every agent token carries, so secret scanners can recognise a leaked one.
pub const TOKEN_PREFIX: &str = "cs_agent_";

/// A freshly minted or presented bearer token.
#[derive(Debug, Clone)]
pub struct AgentToken(Secret<String>);

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
#[error("the operating system's random source failed: {0}")]
pub struct RandomnessError(String);

impl AgentToken {
    /// Mints a new random token.
    pub fn generate() -> Result<Self, RandomnessError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| RandomnessError(e.to_string()))?;
        Ok(Self(Secret::new(format!("{TOKEN_PREFIX}{}", hex(&bytes)))))
    }

    /// Wraps a token presented by a client (not yet checked).
    pub fn presented(text: &str) -> Self {
        Self(Secret::new(text.trim().to_string()))
    }

    /// Whether the text has the shape of a Countersign token (cheap pre-check).
    pub fn is_well_formed(&self) -> bool {
        self.0.expose().strip_prefix(TOKEN_PREFIX).is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
    }

    /// The hash stored in the database: `sha256:<hex>`.
    pub fn hash(&self) -> String {
        format!(
            "sha256:{}",
            hex(&Sha256::digest(self.0.expose().as_bytes()))
        )
    }

    /// The token itself, for showing once to the operator who created it.
    pub fn reveal(&self) -> &str {
        self.0.expose()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_well_formed_and_hashed() {
        let a = AgentToken::generate().unwrap();
        let b = AgentToken::generate().unwrap();
        assert_ne!(a.reveal(), b.reveal());
        assert!(a.is_well_formed());
        assert_eq!(a.reveal().len(), TOKEN_PREFIX.len() + 64);
        assert_ne!(a.hash(), b.hash());
        assert!(a.hash().starts_with("sha256:"));
        assert!(!a.hash().contains(a.reveal()));
        assert!(!format!("{a:?}").contains(a.reveal()));
        assert_eq!(AgentToken::presented(a.reveal()).hash(), a.hash());
    }

    #[test]
    fn malformed_tokens_are_recognised() {
        for bad in [
            "",
            "cs_agent_",
            "Bearer x",
            "cs_agent_zz",
            &format!("cs_agent_{}", "A".repeat(64)),
        ] {
            assert!(!AgentToken::presented(bad).is_well_formed(), "{bad}");
        }
    }
}
