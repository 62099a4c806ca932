//! What one audit record must satisfy at its place in the chain: its `seq`, its stored hash,
//! its link, the canonical form of its text and the agreement of its columns with that text.
//!
//! INVARIANT (fails closed): [`check_record`] accepts a record exactly when the general
//! check ([`check_text`]: one allocation-free canonical scan of the whole text, reading the
//! embedded columns as it passes them) accepts it. The layout fast path ([`sealed_layout`])
//! only decides "accepted" when it has proven, byte for byte, that the text is what
//! [`super::seal`] writes for these columns around a canonical `detail` value, which the
//! general check accepts too (the argument is on [`sealed_layout`]); when it cannot prove
//! that (a column that needs escapes, an integer beyond ±(2^53 − 1), another layout, any
//! tampering) it proves nothing and the general check decides and names the reason. The
//! property test `audit::the_layout_fast_path_never_accepts_what_the_general_check_refuses`
//! compares the two on random records and random mutations.

use sha2::{Digest, Sha256};

use super::{AuditRecord, LEGACY_CHAIN, RECORD_VERSION};
use crate::canonical::{
    CanonicalError, MAX_SAFE_INTEGER, check_canonical, decode_raw_string, has_special,
    scan_canonical_object,
};

/// Everything one record must satisfy at position `seq` after a record hashed `prev`.
pub(super) fn check_record(r: &AuditRecord, seq: i64, prev: &str) -> Result<(), String> {
    if r.seq != seq {
        return Err(format!("expected record {seq}, found {}", r.seq));
    }
    let digest = Sha256::digest(r.record.as_bytes());
    if !hash_matches(&r.hash, &digest) {
        return Err("stored hash does not match the record".into());
    }
    // (The parallel pass checks each record against its own `prev`: nothing to compare.)
    if !std::ptr::eq(r.prev.as_str(), prev) && r.prev != prev {
        return Err("does not link to the previous record".into());
    }
    if sealed_layout(r) {
        return Ok(());
    }
    check_text(r, prev)
}

/// Whether `stored` is `sha256:` + the lower-case hex of `digest` (no allocation).
fn hash_matches(stored: &str, digest: &[u8]) -> bool {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 64];
    for (pair, b) in hex.chunks_exact_mut(2).zip(digest) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    digest.len() == 32 && stored.strip_prefix("sha256:").map(str::as_bytes) == Some(&hex[..])
}

/// Reads a record's text from both ends: `front` moves forward from the start, `back`
/// backward from the end. Each step matches one piece exactly or fails.
struct Cursor<'a> {
    text: &'a [u8],
    front: usize,
    back: usize,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a [u8]) -> Self {
        Self {
            text,
            front: 0,
            back: text.len(),
        }
    }

    /// The next `n` bytes from the front, consumed.
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.front.checked_add(n).filter(|&end| end <= self.back)?;
        let got = self.text.get(self.front..end)?;
        self.front = end;
        Some(got)
    }

    /// The last `n` bytes before the back, consumed.
    fn take_back(&mut self, n: usize) -> Option<&'a [u8]> {
        let start = self
            .back
            .checked_sub(n)
            .filter(|&start| start >= self.front)?;
        let got = self.text.get(start..self.back)?;
        self.back = start;
        Some(got)
    }

    /// The next `n` bytes from the front, or the last `n` before the back, consumed.
    fn piece(&mut self, n: usize, from_back: bool) -> Option<&'a [u8]> {
        if from_back {
            self.take_back(n)
        } else {
            self.take(n)
        }
    }

    fn lit<const N: usize>(&mut self, lit: &[u8; N], from_back: bool) -> bool {
        self.piece(N, from_back) == Some(lit.as_slice())
    }

    /// A string column: `null`, or its text between quotes when JCS writes it as itself
    /// (no `"`, `\` or control byte). A column that needs escapes matches nothing here.
    fn column(&mut self, value: Option<&str>, from_back: bool) -> bool {
        let Some(s) = value else {
            return self.lit(b"null", from_back);
        };
        let len = s.len() + 2;
        self.piece(len, from_back).is_some_and(|got| {
            got.first() == Some(&b'"')
                && got.last() == Some(&b'"')
                && got.get(1..len - 1) == Some(s.as_bytes())
        }) && !has_special(s.as_bytes())
    }

    /// An integer column within ±(2^53 − 1), where JCS writes exactly its decimal digits;
    /// any other matches nothing here.
    fn int(&mut self, v: i64, from_back: bool) -> bool {
        let magnitude = v.unsigned_abs();
        if magnitude > MAX_SAFE_INTEGER {
            return false;
        }
        let digits = magnitude.checked_ilog10().map_or(1, |log| log as usize + 1);
        // As many bytes as `v`'s digits and sign, reading as `v`: so no leading zero, and
        // `-` only before a non-zero magnitude.
        self.piece(digits + usize::from(v < 0), from_back)
            .is_some_and(|got| raw_int_is(got, v))
    }
}

