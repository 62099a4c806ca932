//! `countersign audit …` end to end on both backends: one chain per tenant (and `_system`),
//! checkpoint notes over every chain signed on demand and by the server, verify against the
//! stored log of checkpoints and exported notes, exports (whole, one tenant's with its
//! inclusion proof, `--since`, `--run`) that verify offline, and the redaction key's
//! fingerprint in the trail.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::audit::checkpoint::CheckpointSigner;
use countersign_core::audit::note::CheckpointNote;
use countersign_core::audit::tree_head::{CheckpointLeaves, InclusionProof, Leaf, TreeHead};
use countersign_core::audit::{AuditEvent, AuditRecord, NewAuditRecord, SYSTEM_CHAIN, seal};
use countersign_core::store::testing::FreshDb;
use countersign_core::{Backend, Store, SystemClock};
use serde_json::json;

use crate::helpers::{countersign_on, spawn_app_with};

/// Test-only seeds (hex), never used outside tests.
const KEY_A: &str = "0707070707070707070707070707070707070707070707070707070707070707";
const KEY_B: &str = "0909090909090909090909090909090909090909090909090909090909090909";

/// The tenant record `i` belongs to: even ones to acme, the others alternately to globex and
/// to no tenant (the `_system` chain).
fn tenant_of(i: usize) -> Option<&'static str> {
    match i % 4 {
        0 | 2 => Some("acme"),
        1 => Some("globex"),
        _ => None,
    }
}

