//! The server's side of the audit trail: the background checkpoint signer, recording the
//! redaction key's fingerprint at start, and the `countersign audit …` commands.
//!
//! INVARIANTS:
//! - `audit verify` exits non-zero on any break, on any refused checkpoint (bad signature,
//!   untrusted key, malformed file) and on unreadable input; it never reports "intact" for
//!   something it could not check, and says which checkpoints it could not compare;
//! - checkpoints are only ever signed over the head read from the database (never over
//!   caller-supplied hashes), and a failure to sign one is logged, never fatal to serving;
//! - the signing seed and the redaction key are never printed; only the public key and the
//!   key fingerprint (an HMAC of a fixed label) are.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use countersign_core::audit::checkpoint::{
    Checkpoint, CheckpointPolicy, CheckpointSigner, PublicKey, VerifyFailure, expect_checkpoints,
};
use countersign_core::audit::{AuditRecord, ChainBreak, ChainVerifier};
use countersign_core::redact::RedactionKey;
use countersign_core::{Clock, Store, StoreError};

use crate::{Config, StartError};

/// How often the checkpoint task looks at the chain head.
pub const CHECKPOINT_POLL: Duration = Duration::from_secs(1);

/// `countersign audit …`.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute the chain and check every signed checkpoint; exit 1 naming the first broken
    /// record. With --file, verify an export offline instead of the database.
    Verify {
        /// A JSON-lines export (`audit export`) to verify instead of the database; a partial
        /// export starting at record k takes its first `prev` as given.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// The file is a sparse export (`export --run`): gaps in seq are allowed, and a record
        /// missing at a gap cannot be detected.
        #[arg(long, requires = "file")]
        sparse: bool,
        /// An older exported checkpoint (JSON) the chain must still extend: a truncated tail
        /// or a rewritten record at or before its seq is a break. Repeatable.
        #[arg(long = "from-checkpoint", value_name = "FILE")]
        from_checkpoint: Vec<PathBuf>,
        /// A trusted public key (hex or base64); checkpoints signed by any other key are
        /// refused. Repeatable. The configured audit_signing_key's public key is always trusted.
        #[arg(long = "public-key", value_name = "KEY")]
        public_key: Vec<String>,
    },
    /// Write records as JSON lines (one stored record per line) to stdout; `verify --file`
    /// accepts the output.
    Export {
        /// Only this run's records (sparse: verify it with --sparse).
        #[arg(long, conflicts_with = "since")]
        run: Option<String>,
        /// Every record from the first one at or after T (RFC 3339 or Unix ms) to the head.
        #[arg(long, value_name = "T")]
        since: Option<String>,
    },
    /// Sign the current chain head now, store the checkpoint and write it as JSON.
    Checkpoint {
        /// Write the checkpoint here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Write a stored checkpoint (the newest, or the newest at or below --seq) as JSON.
    ExportCheckpoint {
        /// The newest checkpoint at or below this record.
        #[arg(long)]
        seq: Option<i64>,
        /// Write the checkpoint here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print the public key that verifies this server's checkpoints (hex).
    PublicKey,
}

/// Why an audit command failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditCliError {
    /// Could not reach or migrate the database.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A refusal or a break, with its one-line reason.
    #[error("{0}")]
    Refused(String),
}

fn refused(msg: impl Into<String>) -> AuditCliError {
    AuditCliError::Refused(msg.into())
}

fn db(e: StoreError) -> AuditCliError {
    AuditCliError::Start(StartError::Database(e))
}

/// Runs an audit command; connects to the database only when it needs it.
///
/// # Errors
/// [`AuditCliError`], whose `Display` is the line to print.
pub async fn run_command(
    config: &Config,
    clock: Arc<dyn Clock>,
    command: AuditCommand,
) -> Result<(), AuditCliError> {
    match command {
        AuditCommand::PublicKey => {
            let signer = signer(config)?;
            println!("{}", signer.public_key());
            Ok(())
        }
        AuditCommand::Verify {
            file: Some(file),
            sparse,
            from_checkpoint,
            public_key,
        } => {
            let trusted = trusted_keys(config, &public_key)?;
            let external = read_checkpoints(&from_checkpoint)?;
            verify_file(&file, sparse, &external, &trusted)
        }
        command => {
            let store = crate::connect_and_migrate(config, clock)
                .await
                .map_err(StartError::Database)?;
            let result = with_store(config, &store, command).await;
            store.close().await;
            result
        }
    }
}

