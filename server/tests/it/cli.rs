//! The binary itself: exit codes and one-line errors, no stack traces.

use crate::helpers::{countersign_cmd as countersign, countersign_on};

fn assert_one_clean_line(stderr: &[u8], needle: &str) {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one line, got: {text}");
    assert!(lines[0].contains(needle), "{text}");
    assert!(
        !text.contains("panicked") && !text.contains("backtrace"),
        "{text}"
    );
}

#[test]
fn help_lists_the_commands() {
    let out = countersign().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["serve", "migrate"] {
        assert!(text.contains(cmd), "{text}");
    }
}

#[test]
fn a_bad_config_value_exits_non_zero_with_one_line() {
    let out = countersign()
        .arg("serve")
        .env("COUNTERSIGN_LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_one_clean_line(&out.stderr, "COUNTERSIGN_LISTEN");

    let out = countersign()
        .arg("migrate")
        .env("COUNTERSIGN_UNHEARD_OF", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_one_clean_line(&out.stderr, "COUNTERSIGN_UNHEARD_OF");
}

#[test]
fn an_unreachable_database_exits_non_zero_with_one_line_and_no_password() {
    // Nothing listens on port 1.
    let out = countersign()
        .arg("serve")
        .env(
            "COUNTERSIGN_DATABASE_URL",
            "postgres://cs:topsecret@127.0.0.1:1/cs",
        )
        .env("COUNTERSIGN_LOG_LEVEL", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_one_clean_line(&out.stderr, "COUNTERSIGN_DATABASE_URL");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("topsecret"));
}

#[test]
fn migrate_creates_and_migrates_a_sqlite_database() {
    let dir = std::env::temp_dir().join(format!("cs-cli-{}", std::process::id()));
    let url = format!("sqlite://{}/sub/cs.db", dir.display());
    let out = countersign()
        .arg("migrate")
        .env("COUNTERSIGN_DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("migrated sqlite database to version"));
    assert!(dir.join("sub/cs.db").is_file());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn agent_tokens_are_created_once_listed_without_secrets_and_revoked() {
    let dir = std::env::temp_dir().join(format!("cs-agents-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/cs.db", dir.display());
    let run = |args: &[&str]| countersign_on(&url).args(args).output().unwrap();
    // No registry yet: refused, the role cannot be checked.
    let out = run(&[
        "agent-token",
        "create",
        "--name",
        "bot",
        "--role",
        "worker.finance",
    ]);
    assert_eq!(out.status.code(), Some(1));

    let finance = crate::helpers::example("finance");
    assert!(run(&["registry", "import", &finance]).status.success());

    let out = run(&[
        "agent-token",
        "create",
        "--name",
        "bot",
        "--role",
        "no.such.role",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no.such.role"));

    let out = run(&[
        "agent-token",
        "create",
        "--name",
        "bot",
        "--role",
        "worker.finance",
        "--expires",
        "30d",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        token.starts_with("cs_agent_") && token.len() == 9 + 64,
        "{token}"
    );

    let out = run(&["agent-token", "list"]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("bot") && listing.contains("active"),
        "{listing}"
    );
    assert!(!listing.contains(&token));

    let out = run(&["agent-token", "revoke", "bot"]);
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&run(&["agent-token", "list"]).stdout).to_string();
    assert!(listing.contains("revoked"), "{listing}");

    let out = run(&["agent-token", "revoke", "nobody"]);
    assert_eq!(out.status.code(), Some(1));

    // Four eyes needs a person as the creator: a malformed one is refused, a Unix user warned.
    let vm = |name: &str, by: &str| {
        run(&[
            "agent-token",
            "create",
            "--name",
            name,
            "--role",
            "worker.vendor_master",
            "--by",
            by,
        ])
    };
    let out = vm("vm-a", "person:alice");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("person:ISS#SUB"));
    let out = vm("vm-b", "alice");
    assert!(out.status.success());
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(
        warned.contains("warning") && warned.contains("supplier.update_iban"),
        "{warned}"
    );
    let out = vm("vm-c", "person:https://idp.example#alice");
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));
    // A role without four-eyes tools is not warned about.
    assert!(
        !String::from_utf8_lossy(
            &run(&[
                "agent-token",
                "create",
                "--name",
                "f2",
                "--role",
                "worker.finance",
                "--by",
                "alice"
            ])
            .stderr
        )
        .contains("warning")
    );
    let listing = String::from_utf8_lossy(&run(&["agent-token", "list"]).stdout).to_string();
    assert!(
        !listing.contains("vm-a")
            && listing.contains("created_by=person:https://idp.example#alice"),
        "{listing}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn audit_verify_reports_an_intact_chain_and_export_writes_json_lines() {
    use countersign_core::audit::{AuditEvent, NewAuditRecord};
    let db = countersign_core::store::testing::FreshDb::create(countersign_core::Backend::Sqlite)
        .await
        .unwrap();
    let store = db
        .store(std::sync::Arc::new(countersign_core::SystemClock))
        .await;
    for (i, event) in [AuditEvent::Proposed, AuditEvent::Refused]
        .into_iter()
        .enumerate()
    {
        store
            .append_audit(&NewAuditRecord {
                event: Some(event),
                run_id: Some(if i == 0 { "run-a" } else { "run-b" }.into()),
                tool: Some("supplier.update_iban".into()),
                rule: Some("role.tool_not_listed".into()),
                ..NewAuditRecord::default()
            })
            .await
            .unwrap();
    }
    store.close().await;
    let url = db.url.expose().clone();

    let out = countersign_on(&url)
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("intact: 2 record(s)"));

    let out = countersign_on(&url)
        .args(["audit", "export", "--run", "run-b"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["event"], "refused");
    assert_eq!(lines[0]["seq"], 2);

    // Someone with DDL rights drops the guard and rewrites record 1: verify names it.
    let store = db
        .store(std::sync::Arc::new(countersign_core::SystemClock))
        .await;
    store
        .execute_sql("DROP TRIGGER audit_no_update")
        .await
        .unwrap();
    store
        .execute_sql("UPDATE audit SET record = replace(record, 'run-a', 'run-x') WHERE seq = 1")
        .await
        .unwrap();
    store.close().await;
    let out = countersign_on(&url)
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken at record 1"), "{err}");
    db.drop_db().await;
}
