//! `countersign audit …` end to end on both backends: checkpoints signed on demand and by
//! the server, verify against stored and exported checkpoints, exports that verify offline,
//! and the redaction key's fingerprint in the trail.

use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::audit::checkpoint::{Checkpoint, CheckpointSigner};
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::store::testing::FreshDb;
use countersign_core::{Backend, Store, SystemClock};

use crate::helpers::{countersign_on, spawn_app_with};

/// Test-only seeds (hex), never used outside tests.
const KEY_A: &str = "0707070707070707070707070707070707070707070707070707070707070707";
const KEY_B: &str = "0909090909090909090909090909090909090909090909090909090909090909";

fn new_record(i: usize) -> NewAuditRecord {
    NewAuditRecord {
        event: Some(if i.is_multiple_of(2) {
            AuditEvent::Proposed
        } else {
            AuditEvent::Refused
        }),
        run_id: Some(
            if i.is_multiple_of(3) {
                "run-b"
            } else {
                "run-a"
            }
            .into(),
        ),
        tool: Some("supplier.update_iban".into()),
        rule: Some("role.tool_not_listed".into()),
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
}

async fn append(store: &Store, from: usize, to: usize) {
    for i in from..to {
        store.append_audit(&new_record(i)).await.unwrap();
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

async fn scenario(env: &Env, store: &Store, backend: Backend) {
    // Nothing to sign yet.
    broken(&env.run(&["audit", "checkpoint"], Some(KEY_A)), "empty");
    append(store, 0, 6).await;
    let cp_file = env.path("cp6.json");
    ok(&env.run(&["audit", "checkpoint", "--out", &cp_file], Some(KEY_A)));
    let cp: Checkpoint = serde_json::from_str(&std::fs::read_to_string(&cp_file).unwrap()).unwrap();
    assert_eq!(cp.seq, 6);
    append(store, 6, 10).await;
    let since_ms = store.audit_records(8, 1).await.unwrap()[0].at;

    // The stored checkpoint and the exported one both verify; a foreign trusted key refuses them.
    let text = ok(&env.run(
        &["audit", "verify", "--from-checkpoint", &cp_file],
        Some(KEY_A),
    ));
    assert!(
        text.contains("intact: 10 record(s), 2 signed checkpoint(s)"),
        "{text}"
    );
    let pub_b = CheckpointSigner::parse(KEY_B)
        .unwrap()
        .public_key()
        .to_string();
    broken(
        &env.run(&["audit", "verify", "--public-key", &pub_b], None),
        "not a trusted key",
    );
    let pub_a = CheckpointSigner::parse(KEY_A)
        .unwrap()
        .public_key()
        .to_string();
    ok(&env.run(&["audit", "verify", "--public-key", &pub_a], None));

    // export-checkpoint writes the stored one.
    let out = ok(&env.run(&["audit", "export-checkpoint", "--seq", "9"], None));
    assert_eq!(serde_json::from_str::<Checkpoint>(&out).unwrap(), cp);

    // A forged checkpoint file (signature changed, or claiming another hash) is refused.
    let mut forged = cp.clone();
    forged.signature.replace_range(
        0..2,
        if forged.signature.starts_with("00") {
            "11"
        } else {
            "00"
        },
    );
    let forged_file = env.write("forged.json", &serde_json::to_string(&forged).unwrap());
    broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &forged_file],
            None,
        ),
        "signature does not verify",
    );
    // Signed by another key.
    let foreign = CheckpointSigner::parse(KEY_B)
        .unwrap()
        .sign(cp.seq, &cp.hash, cp.at)
        .unwrap();
    let foreign_file = env.write("foreign.json", &serde_json::to_string(&foreign).unwrap());
    broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &foreign_file],
            Some(KEY_A),
        ),
        "not a trusted key",
    );

    // Exports: whole, --since (RFC 3339 and ms), --run; each verifies offline.
    let all = ok(&env.run(&["audit", "export"], None));
    assert_eq!(all.lines().count(), 10);
    let all_file = env.write("all.jsonl", &all);
    let text = ok(&env.run(
        &[
            "audit",
            "verify",
            "--file",
            &all_file,
            "--from-checkpoint",
            &cp_file,
        ],
        Some(KEY_A),
    ));
    assert!(
        text.contains("intact: 10 record(s) from record 1"),
        "{text}"
    );

    let since = ok(&env.run(&["audit", "export", "--since", &since_ms.to_string()], None));
    let first: serde_json::Value = serde_json::from_str(since.lines().next().unwrap()).unwrap();
    assert!(first["seq"].as_i64().unwrap() <= 8, "{since}");
    let since_file = env.write("since.jsonl", &since);
    ok(&env.run(&["audit", "verify", "--file", &since_file], None));
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

    let run_b = ok(&env.run(&["audit", "export", "--run", "run-b"], None));
    let seqs: Vec<i64> = run_b
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, vec![1, 4, 7, 10]);
    let run_file = env.write("run-b.jsonl", &run_b);
    broken(
        &env.run(&["audit", "verify", "--file", &run_file], None),
        "--sparse",
    );
    ok(&env.run(&["audit", "verify", "--file", &run_file, "--sparse"], None));
    // A sparse export that ends before the checkpoint's record (6) says it was not compared.
    let short = run_b.lines().take(2).collect::<Vec<_>>().join("\n") + "\n";
    let short_file = env.write("run-b-short.jsonl", &short);
    let text = ok(&env.run(
        &[
            "audit",
            "verify",
            "--file",
            &short_file,
            "--sparse",
            "--from-checkpoint",
            &cp_file,
        ],
        Some(KEY_A),
    ));
    assert!(
        text.contains("1 of them outside the export and not compared"),
        "{text}"
    );

    // Offline tampering: a changed byte, a deleted line, a swap, a cut tail.
    let lines: Vec<&str> = all.lines().collect();
    let check = |name: &str, kept: Vec<String>, needle: &str| {
        let f = env.write(name, &(kept.join("\n") + "\n"));
        broken(
            &env.run(
                &[
                    "audit",
                    "verify",
                    "--file",
                    &f,
                    "--from-checkpoint",
                    &cp_file,
                ],
                Some(KEY_A),
            ),
            needle,
        )
    };
    let mut changed: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    changed[4] = changed[4].replacen("supplier.update_iban", "supplier.update_ibam", 2);
    check("changed.jsonl", changed, "broken at record 5");
    let mut deleted: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    deleted.remove(2);
    check("deleted.jsonl", deleted, "broken at record 3");
    let mut swapped: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    swapped.swap(3, 7);
    check("swapped.jsonl", swapped, "broken at record 4");
    let cut: Vec<String> = lines[..4].iter().map(|l| l.to_string()).collect();
    // The cut file alone is a valid shorter chain; only the checkpoint catches it.
    let cut_file = env.write("cut-alone.jsonl", &(cut.join("\n") + "\n"));
    ok(&env.run(&["audit", "verify", "--file", &cut_file], None));
    let err = check("cut.jsonl", cut, "broken at record 5");
    assert!(err.contains("truncated"), "{err}");

    // In the database: someone with DDL rights drops the guards, cuts the tail to 4 records
    // and removes the checkpoints. The chain alone verifies; the exported checkpoint does not.
    let ddl: &[&str] = match backend {
        Backend::Sqlite => &[
            "DROP TRIGGER audit_no_delete",
            "DROP TRIGGER audit_checkpoints_no_delete",
        ],
        Backend::Postgres => &[
            "ALTER TABLE audit DISABLE TRIGGER audit_no_update",
            "ALTER TABLE audit_checkpoints DISABLE TRIGGER audit_checkpoints_no_update",
        ],
    };
    for sql in ddl {
        store.execute_sql(sql).await.unwrap();
    }
    store
        .execute_sql("DELETE FROM audit WHERE seq > 4")
        .await
        .unwrap();
    store
        .execute_sql("DELETE FROM audit_checkpoints")
        .await
        .unwrap();
    let text = ok(&env.run(&["audit", "verify"], Some(KEY_A)));
    assert!(text.contains("intact: 4 record(s)"), "{text}");
    let err = broken(
        &env.run(
            &["audit", "verify", "--from-checkpoint", &cp_file],
            Some(KEY_A),
        ),
        "broken at record 5",
    );
    assert!(err.contains("truncated"), "{err}");
}

