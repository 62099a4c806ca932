//! The chain itself: a record's canonical body and hash, sealing a record onto the chain, and
//! verifying a chain (in parallel over record ranges, then stitched) with the first break named.

use super::check::check_record;
use super::{AuditEvent, AuditRecord, NewAuditRecord, RECORD_VERSION};
use crate::canonical::{CanonicalError, canonicalize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The first broken link of a chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("audit chain {chain} broken at record {seq}: {reason}")]
pub struct ChainBreak {
    /// The chain (empty when the verifier was not told which).
    pub chain: String,
    /// The `seq` of the first bad record (or where a missing one should be).
    pub seq: i64,
    /// What is wrong.
    pub reason: String,
}

/// `sha256:` + hex of SHA-256 over `text`.
pub fn hash_text(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    out.push_str(&crate::keys::hex(&digest));
    out
}

pub(crate) fn body(
    chain: &str,
    new: &NewAuditRecord,
    event: AuditEvent,
    seq: i64,
    at: i64,
    prev: &str,
) -> Value {
    json!({
        "chain": chain,
        "v": RECORD_VERSION,
        "seq": seq,
        "at": at,
        "event": event.as_str(),
        "run_id": new.run_id,
        "step_id": new.step_id,
        "tool": new.tool,
        "actor": new.actor,
        "rule": new.rule,
        "detail": Value::Object(new.detail.clone()),
        "prev": prev,
    })
}

/// Builds the record that appending `new` as `event` to `chain` at `seq`, time `at`, after a
/// record hashed `prev` stores: its canonical text (format [`RECORD_VERSION`]) and hash. Pure
/// (no database); the append path and tools that build chains offline (the benchmark) share
/// it.
///
/// # Errors
/// `detail` holds a value with no canonical form. (Nothing seals onto the frozen
/// [`LEGACY_CHAIN`]: no tenant maps to it and the database refuses its appends.)
pub fn seal(
    chain: &str,
    new: &NewAuditRecord,
    event: AuditEvent,
    seq: i64,
    at: i64,
    prev: &str,
) -> Result<AuditRecord, CanonicalError> {
    let record = canonicalize(&body(chain, new, event, seq, at, prev))?;
    let hash = hash_text(&record);
    Ok(AuditRecord {
        chain: chain.to_string(),
        seq,
        pos: 0,
        at,
        event: event.as_str().to_string(),
        run_id: new.run_id.clone(),
        step_id: new.step_id.clone(),
        tool: new.tool.clone(),
        actor: new.actor.clone(),
        rule: new.rule.clone(),
        record,
        prev: prev.to_string(),
        hash,
    })
}

/// Checks a chain given in `seq` order, starting at `expected_prev` (use [`GENESIS`] for a
/// whole chain) and `first_seq`. Returns how many records were verified. Uses up to
/// [`default_threads`] threads for the per-record checks (see [`ChainVerifier::push_all`]).
pub fn verify(
    records: &[AuditRecord],
    first_seq: i64,
    expected_prev: &str,
) -> Result<i64, ChainBreak> {
    verify_with_threads(records, first_seq, expected_prev, default_threads())
}

/// [`verify`] on exactly `threads` threads (1 = all on the calling thread).
pub fn verify_with_threads(
    records: &[AuditRecord],
    first_seq: i64,
    expected_prev: &str,
    threads: usize,
) -> Result<i64, ChainBreak> {
    let mut v = ChainVerifier::new(first_seq, expected_prev).threads(threads);
    v.push_all(records)?;
    v.finish()
}

/// The machine's available parallelism, at most 8 (1 when unknown).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// Below this many records per thread, threads cost more than they save.
pub(crate) const MIN_RECORDS_PER_THREAD: usize = 2_048;

/// What the parallel pass proved of one record.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Proven {
    /// [`check_record`] passes at the record's own `seq` after its own `prev` (its hash,
    /// canonical form and columns).
    consistent: bool,
    /// It directly follows the record before it in the slice: `seq` one more, `prev` that
    /// record's `hash`. Never set for the first record of a chunk (its predecessor is in
    /// another chunk) nor for the first of the slice.
    linked: bool,
}

