//! `audit verify` throughput: [`verify`] over 1,000,000 in-memory records (built with the
//! append path's own [`seal`], so the canonical bytes are exactly what is stored), next to
//! raw SHA-256 over the same record bytes in the same run: the physical floor, since verify
//! must at least hash every record. Target: verify ≥ 50 % of raw SHA-256 throughput.
//!
//! Verify checks each record (SHA-256, canonical form, columns) on several threads and walks
//! the chain links sequentially, so the comparison is printed both ways, from one run:
//! * single-threaded verify against single-threaded raw SHA-256 (like for like);
//! * N-threaded verify (what `audit verify` does) against single-threaded raw SHA-256 and
//!   against raw SHA-256 spread over the same N threads (like for like again).
//!
//! Run with `cargo bench -p countersign-core --bench audit_verify`; `AUDIT_VERIFY_RECORDS`
//! overrides the record count (e.g. 100000 while iterating). Prints records/s and ratios
//! (median of 5 passes each). Criterion also times both over 100,000 records.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use countersign_core::audit::{
    AuditEvent, AuditRecord, GENESIS, NewAuditRecord, default_threads, seal, verify,
    verify_with_threads,
};
use criterion::{Criterion, criterion_group};
use serde_json::json;
use sha2::{Digest, Sha256};

const RECORDS: usize = 1_000_000;

/// A realistic record: a payment step's redacted inputs, decision and outcome.
fn new_record(i: usize) -> (NewAuditRecord, AuditEvent) {
    let events = [
        AuditEvent::Proposed,
        AuditEvent::Decided,
        AuditEvent::Started,
        AuditEvent::Succeeded,
    ];
    let event = events[i % events.len()];
    let mut detail = serde_json::Map::new();
    detail.insert(
        "inputs".into(),
        json!({
            "invoice_id": format!("INV-{:08}", i / 4),
            "amount": 4180.25 + (i / 4) as f64,
            "currency": "EUR",
            "iban": "hmac-sha256:9f2c1a7be0d44c05a8e1f3b6c2d9e7a41b5c8d0e2f3a4b5c6d7e8f9a0b1c2d3e",
            "value_date": "2026-06-15"
        }),
    );
    detail.insert("idem_key".into(), json!(format!("idem:{:064x}", i / 4)));
    detail.insert(
        "outcome".into(),
        json!({"status": "ok", "latency_ms": 41 + i % 17}),
    );
    let new = NewAuditRecord {
        event: Some(event),
        run_id: Some(format!("run-{:06}", i / 40)),
        step_id: Some(format!("step-{:08}", i / 4)),
        tool: Some("payment.schedule".into()),
        actor: Some("worker.finance/agent-fin-1".into()),
        rule: Some("payment.over_limit_needs_approval".into()),
        detail,
        tenant: None,
    };
    (new, event)
}

fn chain(n: usize) -> Vec<AuditRecord> {
    let mut prev = GENESIS.to_string();
    (0..n)
        .map(|i| {
            let (new, event) = new_record(i);
            let r = seal(
                countersign_core::audit::SYSTEM_CHAIN,
                &new,
                event,
                i as i64 + 1,
                1_781_170_937_000 + i as i64,
                &prev,
            )
            .unwrap();
            prev.clone_from(&r.hash);
            r
        })
        .collect()
}

#[inline(never)]
fn raw_sha256(records: &[AuditRecord]) -> u8 {
    let mut acc = 0u8;
    for r in records {
        acc ^= Sha256::digest(r.record.as_bytes())[0];
    }
    acc
}

/// Raw SHA-256 of every record on `threads` threads, in contiguous chunks (as verify splits).
fn raw_sha256_threads(records: &[AuditRecord], threads: usize) -> u8 {
    let size = records.len().div_ceil(threads.max(1));
    std::thread::scope(|s| {
        let handles: Vec<_> = records
            .chunks(size)
            .map(|c| s.spawn(move || raw_sha256(c)))
            .collect();
        handles
            .into_iter()
            .fold(0, |acc, h| acc ^ h.join().unwrap())
    })
}

