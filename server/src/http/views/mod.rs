//! The server side of the dashboard's run timeline, audit search and gate metrics
//! ([`countersign_app::runs`], [`countersign_app::audit`], [`countersign_app::metrics`] with
//! the gate advisor and shadow rules), the audit export route `GET /audit/export.jsonl`, and
//! the two forms of the metrics page that file proposals (`drafts`: `POST /gates/draft`,
//! `POST /admin/shadow/promote`; their invariants are that module's).
//!
//! Invariants:
//! * Apart from `drafts`, everything here only reads. Nothing here decides who may see what
//!   alone: the app's server functions check the signed-in person's role and tenant first
//!   and pass the tenant in; every query is scoped to it (runs of that tenant; audit records
//!   of its runs, or of no run).
//! * `GET /audit/export.jsonl` sits behind the session gate (signed out: redirect to
//!   sign-in), needs the auditor, admin or manager role and a tenant (403 otherwise), and
//!   writes exactly the lines `countersign audit export` writes (one stored record, as JSON,
//!   per line), in chain order, for the same filter the search page shows. A filtered export
//!   is sparse: verify it with `countersign audit verify --file F --sparse`.
//! * The chain status fails closed: a refused checkpoint or any break is shown as broken
//!   with the first bad record; a tail too long to check on a page load is shown as
//!   not checked, never as intact.

mod advice;
mod drafts;
mod export;
mod metrics;
pub use advice::{Draft, draft_for};
pub use drafts::{draft, promote};
pub use export::export;
use metrics::{DAY_MS, detail_of};
use std::collections::BTreeMap;
use std::sync::Arc;

use countersign_app::audit::{
    Audit, AuditPage, AuditQuery, AuditRow, AuditSource, ChainStatus, PAGE_SIZE,
};
use countersign_app::inbox::{BoxFuture, format_amount, pretty_canonical};
use countersign_app::metrics::{AdviceRow, Metrics, MetricsData, MetricsSource, WINDOW_DAYS};
use countersign_app::runs::{
    EventView, RunDetail, RunListPage, RunRow, Runs, RunsSource, StepCounts, StepLinks, StepView,
};
use countersign_core::StoreError;
use countersign_core::audit::chain_of_tenant;
use countersign_core::audit::checkpoint::{PublicKey, VerifyFailure};
use countersign_core::audit::tree_head::InclusionProof;
use countersign_core::audit::{AuditRecord, ChainVerifier};
use countersign_core::store::{AuditCursor, AuditFilter, Run};
use serde_json::Value;

use super::inbox::{target, utc};
use super::names::Names;
use crate::AppState;

/// Runs per page of the run list.
const RUNS_PAGE: i64 = 50;
/// Records after the last signed checkpoint that a page load still verifies.
pub const MAX_TAIL: i64 = 100_000;

/// The store-backed sources of the three pages, and the one full chain verification this
/// server runs at a time.
pub struct Views(pub AppState, FullCheck);

/// Held while [`Views::chain_status`] verifies the whole chain. (No result is reused: a
/// record changed in place keeps the head, so only a new reading can tell.)
type FullCheck = tokio::sync::Mutex<()>;

/// The context values the router provides to the dashboard.
pub fn contexts(state: &AppState) -> (Runs, Audit, Metrics) {
    let views = Arc::new(Views(state.clone(), FullCheck::default()));
    (Runs(views.clone()), Audit(views.clone()), Metrics(views))
}

fn opaque(what: &'static str) -> impl Fn(StoreError) -> String {
    move |e| {
        tracing::error!(error = %e, "{what} failed");
        "the database did not answer".to_string()
    }
}

fn run_row(run: &Run, counts: StepCounts, names: &Names) -> RunRow {
    RunRow {
        id: run.id.clone(),
        task: run.task.clone(),
        status: run.status.as_str().to_string(),
        principal: run.principal.clone(),
        principal_name: names.actor(&run.principal),
        tenant: run.tenant.clone(),
        origin: run.origin.clone(),
        created: utc(run.created_at),
        reason: run.reason.clone(),
        steps: counts,
    }
}