/// Record `i` of `tenant`'s chain: acme's records belong to runs `run-b` (every other one)
/// and `run-a`, globex's to `run-g`, the system's to none.
fn new_record(i: usize, tenant: Option<&str>) -> NewAuditRecord {
    let run = match tenant {
        Some("acme") if i.is_multiple_of(4) => Some("run-b"),
        Some("acme") => Some("run-a"),
        Some(_) => Some("run-g"),
        None => None,
    };
    NewAuditRecord {
        event: Some(if i.is_multiple_of(2) {
            AuditEvent::Proposed
        } else {
            AuditEvent::Refused
        }),
        run_id: run.map(str::to_string),
        tool: Some("supplier.update_iban".into()),
        rule: Some("role.tool_not_listed".into()),
        tenant: tenant.map(str::to_string),
        ..NewAuditRecord::default()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Exit 1 with one line naming `needle`; returns that line.
#[track_caller]
fn broken(o: &Output, needle: &str) -> String {
    assert_eq!(
        o.status.code(),
        Some(1),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    let err = stderr(o);
    assert!(err.contains(needle), "wanted {needle:?} in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// `text` contains `needle`.
#[track_caller]
fn says(text: &str, needle: &str) {
    assert!(text.contains(needle), "wanted {needle:?} in: {text}");
}

struct Env {
    url: String,
    dir: PathBuf,
}

impl Env {
    fn run(&self, args: &[&str], key: Option<&str>) -> Output {
        let mut cmd = countersign_on(&self.url);
        if let Some(k) = key {
            cmd.env("COUNTERSIGN_AUDIT_SIGNING_KEY", k);
        }
        cmd.args(args).output().unwrap()
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn write(&self, name: &str, text: &str) -> String {
        std::fs::write(self.dir.join(name), text).unwrap();
        self.path(name)
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(path).unwrap()
    }
}

async fn append(store: &Store, from: usize, to: usize) {
    for i in from..to {
        store
            .append_audit(&new_record(i, tenant_of(i)))
            .await
            .unwrap();
    }
}

fn temp_dir(tag: &str, backend: Backend) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cs-audit-{tag}-{}-{}",
        backend.as_str(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Lines joined as a file's text.
fn file_text(lines: &[String]) -> String {
    lines.join("\n") + "\n"
}

/// An export's opening proof (if any) and its records.
fn parse_export(text: &str) -> (Option<InclusionProof>, Vec<AuditRecord>) {
    let mut proof = None;
    let mut records = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if n == 0
            && let Ok(p) = serde_json::from_str::<InclusionProof>(line)
        {
            proof = Some(p);
            continue;
        }
        if n == 0 && serde_json::from_str::<CheckpointLeaves>(line).is_ok() {
            continue;
        }
        records.push(serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")));
    }
    (proof, records)
}

/// `(chain, seq of its first record, how many records)`, in the export's order; panics when
/// a chain's records are not consecutive.
fn chains_of(records: &[AuditRecord]) -> Vec<(String, i64, usize)> {
    let mut out: Vec<(String, i64, usize)> = Vec::new();
    for r in records {
        match out.last_mut() {
            Some((chain, first, n)) if *chain == r.chain => {
                assert_eq!(r.seq, *first + *n as i64, "{r:?}");
                *n += 1;
            }
            _ => {
                assert!(
                    out.iter().all(|(c, _, _)| *c != r.chain),
                    "chain {} is split: {records:?}",
                    r.chain
                );
                out.push((r.chain.clone(), r.seq, 1));
            }
        }
    }
    out
}

fn seqs(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
    pairs.iter().map(|(c, s)| ((*c).to_string(), *s)).collect()
}

/// Checks that `th` covers every non-empty chain exactly at its head (the head row, and the
/// record there); returns each covered chain's `seq`.
async fn covered(store: &Store, th: &TreeHead) -> BTreeMap<String, i64> {
    let mut heads = Vec::new();
    for chain in store.audit_chain_names().await.unwrap() {
        let (seq, hash) = store.audit_chain_head(&chain).await.unwrap().unwrap();
        if seq > 0 {
            let record = store.audit_records(&chain, seq, 1).await.unwrap();
            assert_eq!(
                record[0].hash, hash,
                "{chain}: the head row names its last record"
            );
            heads.push(Leaf { chain, seq, hash });
        }
    }
    let mut leaves = th.leaves.clone();
    leaves.sort_by(|a, b| a.chain.cmp(&b.chain));
    heads.sort_by(|a, b| a.chain.cmp(&b.chain));
    assert_eq!(
        leaves,
        heads,
        "checkpoint {} covers every head",
        th.number()
    );
    assert_eq!(th.note.body.size, th.leaves.len() as u64);
    leaves.into_iter().map(|l| (l.chain, l.seq)).collect()
}

/// `text` with the base64 character at byte `at` replaced by another one.
fn flip_b64(text: &str, at: usize) -> String {
    let mut bytes = text.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}

/// A checkpoint note with one character of its Ed25519 signature changed (past the key id).
fn forge_signature(note: &str) -> String {
    let (signed, sigs) = note.split_once("\n\n").unwrap();
    let blob = sigs.rfind(' ').unwrap() + 1;
    format!("{signed}\n\n{}", flip_b64(sigs, blob + 20))
}

/// A checkpoint note whose root hash was changed, its signature kept.
fn forge_root(note: &str) -> String {
    let root_at = note.match_indices('\n').nth(1).unwrap().0 + 1;
    flip_b64(note, root_at + 5)
}

/// `records` from index `from` on rewritten (a changed detail) and re-sealed after `prev`, so
/// that they link: what someone able to rewrite an export would do.
fn rewritten_from(records: &[AuditRecord], from: usize, prev: &str) -> Vec<AuditRecord> {
    let mut out = records[..from].to_vec();
    let mut prev = prev.to_string();
    for r in &records[from..] {
        let event: AuditEvent = serde_json::from_value(json!(r.event)).unwrap();
        let mut new = NewAuditRecord {
            event: Some(event),
            run_id: r.run_id.clone(),
            step_id: r.step_id.clone(),
            tool: r.tool.clone(),
            actor: r.actor.clone(),
            rule: r.rule.clone(),
            ..NewAuditRecord::default()
        };
        new.detail.insert("iban".into(), json!("attacker"));
        let forged = seal(&r.chain, &new, event, r.seq, r.at, &prev).unwrap();
        prev.clone_from(&forged.hash);
        out.push(forged);
    }
    out
}

fn jsonl(records: &[AuditRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect()
}

#[test]
fn public_key_and_checkpoint_need_the_signing_key_and_never_show_it() {
    let out = crate::helpers::countersign_cmd()
        .args(["audit", "public-key"])
        .env("COUNTERSIGN_LOG_LEVEL", "off")
        .output()
        .unwrap();
    broken(&out, "audit_signing_key");

    let out = crate::helpers::countersign_cmd()
        .args(["audit", "public-key"])
        .env("COUNTERSIGN_AUDIT_SIGNING_KEY", KEY_A)
        .output()
        .unwrap();
    let shown = ok(&out);
    let expected = CheckpointSigner::parse(KEY_A)
        .unwrap()
        .public_key()
        .to_string();
    assert_eq!(shown.trim(), expected);
    assert!(!shown.contains(KEY_A));

    // A malformed key is a configuration error (exit 2) that does not echo the value.
    let out = crate::helpers::countersign_cmd()
        .args(["audit", "public-key"])
        .env("COUNTERSIGN_AUDIT_SIGNING_KEY", "0707not-a-key")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("COUNTERSIGN_AUDIT_SIGNING_KEY") && !err.contains("0707not"),
        "{err}"
    );

    let out = crate::helpers::countersign_cmd()
        .args(["audit", "public-key"])
        .env("COUNTERSIGN_REDACTION_KEY", "too short")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("COUNTERSIGN_REDACTION_KEY") && !err.contains("too short"),
        "{err}"
    );
}

#[tokio::test]
async fn verify_checks_checkpoints_and_exports_verify_offline() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(db) = FreshDb::create(backend).await else {
            continue;
        };
        let env = Env {
            url: db.url.expose().clone(),
            dir: temp_dir("flow", backend),
        };
        let store = db.store(Arc::new(SystemClock)).await;
        scenario(&env, &store, backend).await;
        store.close().await;
        db.drop_db().await;
        let _ = std::fs::remove_dir_all(&env.dir);
    }
}

/// What the scenario's steps share.
struct Keys {
    a: CheckpointSigner,
    pub_a: String,
    pub_b: String,
}

async fn scenario(env: &Env, store: &Store, backend: Backend) {
    let a = CheckpointSigner::parse(KEY_A).unwrap();
    let keys = Keys {
        pub_a: a.public_key().to_string(),
        pub_b: CheckpointSigner::parse(KEY_B)
            .unwrap()
            .public_key()
            .to_string(),
        a,
    };

    // Nothing to sign yet.
    broken(
        &env.run(&["audit", "checkpoint"], Some(KEY_A)),
        "the audit trail is empty: nothing to sign",
    );
    // Records 0..8: acme 1..=4, globex 1..=2, _system 1..=2.
    append(store, 0, 8).await;

    // No checkpoint covers acme yet: its export carries no proof, and says so.
    let out = env.run(&["audit", "export", "--tenant", "acme"], None);
    let (proof, records) = parse_export(&ok(&out));
    assert!(proof.is_none());
    assert_eq!(chains_of(&records), vec![("acme".to_string(), 1, 4)]);
    says(&stderr(&out), "no checkpoint covers chain acme");

    let cp_file = env.path("cp1.note");
    let out = env.run(&["audit", "checkpoint", "--out", &cp_file], Some(KEY_A));
    ok(&out);
    says(&stderr(&out), "checkpoint 1 over 3 chain(s)");
    let cp_text = env.read(&cp_file);
    assert!(!cp_text.contains(KEY_A));
    let cp = CheckpointNote::parse(&cp_text).unwrap();
    assert_eq!(
        (cp.body.number, cp.body.size, cp.body.prev),
        (1, 3, [0; 32])
    );
    cp.verify(&[*keys.a.public_key().key()]).unwrap();
    let stored = store.latest_tree_head().await.unwrap().unwrap();
    assert_eq!(stored.note, cp);
    assert_eq!(stored.public_key, keys.pub_a);
    assert_eq!(
        covered(store, &stored).await,
        seqs(&[("_system", 2), ("acme", 4), ("globex", 2)])
    );

    // Records 8..16, a little later: acme 5..=8, globex 3..=4, _system 3..=4.
    tokio::time::sleep(Duration::from_millis(20)).await;
    append(store, 8, 16).await;
    let since_ms = store.audit_records("acme", 5, 1).await.unwrap()[0].at;

    checkpoint_files(env, &keys, &cp, &cp_text).await;
    exports(env, &keys, &cp_text, since_ms);

    // A second checkpoint: the log grows, each naming the one before.
    let cp2_file = env.path("cp2.note");
    ok(&env.run(&["audit", "checkpoint", "--out", &cp2_file], Some(KEY_A)));
    let cp2_text = env.read(&cp2_file);
    let cp2 = CheckpointNote::parse(&cp2_text).unwrap();
    assert_eq!(cp2.body.number, 2);
    assert_eq!(cp2.body.prev, cp.body.hash());
    let stored2 = store.latest_tree_head().await.unwrap().unwrap();
    assert_eq!(stored2.note, cp2);
    assert_eq!(
        covered(store, &stored2).await,
        seqs(&[("_system", 4), ("acme", 8), ("globex", 4)])
    );
    // Nothing moved since: asking again gives that checkpoint, no new one.
    assert_eq!(
        ok(&env.run(&["audit", "checkpoint"], Some(KEY_A))),
        cp2_text
    );
    assert_eq!(store.tree_heads().await.unwrap().len(), 2);
    assert_eq!(
        ok(&env.run(&["audit", "export-checkpoint", "--number", "1"], None)),
        cp_text
    );
    let text = ok(&env.run(
        &[
            "audit",
            "verify",
            "--from-checkpoint",
            &cp_file,
            "--from-checkpoint",
            &cp2_file,
        ],
        Some(KEY_A),
    ));
    says(
        &text,
        "audit intact: 16 record(s) in 3 chain(s), 2 signed checkpoint(s) verified",
    );

    // --tenant verifies one chain (and the log of checkpoints).
    let text = ok(&env.run(&["audit", "verify", "--tenant", "acme"], Some(KEY_A)));
    says(
        &text,
        "audit intact: 8 record(s) in 1 chain(s) (only acme), 2 signed checkpoint(s) verified",
    );
    let text = ok(&env.run(&["audit", "verify", "--tenant", SYSTEM_CHAIN], Some(KEY_A)));
    says(
        &text,
        "audit intact: 4 record(s) in 1 chain(s) (only _system)",
    );
    broken(
        &env.run(&["audit", "verify", "--tenant", "_nope"], Some(KEY_A)),
        "--tenant \"_nope\"",
    );

    database_rollback(env, store, backend, &stored2, &cp_file, &cp2_file).await;
}

/// Checkpoint 1 (over 8 records) against the store of 16: the file and the stored log agree,
/// and every forgery of the file or distrust of its key is refused.
async fn checkpoint_files(env: &Env, keys: &Keys, cp: &CheckpointNote, cp_text: &str) {
    let cp_file = env.path("cp1.note");
    let text = ok(&env.run(
        &["audit", "verify", "--from-checkpoint", &cp_file],
        Some(KEY_A),
    ));
    says(
        &text,
        "audit intact: 16 record(s) in 3 chain(s), 1 signed checkpoint(s) verified",
    );
    // Trusting the key by --public-key alone does as well; a foreign trusted key refuses the
    // stored log.
    ok(&env.run(
        &[
            "audit",
            "verify",
            "--public-key",
            &keys.pub_a,
            "--from-checkpoint",
            &cp_file,
        ],
        None,
    ));
    let err = broken(
        &env.run(&["audit", "verify", "--public-key", &keys.pub_b], None),
        "checkpoint 1 refused: no signature by a trusted key",
    );
    assert!(!err.contains("intact"), "{err}");
    // With no trusted key at all, it says what the signatures were checked against.
    let out = env.run(&["audit", "verify"], None);
    says(&ok(&out), "1 signed checkpoint(s) verified");
    says(&stderr(&out), "note: no trusted key");

    // export-checkpoint writes the stored note, byte for byte.
    assert_eq!(ok(&env.run(&["audit", "export-checkpoint"], None)), cp_text);
    let out_file = env.path("exported.note");
    ok(&env.run(
        &[
            "audit",
            "export-checkpoint",
            "--number",
            "1",
            "--out",
            &out_file,
        ],
        None,
    ));
    assert_eq!(env.read(&out_file), cp_text);
    broken(
        &env.run(&["audit", "export-checkpoint", "--number", "2"], None),
        "no such stored checkpoint",
    );

    // A forged note file: one character of the signature changed.
    let forged = forge_signature(cp_text);
    assert_eq!(CheckpointNote::parse(&forged).unwrap().body, cp.body);
    let forged_file = env.write("forged-signature.note", &forged);
    let err = broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &forged_file],
            Some(KEY_A),
        ),
        "the signature does not verify",
    );
    says(&err, "checkpoint 1 refused");
    // The same body signed by another key (its own signature line).
    let foreign = CheckpointSigner::parse(KEY_B)
        .unwrap()
        .sign_note(cp.body.clone());
    let foreign_file = env.write("foreign.note", &foreign.text);
    broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &foreign_file],
            Some(KEY_A),
        ),
        "no signature by a trusted key",
    );
    // Another root under the genuine signature: not the stored checkpoint 1.
    let root_file = env.write("forged-root.note", &forge_root(cp_text));
    broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &root_file],
            Some(KEY_A),
        ),
        "differs from the stored checkpoint 1: the log was forked",
    );
    let junk = env.write("junk.note", "not a checkpoint\n");
    broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &junk],
            Some(KEY_A),
        ),
        "malformed checkpoint note",
    );

    // A legacy JSON checkpoint pins the _legacy chain: refused when signed by an untrusted
    // key, and a break when the chain does not reach it (this store has no legacy records).
    let hash = store_hash_placeholder();
    let legacy_b = CheckpointSigner::parse(KEY_B)
        .unwrap()
        .sign(1, &hash, 1)
        .unwrap();
    let legacy_b_file = env.write("legacy-b.json", &serde_json::to_string(&legacy_b).unwrap());
    broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &legacy_b_file],
            Some(KEY_A),
        ),
        "which is not a trusted key",
    );
    let legacy_a = keys.a.sign(1, &hash, 1).unwrap();
    let legacy_a_file = env.write("legacy-a.json", &serde_json::to_string(&legacy_a).unwrap());
    let err = broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &legacy_a_file],
            Some(KEY_A),
        ),
        "audit chain _legacy broken at record 1",
    );
    says(&err, "truncated");
}

