//! Durations as the registry writes them: `72h`, `15m`, `30s`, `7d`.
//!
//! INVARIANT: a [`Span`] is a whole, positive number of seconds no longer than 366 days;
//! zero and negative spans are refused, so an approval can never be born expired or
//! never expire.

use std::fmt;

use serde::{Deserialize, Serialize};

const MAX_SECONDS: u64 = 366 * 24 * 3600;

/// A positive duration written `<integer><unit>` with unit `s`, `m`, `h` or `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Span {
    seconds: u64,
}

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "duration {0:?} is invalid: write a positive whole number and a unit s, m, h or d (e.g. 72h), at most 366d"
)]
pub struct SpanError(pub String);

impl Span {
    /// A span of whole hours (used for defaults).
    pub const fn hours(h: u64) -> Self {
        Self { seconds: h * 3600 }
    }

    /// Parses `72h`, `15m`, `30s`, `7d`.
    pub fn parse(s: &str) -> Result<Self, SpanError> {
        let err = || SpanError(s.chars().take(40).collect());
        let s_trim = s.trim();
        // The unit is the last character, which may be more than one byte ("5é").
        let unit_at = s_trim
            .char_indices()
            .last()
            .map(|(i, _)| i)
            .ok_or_else(err)?;
        let (digits, unit) = s_trim.split_at(unit_at);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let n: u64 = digits.parse().map_err(|_| err())?;
        let factor = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => return Err(err()),
        };
        let seconds = n.checked_mul(factor).ok_or_else(err)?;
        if seconds == 0 || seconds > MAX_SECONDS {
            return Err(err());
        }
        Ok(Self { seconds })
    }

    /// The span in seconds.
    pub fn as_secs(self) -> u64 {
        self.seconds
    }

    /// The span as a chrono duration, for expiry arithmetic against a [`crate::Clock`].
    pub fn to_chrono(self) -> chrono::Duration {
        // INVARIANT: seconds <= MAX_SECONDS, far inside i64.
        chrono::Duration::seconds(i64::try_from(self.seconds).unwrap_or(i64::MAX / 1000))
    }
}

impl fmt::Display for Span {
    /// Whole hours as `h` (`72h`, the unit approvals are usually set in), else whole minutes
    /// as `m`, else seconds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.seconds;
        if s.is_multiple_of(3600) {
            write!(f, "{}h", s / 3600)
        } else if s.is_multiple_of(60) {
            write!(f, "{}m", s / 60)
        } else {
            write!(f, "{s}s")
        }
    }
}

impl TryFrom<String> for Span {
    type Error = SpanError;
    fn try_from(s: String) -> Result<Self, SpanError> {
        Self::parse(&s)
    }
}

impl From<Span> for String {
    fn from(s: Span) -> String {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_parse_and_print() {
        assert_eq!(Span::parse("72h").unwrap().as_secs(), 72 * 3600);
        assert_eq!(Span::parse("72h").unwrap().to_string(), "72h");
        assert_eq!(Span::parse("3d").unwrap().to_string(), "72h");
        assert_eq!(Span::parse("90m").unwrap().to_string(), "90m");
        assert_eq!(Span::parse("61s").unwrap().to_string(), "61s");
        for bad in [
            "",
            "h",
            "0h",
            "-1h",
            "1.5h",
            "72",
            "72 h",
            "1w",
            "367d",
            "99999999999999999999s",
            // A multi-byte last character is refused, never a panic.
            "5é",
            "é",
            "72h☃",
        ] {
            assert!(Span::parse(bad).is_err(), "{bad}");
        }
    }
}
