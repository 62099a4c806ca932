//! Interop: `/mcp` driven by MCP clients nobody here wrote — the official Python SDK (PyPI
//! `mcp`, pinned in interop/python/requirements.txt, venv from `make interop-tools`) and the
//! official TypeScript SDK (npm `@modelcontextprotocol/sdk` 1.x and its successor
//! `@modelcontextprotocol/client` 2.x, pinned in package.json) — each run as a real process
//! against the finance example on both backends. The Python SDK runs twice: with its defaults
//! it settles on the session-less 2026-07-28 revision (`server/discover`); forced to the
//! handshake (`mode="legacy"`) it opens a session at 2025-11-25. The TypeScript SDK 1.x knows
//! no revision after 2025-11-25; 2.x negotiates 2026-07-28 when asked to
//! (`versionNegotiation: {mode: "auto"}`; its default is still the handshake).
//!
//! Each client (interop/python/client.py, interop/node/client.mjs, client-v2.mjs) connects with its SDK's
//! defaults, runs a JSON script of operations and prints one JSON document of what the SDK
//! handed back. Assertions are on `isError`, `structuredContent.status`/`rule` and error
//! messages only, not on whole result bodies.
//!
//! A missing interpreter or SDK skips the test with a loud message, except under `CI=true`,
//! where it is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use countersign_core::Backend;
use countersign_core::store::NewAgent;
use serde_json::{Value, json};

use crate::helpers::{TestApp, example, spawn_app_with};