/// A well-formed record hash that no record has.
fn store_hash_placeholder() -> String {
    format!("sha256:{}", "ab".repeat(32))
}

/// Exports of the 16 records, with checkpoint 1 (over the first 8) the newest.
fn exports(env: &Env, keys: &Keys, cp_text: &str, since_ms: i64) {
    let cp_file = env.path("cp1.note");
    let pub_a = keys.pub_a.as_str();

    // Whole: every chain, chain by chain, from record 1, led by the newest checkpoint and all
    // its leaves.
    let all = ok(&env.run(&["audit", "export"], None));
    let (proof, records) = parse_export(&all);
    assert!(proof.is_none());
    let header: CheckpointLeaves =
        serde_json::from_str(all.lines().next().unwrap()).expect("a checkpoint header");
    assert_eq!(header.checkpoint, cp_text);
    assert_eq!(header.leaves.len(), 3);
    let mut chains = chains_of(&records);
    chains.sort();
    assert_eq!(
        chains,
        vec![
            ("_system".to_string(), 1, 4),
            ("acme".to_string(), 1, 8),
            ("globex".to_string(), 1, 4)
        ]
    );
    let all_file = env.write("all.jsonl", &all);
    let text = ok(&env.run(&["audit", "verify", "--file", &all_file], None));
    says(
        &text,
        "intact: 16 record(s) in 3 chain(s) from record 1, 1 checkpoint(s) checked",
    );
    // The note the auditor holds is the one the export carries: both checked.
    let text = ok(&env.run(
        &[
            "audit",
            "verify",
            "--file",
            &all_file,
            "--from-checkpoint",
            &cp_file,
            "--public-key",
            pub_a,
        ],
        None,
    ));
    says(&text, "2 checkpoint(s) checked");
    // A chain left out of the whole export is noticed from the checkpoint's leaves.
    let without_globex: Vec<String> = all
        .lines()
        .enumerate()
        .filter(|(i, l)| *i == 0 || !l.contains("\"chain\":\"globex\""))
        .map(|(_, l)| l.to_string())
        .collect();
    let f = env.write("all-without-globex.jsonl", &file_text(&without_globex));
    broken(
        &env.run(
            &["audit", "verify", "--file", &f, "--public-key", pub_a],
            None,
        ),
        "covers chain globex up to record 2 but the export holds none of its records",
    );
    // Leaves that do not hash to the signed root are refused.
    let mut bent = header.clone();
    bent.leaves[0].seq += 1;
    let mut bent_lines: Vec<String> = all.lines().map(str::to_string).collect();
    bent_lines[0] = serde_json::to_string(&bent).unwrap();
    let f = env.write("all-bent-leaves.jsonl", &file_text(&bent_lines));
    broken(
        &env.run(
            &["audit", "verify", "--file", &f, "--public-key", pub_a],
            None,
        ),
        "do not hash to the signed root",
    );

    // Tampering with the whole export: a changed byte, and a record moved out of its chain's
    // run of lines (verified on its own, it would be a valid partial chain).
    let lines: Vec<String> = all.lines().map(str::to_string).collect();
    let globex_3 = records
        .iter()
        .position(|r| r.chain == "globex" && r.seq == 3)
        .unwrap();
    // (Line 0 is the checkpoint header.)
    let mut changed = lines.clone();
    changed[globex_3 + 1] =
        changed[globex_3 + 1].replacen("supplier.update_iban", "supplier.update_ibam", 2);
    let f = env.write("all-changed.jsonl", &file_text(&changed));
    broken(
        &env.run(&["audit", "verify", "--file", &f], None),
        "audit chain globex broken at record 3",
    );
    let first_chain = &records[0].chain;
    let last_of_first = records
        .iter()
        .rposition(|r| r.chain == *first_chain)
        .unwrap();
    let mut moved = lines.clone();
    let line = moved.remove(last_of_first + 1);
    moved.push(line);
    let f = env.write("all-moved.jsonl", &file_text(&moved));
    broken(
        &env.run(&["audit", "verify", "--file", &f], None),
        &format!("chain {first_chain} continues after another chain"),
    );

    tenant_export(env, pub_a, cp_text);

    // --since (Unix ms or RFC 3339): each chain from its first record at or after T.
    let since = ok(&env.run(&["audit", "export", "--since", &since_ms.to_string()], None));
    let (proof, records) = parse_export(&since);
    assert!(proof.is_none());
    let mut chains = chains_of(&records);
    chains.sort();
    assert_eq!(
        chains,
        vec![
            ("_system".to_string(), 3, 2),
            ("acme".to_string(), 5, 4),
            ("globex".to_string(), 3, 2)
        ],
        "{since}"
    );
    let since_file = env.write("since.jsonl", &since);
    says(
        &ok(&env.run(&["audit", "verify", "--file", &since_file], None)),
        "intact: 8 record(s) in 3 chain(s) from record",
    );
    let rfc3339 = chrono::DateTime::from_timestamp_millis(since_ms)
        .unwrap()
        .to_rfc3339();
    assert_eq!(
        ok(&env.run(&["audit", "export", "--since", &rfc3339], None)),
        since
    );
    broken(
        &env.run(&["audit", "export", "--since", "yesterday"], None),
        "--since",
    );
    // One tenant's records since T, led by the proof: it pins the record before the first.
    let acme_since = ok(&env.run(
        &[
            "audit",
            "export",
            "--tenant",
            "acme",
            "--since",
            &since_ms.to_string(),
        ],
        None,
    ));
    let f = env.write("acme-since.jsonl", &acme_since);
    says(
        &ok(&env.run(
            &["audit", "verify", "--file", &f, "--public-key", pub_a],
            None,
        )),
        "intact: 4 record(s) in 1 chain(s) from record 5, 1 checkpoint(s) checked",
    );
    // Re-sealed after another record 4: it links on its own; the proof pins record 4.
    let (proof_line, acme_records) = parse_export(&acme_since);
    let resealed = jsonl(&rewritten_from(&acme_records, 0, &store_hash_placeholder()));
    let f = env.write("acme-since-alone.jsonl", &file_text(&resealed));
    says(
        &ok(&env.run(&["audit", "verify", "--file", &f], None)),
        "intact: 4 record(s) in 1 chain(s) from record 5",
    );
    let mut lines = vec![serde_json::to_string(&proof_line.unwrap()).unwrap()];
    lines.extend(resealed);
    let f = env.write("acme-since-prev.jsonl", &file_text(&lines));
    let err = broken(
        &env.run(
            &["audit", "verify", "--file", &f, "--public-key", pub_a],
            None,
        ),
        "audit chain acme broken at record 5",
    );
    says(
        &err,
        "that checkpoint 1 (carried by the export) signed for record 4",
    );

    // --run: a sparse export of one run's records (acme's 1, 3, 5, 7).
    let run_b = ok(&env.run(&["audit", "export", "--run", "run-b"], None));
    let (proof, records) = parse_export(&run_b);
    assert!(proof.is_none());
    assert!(records.iter().all(|r| r.chain == "acme"), "{run_b}");
    assert_eq!(
        records.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![1, 3, 5, 7]
    );
    let run_file = env.write("run-b.jsonl", &run_b);
    broken(
        &env.run(&["audit", "verify", "--file", &run_file], None),
        "--sparse",
    );
    says(
        &ok(&env.run(&["audit", "verify", "--file", &run_file, "--sparse"], None)),
        "intact: 4 record(s) in 1 chain(s) from record 1 (sparse)",
    );
    let text = ok(&env.run(
        &[
            "audit",
            "verify",
            "--file",
            &run_file,
            "--sparse",
            "--from-checkpoint",
            &cp_file,
        ],
        Some(KEY_A),
    ));
    says(&text, "1 given but outside the export and not compared");
    // A changed byte is still caught in a sparse export.
    let mut lines: Vec<String> = run_b.lines().map(str::to_string).collect();
    lines[2] = lines[2].replacen("supplier.update_iban", "supplier.update_ibam", 2);
    let f = env.write("run-b-changed.jsonl", &file_text(&lines));
    broken(
        &env.run(&["audit", "verify", "--file", &f, "--sparse"], None),
        "audit chain acme broken at record 5",
    );
}

