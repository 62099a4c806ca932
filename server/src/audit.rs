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
use countersign_core::audit::note::CheckpointNote;
use countersign_core::audit::tree_head::{CheckpointLeaves, InclusionProof, Leaf};
use countersign_core::audit::{
    AuditRecord, ChainBreak, ChainVerifier, LEGACY_CHAIN, SYSTEM_CHAIN, chain_of_tenant,
};
use countersign_core::redact::RedactionKey;
use countersign_core::{Clock, Store, StoreError};

use crate::{Config, StartError};

/// How often the checkpoint task looks at the chain head.
pub const CHECKPOINT_POLL: Duration = Duration::from_secs(1);

/// `countersign audit …`.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute every chain (or one tenant's) and check every signed checkpoint; exit 1
    /// naming the first broken record. With --file, verify an export offline instead of the
    /// database.
    Verify {
        /// Only this tenant's chain (or `_system`, `_legacy`), and the log of checkpoints.
        #[arg(long, conflicts_with = "file")]
        tenant: Option<String>,
        /// A JSON-lines export (`audit export`) to verify instead of the database; a partial
        /// export starting at record k takes its first `prev` as given.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// The file is a sparse export (`export --run`): gaps in seq are allowed, and a record
        /// missing at a gap cannot be detected.
        #[arg(long, requires = "file")]
        sparse: bool,
        /// An exported checkpoint (a signed note from `audit checkpoint`, or a legacy JSON
        /// checkpoint) the chains must still extend: a truncated tail, a rewritten record at
        /// or before its seq, or a stored log of checkpoints without it is a break. Repeatable.
        #[arg(long = "from-checkpoint", value_name = "FILE")]
        from_checkpoint: Vec<PathBuf>,
        /// A trusted public key (hex or base64); checkpoints signed by any other key are
        /// refused. Repeatable. The configured audit_signing_key's public key is always trusted.
        #[arg(long = "public-key", value_name = "KEY")]
        public_key: Vec<String>,
    },
    /// Write records as JSON lines (one stored record per line, chain by chain) to stdout;
    /// `verify --file` accepts the output.
    Export {
        /// Only this tenant's chain (or `_system`, `_legacy`), from its first record, led by
        /// the proof that the newest checkpoint covers it: its auditor verifies it offline
        /// with `verify --file` and the public key, seeing no other tenant's records.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this run's records (sparse: verify it with --sparse).
        #[arg(long, conflicts_with = "since")]
        run: Option<String>,
        /// Every record from the first one at or after T (RFC 3339 or Unix ms) to the head.
        #[arg(long, value_name = "T")]
        since: Option<String>,
    },
    /// Sign every chain's head now (a checkpoint note), store it and write it out.
    Checkpoint {
        /// Write the checkpoint here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Write a stored checkpoint note (the newest, or number --number).
    ExportCheckpoint {
        /// The checkpoint's number.
        #[arg(long)]
        number: Option<i64>,
        /// Write the checkpoint here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print the public key that verifies this server's checkpoints (hex).
    PublicKey,
    /// Check every passkey-signed approval: verify the chain(s) as `verify` does, then
    /// re-derive each signed record's challenge from the record (what was signed, verdict,
    /// approver, expiry, nonce) and verify its signature with the public key recorded at the
    /// passkey's registration; exit 1 naming the first record that fails. With --from-export,
    /// an export file (`audit export`) offline, needing nothing else.
    VerifySignatures {
        /// A JSON-lines export to check instead of the database.
        #[arg(long = "from-export", value_name = "FILE")]
        from_export: Option<PathBuf>,
        /// Only this tenant's chain.
        #[arg(long, conflicts_with = "from_export")]
        tenant: Option<String>,
        /// An exported checkpoint the chains must still extend (as for `verify`). Repeatable.
        #[arg(long = "from-checkpoint", value_name = "FILE")]
        from_checkpoint: Vec<PathBuf>,
        /// A trusted checkpoint public key (as for `verify`). Repeatable.
        #[arg(long = "public-key", value_name = "KEY")]
        public_key: Vec<String>,
    },
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
            ..
        } => {
            let trusted = trusted_keys(config, &public_key)?;
            let external = read_checkpoints(&from_checkpoint)?;
            verify_file(&file, sparse, &external, &trusted)
        }
        AuditCommand::VerifySignatures {
            from_export: Some(file),
            from_checkpoint,
            public_key,
            ..
        } => {
            // The records are only as good as their chain: verify it first (as `verify --file`).
            let trusted = trusted_keys(config, &public_key)?;
            verify_file(&file, false, &read_checkpoints(&from_checkpoint)?, &trusted)?;
            signatures_in_file(&file)
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
        AuditCommand::VerifySignatures {
            tenant,
            from_checkpoint,
            public_key,
            ..
        } => {
            let only = tenant.as_deref().map(chain_named).transpose()?;
            // The records are only as good as their chain: verify it first (as `verify`).
            let trusted = trusted_keys(config, &public_key)?;
            let external = read_checkpoints(&from_checkpoint)?;
            if let Err(f) = store
                .verify_audit_full(&trusted, &external.legacy, &external.notes, only.as_deref())
                .await
                .map_err(db)?
            {
                return Err(refused(f.to_string()));
            }
            let report = store
                .verify_stored_signatures(only.as_deref())
                .await
                .map_err(db)?
                .map_err(|f| refused(format!("signature check failed: {f}")))?;
            print_signatures(&report);
            Ok(())
        }
        AuditCommand::Verify {
            tenant,
            from_checkpoint,
            public_key,
            ..
        } => {
            let trusted = trusted_keys(config, &public_key)?;
            let external = read_checkpoints(&from_checkpoint)?;
            let only = tenant.as_deref().map(chain_named).transpose()?;
            match store
                .verify_audit_full(&trusted, &external.legacy, &external.notes, only.as_deref())
                .await
                .map_err(db)?
            {
                Ok(report) => {
                    println!(
                        "audit intact: {} record(s) in {} chain(s){}, {} signed checkpoint(s) \
                         verified",
                        report.records,
                        report.chains,
                        only.map(|c| format!(" (only {c})")).unwrap_or_default(),
                        report.checkpoints
                    );
                    note_untrusted(&trusted, report.checkpoints);
                    Ok(())
                }
                Err(f) => Err(refused(f.to_string())),
            }
        }
        AuditCommand::Export { tenant, run, since } => {
            let chain = tenant.as_deref().map(chain_named).transpose()?;
            export(store, chain, run, since).await
        }
        AuditCommand::Checkpoint { out } => {
            let signer = signer(config)?;
            let th = store
                .checkpoint_audit(&signer, None)
                .await
                .map_err(db)?
                .ok_or_else(|| refused("the audit trail is empty: nothing to sign"))?;
            eprintln!(
                "checkpoint {} over {} chain(s)",
                th.number(),
                th.leaves.len()
            );
            write_text(&th.note.text, out.as_deref())
        }
        AuditCommand::ExportCheckpoint { number, out } => {
            let th = match number {
                None => store.latest_tree_head().await.map_err(db)?,
                Some(n) => store
                    .tree_heads()
                    .await
                    .map_err(db)?
                    .into_iter()
                    .find(|t| t.number() == n),
            }
            .ok_or_else(|| refused("no such stored checkpoint"))?;
            write_text(&th.note.text, out.as_deref())
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

/// The chain `--tenant` names: a tenant's, or a reserved chain by its own name.
fn chain_named(tenant: &str) -> Result<String, AuditCliError> {
    if tenant == SYSTEM_CHAIN || tenant == LEGACY_CHAIN {
        return Ok(tenant.to_string());
    }
    chain_of_tenant(Some(tenant))
        .map_err(|e| refused(format!("--tenant {tenant:?}: {}", StoreError::from(e))))
}

/// Checkpoints read from files: notes over every chain, and legacy JSON ones.
#[derive(Default)]
struct External {
    notes: Vec<(CheckpointNote, String)>,
    legacy: Vec<(Checkpoint, String)>,
}

fn read_checkpoints(files: &[PathBuf]) -> Result<External, AuditCliError> {
    let mut out = External::default();
    for f in files {
        let text =
            std::fs::read_to_string(f).map_err(|e| refused(format!("{}: {e}", f.display())))?;
        let label = format!("the checkpoint in {}", f.display());
        if text.trim_start().starts_with('{') {
            let cp: Checkpoint = serde_json::from_str(&text)
                .map_err(|e| refused(format!("{}: not a checkpoint: {e}", f.display())))?;
            out.legacy.push((cp, label));
        } else {
            let note = CheckpointNote::parse(&text)
                .map_err(|e| refused(format!("{}: {e}", f.display())))?;
            out.notes.push((note, label));
        }
    }
    Ok(out)
}

fn write_text(text: &str, out: Option<&Path>) -> Result<(), AuditCliError> {
    match out {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| refused(format!("{}: {e}", path.display())))
        }
        None => {
            print!("{text}");
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
    chain: Option<String>,
    run: Option<String>,
    since: Option<String>,
) -> Result<(), AuditCliError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let line = |out: &mut std::io::BufWriter<_>, text: String| -> Result<(), AuditCliError> {
        writeln!(out, "{text}").map_err(|e| refused(format!("stdout: {e}")))
    };
    let record = |r: &AuditRecord| -> Result<String, AuditCliError> {
        serde_json::to_string(r)
            .map_err(|e| refused(format!("cannot serialise record {}: {e}", r.seq)))
    };
    if let Some(run) = run {
        for r in store.audit_for_run(&run).await.map_err(db)? {
            line(&mut out, record(&r)?)?;
        }
        return out.flush().map_err(|e| refused(format!("stdout: {e}")));
    }
    let chains = match &chain {
        Some(c) => {
            let covering = store.latest_tree_head().await.map_err(db)?;
            let proof = match &covering {
                Some(th) => InclusionProof::of(th, c).map_err(db)?,
                None => None,
            };
            match proof {
                Some(p) => line(
                    &mut out,
                    serde_json::to_string(&p)
                        .map_err(|e| refused(format!("cannot serialise the proof: {e}")))?,
                )?,
                None => eprintln!(
                    "note: no checkpoint covers chain {c} yet (run `countersign audit \
                     checkpoint`): the export carries no proof"
                ),
            }
            vec![c.clone()]
        }
        None => {
            // Whole chains from record 1: led by the newest checkpoint and all its leaves, so
            // each chain is pinned offline and a chain left out is noticed.
            match store.latest_tree_head().await.map_err(db)? {
                Some(th) if since.is_none() => line(
                    &mut out,
                    serde_json::to_string(&CheckpointLeaves::of(&th))
                        .map_err(|e| refused(format!("cannot serialise the checkpoint: {e}")))?,
                )?,
                Some(_) => {}
                None => eprintln!(
                    "note: no checkpoint yet (run `countersign audit checkpoint`): the export \
                     carries none"
                ),
            }
            store.audit_chain_names().await.map_err(db)?
        }
    };
    let since = since.as_deref().map(parse_since).transpose()?;
    for chain in chains {
        let first = match since {
            None => Some(1),
            Some(t) => store.audit_first_seq_since(&chain, t).await.map_err(db)?,
        };
        let Some(mut next) = first else {
            continue;
        };
        loop {
            let page = store
                .audit_records(&chain, next, 10_000)
                .await
                .map_err(db)?;
            if page.is_empty() {
                break;
            }
            next += page.len() as i64;
            for r in &page {
                line(&mut out, record(r)?)?;
            }
        }
    }
    out.flush().map_err(|e| refused(format!("stdout: {e}")))
}

/// One line of an export: a record, or (first) the checkpoint it carries: a tenant's export's
/// inclusion proof, or a whole export's leaves.
enum ExportLine {
    Record(Box<AuditRecord>),
    Proof(Box<InclusionProof>),
    Leaves(Box<CheckpointLeaves>),
}

/// Verifies a JSON-lines export offline: chain by chain (records of one chain are
/// consecutive), each from its first record, against the proof the export opens with and the
/// checkpoints given.
fn verify_file(
    path: &Path,
    sparse: bool,
    external: &External,
    trusted: &[PublicKey],
) -> Result<(), AuditCliError> {
    let file =
        std::fs::File::open(path).map_err(|e| refused(format!("{}: {e}", path.display())))?;
    let parse = |n: usize, line: &str| -> Result<ExportLine, AuditCliError> {
        if let Ok(r) = serde_json::from_str::<AuditRecord>(line) {
            return Ok(ExportLine::Record(Box::new(r)));
        }
        if n == 0
            && let Ok(p) = serde_json::from_str::<InclusionProof>(line)
        {
            return Ok(ExportLine::Proof(Box::new(p)));
        }
        if n == 0
            && let Ok(l) = serde_json::from_str::<CheckpointLeaves>(line)
        {
            return Ok(ExportLine::Leaves(Box::new(l)));
        }
        let e = serde_json::from_str::<AuditRecord>(line).err();
        Err(refused(format!(
            "{} line {}: not an audit record: {}",
            path.display(),
            n + 1,
            e.map(|e| e.to_string()).unwrap_or_default()
        )))
    };
    let failure = |f: VerifyFailure| refused(f.to_string());
    let gap_hint = |b: ChainBreak| -> AuditCliError {
        if !sparse && b.reason.starts_with("expected record") {
            refused(format!(
                "{b} (an export --run is sparse: verify it with --sparse)"
            ))
        } else {
            refused(b.to_string())
        }
    };
    // The checkpoint the export carries, and the chain heads it pins.
    let mut proven: Option<(Vec<Leaf>, CheckpointNote)> = None;
    let mut current: Option<ChainVerifier> = None;
    let mut first_seq = None;
    let (mut count, mut chains, mut checkpoints, mut skipped) = (0_i64, 0_usize, 0_usize, 0_usize);
    let mut seen_chains: Vec<String> = Vec::new();
    let finish =
        |v: ChainVerifier, checkpoints_skipped: &mut usize| -> Result<i64, AuditCliError> {
            *checkpoints_skipped +=
                v.skipped_checkpoints() + if sparse { v.pending_checkpoints() } else { 0 };
            v.finish().map_err(|b| refused(b.to_string()))
        };
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| refused(format!("{}: {e}", path.display())))?;
        if line.trim().is_empty() {
            continue;
        }
        let r = match parse(n, &line)? {
            ExportLine::Proof(p) => {
                let note = p.verify(trusted).map_err(failure)?;
                checkpoints += 1;
                proven = Some((vec![p.leaf.clone()], note));
                continue;
            }
            ExportLine::Leaves(l) => {
                let note = l.verify(trusted).map_err(failure)?;
                checkpoints += 1;
                proven = Some((l.leaves.clone(), note));
                continue;
            }
            ExportLine::Record(r) => *r,
        };
        if current.as_ref().is_none_or(|v| v.chain_name() != r.chain) {
            if let Some(v) = current.take() {
                count += finish(v, &mut skipped)?;
                chains += 1;
            }
            if seen_chains.contains(&r.chain) {
                return Err(refused(format!(
                    "{} line {}: chain {} continues after another chain: an export lists each \
                     chain's records together",
                    path.display(),
                    n + 1,
                    r.chain
                )));
            }
            seen_chains.push(r.chain.clone());
            first_seq.get_or_insert(r.seq);
            let mut v = ChainVerifier::new(r.seq, &r.prev).chain(&r.chain);
            if sparse {
                v = v.sparse();
            }
            if r.chain == LEGACY_CHAIN {
                checkpoints += expect_checkpoints(
                    &mut v,
                    external.legacy.iter().map(|(c, s)| (c, s.clone())),
                    trusted,
                )
                .map_err(failure)?;
            }
            if let Some((leaves, note)) = &proven
                && let Some(leaf) = leaves.iter().find(|l| l.chain == r.chain)
            {
                // The pinned record, or the one right after it, must be in the export: a
                // chain that starts later would be checked against nothing.
                if r.seq > leaf.seq.saturating_add(1) {
                    return Err(refused(format!(
                        "{} line {}: chain {} starts at record {} but checkpoint {} pins record \
                         {}: the records between are missing",
                        path.display(),
                        n + 1,
                        r.chain,
                        r.seq,
                        note.body.number,
                        leaf.seq
                    )));
                }
                v.expect(
                    leaf.seq,
                    &leaf.hash,
                    format!("checkpoint {} (carried by the export)", note.body.number),
                )
                .map_err(|b| refused(b.to_string()))?;
            }
            current = Some(v);
        }
        if let Some(v) = current.as_mut() {
            v.push(&r).map_err(gap_hint)?;
        }
    }
    if let Some(v) = current.take() {
        count += finish(v, &mut skipped)?;
        chains += 1;
    }
    if let Some((leaves, note)) = &proven
        && let Some(leaf) = leaves.iter().find(|l| !seen_chains.contains(&l.chain))
    {
        return Err(refused(format!(
            "{}: checkpoint {} covers chain {} up to record {} but the export holds none of \
             its records: they were removed",
            path.display(),
            note.body.number,
            leaf.chain,
            leaf.seq
        )));
    }
    // Legacy checkpoints pin the legacy chain: without its records they check nothing.
    if !external.legacy.is_empty() && !seen_chains.iter().any(|c| c == LEGACY_CHAIN) {
        if !sparse {
            return Err(refused(format!(
                "{}: {} legacy checkpoint(s) given but the export holds no record of the \
                 {LEGACY_CHAIN} chain they pin",
                path.display(),
                external.legacy.len()
            )));
        }
        skipped += external.legacy.len();
    }
    // A checkpoint file given must be checked here, or the verification fails: the export's
    // own checkpoint (same number: the same text), or the one right after it links to it.
    for (note, label) in &external.notes {
        let n = note.body.number;
        match &proven {
            Some((_, mine)) if mine.body.number == n => {
                if mine.body != note.body {
                    return Err(refused(format!(
                        "{label} differs from the export's checkpoint {n}: the log was forked"
                    )));
                }
                checkpoints += 1;
            }
            Some((_, mine)) if mine.body.number == n + 1 && mine.body.prev == note.body.hash() => {
                checkpoints += 1;
            }
            _ if sparse => skipped += 1,
            Some((_, mine)) => {
                return Err(refused(format!(
                    "{label} is checkpoint {n}, which this export (carrying checkpoint {}) \
                     cannot check: verify against the database, or export again",
                    mine.body.number
                )));
            }
            None => {
                return Err(refused(format!(
                    "{label} cannot be checked: this export carries no checkpoint (an export \
                     --since carries none; export whole chains, or verify against the database)"
                )));
            }
        }
    }
    if chains == 0 {
        if external.notes.is_empty() && external.legacy.is_empty() && proven.is_none() {
            println!("{}: empty export, nothing to verify", path.display());
            return Ok(());
        }
        return Err(refused(format!(
            "{}: empty export, but checkpoints were given to check",
            path.display()
        )));
    }
    println!(
        "{}: intact: {count} record(s) in {chains} chain(s) from record {}{}, {checkpoints} \
         checkpoint(s) checked{}",
        path.display(),
        first_seq.unwrap_or(1),
        if sparse { " (sparse)" } else { "" },
        if skipped > 0 {
            format!(", {skipped} given but outside the export and not compared")
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
                Ok(Some(th)) => tracing::info!(
                    number = th.number(),
                    chains = th.leaves.len(),
                    "audit checkpoint signed"
                ),
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

/// `audit verify-signatures --from-export FILE`: every record of the export (chain by chain,
/// as `audit export` writes them; a leading checkpoint proof is skipped).
fn signatures_in_file(path: &Path) -> Result<(), AuditCliError> {
    let file =
        std::fs::File::open(path).map_err(|e| refused(format!("{}: {e}", path.display())))?;
    let mut records = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| refused(format!("{}: {e}", path.display())))?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<AuditRecord>(&line) {
            Ok(r) => records.push(r),
            // The proof a tenant export starts with is not a record.
            Err(_) if n == 0 => {}
            Err(e) => {
                return Err(refused(format!(
                    "{} line {}: not an audit record: {e}",
                    path.display(),
                    n + 1
                )));
            }
        }
    }
    let report = countersign_core::signing::offline::verify_signatures(&records)
        .map_err(|f| refused(format!("signature check failed: {f}")))?;
    print_signatures(&report);
    Ok(())
}

fn print_signatures(report: &countersign_core::signing::offline::SignatureReport) {
    println!(
        "signatures intact: {} signed decision(s) verified against {} passkey registration(s)",
        report.signatures, report.registrations
    );
}
