//! Canonical JSON: the RFC 8785 JSON Canonicalization Scheme (JCS) over [`serde_json::Value`].
//!
//! Owns the one byte form every hash in Countersign is computed over: inputs hashes,
//! idempotency keys, approval bindings and redaction digests all start here, so two
//! spellings of the same arguments (key order, `1.0` vs `1` vs `1e0`, insignificant
//! whitespace, escapes) give the same bytes and the same key.
//!
//! The rules, as RFC 8785 states them:
//! - no whitespace;
//! - object members sorted by their names compared as arrays of UTF-16 code units;
//! - strings escaped minimally: `"` and `\` escaped, the control characters U+0000–U+001F
//!   written as `\b \t \n \f \r` where JSON has a short form and `\u00xx` (lower-case hex)
//!   otherwise; every other character, non-ASCII included, written as itself in UTF-8;
//! - numbers written as ECMAScript's `Number.prototype.toString` writes the IEEE 754
//!   double (shortest round-trip digits, exponent from 1e21 and below 1e-6, `-0` as `0`);
//!   the `ryu-js` crate does that formatting.
//!
//! INVARIANT (fails closed): a value that cannot be written without changing its meaning is
//! refused, never approximated. That covers integers outside ±(2^53 − 1) whose digits JCS
//! would change: serde_json keeps them exactly as `u64`/`i64`, but JCS writes the nearest
//! double, so two different ids (`9007199254740993` and `9007199254740992`) would canonicalise
//! to the same bytes and share an idempotency key. Such an integer is accepted only when JCS
//! writes it back digit for digit (`9007199254740992`, `117215355802596770`, the text JCS
//! itself produces for large doubles, so canonical text always re-canonicalises to itself);
//! any other is refused and must travel as a string. Non-finite numbers are refused too
//! (serde_json cannot hold them, the check is defence in depth).
//!
//! Left to the parser: duplicate member names (serde_json keeps the last one) and decimal
//! literals with more precision than a double (rounded when parsed). Both happen before a
//! [`Value`] exists; the canonical form is that of the parsed value.

mod scan;

use std::cmp::Ordering;
use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::{Map, Number, Value};

pub use scan::{MAX_DEPTH, check_canonical, decode_raw_string, has_special, scan_canonical_object};

/// The largest integer magnitude a double holds exactly together with its neighbours
/// (2^53 − 1, ECMAScript's `Number.MAX_SAFE_INTEGER`).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Why a value has no canonical form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    /// An integer JCS could only write rounded.
    #[error("integer {0} is outside ±(2^53 − 1) and would be rounded by JCS; send it as a string")]
    UnsafeInteger(String),
    /// NaN or an infinity.
    #[error("number is not finite")]
    NonFinite,
    /// Text offered as canonical JSON is not valid JSON.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// Text offered as canonical JSON is JSON but not in canonical form.
    #[error("JSON text is not in RFC 8785 canonical form")]
    NotCanonical,
}

/// The RFC 8785 canonical text of `value`.
///
/// # Errors
/// [`CanonicalError::UnsafeInteger`] for integers outside ±(2^53 − 1) and
/// [`CanonicalError::NonFinite`] for non-finite numbers.
pub fn canonicalize(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_value(value, &mut out)?;
    Ok(out)
}

/// The canonical text of one number, as it appears inside [`canonicalize`]'s output.
///
/// Exposed so exact decimal readings of a number (money in minor units) start from the same
/// digits the hash covers.
///
/// # Errors
/// As [`canonicalize`].
pub fn number_text(n: &Number) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_number(n, &mut out)?;
    Ok(out)
}

/// Compares two member names as RFC 8785 orders them: by UTF-16 code units.
pub fn cmp_utf16(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// Text known to be the canonical form of some JSON value.
///
/// INVARIANT: only built by canonicalising a [`Value`] or by checking that text is already
/// canonical, so hashing [`CanonicalJson::as_bytes`] is hashing the JCS form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CanonicalJson(String);

impl CanonicalJson {
    /// Canonicalises `value`.
    ///
    /// # Errors
    /// As [`canonicalize`].
    pub fn from_value(value: &Value) -> Result<Self, CanonicalError> {
        canonicalize(value).map(Self)
    }

    /// Accepts `text` only if it is already exactly the canonical form of the JSON it holds
    /// (for text read back from storage).
    ///
    /// # Errors
    /// [`CanonicalError::NotJson`], [`CanonicalError::NotCanonical`], or the errors of
    /// [`canonicalize`].
    pub fn from_canonical_text(text: &str) -> Result<Self, CanonicalError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| CanonicalError::NotJson(e.to_string()))?;
        let canonical = canonicalize(&value)?;
        if canonical == text {
            Ok(Self(canonical))
        } else {
            Err(CanonicalError::NotCanonical)
        }
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The canonical bytes (UTF-8), what hashes are computed over.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The canonical text, owned.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Parses the canonical text back into a value.
    ///
    /// # Errors
    /// Never for text built by this type; the `Result` keeps the signature honest.
    pub fn to_value(&self) -> Result<Value, CanonicalError> {
        serde_json::from_str(&self.0).map_err(|e| CanonicalError::NotJson(e.to_string()))
    }
}