/// Whether `r.record` is, byte for byte, the canonical text [`super::body`] has for `r`'s
/// columns, with a canonical `detail` value. `false` proves nothing.
///
/// Why acceptance here implies acceptance by [`check_text`]: the text is then an object
/// whose members are the ten names below (twelve with `chain` and `v` for a record of format
/// version 2, i.e. of any chain but the legacy one), written without escapes and strictly increasing
/// in byte order, which for ASCII names is RFC 8785's UTF-16 order; each value is canonical:
/// a string with no `"`, `\` or control byte written as itself, `null`, the decimal digits
/// of an integer within ±(2^53 − 1) (exactly what JCS writes for it), or `detail`, which
/// [`check_canonical`] accepted as one whole value between the members before it and those
/// after it. So the text is canonical, and each embedded column is the stored column,
/// `prev` included (the caller checked `r.prev == prev`).
fn sealed_layout(r: &AuditRecord) -> bool {
    const FRONT: bool = false;
    const BACK: bool = true;
    let mut c = Cursor::new(r.record.as_bytes());
    // Member names in RFC 8785 order, as `body` names them: those before `detail` from the
    // front, those after it from the back (so in reverse: v, tool, step_id, … event). A
    // legacy (version 1) record has neither `chain` nor `v`.
    let legacy = r.chain == LEGACY_CHAIN;
    let framed = c.lit(b"{\"actor\":", FRONT)
        && c.column(r.actor.as_deref(), FRONT)
        && c.lit(b",\"at\":", FRONT)
        && c.int(r.at, FRONT)
        && (legacy || (c.lit(b",\"chain\":", FRONT) && c.column(Some(&r.chain), FRONT)))
        && c.lit(b",\"detail\":", FRONT)
        && c.lit(b"}", BACK)
        && (legacy || (c.int(RECORD_VERSION, BACK) && c.lit(b",\"v\":", BACK)))
        && c.column(r.tool.as_deref(), BACK)
        && c.lit(b",\"tool\":", BACK)
        && c.column(r.step_id.as_deref(), BACK)
        && c.lit(b",\"step_id\":", BACK)
        && c.int(r.seq, BACK)
        && c.lit(b",\"seq\":", BACK)
        && c.column(r.run_id.as_deref(), BACK)
        && c.lit(b",\"run_id\":", BACK)
        && c.column(r.rule.as_deref(), BACK)
        && c.lit(b",\"rule\":", BACK)
        && c.column(Some(&r.prev), BACK)
        && c.lit(b",\"prev\":", BACK)
        && c.column(Some(&r.event), BACK)
        && c.lit(b",\"event\":", BACK);
    framed
        && r.record
            .get(c.front..c.back)
            .is_some_and(|detail| check_canonical(detail).is_ok())
}

