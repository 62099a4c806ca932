//! A single-pass check that text is already in RFC 8785 canonical form, without building a
//! [`serde_json::Value`] or writing the canonical text again.
//!
//! Used where text read back from storage must be proven canonical many times over (the audit
//! chain's `verify` runs it on every record), so it is allocation-free on the common path and
//! works on bytes: positions, not re-sliced `&str`s, until a caller needs text. It runs in two
//! stages, as SIMD JSON parsers do: a bitmask of the special bytes (`"`, `\\`, control bytes)
//! of each 64-byte block (SSE2 on x86-64, through `safe_arch`; a plain loop elsewhere), then
//! the grammar, which jumps from one special byte to the next inside strings. Strings,
//! numbers and name order have a short inlined path for the common case and an out-of-line
//! one for escapes, exponents and non-ASCII names.
//!
//! INVARIANT: [`check_canonical`] accepts `text` exactly when
//! `canonicalize(&serde_json::from_str(text)?) == text` (the property test in
//! `core/tests/it/canonical.rs` compares the two on random values and random mutations).
//! The rules it enforces, each the mirror of one rule of [`super::canonicalize`]:
//! - no byte below 0x20 anywhere (no whitespace between tokens, control characters escaped):
//!   inside strings the special-byte masks refuse them, outside strings the grammar matches
//!   every byte; no trailing bytes, nesting at most [`MAX_DEPTH`] deep (serde_json's limit);
//! - object members strictly increasing by UTF-16 code units (which also refuses duplicates);
//! - strings: escapes only `\" \\ \b \t \n \f \r` and `\u00xx` (lower-case hex) for the other
//!   control characters;
//! - numbers: the token is what [`super::number_text`] writes for the number it denotes;
//!   plain decimals of at most 15 significant digits (see [`Scanner::number`]) are accepted
//!   without parsing, every other token is parsed and re-written.

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
    let mut s = Scanner::new(text);
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
    let mut s = Scanner::new(text);
    s.object(0, Some(&mut member))?;
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

fn not_canonical<T>() -> Result<T, CanonicalError> {
    Err(CanonicalError::NotCanonical)
}

/// A string token found by [`Scanner::string`]: its content's byte range (between the
/// quotes) and whether the content holds an escape.
#[derive(Clone, Copy)]
struct Token {
    start: usize,
    end: usize,
    escaped: bool,
}

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    /// The [`special_bytes`] masks of blocks `window_first..window_first + window_len`.
    window: [u64; WINDOW],
    window_first: usize,
    window_len: usize,
}

/// How many 64-byte blocks' masks a scanner keeps (1 KiB of text: a whole typical record).
const WINDOW: usize = 16;