/// acme's export: the proof that checkpoint 1 covers its chain at record 4, then its 8
/// records; verified offline with the public key, and every tampering refused.
fn tenant_export(env: &Env, pub_a: &str, cp_text: &str) {
    let cp_file = env.path("cp1.note");
    let acme = ok(&env.run(&["audit", "export", "--tenant", "acme"], None));
    let (proof, records) = parse_export(&acme);
    let proof = proof.expect("a checkpoint covers acme: the export opens with its proof");
    assert_eq!(proof.checkpoint, cp_text);
    assert_eq!(proof.public_key, pub_a);
    assert_eq!(
        proof.leaf,
        Leaf {
            chain: "acme".into(),
            seq: 4,
            hash: records[3].hash.clone()
        }
    );
    assert_eq!(chains_of(&records), vec![("acme".to_string(), 1, 8)]);
    let acme_file = env.write("acme.jsonl", &acme);
    let verify = |file: &str, extra: &[&str]| {
        let mut args = vec!["audit", "verify", "--file", file, "--public-key", pub_a];
        args.extend_from_slice(extra);
        env.run(&args, None)
    };
    says(
        &ok(&verify(&acme_file, &[])),
        "intact: 8 record(s) in 1 chain(s) from record 1, 1 checkpoint(s) checked",
    );
    says(
        &ok(&verify(&acme_file, &["--from-checkpoint", &cp_file])),
        "intact: 8 record(s) in 1 chain(s) from record 1, 2 checkpoint(s) checked",
    );
    // Records up to the pinned one (and the one after it) cut from the front: the proof
    // would check nothing.
    let late: Vec<String> = acme
        .lines()
        .enumerate()
        .filter(|(i, _)| *i == 0 || *i > 5)
        .map(|(_, l)| l.to_string())
        .collect();
    let f = env.write("acme-late.jsonl", &file_text(&late));
    broken(&verify(&f, &[]), "the records between are missing");
    // A legacy checkpoint given with an export that holds no legacy record checks nothing.
    broken(
        &verify(
            &acme_file,
            &["--from-checkpoint", &env.path("legacy-a.json")],
        ),
        "holds no record of the _legacy chain",
    );
    // A note that is not the one in the export's proof (same number, another root).
    let root_file = env.path("forged-root.note");
    broken(
        &verify(&acme_file, &["--from-checkpoint", &root_file]),
        "differs from the export's checkpoint 1: the log was forked",
    );
    // Another key trusted: the export's checkpoint is refused.
    broken(
        &env.run(
            &[
                "audit",
                "verify",
                "--file",
                &acme_file,
                "--public-key",
                &CheckpointSigner::parse(KEY_B)
                    .unwrap()
                    .public_key()
                    .to_string(),
            ],
            None,
        ),
        "checkpoint 1 refused: the export's checkpoint: no signature by a trusted key",
    );
    // No key at all: verified against the key the proof names, and it says so.
    let out = env.run(&["audit", "verify", "--file", &acme_file], None);
    says(&ok(&out), "1 checkpoint(s) checked");
    says(&stderr(&out), "note: no trusted key");

    let lines: Vec<String> = acme.lines().map(str::to_string).collect();
    let check = |name: &str, kept: &[String], needle: &str| {
        let f = env.write(name, &file_text(kept));
        broken(&verify(&f, &[]), needle)
    };
    // Offline tampering with the records (line k is record k).
    let mut changed = lines.clone();
    changed[3] = changed[3].replacen("supplier.update_iban", "supplier.update_ibam", 2);
    check(
        "changed.jsonl",
        &changed,
        "audit chain acme broken at record 3",
    );
    let mut deleted = lines.clone();
    deleted.remove(3);
    check(
        "deleted.jsonl",
        &deleted,
        "audit chain acme broken at record 3",
    );
    let mut swapped = lines.clone();
    swapped.swap(2, 6);
    check(
        "swapped.jsonl",
        &swapped,
        "audit chain acme broken at record 2",
    );
    // A cut tail is a valid shorter chain on its own; the proof catches it.
    let cut = &lines[..4];
    let f = env.write("cut-alone.jsonl", &file_text(&cut[1..]));
    says(
        &ok(&verify(&f, &[])),
        "intact: 3 record(s) in 1 chain(s) from record 1, 0 checkpoint(s) checked",
    );
    let err = check("cut.jsonl", cut, "audit chain acme broken at record 4");
    says(&err, "checkpoint 1 (carried by the export) signed record 4");
    says(&err, "truncated");
    // Records rewritten and re-hashed from record 2 on: the chain links, the proof does not.
    let rewritten = jsonl(&rewritten_from(&records, 1, &records[0].hash));
    let f = env.write("rewritten-alone.jsonl", &file_text(&rewritten));
    says(&ok(&verify(&f, &[])), "intact: 8 record(s)");
    let mut with_proof = vec![lines[0].clone()];
    with_proof.extend(rewritten);
    check(
        "rewritten.jsonl",
        &with_proof,
        "a record in 1..=4 was rewritten",
    );
    // Every record removed: the proof still says the chain had some.
    check(
        "emptied.jsonl",
        &lines[..1],
        "holds none of its records: they were removed",
    );

    // Tampering with the proof line.
    let with_proof_line = |name: &str, p: &InclusionProof, kept: &[String]| {
        let mut out = vec![serde_json::to_string(p).unwrap()];
        out.extend_from_slice(kept);
        check(name, &out, "")
    };
    let mut bad_path = proof.clone();
    bad_path.proof[0] = flip_b64(&bad_path.proof[0], 5);
    let err = with_proof_line("bad-path.jsonl", &bad_path, &lines[1..]);
    says(&err, "does not lead to the signed root");
    // The leaf moved back to cover a cut tail.
    let mut lowered = proof.clone();
    lowered.leaf = Leaf {
        chain: "acme".into(),
        seq: 3,
        hash: records[2].hash.clone(),
    };
    let err = with_proof_line("lowered-leaf.jsonl", &lowered, &lines[1..4]);
    says(&err, "does not lead to the signed root");
    // The checkpoint text in the header changed (another root, the signature kept).
    let mut bad_note = proof.clone();
    bad_note.checkpoint = forge_root(&proof.checkpoint);
    let err = with_proof_line("bad-note.jsonl", &bad_note, &lines[1..]);
    says(
        &err,
        "checkpoint 1 refused: the export's checkpoint: the signature does not verify",
    );
}