fn add_count(c: &mut StepCounts, status: &str, n: i64) {
    c.total += n;
    match status {
        "done" => c.done += n,
        "needs_approval" => c.waiting += n,
        "pending" | "running" => c.open += n,
        "unknown" => c.unknown += n,
        _ => c.stopped += n,
    }
}

fn amount_of(inputs: &Value) -> Option<String> {
    inputs
        .get("amount")
        .and_then(Value::as_f64)
        .and_then(|a| format_amount(a, inputs.get("currency").and_then(Value::as_str)))
}

/// A one-line summary of a record's detail: decision, amount with currency, approvals,
/// outcome, reference, latency.
pub fn summary(record: &str) -> String {
    let d = detail_of(record);
    let text = |k: &str| d.get(k).and_then(Value::as_str).map(str::to_string);
    let mut parts = Vec::new();
    if let Some(decision) = text("decision") {
        parts.push(format!("decision {decision}"));
    }
    if let Some(inputs) = d.get("inputs") {
        if let Some(amount) = amount_of(inputs) {
            parts.push(amount);
        }
        if let Some(t) = target(inputs) {
            parts.push(t);
        }
    }
    if let (Some(given), Some(needed)) = (
        d.get("approvals").and_then(Value::as_i64),
        d.get("approvals_needed").and_then(Value::as_i64),
    ) {
        parts.push(format!("{given} of {needed} approval(s)"));
    }
    if let Some(reason) = text("reason") {
        parts.push(format!("reason: {reason}"));
    }
    if let Some(status) = text("status") {
        parts.push(format!("status {status}"));
    }
    if let Some(code) = text("code") {
        parts.push(format!("code {code}"));
    }
    if let Some(state) = text("key_state") {
        parts.push(format!("key {state}"));
    }
    if let Some(found) = d.get("found").and_then(Value::as_bool) {
        parts.push(if found {
            "the target has the effect".to_string()
        } else {
            "the target has no effect under this key".to_string()
        });
    }
    if let Some(reference) = text("reference") {
        parts.push(format!("ref {reference}"));
    }
    if let Some(ms) = d.get("latency_ms").and_then(Value::as_i64) {
        parts.push(format!("{ms} ms"));
    }
    if let Some(kind) = text("kind") {
        parts.push(kind);
    }
    if d.get("replay").and_then(Value::as_bool) == Some(true) {
        parts.push("replayed: stored outcome returned".to_string());
    }
    parts.join(" · ")
}

/// How long a run's task may be where it names the run in a list.
const TASK_NAME_CHARS: usize = 60;

/// `task` shortened to name its run in a list.
fn task_name(task: &str) -> String {
    let mut chars = task.chars();
    let head: String = chars.by_ref().take(TASK_NAME_CHARS).collect();
    if chars.next().is_some() {
        format!("{}…", head.trim_end())
    } else {
        head
    }
}

fn audit_row(r: &AuditRecord, names: &Names, tasks: &BTreeMap<String, String>) -> AuditRow {
    AuditRow {
        run_task: r
            .run_id
            .as_ref()
            .and_then(|id| tasks.get(id))
            .map(|t| task_name(t)),
        actor_name: r.actor.as_deref().map(|a| names.actor(a)),
        seq: r.seq,
        at: utc_seconds(r.at),
        event: r.event.clone(),
        run_id: r.run_id.clone(),
        step_id: r.step_id.clone(),
        tool: r.tool.clone(),
        actor: r.actor.clone(),
        rule: r.rule.clone(),
        summary: summary(&r.record),
        record: pretty_canonical(&r.record),
        hash: r.hash.clone(),
        signed: serde_json::from_str::<serde_json::Value>(&r.record)
            .ok()
            .and_then(|v| {
                v.pointer("/detail/signature")
                    .map(serde_json::Value::is_object)
            })
            .unwrap_or(false),
    }
}

