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
    let _ = std::fs::remove_dir_all(dir);
}