async fn with_store(
    config: &Config,
    store: &Store,
    command: AuditCommand,
) -> Result<(), AuditCliError> {
    match command {
        AuditCommand::PublicKey => Ok(()),
        AuditCommand::Verify {
            from_checkpoint,
            public_key,
            ..
        } => {
            let trusted = trusted_keys(config, &public_key)?;
            let external = read_checkpoints(&from_checkpoint)?;
            match store
                .verify_audit_full(&trusted, &external)
                .await
                .map_err(db)?
            {
                Ok(report) => {
                    println!(
                        "audit chain intact: {} record(s), {} signed checkpoint(s) verified",
                        report.records, report.checkpoints
                    );
                    note_untrusted(&trusted, report.checkpoints);
                    Ok(())
                }
                Err(f) => Err(refused(f.to_string())),
            }
        }
        AuditCommand::Export { run, since } => export(store, run, since).await,
        AuditCommand::Checkpoint { out } => {
            let signer = signer(config)?;
            let cp = store
                .checkpoint_audit(&signer, None)
                .await
                .map_err(db)?
                .ok_or_else(|| refused("the audit chain is empty: nothing to sign"))?;
            eprintln!("checkpoint for record {} ({})", cp.seq, cp.hash);
            write_checkpoint(&cp, out.as_deref())
        }
        AuditCommand::ExportCheckpoint { seq, out } => {
            let cp = store
                .audit_checkpoint_at_or_before(seq)
                .await
                .map_err(db)?
                .ok_or_else(|| refused("no stored checkpoint (at or below that record)"))?;
            write_checkpoint(&cp, out.as_deref())
        }
    }
}

fn signer(config: &Config) -> Result<CheckpointSigner, AuditCliError> {
    config.audit_signing_key.clone().ok_or_else(|| {
        refused("audit_signing_key (COUNTERSIGN_AUDIT_SIGNING_KEY) is not set: no checkpoint key")
    })
}

fn trusted_keys(config: &Config, given: &[String]) -> Result<Vec<PublicKey>, AuditCliError> {
    let mut keys = given
        .iter()
        .map(|k| PublicKey::parse(k).map_err(|e| refused(format!("--public-key {k:?}: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(s) = &config.audit_signing_key {
        keys.push(s.public_key());
    }
    Ok(keys)
}

fn note_untrusted(trusted: &[PublicKey], checkpoints: usize) {
    if trusted.is_empty() && checkpoints > 0 {
        eprintln!(
            "note: no trusted key (--public-key or audit_signing_key): checkpoint signatures were \
             checked against the key each names, which a writer of the database could replace"
        );
    }
}

fn read_checkpoints(files: &[PathBuf]) -> Result<Vec<(Checkpoint, String)>, AuditCliError> {
    files
        .iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(f).map_err(|e| refused(format!("{}: {e}", f.display())))?;
            let cp: Checkpoint = serde_json::from_str(&text)
                .map_err(|e| refused(format!("{}: not a checkpoint: {e}", f.display())))?;
            Ok((cp, format!("the checkpoint in {}", f.display())))
        })
        .collect()
}

fn write_checkpoint(cp: &Checkpoint, out: Option<&Path>) -> Result<(), AuditCliError> {
    let text = serde_json::to_string_pretty(cp)
        .map_err(|e| refused(format!("cannot serialise the checkpoint: {e}")))?;
    match out {
        Some(path) => std::fs::write(path, text + "\n")
            .map_err(|e| refused(format!("{}: {e}", path.display()))),
        None => {
            println!("{text}");
            Ok(())
        }
    }
}

/// Parses `--since`: Unix ms, or an RFC 3339 time.
fn parse_since(text: &str) -> Result<i64, AuditCliError> {
    if let Ok(ms) = text.trim().parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|_| refused(format!("--since {text:?}: expected RFC 3339 or Unix ms")))
}