/// The general check of a record's text: canonical form, and the embedded columns, in one
/// pass over the text.
fn check_text(r: &AuditRecord, prev: &str) -> Result<(), String> {
    // A legacy record (format version 1) names no chain and no version; any other names both,
    // its chain being the one it is stored in.
    let legacy = r.chain == LEGACY_CHAIN;
    let mut seen = 0u16;
    let mut bad: Option<&'static str> = None;
    let scanned = scan_canonical_object(&r.record, |name, raw| {
        let (bit, ok) = match name {
            "seq" => (1, raw_int_is(raw.as_bytes(), r.seq)),
            "at" => (2, raw_int_is(raw.as_bytes(), r.at)),
            "event" => (4, raw_is(raw, Some(&r.event))),
            "run_id" => (8, raw_is(raw, r.run_id.as_deref())),
            "step_id" => (16, raw_is(raw, r.step_id.as_deref())),
            "tool" => (32, raw_is(raw, r.tool.as_deref())),
            "actor" => (64, raw_is(raw, r.actor.as_deref())),
            "rule" => (128, raw_is(raw, r.rule.as_deref())),
            "prev" => (256, raw_is(raw, Some(prev))),
            "chain" => (512, !legacy && raw_is(raw, Some(&r.chain))),
            "v" => (1024, !legacy && raw_int_is(raw.as_bytes(), RECORD_VERSION)),
            _ => (0, true),
        };
        seen |= bit;
        if !ok && bad.is_none() {
            bad = Some(if bit == 256 {
                "does not link to the previous record"
            } else {
                "columns disagree with the hashed record"
            });
        }
    });
    match scanned {
        Err(CanonicalError::NotJson(e)) => return Err(format!("record is not JSON: {e}")),
        Err(CanonicalError::NotCanonical) => return Err("record text is not canonical".into()),
        Err(e) => return Err(e.to_string()),
        Ok(()) => {}
    }
    if let Some(reason) = bad {
        return Err(reason.into());
    }
    // seq, at, event and prev are never null, so they must be present; an absent optional
    // column reads as null.
    let optional_absent_ok = [
        (8, r.run_id.is_none()),
        (16, r.step_id.is_none()),
        (32, r.tool.is_none()),
        (64, r.actor.is_none()),
        (128, r.rule.is_none()),
    ]
    .iter()
    .all(|(bit, none)| seen & bit != 0 || *none);
    if seen & 256 == 0 {
        return Err("does not link to the previous record".into());
    }
    let versioned = if legacy { 0 } else { 512 | 1024 };
    if seen & 7 != 7 || !optional_absent_ok || seen & (512 | 1024) != versioned {
        return Err("columns disagree with the hashed record".into());
    }
    Ok(())
}

/// Whether a raw number token from canonical text is the integer `want`. JCS writes every
/// integer an `i64` column can hold (below 10^21) as plain digits, so comparing digits is
/// exact; a token of more than 18 digits takes the general parse.
fn raw_int_is(raw: &[u8], want: i64) -> bool {
    let (negative, digits) = match raw.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, raw),
    };
    if digits.is_empty() || digits.len() > 18 {
        return std::str::from_utf8(raw).is_ok_and(|raw| raw.parse::<i64>() == Ok(want));
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return false;
        }
        value = value * 10 + i64::from(d - b'0');
    }
    (if negative { -value } else { value }) == want
}

/// Whether a raw value token from canonical text is the string `want` (or null for `None`).
fn raw_is(raw: &str, want: Option<&str>) -> bool {
    match want {
        None => raw == "null",
        Some(want) => {
            let Some(inner) = raw
                .strip_prefix('"')
                .and_then(|r| r.strip_suffix('"'))
                .filter(|_| raw.len() >= 2)
            else {
                return false;
            };
            // Common case: written as itself. Otherwise it can only match through escapes.
            inner == want
                || (inner.contains('\\') && decode_raw_string(inner).is_ok_and(|s| s == want))
        }
    }
}

/// Test access: whether the layout fast path alone accepts `r`, and what the general check
/// alone says (both after the same seq, hash and link checks as [`check_record`]).
#[cfg(feature = "test-support")]
pub fn fast_and_general(r: &AuditRecord, prev: &str) -> (bool, Result<(), String>) {
    (sealed_layout(r), check_text(r, prev))
}