/// [`Proven`] for each record, computed in `threads` contiguous chunks. Position and link
/// across chunks, and checkpoints, are left to the sequential pass.
pub(crate) fn prove(records: &[AuditRecord], threads: usize) -> Vec<Proven> {
    let one = |chunk: &[AuditRecord]| -> Vec<Proven> {
        let mut before: Option<&AuditRecord> = None;
        chunk
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if let Some(next) = chunk.get(i + 1) {
                    touch(next);
                }
                let linked =
                    before.is_some_and(|b| b.seq.checked_add(1) == Some(r.seq) && b.hash == r.prev);
                before = Some(r);
                Proven {
                    consistent: check_record(r, r.seq, &r.prev).is_ok(),
                    linked,
                }
            })
            .collect()
    };
    let threads = threads
        .max(1)
        .min(records.len() / MIN_RECORDS_PER_THREAD)
        .max(1);
    if threads == 1 {
        return one(records);
    }
    let size = records.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = records
            .chunks(size)
            .map(|chunk| scope.spawn(move || one(chunk)))
            .collect();
        let mut out = Vec::with_capacity(records.len());
        for h in handles {
            match h.join() {
                Ok(part) => out.extend(part),
                // A panicking check proves nothing: every record of that chunk is re-checked
                // sequentially (fail closed, same first break).
                Err(_) => out.resize(out.len() + size, Proven::default()),
            }
        }
        out.truncate(records.len());
        out
    })
}

/// Reads one byte of each of a record's heap strings so their cache misses overlap with the
/// work on the record before it (verify is otherwise bound by memory latency, not hashing).
pub(crate) fn touch(r: &AuditRecord) {
    let first = |s: &str| s.as_bytes().first().copied().unwrap_or(0);
    let opt = |s: &Option<String>| s.as_deref().map_or(0, first);
    std::hint::black_box(
        first(&r.record)
            ^ first(&r.hash)
            ^ first(&r.prev)
            ^ first(&r.event)
            ^ opt(&r.run_id)
            ^ opt(&r.step_id)
            ^ opt(&r.tool)
            ^ opt(&r.actor)
            ^ opt(&r.rule),
    );
}

/// A hash a signed checkpoint (stored, or read from a file) says the chain has at `seq`.
#[derive(Debug, Clone)]
pub(crate) struct Expectation {
    hash: String,
    source: String,
}

/// Verifies a chain record by record, in `seq` order, and checks it against checkpoint
/// hashes as it passes their `seq`.
///
/// INVARIANT (fails closed): the first problem met, in `seq` order, is reported; a checkpoint
/// whose `seq` lies beyond the last record pushed is a truncation, reported by
/// [`ChainVerifier::finish`] at the first missing record.
#[derive(Debug, Clone)]
pub struct ChainVerifier {
    /// The chain verified (empty: not told; then records of any chain are taken as given).
    chain: String,
    next_seq: i64,
    prev: String,
    expected: BTreeMap<i64, Vec<Expectation>>,
    /// Highest `seq` at which a checkpoint matched (or `first_seq - 1`).
    last_matched: i64,
    count: i64,
    sparse: bool,
    skipped_checkpoints: usize,
    threads: usize,
}

impl ChainVerifier {
    /// Starts at `first_seq`, taking `prev` as the hash of the record before it.
    pub fn new(first_seq: i64, prev: &str) -> Self {
        Self {
            chain: String::new(),
            next_seq: first_seq,
            prev: prev.to_string(),
            expected: BTreeMap::new(),
            last_matched: first_seq.saturating_sub(1),
            count: 0,
            sparse: false,
            skipped_checkpoints: 0,
            threads: 1,
        }
    }

    /// Verifies chain `chain`: a record of another chain is a break (and breaks name it).
    pub fn chain(mut self, chain: &str) -> Self {
        self.chain = chain.to_string();
        self
    }

    /// The hash of the last record accepted (the `prev` the next one must carry).
    pub fn last_hash(&self) -> &str {
        &self.prev
    }