fn utc_seconds(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || "unknown time".into(),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// Reads a time filter: Unix ms, `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM[:SS]` (UTC) or RFC 3339.
pub fn parse_time(text: &str) -> Option<i64> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<i64>() {
        return Some(ms);
    }
    if let Ok(d) = chrono::DateTime::parse_from_rfc3339(t) {
        return Some(d.timestamp_millis());
    }
    for f in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(d) = chrono::NaiveDateTime::parse_from_str(t, f) {
            return Some(d.and_utc().timestamp_millis());
        }
    }
    chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|d| d.and_utc().timestamp_millis())
}

/// The store filter for `q` within `tenant`; `Err` names the field that does not parse.
pub fn filter_for(tenant: &str, q: &AuditQuery) -> Result<AuditFilter, String> {
    let time = |field: &str, v: &Option<String>| -> Result<Option<i64>, String> {
        match v.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(s) => parse_time(s).map(Some).ok_or_else(|| {
                format!(
                    "The {field} time could not be read. Use YYYY-MM-DD or YYYY-MM-DDTHH:MM (UTC). \
                     No records were searched."
                )
            }),
        }
    };
    let clean = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    Ok(AuditFilter {
        tenant: Some(tenant.to_string()),
        run: clean(&q.run),
        tool: clean(&q.tool),
        actor: clean(&q.actor),
        approver: clean(&q.approver),
        event: clean(&q.event),
        rule: clean(&q.rule),
        from_ms: time("from", &q.from)?,
        to_ms: time("to", &q.to)?,
    })
}

/// `q` with an actor given as an agent's name (no `:`) replaced by the recorded actor of that
/// active agent's direct calls, when the tenant has one of that name (the search page and the
/// export filter alike).
pub(crate) fn with_agent_names(names: &Names, tenant: &str, q: &AuditQuery) -> AuditQuery {
    let mut q = q.clone();
    if let Some(actor) = q
        .actor
        .as_deref()
        .map(str::trim)
        .filter(|a| !a.contains(':'))
        && let Some(recorded) = names.agent_actor(actor, tenant)
    {
        q.actor = Some(recorded);
    }
    q
}

fn cursor_for(q: &AuditQuery) -> Result<AuditCursor, String> {
    let num = |v: &Option<String>| -> Result<Option<i64>, String> {
        match v.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(s) => s
                .parse::<i64>()
                .map(Some)
                .map_err(|_| "The page cursor could not be read.".to_string()),
        }
    };
    Ok(match (num(&q.before)?, num(&q.after)?) {
        (Some(b), _) => AuditCursor::Before(b),
        (None, Some(a)) => AuditCursor::After(a),
        (None, None) => AuditCursor::Newest,
    })
}

fn broken(f: VerifyFailure) -> ChainStatus {
    match f {
        VerifyFailure::Chain(b) => ChainStatus::Broken {
            seq: b.seq,
            reason: b.reason,
        },
        VerifyFailure::Log { number, reason } => ChainStatus::Broken {
            seq: 0,
            reason: format!("checkpoint {number} is refused: {reason}"),
        },
        VerifyFailure::Checkpoint { seq, error, .. } => ChainStatus::Broken {
            seq,
            reason: format!("the signed checkpoint for record {seq} is refused: {error}"),
        },
    }
}