impl fmt::Display for CanonicalJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for CanonicalJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

fn write_value(value: &Value, out: &mut String) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => write_object(map, out)?,
    }
    Ok(())
}

fn write_object(map: &Map<String, Value>, out: &mut String) -> Result<(), CanonicalError> {
    let mut members: Vec<(&String, &Value)> = map.iter().collect();
    members.sort_by(|(a, _), (b, _)| cmp_utf16(a, b));
    out.push('{');
    for (i, (name, value)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(name, out);
        out.push(':');
        write_value(value, out)?;
    }
    out.push('}');
    Ok(())
}

fn write_string(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{0c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if u32::from(c) < 0x20 => {
                let b = u32::from(c) as usize;
                out.push_str("\\u00");
                out.push(char::from(HEX[b >> 4]));
                out.push(char::from(HEX[b & 0xf]));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(n: &Number, out: &mut String) -> Result<(), CanonicalError> {
    if let Some(u) = n.as_u64() {
        // u64 → f64 rounds to nearest, as parsing the digits as a double would.
        #[allow(clippy::cast_precision_loss)]
        write_integer(u.to_string(), u > MAX_SAFE_INTEGER, u as f64, out)?;
    } else if let Some(i) = n.as_i64() {
        #[allow(clippy::cast_precision_loss)]
        write_integer(
            i.to_string(),
            i.unsigned_abs() > MAX_SAFE_INTEGER,
            i as f64,
            out,
        )?;
    } else {
        let f = n.as_f64().ok_or(CanonicalError::NonFinite)?;
        write_f64(f, out)?;
    }
    Ok(())
}

/// Writes an integer held exactly; beyond the safe range only if JCS's text for the nearest
/// double is the same digits.
fn write_integer(
    digits: String,
    beyond_safe: bool,
    nearest: f64,
    out: &mut String,
) -> Result<(), CanonicalError> {
    if beyond_safe {
        let mut as_double = String::new();
        write_f64(nearest, &mut as_double)?;
        if as_double != digits {
            return Err(CanonicalError::UnsafeInteger(digits));
        }
    }
    out.push_str(&digits);
    Ok(())
}

fn write_f64(f: f64, out: &mut String) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFinite);
    }
    if f == 0.0 {
        // Both zeros are written "0" (ECMAScript prints -0 as 0).
        out.push('0');
        return Ok(());
    }
    let mut buffer = ryu_js::Buffer::new();
    out.push_str(buffer.format_finite(f));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escapes_only_what_jcs_escapes() {
        let s = canonicalize(&json!("a\u{1}\u{1f}\u{7f}\u{2028}é\"\\/")).unwrap();
        assert_eq!(s, "\"a\\u0001\\u001f\u{7f}\u{2028}é\\\"\\\\/\"");
    }

    #[test]
    fn refuses_integers_beyond_the_safe_range() {
        assert!(canonicalize(&json!(9_007_199_254_740_991_u64)).is_ok());
        assert!(matches!(
            canonicalize(&json!(9_007_199_254_740_993_u64)),
            Err(CanonicalError::UnsafeInteger(_))
        ));
        // 2^60 is a double exactly, but JCS writes it 1152921504606847000.
        assert!(matches!(
            canonicalize(&json!(1_152_921_504_606_846_976_u64)),
            Err(CanonicalError::UnsafeInteger(_))
        ));
        assert!(matches!(
            canonicalize(&json!(u64::MAX)),
            Err(CanonicalError::UnsafeInteger(_))
        ));
        // Digits JCS writes back unchanged are kept (this is how it writes large doubles).
        assert_eq!(
            canonicalize(&json!(9_007_199_254_740_992_u64)).unwrap(),
            "9007199254740992"
        );
        assert_eq!(
            canonicalize(&json!(-117_215_355_802_596_770_i64)).unwrap(),
            "-117215355802596770"
        );
        assert_eq!(
            canonicalize(&json!(-1.1721535580259677e17)).unwrap(),
            "-117215355802596770"
        );
        assert!(matches!(
            canonicalize(&json!({"a": [-9_007_199_254_740_993_i64]})),
            Err(CanonicalError::UnsafeInteger(_))
        ));
    }

    #[test]
    fn canonical_text_is_checked() {
        assert!(CanonicalJson::from_canonical_text(r#"{"a":1,"b":2}"#).is_ok());
        assert_eq!(
            CanonicalJson::from_canonical_text(r#"{"b":2,"a":1}"#),
            Err(CanonicalError::NotCanonical)
        );
        assert_eq!(
            CanonicalJson::from_canonical_text(r#"{"a":1.0}"#),
            Err(CanonicalError::NotCanonical)
        );
        assert!(matches!(
            CanonicalJson::from_canonical_text("{"),
            Err(CanonicalError::NotJson(_))
        ));
    }
}