    /// The chain verified (empty when not told).
    pub fn chain_name(&self) -> &str {
        &self.chain
    }

    /// Lets [`ChainVerifier::push_all`] check records on up to `n` threads.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// Checks the next records, in order: the same checks and the same first break as
    /// [`ChainVerifier::push`] on each in turn. The per-record work (SHA-256, canonical form,
    /// columns, the link to the record before it in the same chunk) runs on up to
    /// [`ChainVerifier::threads`] threads over contiguous chunks; the chain itself (`seq`
    /// order, each `prev` = the hash before it, checkpoints) is then walked sequentially. A record found inconsistent, or met at another position or after
    /// another hash than it states, goes through the full sequential check, which names the
    /// break exactly as [`ChainVerifier::push`] would.
    ///
    /// # Errors
    /// The first thing wrong, named by its `seq`.
    pub fn push_all(&mut self, records: &[AuditRecord]) -> Result<(), ChainBreak> {
        let proven = prove(records, self.threads);
        // `self.prev` is brought up to date lazily: while records pass on the fast path the
        // current `prev` is the hash of `records[accepted]`, copied into `self.prev` before
        // anything reads it.
        let mut accepted: Option<usize> = None;
        for (i, (r, p)) in records.iter().zip(proven).enumerate() {
            // Fast path: proven consistent and linked to the record just accepted (so at the
            // expected position after the expected hash), no checkpoint due at this `seq`,
            // not a sparse export: exactly what `push_with` would accept, without touching
            // the record again.
            // (`linked` is never set for the first record, and every record before `i` was
            // accepted or the loop has returned: so `records[i - 1]` is the one just accepted.)
            if p.consistent
                && p.linked
                && !self.sparse
                && (self.chain.is_empty() || r.chain == self.chain)
                && self.next_seq < i64::MAX
                && (self.expected.is_empty() || !self.expected.contains_key(&self.next_seq))
            {
                self.next_seq += 1;
                self.count += 1;
                accepted = Some(i);
                continue;
            }
            if let Some(a) = accepted.take() {
                self.prev.clone_from(&records[a].hash);
            }
            self.push_with(r, p.consistent)?;
            accepted = Some(i);
        }
        if let Some(a) = accepted {
            self.prev.clone_from(&records[a].hash);
        }
        Ok(())
    }

    /// Accepts gaps in `seq` (an export of one run's records): across a gap the next
    /// record's `prev` is taken as given, so a record missing there cannot be detected.
    pub fn sparse(mut self) -> Self {
        self.sparse = true;
        self
    }

    /// The `seq` the next record must have.
    pub fn next_seq(&self) -> i64 {
        self.next_seq
    }

    /// Checkpoints that could not be checked (before the first record, or in a gap).
    pub fn skipped_checkpoints(&self) -> usize {
        self.skipped_checkpoints
    }

    /// Checkpoints for records after the last one pushed so far (a sparse export that ends
    /// before them never compares them; a whole chain refuses them at [`Self::finish`]).
    pub fn pending_checkpoints(&self) -> usize {
        self.expected.values().map(Vec::len).sum()
    }

    /// Requires the chain to hold `hash` at `seq` (`source` names the checkpoint in
    /// messages). Call before pushing records.
    ///
    /// # Errors
    /// The checkpoint is for the record just before the first one and `prev` differs.
    pub fn expect(
        &mut self,
        seq: i64,
        hash: &str,
        source: impl Into<String>,
    ) -> Result<(), ChainBreak> {
        let source = source.into();
        if self.next_seq.checked_sub(1) == Some(seq) && self.count == 0 {
            if hash != self.prev {
                return Err(ChainBreak {
                    chain: self.chain.clone(),
                    seq: self.next_seq,
                    reason: format!(
                        "its prev {} is not the hash {hash} that {source} signed for record {seq}",
                        self.prev
                    ),
                });
            }
            return Ok(());
        }
        if seq < self.next_seq {
            self.skipped_checkpoints += 1;
            return Ok(());
        }
        self.expected.entry(seq).or_default().push(Expectation {
            hash: hash.to_string(),
            source,
        });
        Ok(())
    }