impl Views {
    async fn run_page(
        &self,
        tenant: &str,
        before: Option<String>,
    ) -> Result<RunListPage, StoreError> {
        let store = &self.0.store;
        let cursor = before.as_deref().and_then(|c| {
            let (at, id) = c.split_once(':')?;
            Some((at.parse::<i64>().ok()?, id.to_string()))
        });
        let mut runs = store
            .runs_page(
                tenant,
                cursor.as_ref().map(|(at, id)| (*at, id.as_str())),
                RUNS_PAGE + 1,
            )
            .await?;
        let older = if runs.len() as i64 > RUNS_PAGE {
            runs.truncate(usize::try_from(RUNS_PAGE).unwrap_or(50));
            runs.last().map(|r| format!("{}:{}", r.created_at, r.id))
        } else {
            None
        };
        let ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
        let mut counts: BTreeMap<String, StepCounts> = BTreeMap::new();
        for (run, status, n) in store.step_status_counts(&ids).await? {
            add_count(counts.entry(run).or_default(), &status, n);
        }
        let names = Names::load(store, tenant).await?;
        let rows = runs
            .iter()
            .map(|r| run_row(r, counts.remove(&r.id).unwrap_or_default(), &names))
            .collect();
        Ok((rows, older))
    }

    async fn run_detail(&self, tenant: &str, id: &str) -> Result<Option<RunDetail>, StoreError> {
        let store = &self.0.store;
        let run = match store.get_run(id).await {
            Ok(r) => r,
            Err(StoreError::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        if run.tenant != tenant {
            return Ok(None);
        }
        let steps = store.steps_for_run(&run.id).await?;
        let records = store.audit_for_run(&run.id).await?;
        let mut counts = StepCounts::default();
        for s in &steps {
            add_count(&mut counts, s.status.as_str(), 1);
        }
        let mut links: BTreeMap<&str, StepLinks> = BTreeMap::new();
        for r in &records {
            let Some(step) = r.step_id.as_deref() else {
                continue;
            };
            let l = links.entry(step).or_default();
            // The proposal is the step's first record: `proposed` for a planned step, the
            // first `decided` (carrying the inputs) for an agent's direct call.
            l.proposal.get_or_insert(r.seq);
            match r.event.as_str() {
                "decided" => l.decision = Some(r.seq),
                "approved" | "rejected" | "expired" => l.approvals.push((r.seq, r.event.clone())),
                "succeeded" | "failed" | "unknown" | "reconciled" | "refused" | "cancelled"
                | "compensated" => {
                    l.outcome = Some((r.seq, r.event.clone()));
                    // A read's one record carries its decision too (`pipeline::FOLDED`).
                    if crate::pipeline::folds(
                        &r.record,
                        countersign_core::audit::AuditEvent::Decided,
                    ) {
                        l.decision = Some(r.seq);
                    }
                }
                _ => {}
            }
        }
        let step_seq: BTreeMap<&str, i64> = steps.iter().map(|s| (s.id.as_str(), s.seq)).collect();
        let loaded = self.0.registry.current();
        let step_views = steps
            .iter()
            .map(|s| {
                // Shown through the tool's redaction; a tool no longer in the registry shows
                // nothing of its inputs or answer (fail closed).
                let tool = loaded.as_ref().and_then(|l| {
                    countersign_core::ToolName::parse(&s.tool)
                        .ok()
                        .and_then(|t| l.bundle.registry.tool(&t).cloned())
                });
                let shown = |text: &str| match (&tool, serde_json::from_str::<Value>(text)) {
                    (Some(tool), Ok(v)) => crate::pipeline::redacted(&self.0.shown_key, tool, &v),
                    _ => Value::Null,
                };
                // Inputs as the audit shows them (keyed digests; a plan's steps each by its
                // own tool).
                let inputs = match (&tool, serde_json::from_str::<Value>(&s.inputs)) {
                    (Some(tool), Ok(v)) => crate::pipeline::audit_inputs(&self.0, tool, &v),
                    _ => Value::Null,
                };
                let reference = s.outcome.as_deref().map(shown).and_then(|o| {
                    o.pointer("/answer/ref")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
                StepView {
                    id: s.id.clone(),
                    seq: s.seq,
                    tool: s.tool.clone(),
                    effect: s.effect.as_str().to_string(),
                    status: s.status.as_str().to_string(),
                    amount: amount_of(&inputs),
                    target: target(&inputs),
                    attempts: s.attempts,
                    rule: s.rule.clone(),
                    reference,
                    links: links.get(s.id.as_str()).cloned().unwrap_or_default(),
                }
            })
            .collect();
        let names = Names::load(store, tenant).await?;
        let events = records
            .iter()
            .map(|r| EventView {
                actor_name: r.actor.as_deref().map(|a| names.actor(a)),
                seq: r.seq,
                at: utc_seconds(r.at),
                event: r.event.clone(),
                step_id: r.step_id.clone(),
                step_seq: r.step_id.as_deref().and_then(|s| step_seq.get(s).copied()),
                tool: r.tool.clone(),
                actor: r.actor.clone(),
                rule: r.rule.clone(),
                summary: summary(&r.record),
                record: pretty_canonical(&r.record),
            })
            .collect();
        Ok(Some(RunDetail {
            run: run_row(&run, counts, &names),
            planned: run.planned,
            replan: run.replan,
            steps: step_views,
            events,
        }))
    }

    fn trusted(&self) -> Vec<PublicKey> {
        self.0
            .config
            .audit_signing_key
            .iter()
            .map(|s| s.public_key())
            .collect()
    }

    /// The status of `tenant`'s chain: the whole chain (and the log of checkpoints) when
    /// `full` (or when no checkpoint covers it yet and it is short enough), otherwise from its
    /// head in the newest signed checkpoint (the note's signature and the chain's inclusion
    /// proof checked) to its head now.
    pub async fn chain_status(&self, tenant: &str, full: bool) -> Result<ChainStatus, StoreError> {
        let store = &self.0.store;
        let chain = chain_of_tenant(Some(tenant))?;
        let head = match store.audit_chain_head(&chain).await? {
            Some((seq, _)) if seq > 0 => seq,
            _ => return Ok(ChainStatus::Empty),
        };
        if full {
            // One full verification at a time: a second request meanwhile is told so and
            // reads nothing.
            let Ok(_running) = self.1.try_lock() else {
                return Ok(ChainStatus::Busy);
            };
            return self.verify(&chain, head, true).await;
        }
        self.verify(&chain, head, false).await
    }

    /// Chain `chain`'s status up to `head`: from its leaf in the newest checkpoint, or
    /// (`full`, or no checkpoint covering it and a short chain) from record 1.
    async fn verify(&self, chain: &str, head: i64, full: bool) -> Result<ChainStatus, StoreError> {
        let store = &self.0.store;
        let trusted = self.trusted();
        let proof = match store.latest_tree_head().await? {
            Some(th) if !full => InclusionProof::of(&th, chain)?,
            _ => None,
        };
        let Some(proof) = proof else {
            if !full && head > MAX_TAIL {
                return Ok(ChainStatus::NotChecked { records: head });
            }
            return Ok(
                match store
                    .verify_audit_full(&trusted, &[], &[], Some(chain))
                    .await?
                {
                    Ok(report) => ChainStatus::Intact {
                        checked: report.records,
                        from_seq: 1,
                        head,
                        checkpoint: None,
                        trusted_key: !trusted.is_empty(),
                    },
                    Err(f) => broken(f),
                },
            );
        };
        let note = match proof.verify(&trusted) {
            Ok(note) => note,
            Err(f) => return Ok(broken(f)),
        };
        let leaf = &proof.leaf;
        if head - leaf.seq > MAX_TAIL {
            return Ok(ChainStatus::NotChecked {
                records: head - leaf.seq,
            });
        }
        // Start at the signed record itself: it must still hash to the signed hash, and
        // every record after it must link on.
        let Some(signed) = store.audit_record(chain, leaf.seq).await? else {
            return Ok(ChainStatus::Broken {
                seq: leaf.seq,
                reason: format!(
                    "missing: the chain ends at record {head} but checkpoint {} signed record {}; \
                     the tail was truncated",
                    note.body.number, leaf.seq
                ),
            });
        };
        let mut v = ChainVerifier::new(leaf.seq, &signed.prev).chain(chain);
        if let Err(b) = v.expect(
            leaf.seq,
            &leaf.hash,
            format!("checkpoint {}", note.body.number),
        ) {
            return Ok(broken(b.into()));
        }
        Ok(match store.verify_audit_with(v).await? {
            Ok(checked) => ChainStatus::Intact {
                checked,
                from_seq: leaf.seq,
                head,
                checkpoint: Some((leaf.seq, utc(note.body.at))),
                trusted_key: !trusted.is_empty(),
            },
            Err(b) => broken(b.into()),
        })
    }

    async fn search(&self, tenant: &str, q: &AuditQuery) -> Result<AuditPage, StoreError> {
        let full = q.verify.as_deref() == Some("full");
        let chain = self.chain_status(tenant, full).await?;
        // With the whole chain, every passkey signature in it: the same check as
        // `countersign audit verify-signatures`.
        // Only over a chain that verified: a broken one's records prove nothing.
        let signatures = if full && matches!(chain, ChainStatus::Intact { .. }) {
            let name = chain_of_tenant(Some(tenant))?;
            Some(
                self.0
                    .store
                    .verify_stored_signatures(Some(&name))
                    .await?
                    .map(|r| (r.signatures, r.registrations))
                    .map_err(|f| (f.seq, f.why)),
            )
        } else {
            None
        };
        let names = Names::load(&self.0.store, tenant).await?;
        let q = &with_agent_names(&names, tenant, q);
        let parsed = filter_for(tenant, q).and_then(|f| Ok((f, cursor_for(q)?)));
        let (filter, cursor) = match parsed {
            Ok(p) => p,
            Err(invalid) => {
                return Ok(AuditPage {
                    rows: Vec::new(),
                    newer: None,
                    older: None,
                    chain,
                    invalid: Some(invalid),
                    signatures,
                });
            }
        };
        let limit = PAGE_SIZE;
        let mut records = self
            .0
            .store
            .search_audit(&filter, cursor, i64::try_from(limit + 1).unwrap_or(51))
            .await?;
        let more = records.len() > limit;
        let (newer, older) = match cursor {
            AuditCursor::Newest | AuditCursor::Before(_) => {
                records.truncate(limit);
                let newer = matches!(cursor, AuditCursor::Before(_))
                    .then(|| records.first().map(|r| r.pos))
                    .flatten();
                (newer, more.then(|| records.last().map(|r| r.pos)).flatten())
            }
            AuditCursor::After(_) => {
                // Newest first: the extra record is the newest one.
                if more {
                    records.remove(0);
                }
                (
                    more.then(|| records.first().map(|r| r.pos)).flatten(),
                    records.last().map(|r| r.pos),
                )
            }
        };
        // The runs of the page's records, named by their task (this tenant's runs only).
        let mut tasks = BTreeMap::new();
        for id in records.iter().filter_map(|r| r.run_id.as_deref()) {
            if tasks.contains_key(id) {
                continue;
            }
            match self.0.store.get_run(id).await {
                Ok(run) if run.tenant == tenant => {
                    tasks.insert(id.to_string(), run.task);
                }
                Ok(_) | Err(StoreError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(AuditPage {
            rows: records
                .iter()
                .map(|r| audit_row(r, &names, &tasks))
                .collect(),
            newer,
            older,
            chain,
            invalid: None,
            signatures,
        })
    }

    /// `tenant`'s gate records behind the metrics window ending today (the store's clock), with
    /// the window's first instant (midnight UTC) and now.
    async fn gate_window(&self, tenant: &str) -> Result<(Vec<AuditRecord>, i64, i64), StoreError> {
        let store = &self.0.store;
        let now = store.clock().now_ms();
        let today = now.div_euclid(DAY_MS) * DAY_MS;
        let since = today - (WINDOW_DAYS - 1) * DAY_MS;
        // Gates decided in the window may have opened before it: read one window further
        // back for their opening times.
        let records = store
            .gate_records(Some(tenant), since - WINDOW_DAYS * DAY_MS)
            .await?;
        Ok((records, since, now))
    }

    /// The gate advisor's rows over `tenant`'s window (what a draft is checked against).
    pub(super) async fn gate_advice(&self, tenant: &str) -> Result<Vec<AdviceRow>, StoreError> {
        let (records, since, now) = self.gate_window(tenant).await?;
        let loaded = self.0.registry.current();
        let bundle = loaded.as_ref().map(|l| &l.bundle);
        Ok(advice::advice_rows(
            &metrics::gates(&records),
            since,
            now,
            bundle,
        ))
    }

    /// Gate metrics over `tenant`'s runs for the window ending today (the store's clock),
    /// with the gate advisor and the shadow rules' would-decisions.
    pub async fn gate_metrics(&self, tenant: &str, admin: bool) -> Result<MetricsData, StoreError> {
        let store = &self.0.store;
        let (records, since, now) = self.gate_window(tenant).await?;
        let gates = metrics::gates(&records);
        let mut data = metrics::metrics_of(&gates, since, now);
        let loaded = self.0.registry.current();
        let bundle = loaded.as_ref().map(|l| &l.bundle);
        data.advice = advice::advice_rows(&gates, since, now, bundle);
        let shadowed = store.shadow_records(tenant, since).await?;
        data.shadow = advice::shadow_rows(&shadowed, bundle);
        data.admin = admin;
        Ok(data)
    }
}

impl RunsSource for Views {
    fn runs<'a>(
        &'a self,
        tenant: &'a str,
        before: Option<String>,
    ) -> BoxFuture<'a, Result<RunListPage, String>> {
        Box::pin(async move {
            self.run_page(tenant, before)
                .await
                .map_err(opaque("runs: listing"))
        })
    }

    fn run<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunDetail>, String>> {
        Box::pin(async move {
            self.run_detail(tenant, id)
                .await
                .map_err(opaque("runs: reading a run"))
        })
    }
}

impl AuditSource for Views {
    fn search<'a>(
        &'a self,
        tenant: &'a str,
        query: &'a AuditQuery,
    ) -> BoxFuture<'a, Result<AuditPage, String>> {
        Box::pin(async move {
            Views::search(self, tenant, query)
                .await
                .map_err(opaque("audit: searching"))
        })
    }
}

impl MetricsSource for Views {
    fn metrics<'a>(
        &'a self,
        tenant: &'a str,
        admin: bool,
    ) -> BoxFuture<'a, Result<MetricsData, String>> {
        Box::pin(async move {
            self.gate_metrics(tenant, admin)
                .await
                .map_err(opaque("metrics: reading gates"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_the_forms_the_form_sends() {
        assert_eq!(parse_time("1781170937000"), Some(1_781_170_937_000));
        assert_eq!(parse_time("2026-06-11"), Some(1_781_136_000_000));
        assert_eq!(parse_time("2026-06-11T09:42"), Some(1_781_170_920_000));
        assert_eq!(parse_time("2026-06-11T09:42:00Z"), Some(1_781_170_920_000));
        assert_eq!(parse_time("yesterday"), None);
    }

    #[test]
    fn summaries_show_amounts_with_currency() {
        let record = r#"{"detail":{"decision":"require_approval","inputs":{"amount":4180,"currency":"EUR","invoice_id":"INV-1"}},"seq":1}"#;
        let s = summary(record);
        assert!(s.contains("4,180.00 EUR"), "{s}");
        assert!(s.contains("invoice INV-1"), "{s}");
        assert!(s.contains("decision require_approval"), "{s}");
    }
}
