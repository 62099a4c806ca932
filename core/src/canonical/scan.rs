//! A single-pass check that text is already in RFC 8785 canonical form, without building a
//! [`serde_json::Value`] or writing the canonical text again.
//!
//! Used where text read back from storage must be proven canonical many times over (the audit
//! chain's `verify` runs it on every record), so it is allocation-free on the common path.
//!
//! INVARIANT: [`check_canonical`] accepts `text` exactly when
//! `canonicalize(&serde_json::from_str(text)?) == text` (the property test in
//! `core/tests/it/canonical.rs` compares the two on random values and random mutations).
//! The rules it enforces, each the mirror of one rule of [`super::canonicalize`]:
//! - no byte below 0x20 anywhere (no whitespace between tokens, control characters escaped),
//!   no trailing bytes, nesting at most [`MAX_DEPTH`] deep (serde_json's limit);
//! - object members strictly increasing by UTF-16 code units (which also refuses duplicates);
//! - strings: escapes only `\" \\ \b \t \n \f \r` and `\u00xx` (lower-case hex) for the other
//!   control characters;
//! - numbers: the token is what [`super::number_text`] writes for the number it denotes;
//!   plain decimals of at most 15 significant digits (see `plain_decimal_is_canonical`) are
//!   accepted without parsing, every other token is parsed and re-written.

use std::cmp::Ordering;

use serde_json::Number;

use super::{CanonicalError, cmp_utf16, number_text};

/// How deep arrays and objects may nest (serde_json's own recursion limit).
pub const MAX_DEPTH: usize = 128;

/// Checks that `text` is canonical JSON; see the module invariant.
///
/// # Errors
/// [`CanonicalError::NotCanonical`] (or [`CanonicalError::NotJson`] for text that is not JSON
/// at all, where that is cheap to tell).
pub fn check_canonical(text: &str) -> Result<(), CanonicalError> {
    no_control_bytes(text)?;
    let mut s = Scanner {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    s.value(0)?;
    s.end()
}

/// Checks that `text` is a canonical JSON object and calls `member(raw_name, raw_value)` for
/// each top-level member, in order. `raw_name` is the name as written between its quotes
/// (escapes not decoded), `raw_value` the member's value token as written.
///
/// # Errors
/// As [`check_canonical`]; also when `text` is not an object.
pub fn scan_canonical_object<'a>(
    text: &'a str,
    mut member: impl FnMut(&'a str, &'a str),
) -> Result<(), CanonicalError> {
    no_control_bytes(text)?;
    let mut s = Scanner {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    s.object(0, &mut member)?;
    s.end()
}

/// Decodes a raw string token's content (between the quotes) when it holds escapes.
///
/// # Errors
/// [`CanonicalError::NotJson`] when the escapes are not JSON.
pub fn decode_raw_string(raw: &str) -> Result<std::borrow::Cow<'_, str>, CanonicalError> {
    if raw.contains('\\') {
        let quoted = format!("\"{raw}\"");
        serde_json::from_str::<String>(&quoted)
            .map(std::borrow::Cow::Owned)
            .map_err(|e| CanonicalError::NotJson(e.to_string()))
    } else {
        Ok(std::borrow::Cow::Borrowed(raw))
    }
}

/// Canonical text holds no byte below 0x20 anywhere: not between tokens (no whitespace) and
/// not inside strings (control characters are escaped). Checked once over the whole text
/// (vectorised), so the string scan below only looks for quotes and backslashes.
fn no_control_bytes(text: &str) -> Result<(), CanonicalError> {
    if text.bytes().fold(0xffu8, |m, b| m.min(b)) < 0x20 {
        not_canonical()
    } else {
        Ok(())
    }
}

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

fn not_canonical<T>() -> Result<T, CanonicalError> {
    Err(CanonicalError::NotCanonical)
}

impl<'a> Scanner<'a> {
    fn end(&self) -> Result<(), CanonicalError> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            not_canonical()
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn value(&mut self, depth: usize) -> Result<(), CanonicalError> {
        match self.peek() {
            Some(b'{') => self.object(depth, &mut |_: &'a str, _: &'a str| {}),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(|_| ()),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => not_canonical(),
        }
    }