fn bench(c: &mut Criterion) {
    let records = chain(100_000);
    let mut group = c.benchmark_group("audit 100k records");
    group.sample_size(10);
    group.bench_function("verify", |b| {
        b.iter(|| black_box(verify(black_box(&records), 1, GENESIS).unwrap()));
    });
    group.bench_function("raw sha256", |b| {
        b.iter(|| black_box(raw_sha256(black_box(&records))));
    });
    group.finish();
}

criterion_group!(benches, bench);

fn median(mut f: impl FnMut() -> Duration) -> Duration {
    let mut times: Vec<Duration> = (0..5).map(|_| f()).collect();
    times.sort();
    times[times.len() / 2]
}

/// `AUDIT_VERIFY_PROFILE=1`: one pass of raw SHA-256 and one single-threaded verify over
/// `AUDIT_VERIFY_RECORDS` (default 2,000) records and nothing else, for an instruction
/// profile: `valgrind --tool=callgrind` on this binary, then compare the inclusive cost of
/// `raw_sha256` with `verify_with_threads` (per record, independent of machine load).
#[inline(never)]
fn profile_once() {
    let n: usize = std::env::var("AUDIT_VERIFY_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let records = chain(n);
    black_box(raw_sha256(black_box(&records)));
    assert_eq!(
        verify_with_threads(black_box(&records), 1, GENESIS, 1),
        Ok(n as i64)
    );
}

fn main() {
    if std::env::var_os("AUDIT_VERIFY_PROFILE").is_some() {
        profile_once();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();

    // In cache: 2,000 records, 500 passes.
    let small = chain(2_000);
    let sha_c = median(|| {
        let t = Instant::now();
        for _ in 0..500 {
            black_box(raw_sha256(black_box(&small)));
        }
        t.elapsed()
    });
    let ver_c = median(|| {
        let t = Instant::now();
        for _ in 0..500 {
            assert_eq!(verify(black_box(&small), 1, GENESIS), Ok(2_000));
        }
        t.elapsed()
    });
    println!(
        "in cache (2,000 records x 500, both single-threaded: too few records to split): verify at {:.0} % of raw SHA-256",
        100.0 * sha_c.as_secs_f64() / ver_c.as_secs_f64()
    );

    let n: usize = std::env::var("AUDIT_VERIFY_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RECORDS);
    let threads = default_threads();
    let records = chain(n);
    let bytes: usize = records.iter().map(|r| r.record.len()).sum();
    let time = |f: &dyn Fn()| {
        median(|| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
    };
    let sha1 = time(&|| {
        black_box(raw_sha256(black_box(&records)));
    });
    let shan = time(&|| {
        black_box(raw_sha256_threads(black_box(&records), threads));
    });
    let ver1 = time(&|| {
        assert_eq!(
            verify_with_threads(black_box(&records), 1, GENESIS, 1),
            Ok(n as i64)
        );
    });
    let vern = time(&|| {
        assert_eq!(
            verify_with_threads(black_box(&records), 1, GENESIS, threads),
            Ok(n as i64)
        );
    });
    let per_s = |d: Duration| n as f64 / d.as_secs_f64();
    let pct = |a: Duration, b: Duration| 100.0 * per_s(a) / per_s(b);
    println!(
        "audit verify over {n} records ({:.0} bytes/record), {threads} thread(s) available:",
        bytes as f64 / n as f64
    );
    println!(
        "  raw SHA-256, 1 thread:         {:>10.0} records/s ({sha1:?})",
        per_s(sha1)
    );
    println!(
        "  raw SHA-256, {threads} threads:        {:>10.0} records/s ({shan:?})",
        per_s(shan)
    );
    println!(
        "  verify, 1 thread:              {:>10.0} records/s ({ver1:?})",
        per_s(ver1)
    );
    println!(
        "  verify, {threads} threads (default):  {:>10.0} records/s ({vern:?})",
        per_s(vern)
    );
    println!(
        "  single-threaded verify vs single-threaded raw SHA-256: {:.0} %",
        pct(ver1, sha1)
    );
    println!(
        "  {threads}-thread verify vs single-threaded raw SHA-256:    {:.0} %",
        pct(vern, sha1)
    );
    println!(
        "  {threads}-thread verify vs {threads}-thread raw SHA-256:          {:.0} %",
        pct(vern, shan)
    );
}