const INV: &str = "INV-20260611";
const REASON: &str = "Invoice approved by AP, due in four days";
/// The handshake revisions Countersign speaks; a handshake client must settle on one of them.
const REVISIONS: [&str; 2] = ["2025-06-18", "2025-11-25"];
/// The session-less revision Countersign speaks.
const MODERN: &str = crate::mcp::SESSION_LESS;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Sdk {
    /// The Python SDK with its defaults (a `server/discover` probe first).
    Python,
    /// The Python SDK forced to the `initialize` handshake.
    PythonHandshake,
    TypeScript,
    /// The TypeScript SDK 2.x, negotiating (`server/discover` first).
    TypeScriptModern,
}

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("server/ has a parent")
        .to_path_buf()
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// `None` (after a loud message) when the tool is missing outside CI; a failure in CI.
fn missing(sdk: Sdk, why: &str) -> Option<Command> {
    if in_ci() {
        panic!("interop {sdk:?}: {why}, and CI=true: the interop tests must run in CI");
    }
    eprintln!(
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         !!! interop {sdk:?}: {why}\n\
         !!! THE {sdk:?} SDK INTEROP TEST WAS SKIPPED. Run `make interop-tools node-tools`.\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
    None
}

/// The command that runs `sdk`'s client, or `None` when it cannot run here (outside CI).
pub(crate) fn client_command(sdk: Sdk) -> Option<Command> {
    let root = repo_root();
    match sdk {
        Sdk::Python | Sdk::PythonHandshake => {
            let python = std::env::var_os("COUNTERSIGN_TEST_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join(".venv-interop/bin/python"));
            let probe = Command::new(&python)
                .args(["-c", "import mcp.client"])
                .output();
            match probe {
                Ok(out) if out.status.success() => {}
                Ok(out) => {
                    let err = String::from_utf8_lossy(&out.stderr);
                    return missing(
                        sdk,
                        &format!("{} cannot import mcp: {err}", python.display()),
                    );
                }
                Err(e) => return missing(sdk, &format!("{} does not run: {e}", python.display())),
            }
            let mut cmd = Command::new(python);
            cmd.arg(root.join("interop/python/client.py"));
            if matches!(sdk, Sdk::PythonHandshake) {
                cmd.env("MCP_MODE", "legacy");
            }
            Some(cmd)
        }
        Sdk::TypeScript => {
            let sdk_dir = root.join("node_modules/@modelcontextprotocol/sdk");
            if !sdk_dir.join("package.json").is_file() {
                return missing(sdk, &format!("{} is not installed", sdk_dir.display()));
            }
            if let Err(e) = Command::new("node").arg("--version").output() {
                return missing(sdk, &format!("node does not run: {e}"));
            }
            let mut cmd = Command::new("node");
            cmd.arg(root.join("interop/node/client.mjs"));
            Some(cmd)
        }
        Sdk::TypeScriptModern => {
            let sdk_dir = root.join("node_modules/@modelcontextprotocol/client");
            if !sdk_dir.join("package.json").is_file() {
                return missing(sdk, &format!("{} is not installed", sdk_dir.display()));
            }
            if let Err(e) = Command::new("node").arg("--version").output() {
                return missing(sdk, &format!("node does not run: {e}"));
            }
            let mut cmd = Command::new("node");
            cmd.arg(root.join("interop/node/client-v2.mjs"));
            Some(cmd)
        }
    }
}

/// Runs `sdk`'s client as a process against `/mcp` with `token` and `script`; returns the JSON
/// it printed.
async fn run_client(cmd: Command, sdk: Sdk, app: &TestApp, token: &str, script: Value) -> Value {
    run_client_at(cmd, sdk, &app.url("/mcp"), token, script).await
}

/// [`run_client`] against the `/mcp` endpoint at `url`.
pub(crate) async fn run_client_at(
    mut cmd: Command,
    sdk: Sdk,
    url: &str,
    token: &str,
    script: Value,
) -> Value {
    cmd.arg(url)
        .arg(token)
        .arg(script.to_string())
        .current_dir(repo_root());
    // The server runs on this test's runtime: wait for the child off it.
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{sdk:?} client did not start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{sdk:?} client failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{sdk:?} client printed no JSON ({e}): {stdout}\n{stderr}"))
}

/// Creates an agent credential in `role`; returns its token.
async fn agent(app: &TestApp, name: &str, role: &str) -> String {
    let (_, token) = app
        .store
        .create_agent(&NewAgent {
            name: name.into(),
            role: role.into(),
            tenant: "acme".into(),
            created_by: "test".into(),
            expires_at: None,
            acts_for: None,
            origin: countersign_core::policy::TaskOrigin::User,
        })
        .await
        .unwrap();
    token.reveal().to_string()
}

pub(crate) fn call(name: &str, arguments: Value) -> Value {
    json!({"op": "call", "name": name, "arguments": arguments})
}

fn hold(amount: Value) -> Value {
    json!({"invoice_id": INV, "amount": amount, "currency": "EUR", "reason": REASON})
}

fn payment(amount: Value) -> Value {
    json!({"invoice_id": INV, "amount": amount, "currency": "EUR", "value_date": "2026-06-15", "reason": REASON})
}

/// The script's result at `i`, with the whole output in any failure message.
pub(crate) fn at(out: &Value, i: usize) -> &Value {
    &out["results"][i]
}

/// A tool result the SDK accepted (no protocol or client-side error).
pub(crate) fn result(out: &Value, i: usize) -> &Value {
    let r = at(out, i);
    assert!(r.get("error").is_none(), "call {i} raised: {out:#}");
    assert!(r["isError"].is_boolean(), "call {i}: {out:#}");
    r
}

/// The SDK settled on the revision expected of it: the Python SDK's defaults on the
/// session-less 2026-07-28 (through `server/discover`), the others on a handshake revision.
pub(crate) fn assert_negotiated(sdk: Sdk, out: &Value) {
    let rev = out["protocolVersion"].as_str().unwrap_or_default();
    if matches!(sdk, Sdk::Python | Sdk::TypeScriptModern) {
        assert_eq!(rev, MODERN, "{sdk:?}: {out:#}");
        assert_eq!(out["era"], "modern", "{sdk:?}: {out:#}");
    } else {
        assert!(
            REVISIONS.contains(&rev),
            "{sdk:?} negotiated {rev:?}: {out:#}"
        );
        assert_eq!(out["era"], "handshake", "{sdk:?}: {out:#}");
    }
    eprintln!(
        "interop {sdk:?}: {} negotiated {rev} ({})",
        out["sdk"], out["era"]
    );
}

/// The worker.finance script and what the SDK must have seen.
async fn worker_finance(sdk: Sdk, cmd: Command, app: &TestApp) {
    let token = agent(app, "fin-1", "worker.finance").await;
    let mut bad_hold = hold(json!(-5));
    bad_hold["note"] = json!("hold it now");
    let script = json!([
        {"op": "list"},
        call("supplier.update_iban", json!({"supplier_id": "SUP-000042", "iban": "DE89370400440532013000", "reason": REASON})),
        call("no.such.tool", json!({})),
        call("invoice.get", json!({"invoice_id": INV})),
        call("invoice.hold", bad_hold),
        call("invoice.hold", hold(json!(2000))),
        call("invoice.hold", hold(json!(500))),
        call("payment.schedule", payment(json!(30000))),
        // INV-20260611 is on hold by now (the call above); another approved invoice.
        call("payment.schedule", json!({"invoice_id": "INV-20260612", "amount": 1860.50,
            "currency": "EUR", "value_date": "2026-06-15", "reason": REASON})),
    ]);
    let out = run_client(cmd, sdk, app, &token, script).await;
    assert_negotiated(sdk, &out);

    let tools: Vec<&str> = at(&out, 0)["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{out:#}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !tools.contains(&"supplier.update_iban"),
        "{sdk:?}: {tools:?}"
    );
    assert!(!tools.contains(&"plan.submit"), "{sdk:?}: {tools:?}");
    for listed in ["invoice.get", "invoice.hold", "payment.schedule"] {
        assert!(
            tools.contains(&listed),
            "{sdk:?}: {listed} missing from {tools:?}"
        );
    }

    // A tool the role does not have is a protocol error, exactly like one that exists nowhere.
    for i in [1, 2] {
        let err = &at(&out, i)["error"];
        assert_eq!(err["kind"], "protocol", "{sdk:?} call {i}: {out:#}");
        assert_eq!(err["code"], -32602, "{sdk:?} call {i}: {out:#}");
        assert!(
            err["message"]
                .as_str()
                .unwrap_or_default()
                .contains("Unknown tool"),
            "{sdk:?} call {i}: {out:#}"
        );
        assert!(!err.to_string().contains("update_iban"), "{out:#}");
    }

    // An allowed read.
    let read = result(&out, 3);
    assert_eq!(read["isError"], false, "{sdk:?}: {out:#}");

    // Invalid arguments: an error result, not a protocol error.
    let invalid = result(&out, 4);
    assert_eq!(invalid["isError"], true, "{sdk:?}: {out:#}");
    assert_eq!(
        invalid["structuredContent"]["status"], "invalid",
        "{sdk:?}: {out:#}"
    );

    // Above the hold threshold a person countersigns: a non-error result.
    let gated = result(&out, 5);
    assert_eq!(gated["isError"], false, "{sdk:?}: {out:#}");
    assert_eq!(
        gated["structuredContent"]["status"], "needs_approval",
        "{sdk:?}: {out:#}"
    );
    assert_eq!(
        gated["structuredContent"]["rule"], "amount.threshold",
        "{sdk:?}: {out:#}"
    );

    // A small hold is not gated.
    let small = result(&out, 6);
    assert_eq!(small["isError"], false, "{sdk:?}: {out:#}");
    assert_ne!(
        small["structuredContent"]["status"], "needs_approval",
        "{sdk:?}: {out:#}"
    );

    // Above the role's ceiling: denied, naming a rule.
    // Above the role's ceiling: denied, naming a rule. payment.schedule lists an outputSchema;
    // the listed schema admits the gateway's own answers, so SDKs that validate
    // structuredContent (the TypeScript SDK does even on error results) deliver it.
    let denied = result(&out, 7);
    assert_eq!(denied["isError"], true, "{sdk:?}: {out:#}");
    assert_eq!(denied["structuredContent"]["status"], "denied", "{out:#}");
    assert!(denied["structuredContent"]["rule"].is_string(), "{out:#}");

    // A gated payment (a tool with an outputSchema) waits: a non-error result with a step id.
    let waiting = result(&out, 8);
    assert_eq!(waiting["isError"], false, "{sdk:?}: {out:#}");
    assert_eq!(
        waiting["structuredContent"]["status"], "needs_approval",
        "{out:#}"
    );
    assert!(
        waiting["structuredContent"]["step_id"].is_string(),
        "{out:#}"
    );
}

/// The worker.vendor_master script: the IBAN change is listed, and always waits for a person.
async fn vendor_master(sdk: Sdk, cmd: Command, app: &TestApp) {
    let token = agent(app, "vm-1", "worker.vendor_master").await;
    let script = json!([
        {"op": "list"},
        call("supplier.update_iban", json!({"supplier_id": "SUP-000042", "iban": "DE89370400440532013000", "reason": REASON})),
        call("payment.schedule", payment(json!(100))),
    ]);
    let out = run_client(cmd, sdk, app, &token, script).await;
    assert_negotiated(sdk, &out);
    let tools = at(&out, 0)["tools"].to_string();
    assert!(
        tools.contains("\"supplier.update_iban\""),
        "{sdk:?}: {out:#}"
    );
    assert!(!tools.contains("\"payment.schedule\""), "{sdk:?}: {out:#}");
    let gated = result(&out, 1);
    assert_eq!(gated["isError"], false, "{sdk:?}: {out:#}");
    assert_eq!(
        gated["structuredContent"]["status"], "needs_approval",
        "{sdk:?}: {out:#}"
    );
    assert_eq!(at(&out, 2)["error"]["code"], -32602, "{sdk:?}: {out:#}");
}

/// Runs both role scripts with `sdk`'s client against the finance example on both backends.
async fn interop(sdk: Sdk) {
    let registry = example("finance");
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) =
            spawn_app_with(backend, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await
        else {
            continue;
        };
        let Some(cmd) = client_command(sdk) else {
            app.stop().await;
            return;
        };
        worker_finance(sdk, cmd, &app).await;
        let Some(cmd) = client_command(sdk) else {
            app.stop().await;
            return;
        };
        vendor_master(sdk, cmd, &app).await;
        app.stop().await;
    }
}

#[tokio::test]
async fn interop_python_sdk() {
    interop(Sdk::Python).await;
}

#[tokio::test]
async fn interop_python_sdk_handshake() {
    interop(Sdk::PythonHandshake).await;
}

#[tokio::test]
async fn interop_typescript_sdk() {
    interop(Sdk::TypeScript).await;
}

#[tokio::test]
async fn interop_typescript_sdk_v2() {
    interop(Sdk::TypeScriptModern).await;
}