async fn wait_for_checkpoint(store: &Store, seq: i64) -> Checkpoint {
    for _ in 0..100 {
        if let Some(cp) = store.audit_checkpoint_at_or_before(None).await.unwrap()
            && cp.seq >= seq
        {
            return cp;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no checkpoint for record {seq} within 10 s");
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
        // Start-up recorded the key's fingerprint, never the key.
        let head = app.store.audit_in_order(0, 10).await.unwrap();
        assert_eq!(head.len(), 1, "{head:?}");
        assert_eq!(head[0].event, "operational");
        assert!(
            head[0].record.contains(r#""kind":"redaction_key""#),
            "{}",
            head[0].record
        );
        assert!(!head[0].record.contains(redaction));

        // By count: three records unsigned (the operational one included).
        append(&app.store, 0, 2).await;
        let by_count = wait_for_checkpoint(&app.store, 3).await;
        let a = CheckpointSigner::parse(KEY_A).unwrap();
        assert_eq!(by_count.check(&[a.public_key()]), Ok(()));

        // By age: one more record, and the (injected) clock moves past ten minutes.
        append(&app.store, 2, 3).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            app.store
                .audit_checkpoint_at_or_before(None)
                .await
                .unwrap()
                .map(|c| c.seq),
            Some(3),
            "not due yet"
        );
        app.clock.advance(chrono::Duration::minutes(10));
        let by_age = wait_for_checkpoint(&app.store, 4).await;
        assert_eq!(by_age.seq, 4);
        let report = app
            .store
            .verify_audit_full(&[a.public_key()], &[])
            .await
            .unwrap()
            .unwrap();
        assert_eq!((report.records, report.checkpoints), (4, 2));
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
        let (head, _) = store.audit_head().await.unwrap().unwrap();
        let last = store.audit_checkpoint_at_or_before(None).await.unwrap();
        assert_eq!(
            last.map(|c| c.seq),
            Some(head),
            "{backend:?}: the head is signed at exit"
        );
        store.close().await;
        db.drop_db().await;
    }
}