async fn export(
    store: &Store,
    run: Option<String>,
    since: Option<String>,
) -> Result<(), AuditCliError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let write = |out: &mut std::io::BufWriter<_>, r: &AuditRecord| -> Result<(), AuditCliError> {
        let line = serde_json::to_string(r)
            .map_err(|e| refused(format!("cannot serialise record {}: {e}", r.seq)))?;
        writeln!(out, "{line}").map_err(|e| refused(format!("stdout: {e}")))
    };
    if let Some(run) = run {
        for r in store.audit_for_run(&run).await.map_err(db)? {
            write(&mut out, &r)?;
        }
    } else {
        let first = match since {
            None => Some(1),
            Some(t) => store
                .audit_first_seq_since(parse_since(&t)?)
                .await
                .map_err(db)?,
        };
        if let Some(mut next) = first {
            loop {
                let page = store.audit_records(next, 10_000).await.map_err(db)?;
                if page.is_empty() {
                    break;
                }
                next += page.len() as i64;
                for r in &page {
                    write(&mut out, r)?;
                }
            }
        }
    }
    out.flush().map_err(|e| refused(format!("stdout: {e}")))
}

/// Verifies a JSON-lines export offline.
fn verify_file(
    path: &Path,
    sparse: bool,
    external: &[(Checkpoint, String)],
    trusted: &[PublicKey],
) -> Result<(), AuditCliError> {
    let file =
        std::fs::File::open(path).map_err(|e| refused(format!("{}: {e}", path.display())))?;
    let mut lines = std::io::BufReader::new(file).lines().enumerate();
    let parse = |n: usize, line: std::io::Result<String>| -> Result<AuditRecord, AuditCliError> {
        let line = line.map_err(|e| refused(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&line).map_err(|e| {
            refused(format!(
                "{} line {}: not an audit record: {e}",
                path.display(),
                n + 1
            ))
        })
    };
    let first = loop {
        match lines.next() {
            None => break None,
            Some((_, Ok(l))) if l.trim().is_empty() => continue,
            Some((n, l)) => break Some(parse(n, l)?),
        }
    };
    let Some(first) = first else {
        if external.is_empty() {
            println!("{}: empty export, nothing to verify", path.display());
            return Ok(());
        }
        return Err(refused(format!(
            "{}: empty export, but checkpoints were given to check",
            path.display()
        )));
    };
    let mut v = ChainVerifier::new(first.seq, &first.prev);
    if sparse {
        v = v.sparse();
    }
    let failure = |f: VerifyFailure| refused(f.to_string());
    let checkpoints = expect_checkpoints(
        &mut v,
        external.iter().map(|(c, s)| (c, s.clone())),
        trusted,
    )
    .map_err(failure)?;
    let gap_hint = |b: ChainBreak| -> AuditCliError {
        if !sparse && b.reason.starts_with("expected record") {
            refused(format!(
                "{b} (an export --run is sparse: verify it with --sparse)"
            ))
        } else {
            refused(b.to_string())
        }
    };
    v.push(&first).map_err(gap_hint)?;
    for (n, line) in lines {
        if matches!(&line, Ok(l) if l.trim().is_empty()) {
            continue;
        }
        let r = parse(n, line)?;
        v.push(&r).map_err(gap_hint)?;
    }
    // A sparse export may end before a checkpoint's record: that one was not compared either.
    let skipped = v.skipped_checkpoints() + if sparse { v.pending_checkpoints() } else { 0 };
    let count = v.finish().map_err(|b| refused(b.to_string()))?;
    println!(
        "{}: intact: {count} record(s) from record {}{}, {} checkpoint(s) given{}",
        path.display(),
        first.seq,
        if sparse { " (sparse)" } else { "" },
        checkpoints,
        if skipped > 0 {
            format!(", {skipped} of them outside the export and not compared")
        } else {
            String::new()
        }
    );
    note_untrusted(trusted, checkpoints);
    Ok(())
}

/// Starts the background task that signs a checkpoint when one is due. Errors are logged
/// and retried at the next poll.
pub fn spawn_checkpointer(
    store: Store,
    signer: CheckpointSigner,
    policy: CheckpointPolicy,
    poll: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match store.checkpoint_audit(&signer, Some(policy)).await {
                Ok(Some(cp)) => tracing::info!(seq = cp.seq, "audit checkpoint signed"),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "audit checkpoint failed; retrying"),
            }
        }
    })
}

/// Records the redaction key's fingerprint as an audit event when it changed (or is new).
///
/// # Errors
/// The database refused the append.
pub async fn record_redaction_key(store: &Store, key: &RedactionKey) -> Result<(), StoreError> {
    if let Some(r) = store
        .record_redaction_key(&key.fingerprint(), key.id().as_str(), "countersign.serve")
        .await?
    {
        tracing::info!(
            seq = r.seq,
            key_id = key.id().as_str(),
            "redaction key recorded in the audit trail (new or rotated)"
        );
    }
    Ok(())
}