    fn literal(&mut self, word: &str) -> Result<(), CanonicalError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(())
        } else {
            not_canonical()
        }
    }

    fn object<F: FnMut(&'a str, &'a str)>(
        &mut self,
        depth: usize,
        member: &mut F,
    ) -> Result<(), CanonicalError> {
        if depth >= MAX_DEPTH || self.peek() != Some(b'{') {
            return not_canonical();
        }
        self.pos += 1;
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        let mut previous: Option<(&'a str, bool)> = None;
        loop {
            let (name, plain) = self.string()?;
            if let Some((before, before_plain)) = previous
                && names_order(before, before_plain, name, plain)? != Ordering::Less
            {
                return not_canonical();
            }
            previous = Some((name, plain));
            if self.peek() != Some(b':') {
                return not_canonical();
            }
            self.pos += 1;
            let start = self.pos;
            self.value(depth + 1)?;
            member(name, &self.text[start..self.pos]);
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return not_canonical(),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), CanonicalError> {
        if depth >= MAX_DEPTH {
            return not_canonical();
        }
        self.pos += 1;
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.value(depth + 1)?;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return not_canonical(),
            }
        }
    }

    /// Scans a string token; returns its raw content and whether it is plain ASCII without
    /// escapes (so byte order is UTF-16 order). Control bytes were refused up front.
    fn string(&mut self) -> Result<(&'a str, bool), CanonicalError> {
        if self.peek() != Some(b'"') {
            return not_canonical();
        }
        self.pos += 1;
        let start = self.pos;
        let mut escaped = false;
        loop {
            let rest = self.bytes.get(self.pos..).unwrap_or_default();
            let Some(i) = quote_or_backslash(rest) else {
                return not_canonical();
            };
            self.pos += i;
            if self.bytes[self.pos] == b'"' {
                let raw = &self.text[start..self.pos];
                self.pos += 1;
                return Ok((raw, !escaped && raw.is_ascii()));
            }
            escaped = true;
            match self.bytes.get(self.pos + 1).copied() {
                Some(b'"' | b'\\' | b'b' | b't' | b'n' | b'f' | b'r') => self.pos += 2,
                Some(b'u') => {
                    let code = match self.bytes.get(self.pos + 2..self.pos + 6) {
                        Some([b'0', b'0', hi @ (b'0' | b'1'), lo]) => {
                            let lo = match lo {
                                b'0'..=b'9' => lo - b'0',
                                b'a'..=b'f' => lo - b'a' + 10,
                                _ => return not_canonical(),
                            };
                            (hi - b'0') * 16 + lo
                        }
                        _ => return not_canonical(),
                    };
                    // Those with a short form must use it.
                    if matches!(code, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                        return not_canonical();
                    }
                    self.pos += 6;
                }
                _ => return not_canonical(),
            }
        }
    }

    fn number(&mut self) -> Result<(), CanonicalError> {
        let start = self.pos;
        while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = self.peek() {
            self.pos += 1;
        }
        let token = &self.text[start..self.pos];
        let digits = token.strip_prefix('-').unwrap_or(token);
        if plain_decimal_is_canonical(token, digits) {
            return Ok(());
        }
        let n: Number =
            serde_json::from_str(token).map_err(|e| CanonicalError::NotJson(e.to_string()))?;
        if number_text(&n)? == token {
            Ok(())
        } else {
            not_canonical()
        }
    }
}

/// Where the first `"` or `\\` in `bytes` is. Most strings are short: the first 32 bytes are
/// searched eight at a time in a `u64` (the classic "has a zero byte" test on the bytes XOR
/// the wanted byte: its lowest flagged byte is always a true match, since a false flag needs a
/// borrow from a true match below it), the rest with SIMD (`memchr2`).
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    let mut at = 0;
    while at < 32
        && let Some(chunk) = bytes.get(at..at + 8)
    {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let q = w ^ QUOTES;
        let b = w ^ BACKSLASHES;
        let hit = ((q.wrapping_sub(ONES) & !q) | (b.wrapping_sub(ONES) & !b)) & HIGH;
        if hit != 0 {
            return Some(at + (hit.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let rest = bytes.get(at..)?;
    if at < 32 {
        // Fewer than eight bytes left.
        return rest
            .iter()
            .position(|&c| c == b'"' || c == b'\\')
            .map(|i| at + i);
    }
    memchr::memchr2(b'"', b'\\', rest).map(|i| at + i)
}

/// The number tokens that need no parsing: `-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?` with at most
/// 15 significant digits and, below 1, at most five zeros after the point. Such a decimal is
/// the shortest text of the double nearest it (15 digits always round-trip, so no shorter
/// decimal reaches the same double) and ECMAScript writes it without an exponent (it is
/// below 10^15 and at least 10^-6), so it is its own canonical form. `-0` is not one.
fn plain_decimal_is_canonical(token: &str, unsigned: &str) -> bool {
    let (int, frac) = match unsigned.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (unsigned, None),
    };
    let int_ok = int == "0" || (!int.is_empty() && !int.starts_with('0'));
    if !int_ok || !int.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let significant = match frac {
        None => {
            if int == "0" && token.len() != unsigned.len() {
                return false; // -0
            }
            int.len()
        }
        Some(f) => {
            if f.is_empty() || f.ends_with('0') || !f.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            if int == "0" {
                let zeros = f.len() - f.trim_start_matches('0').len();
                if zeros > 5 {
                    return false;
                }
                f.len() - zeros
            } else {
                int.len() + f.len()
            }
        }
    };
    significant <= 15
}

/// RFC 8785 member order of two raw names; decodes only when either is not plain ASCII.
fn names_order(a: &str, a_plain: bool, b: &str, b_plain: bool) -> Result<Ordering, CanonicalError> {
    if a_plain && b_plain {
        // Names of up to eight bytes compare as big-endian integers (no NUL can occur in a
        // plain name, so zero padding orders a prefix first, as byte order does).
        if a.len() <= 8 && b.len() <= 8 {
            let word = |s: &str| {
                let mut w = [0u8; 8];
                w[..s.len()].copy_from_slice(s.as_bytes());
                u64::from_be_bytes(w)
            };
            return Ok(word(a).cmp(&word(b)));
        }
        return Ok(a.as_bytes().cmp(b.as_bytes()));
    }
    let a = decode_raw_string(a)?;
    let b = decode_raw_string(b)?;
    Ok(cmp_utf16(&a, &b))
}

#[cfg(test)]
mod quote_tests {
    use super::quote_or_backslash;

    #[test]
    fn finds_the_first_quote_or_backslash_at_every_offset_and_length() {
        let fillers: [u8; 6] = [b'a', 0x21, 0x23, 0x5b, 0x5d, 0xc3];
        for len in 0..80 {
            for at in 0..=len {
                for (f, wanted) in fillers.iter().zip([b'"', b'\\'].iter().cycle()) {
                    let mut bytes = vec![*f; len];
                    if at < len {
                        bytes[at] = *wanted;
                        // A later match never hides the first.
                        if at + 1 < len {
                            bytes[len - 1] = b'"';
                        }
                    }
                    let want = bytes.iter().position(|&c| c == b'"' || c == b'\\');
                    assert_eq!(
                        quote_or_backslash(&bytes),
                        want,
                        "len {len} at {at} filler {f}"
                    );
                }
            }
        }
    }
}