impl<'a> Scanner<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            text,
            bytes: text.as_bytes(),
            pos: 0,
            window: [0; WINDOW],
            window_first: 0,
            window_len: 0,
        }
    }

    /// Where the first special byte (`"`, `\\` or a control byte) at or after `from` is.
    #[inline(always)]
    fn next_special(&mut self, from: usize) -> Option<usize> {
        let mut at = from;
        loop {
            let block = at / 64;
            let slot = block.wrapping_sub(self.window_first);
            let mask = match self.window.get(slot) {
                Some(&mask) if slot < self.window_len => mask,
                _ => self.fill_window(block)?,
            };
            let mask = mask >> (at % 64);
            if mask != 0 {
                return Some(at + mask.trailing_zeros() as usize);
            }
            at = (block + 1) * 64;
        }
    }

    /// Computes the masks of up to [`WINDOW`] blocks from `block` on; returns the first
    /// (`None` past the end of the text).
    #[inline(never)]
    fn fill_window(&mut self, block: usize) -> Option<u64> {
        let first = block * 64;
        if first >= self.bytes.len() {
            return None;
        }
        let blocks = (self.bytes.len() - first).div_ceil(64).min(WINDOW);
        for (i, mask) in self.window.iter_mut().take(blocks).enumerate() {
            *mask = special_bytes(self.bytes, first + 64 * i);
        }
        self.window_first = block;
        self.window_len = blocks;
        Some(self.window[0])
    }

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

    /// Consumes `byte` if it is next.
    fn eat(&mut self, byte: u8) -> bool {
        let hit = self.peek() == Some(byte);
        self.pos += usize::from(hit);
        hit
    }

    fn value(&mut self, depth: usize) -> Result<(), CanonicalError> {
        match self.peek() {
            Some(b'"') => self.string().map(|_| ()),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'{') => self.object::<fn(&'a str, &'a str)>(depth, None),
            Some(b'[') => self.array(depth),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => not_canonical(),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), CanonicalError> {
        if self.bytes.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(())
        } else {
            not_canonical()
        }
    }

    /// An object; `member` (when given) sees each member's raw name and value.
    fn object<F: FnMut(&'a str, &'a str)>(
        &mut self,
        depth: usize,
        mut member: Option<&mut F>,
    ) -> Result<(), CanonicalError> {
        if depth >= MAX_DEPTH || !self.eat(b'{') {
            return not_canonical();
        }
        if self.eat(b'}') {
            return Ok(());
        }
        let mut previous: Option<Token> = None;
        loop {
            let name = self.string()?;
            if let Some(before) = previous
                && !self.in_order(before, name)?
            {
                return not_canonical();
            }
            previous = Some(name);
            if !self.eat(b':') {
                return not_canonical();
            }
            let start = self.pos;
            // Strings and numbers, the common member values, without the recursive call.
            match self.peek() {
                Some(b'"') => self.string().map(|_| ())?,
                Some(b'-' | b'0'..=b'9') => self.number()?,
                _ => self.value(depth + 1)?,
            }
            if let Some(member) = member.as_mut() {
                member(
                    self.slice(name.start, name.end)?,
                    self.slice(start, self.pos)?,
                );
            }
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

    /// The text between two token boundaries (always ASCII positions, so never split a
    /// character; an error rather than a panic if that ever failed).
    fn slice(&self, start: usize, end: usize) -> Result<&'a str, CanonicalError> {
        self.text
            .get(start..end)
            .ok_or(CanonicalError::NotCanonical)
    }

    fn array(&mut self, depth: usize) -> Result<(), CanonicalError> {
        if depth >= MAX_DEPTH {
            return not_canonical();
        }
        self.pos += 1;
        if self.eat(b']') {
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

    /// Scans a string token (the scanner is at its opening quote): up to the first special
    /// byte, which must be the closing quote or a valid escape; a control byte is refused.
    #[inline(always)]
    fn string(&mut self) -> Result<Token, CanonicalError> {
        if !self.eat(b'"') {
            return not_canonical();
        }
        let start = self.pos;
        match self.next_special(start) {
            Some(i) if self.bytes.get(i) == Some(&b'"') => {
                self.pos = i + 1;
                Ok(Token {
                    start,
                    end: i,
                    escaped: false,
                })
            }
            _ => self.escaped_string(start),
        }
    }

    /// [`Scanner::string`] for a string whose first special byte is not its closing quote.
    #[inline(never)]
    fn escaped_string(&mut self, start: usize) -> Result<Token, CanonicalError> {
        let mut escaped = false;
        loop {
            let Some(i) = self.next_special(self.pos) else {
                return not_canonical();
            };
            self.pos = i + 1;
            match self.bytes.get(i) {
                Some(b'"') => {
                    return Ok(Token {
                        start,
                        end: i,
                        escaped,
                    });
                }
                Some(b'\\') => {
                    escaped = true;
                    self.escape()?;
                }
                _ => return not_canonical(),
            }
        }
    }

    /// Checks the escape whose backslash was just consumed: one of the short forms, or
    /// `\u00xx` in lower-case hex for a control character that has no short form.
    fn escape(&mut self) -> Result<(), CanonicalError> {
        match self.peek() {
            Some(b'"' | b'\\' | b'b' | b't' | b'n' | b'f' | b'r') => self.pos += 1,
            Some(b'u') => {
                let code = match self.bytes.get(self.pos + 1..self.pos + 5) {
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
                self.pos += 5;
            }
            _ => return not_canonical(),
        }
        Ok(())
    }

    /// Whether member name `b` may follow `a`: RFC 8785 orders names by UTF-16 code units.
    /// Without escapes the raw bytes are the UTF-8 of the names, and byte order is UTF-16
    /// order up to their first difference when both bytes there are ASCII (the common
    /// prefix then ends on a character boundary and the next code units are those bytes), or
    /// when one name is a prefix of the other. Anything else is decoded and compared.
    #[inline(always)]
    fn in_order(&self, a: Token, b: Token) -> Result<bool, CanonicalError> {
        // Most neighbours differ in their first byte.
        if let (Some(&x), Some(&y)) = (self.bytes.get(a.start), self.bytes.get(b.start))
            && x != y
            && x.is_ascii()
            && y.is_ascii()
            && !a.escaped
            && !b.escaped
            && a.start < a.end
            && b.start < b.end
        {
            return Ok(x < y);
        }
        self.in_order_slow(a, b)
    }

    #[inline(never)]
    fn in_order_slow(&self, a: Token, b: Token) -> Result<bool, CanonicalError> {
        let raw_a = self.bytes.get(a.start..a.end).unwrap_or_default();
        let raw_b = self.bytes.get(b.start..b.end).unwrap_or_default();
        if !a.escaped && !b.escaped {
            match raw_a.iter().zip(raw_b).find(|(x, y)| x != y) {
                None => return Ok(raw_a.len() < raw_b.len()),
                Some((&x, &y)) if x.is_ascii() && y.is_ascii() => return Ok(x < y),
                Some(_) => {}
            }
        }
        let a = decode_raw_string(self.slice(a.start, a.end)?)?;
        let b = decode_raw_string(self.slice(b.start, b.end)?)?;
        Ok(cmp_utf16(&a, &b) == Ordering::Less)
    }

    /// A number token. The plain decimals `-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?` with at most 15
    /// significant digits and, below 1, at most five zeros after the point are accepted in one
    /// pass: such a decimal is the shortest text of the double nearest it (15 digits always
    /// round-trip, so no shorter decimal reaches the same double) and ECMAScript writes it
    /// without an exponent (it is below 10^15 and at least 10^-6), so it is its own canonical
    /// form. `-0` is not one. Every other token is parsed and written again.
    #[inline(always)]
    fn number(&mut self) -> Result<(), CanonicalError> {
        let bytes = self.bytes;
        let start = self.pos;
        let digits_from = |mut i: usize| {
            while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        let negative = bytes.get(start) == Some(&b'-');
        let int_start = start + usize::from(negative);
        let int_end = digits_from(int_start);
        let int_len = int_end - int_start;
        let zero = int_len == 1 && bytes.get(int_start) == Some(&b'0');
        let mut plain = int_len == 1 || (int_len > 1 && bytes.get(int_start) != Some(&b'0'));
        let mut end = int_end;
        let significant = if bytes.get(int_end) == Some(&b'.') {
            let frac_start = int_end + 1;
            end = digits_from(frac_start);
            let frac = bytes.get(frac_start..end).unwrap_or_default();
            plain &= frac.last().is_some_and(|&d| d != b'0');
            if zero {
                let zeros = frac.iter().take_while(|&&d| d == b'0').count();
                plain &= zeros <= 5;
                frac.len() - zeros
            } else {
                int_len + frac.len()
            }
        } else {
            plain &= !(zero && negative);
            int_len
        };
        plain &= significant <= 15
            && !matches!(
                bytes.get(end),
                Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
            );
        if plain {
            self.pos = end;
            return Ok(());
        }
        self.number_slow(start)
    }

    /// [`Scanner::number`] for a token that is not a plain decimal: parsed and written again.
    #[inline(never)]
    fn number_slow(&mut self, start: usize) -> Result<(), CanonicalError> {
        while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = self.peek() {
            self.pos += 1;
        }
        let token = self.slice(start, self.pos)?;
        let n: Number =
            serde_json::from_str(token).map_err(|e| CanonicalError::NotJson(e.to_string()))?;
        if number_text(&n)? == token {
            Ok(())
        } else {
            not_canonical()
        }
    }
}

/// The special bytes of the 64-byte block of `bytes` starting at `start`: bit `i` is set
/// when byte `start + i` is `"`, `\\` or below 0x20. Bytes past the end count as plain.
/// Every byte inside a string passes through one of these masks before the string is
/// accepted, and every byte outside strings is matched by the grammar, so control bytes
/// are refused wherever they are.
fn special_bytes(bytes: &[u8], start: usize) -> u64 {
    if let Some(Ok(block)) = bytes.get(start..start + 64).map(<&[u8; 64]>::try_from) {
        return special_mask(block);
    }
    let rest = bytes.get(start..).unwrap_or_default();
    let mut padded = [b' '; 64];
    padded[..rest.len().min(64)].copy_from_slice(&rest[..rest.len().min(64)]);
    special_mask(&padded)
}

/// Whether `bytes` holds a special byte (`"`, `\\` or below 0x20): a string JCS would not
/// write as itself. Sixteen bytes at a time through the same masks as [`special_bytes`].
pub fn has_special(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(16);
    let mut found = false;
    for chunk in chunks.by_ref() {
        if let Ok(lanes) = <&[u8; 16]>::try_from(chunk) {
            found |= special_mask16(lanes) != 0;
        }
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut padded = [b' '; 16];
        padded[..rest.len()].copy_from_slice(rest);
        found |= special_mask16(&padded) != 0;
    }
    found
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn special_mask16(lanes: &[u8; 16]) -> u16 {
    use safe_arch::{
        bitor_m128i, cmp_eq_mask_i8_m128i, load_unaligned_m128i, min_u8_m128i, move_mask_i8_m128i,
        set_splat_i8_m128i,
    };
    let v = load_unaligned_m128i(lanes);
    let special = bitor_m128i(
        bitor_m128i(
            cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'"' as i8)),
            cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'\\' as i8)),
        ),
        // v <= 0x1f exactly when min(v, 0x1f) == v.
        cmp_eq_mask_i8_m128i(min_u8_m128i(v, set_splat_i8_m128i(0x1f)), v),
    );
    move_mask_i8_m128i(special) as u16
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
fn special_mask16(lanes: &[u8; 16]) -> u16 {
    lanes.iter().enumerate().fold(0u16, |mask, (i, &b)| {
        mask | (u16::from(b == b'"' || b == b'\\' || b < 0x20) << i)
    })
}

/// The special bytes of one 64-byte block, sixteen at a time.
fn special_mask(block: &[u8; 64]) -> u64 {
    let mut mask = 0u64;
    for (k, lanes) in block.chunks_exact(16).enumerate() {
        if let Ok(lanes) = <&[u8; 16]>::try_from(lanes) {
            mask |= u64::from(special_mask16(lanes)) << (16 * k);
        }
    }
    mask
}

#[cfg(test)]
mod special_tests {
    use super::{has_special, special_bytes};

    #[test]
    fn has_special_finds_any_special_byte_at_any_position() {
        for len in 0..40 {
            let plain = vec![b'a'; len];
            assert!(!has_special(&plain), "len {len}");
            for at in 0..len {
                for b in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                    let mut text = plain.clone();
                    text[at] = b;
                    assert!(has_special(&text), "len {len} at {at} byte {b}");
                }
                let mut text = plain.clone();
                text[at] = 0x7f;
                assert!(!has_special(&text), "DEL is written as itself");
            }
        }
    }

    #[test]
    fn flags_exactly_quotes_backslashes_and_control_bytes() {
        let text: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        for start in (0..text.len() + 64).step_by(64) {
            let mask = special_bytes(&text, start);
            for i in 0..64 {
                let want = text
                    .get(start + i)
                    .is_some_and(|&b| b == b'"' || b == b'\\' || b < 0x20);
                assert_eq!(mask >> i & 1 == 1, want, "byte {}", start + i);
            }
        }
    }
}