/// Someone with DDL rights cuts acme's tail, then lowers its head row, then removes the
/// stored checkpoints: each step is caught until the last, which only the exported notes
/// catch.
async fn database_rollback(
    env: &Env,
    store: &Store,
    backend: Backend,
    stored2: &TreeHead,
    cp_file: &str,
    cp2_file: &str,
) {
    let acme_2 = store.audit_records("acme", 2, 1).await.unwrap()[0]
        .hash
        .clone();
    let cut = "DELETE FROM audit WHERE chain = 'acme' AND seq > 2";
    let lower = format!("UPDATE audit_chains SET seq = 2, hash = '{acme_2}' WHERE chain = 'acme'");
    // The guards hold until dropped.
    for sql in [
        cut,
        lower.as_str(),
        "DELETE FROM audit_tree_heads",
        "DELETE FROM audit_tree_leaves",
    ] {
        assert!(store.execute_sql(sql).await.is_err(), "{backend:?}: {sql}");
    }
    let ddl: &[&str] = match backend {
        Backend::Sqlite => &[
            "DROP TRIGGER audit_no_delete",
            "DROP TRIGGER audit_chains_forward_only",
            "DROP TRIGGER audit_tree_heads_no_delete",
            "DROP TRIGGER audit_tree_leaves_no_delete",
        ],
        Backend::Postgres => &[
            "ALTER TABLE audit DISABLE TRIGGER audit_no_update",
            "ALTER TABLE audit_chains DISABLE TRIGGER audit_chains_forward_only",
            "ALTER TABLE audit_tree_heads DISABLE TRIGGER audit_tree_heads_no_update",
            "ALTER TABLE audit_tree_leaves DISABLE TRIGGER audit_tree_leaves_no_update",
        ],
    };
    for sql in ddl {
        store.execute_sql(sql).await.unwrap();
    }

    // The tail cut alone: the head row still says record 8.
    store.execute_sql(cut).await.unwrap();
    let err = broken(
        &env.run(&["audit", "verify"], Some(KEY_A)),
        "audit chain acme broken at record 3",
    );
    says(&err, "its head is record");
    says(&err, "truncated");
    // The other chains still verify on their own.
    says(
        &ok(&env.run(&["audit", "verify", "--tenant", "globex"], Some(KEY_A))),
        "audit intact: 4 record(s) in 1 chain(s) (only globex), 2 signed checkpoint(s) verified",
    );
    broken(
        &env.run(&["audit", "verify", "--tenant", "acme"], Some(KEY_A)),
        "audit chain acme broken at record 3",
    );

    // The head row lowered too: the stored checkpoints still pin record 4.
    store.execute_sql(&lower).await.unwrap();
    assert_eq!(
        store.audit_chain_head("acme").await.unwrap(),
        Some((2, acme_2.clone()))
    );
    let err = broken(
        &env.run(&["audit", "verify"], Some(KEY_A)),
        "audit chain acme broken at record 3",
    );
    says(&err, "checkpoint 1 signed record 4");
    says(&err, "truncated");

    // The newest checkpoint removed: the older one still pins record 4; the exported newest
    // one shows the log was rolled back.
    assert_eq!(stored2.number(), 2);
    for sql in [
        "DELETE FROM audit_tree_leaves WHERE number = 2",
        "DELETE FROM audit_tree_heads WHERE number = 2",
    ] {
        store.execute_sql(sql).await.unwrap();
    }
    let err = broken(
        &env.run(&["audit", "verify"], Some(KEY_A)),
        "audit chain acme broken at record 3",
    );
    says(&err, "checkpoint 1 signed record 4");
    let err = broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", cp2_file],
            Some(KEY_A),
        ),
        "checkpoint 2 refused",
    );
    says(
        &err,
        "the stored log ends at 1: the database was rolled back",
    );
    says(&err, cp2_file);

    // Every checkpoint removed: the store alone verifies; the exported notes do not.
    for sql in [
        "DELETE FROM audit_tree_leaves",
        "DELETE FROM audit_tree_heads",
    ] {
        store.execute_sql(sql).await.unwrap();
    }
    says(
        &ok(&env.run(&["audit", "verify"], Some(KEY_A))),
        "audit intact: 10 record(s) in 3 chain(s), 0 signed checkpoint(s) verified",
    );
    says(
        &ok(&env.run(&["audit", "verify", "--tenant", "acme"], Some(KEY_A))),
        "audit intact: 2 record(s) in 1 chain(s) (only acme)",
    );
    let err = broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", cp_file],
            Some(KEY_A),
        ),
        "checkpoint 1 refused",
    );
    says(
        &err,
        "the stored log ends at 0: the database was rolled back",
    );
    broken(
        &env.run(
            &[
                "audit",
                "verify",
                "--tenant",
                "acme",
                "--from-checkpoint",
                cp2_file,
            ],
            Some(KEY_A),
        ),
        "the database was rolled back",
    );
}

