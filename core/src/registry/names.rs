//! Names parsed at the boundary: [`ToolName`], [`RoleName`], [`ProviderName`].
//!
//! INVARIANT: a value of these types is 1 to 64 characters of dot-separated segments, each
//! segment starting with a lowercase ASCII letter followed by lowercase letters, digits, `_`
//! or `-` (`payment.schedule`, `worker.finance`, `erp`). That fits MCP's tool-name alphabet,
//! needs no escaping in logs, URLs or Cedar entity ids, and rules out look-alike names that
//! differ only in case or Unicode.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{kind} name {shown:?} is invalid: use 1-{MAX_NAME_LEN} characters, dot-separated segments \
     of lowercase letters, digits, '_' or '-', each segment starting with a letter"
)]
pub struct NameError {
    /// What kind of name it was meant to be.
    pub kind: &'static str,
    /// The refused text (shortened when long).
    pub shown: String,
}

pub(crate) fn is_valid_name(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_NAME_LEN {
        return false;
    }
    s.split('.').all(|segment| {
        let mut chars = segment.chars();
        matches!(chars.next(), Some('a'..='z'))
            && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
    })
}

fn shown(s: &str) -> String {
    s.chars().take(80).collect()
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Parses `s`, refusing anything outside the name alphabet.
            pub fn parse(s: &str) -> Result<Self, NameError> {
                if is_valid_name(s) {
                    Ok(Self(s.to_string()))
                } else {
                    Err(NameError { kind: $kind, shown: shown(s) })
                }
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(s: String) -> Result<Self, NameError> {
                if is_valid_name(&s) {
                    Ok(Self(s))
                } else {
                    Err(NameError { kind: $kind, shown: shown(&s) })
                }
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String {
                n.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

name_type!(
    /// The name of a tool, as agents see it in `tools/list` (`payment.schedule`).
    ToolName,
    "tool"
);
name_type!(
    /// The name of a role: an agent role (`worker.finance`) or, in approval settings, a
    /// people's app role (`approver`).
    RoleName,
    "role"
);
name_type!(
    /// The name of a provider (a target system adapter), never visible to agents (`erp`).
    ProviderName,
    "provider"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_alphabet() {
        for ok in [
            "payment.schedule",
            "worker.finance",
            "erp",
            "a",
            "x1.y_2.z-3",
        ] {
            assert!(ToolName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Payment.schedule",
            ".x",
            "x.",
            "x..y",
            "1x",
            "x y",
            "pаyment", // Cyrillic a
            &"a".repeat(65),
        ] {
            assert!(ToolName::parse(bad).is_err(), "{bad}");
        }
    }
}