    /// Checks the next record.
    ///
    /// # Errors
    /// The first thing wrong with it, named by its `seq`.
    pub fn push(&mut self, r: &AuditRecord) -> Result<(), ChainBreak> {
        self.push_with(r, false)
    }

    /// [`ChainVerifier::push`]; `consistent` = `check_record(r, r.seq, &r.prev)` is known to
    /// pass, so when `r` is at its expected position after the expected hash the check is
    /// skipped (it would be the very same check).
    fn push_with(&mut self, r: &AuditRecord, consistent: bool) -> Result<(), ChainBreak> {
        let seq = self.next_seq;
        if self.sparse && r.seq > seq {
            // A gap: checkpoints inside it cannot be checked, except one right before `r`.
            let gap: Vec<i64> = self.expected.range(..r.seq).map(|(s, _)| *s).collect();
            for s in gap {
                let Some(exps) = self.expected.remove(&s) else {
                    continue;
                };
                if s == r.seq - 1 {
                    for e in exps {
                        if e.hash != r.prev {
                            return Err(ChainBreak {
                                chain: self.chain.clone(),
                                seq: r.seq,
                                reason: format!(
                                    "its prev {} is not the hash {} that {} signed for record {s}",
                                    r.prev, e.hash, e.source
                                ),
                            });
                        }
                    }
                } else {
                    self.skipped_checkpoints += exps.len();
                }
            }
            self.next_seq = r.seq;
            self.prev.clone_from(&r.prev);
        }
        let seq = if self.sparse { self.next_seq } else { seq };
        // INVARIANT (fails closed): no record is accepted at the last `seq` an `i64` holds,
        // so `next_seq` never overflows (the fast path of `push_all` stops short of it too).
        let Some(after) = seq.checked_add(1) else {
            return Err(ChainBreak {
                chain: self.chain.clone(),
                seq,
                reason: "its seq is the largest a chain can hold: nothing can follow it".into(),
            });
        };
        if !self.chain.is_empty() && r.chain != self.chain {
            return Err(ChainBreak {
                chain: self.chain.clone(),
                seq,
                reason: format!("a record of chain {:?} stands in this chain", r.chain),
            });
        }
        if !(consistent && r.seq == seq && r.prev == self.prev) {
            check_record(r, seq, &self.prev).map_err(|reason| ChainBreak {
                chain: self.chain.clone(),
                seq,
                reason,
            })?;
        }
        if let Some(exps) = self.expected.remove(&seq) {
            for e in exps {
                if e.hash != r.hash {
                    return Err(ChainBreak {
                        chain: self.chain.clone(),
                        seq: self.last_matched.saturating_add(1),
                        reason: format!(
                            "record {seq} hashes to {} but {} signed {}: a record in {}..={seq} \
                             was rewritten",
                            r.hash,
                            e.source,
                            e.hash,
                            self.last_matched.saturating_add(1)
                        ),
                    });
                }
            }
            self.last_matched = seq;
        }
        self.prev.clone_from(&r.hash);
        self.next_seq = after;
        self.count += 1;
        Ok(())
    }

    /// Ends the chain; returns how many records were verified.
    ///
    /// # Errors
    /// A checkpoint lies beyond the last record: the chain was truncated (except for a
    /// sparse export, which may end anywhere).
    pub fn finish(self) -> Result<i64, ChainBreak> {
        if let Some((seq, exps)) = self.expected.iter().next()
            && !self.sparse
        {
            let source = exps
                .first()
                .map(|e| e.source.as_str())
                .unwrap_or("a checkpoint");
            return Err(ChainBreak {
                chain: self.chain.clone(),
                seq: self.next_seq,
                reason: format!(
                    "missing: the chain ends at record {} but {source} signed record {seq}; \
                     the tail was truncated",
                    self.next_seq.saturating_sub(1)
                ),
            });
        }
        Ok(self.count)
    }
}