/// The newest stored checkpoint once its number reaches `number` (the server signs them in
/// the background).
async fn wait_for_tree_head(store: &Store, number: i64) -> TreeHead {
    for _ in 0..100 {
        if let Some(th) = store.latest_tree_head().await.unwrap()
            && th.number() >= number
        {
            return th;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no checkpoint {number} within 10 s");
}

#[tokio::test]
async fn serve_signs_checkpoints_by_count_and_age_and_records_the_redaction_key() {
    let redaction = "a redaction key of at least thirty-two bytes";
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) = spawn_app_with(
            backend,
            &[
                ("COUNTERSIGN_AUDIT_SIGNING_KEY", KEY_A),
                ("COUNTERSIGN_AUDIT_CHECKPOINT_EVERY", "3"),
                ("COUNTERSIGN_AUDIT_CHECKPOINT_MINUTES", "10"),
                ("COUNTERSIGN_REDACTION_KEY", redaction),
            ],
        )
        .await
        else {
            continue;
        };
        // Start-up recorded the key's fingerprint, never the key, in the system's chain.
        let head = app.store.audit_in_order(0, 10).await.unwrap();
        assert_eq!(head.len(), 1, "{head:?}");
        assert_eq!(head[0].event, "operational");
        assert_eq!((head[0].chain.as_str(), head[0].seq), (SYSTEM_CHAIN, 1));
        assert!(
            head[0].record.contains(r#""kind":"redaction_key""#),
            "{}",
            head[0].record
        );
        assert!(!head[0].record.contains(redaction));

        // By count: three records unsigned across chains (the operational one included).
        append(&app.store, 0, 2).await;
        let by_count = wait_for_tree_head(&app.store, 1).await;
        let a = CheckpointSigner::parse(KEY_A).unwrap();
        by_count.note.verify(&[*a.public_key().key()]).unwrap();
        assert_eq!(by_count.public_key, a.public_key().to_string());
        assert_eq!(
            covered(&app.store, &by_count).await,
            seqs(&[("_system", 1), ("acme", 1), ("globex", 1)]),
            "{backend:?}"
        );

        // By age: one more record, and the (injected) clock moves past ten minutes.
        append(&app.store, 2, 3).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            app.store
                .latest_tree_head()
                .await
                .unwrap()
                .map(|th| th.number()),
            Some(1),
            "not due yet"
        );
        app.clock.advance(chrono::Duration::minutes(10));
        let by_age = wait_for_tree_head(&app.store, 2).await;
        assert_eq!(by_age.number(), 2);
        assert_eq!(by_age.note.body.prev, by_count.note.body.hash(), "a log");
        assert_eq!(
            covered(&app.store, &by_age).await,
            seqs(&[("_system", 1), ("acme", 2), ("globex", 1)]),
            "{backend:?}"
        );
        let report = app
            .store
            .verify_audit_full(&[a.public_key()], &[], &[], None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (report.records, report.chains, report.checkpoints),
            (4, 3, 2)
        );
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_server_signs_the_records_written_since_the_last_checkpoint() {
    for backend in [
        countersign_core::Backend::Sqlite,
        countersign_core::Backend::Postgres,
    ] {
        // A checkpoint is due only every 1,000 records: none during this short run.
        let Some(app) = crate::helpers::spawn_app_with(
            backend,
            &[
                ("COUNTERSIGN_AUDIT_SIGNING_KEY", KEY_A),
                ("COUNTERSIGN_AUDIT_CHECKPOINT_EVERY", "1000"),
            ],
        )
        .await
        else {
            continue;
        };
        crate::mcp::agent(&app, "bot-1", "worker.finance").await;
        crate::mcp::agent(&app, "bot-2", "worker.finance").await;
        let clock = app.store.clock().clone();
        let db = app.stop_keeping_db().await;
        let store = db.store(clock).await;
        let heads = store.chain_heads().await.unwrap();
        assert!(!heads.is_empty(), "{backend:?}: records were written");
        let last = store
            .latest_tree_head()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{backend:?}: nothing signed at exit"));
        assert_eq!(last.number(), 1, "{backend:?}: none signed before exit");
        covered(&store, &last).await;
        assert_eq!(
            last.leaves, heads,
            "{backend:?}: every chain's head is signed at exit"
        );
        let a = CheckpointSigner::parse(KEY_A).unwrap();
        let report = store
            .verify_audit_full(&[a.public_key()], &[], &[], None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(report.checkpoints, 1);
        store.close().await;
        db.drop_db().await;
    }
}
