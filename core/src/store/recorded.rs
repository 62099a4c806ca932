//! The recorded calls an impact preview replays ([`crate::preview`]): each `decided` record
//! (or a read's one record that folds its decision) joined to its step's canonical arguments.
//!
//! Invariants:
//! * Only reads. A tenant scope reads that tenant's chain only (`audit.chain` is the tenant;
//!   records of no tenant decide no call); `None` is the platform's view, every chain.
//! * The window is a `pos` range from the first record at or after `since_ms`
//!   ([`Store::audit_seq_at`]), read in pages by keyset on `pos`, oldest first.
//! * A record whose policy inputs are missing or unreadable is still replayed, as
//!   approximate (`inputs: None`); a grant id the database no longer holds (or of another
//!   tenant) is left out, and the call counted approximate the same way.

use std::collections::HashMap;

use chrono::DateTime;
use serde_json::Value;

use super::{Store, StoreError, on_pool};
use crate::audit::AuditEvent;
use crate::audit::members::{FOLDED, POLICY_INPUTS};
use crate::policy::{ResourceFact, StandingAuthorization, TaskOrigin};
use crate::preview::{RecordedCall, RecordedInputs};

/// How many records one page reads.
pub const RECORDED_PAGE: i64 = 2_000;

/// One row: pos, chain, seq, at, event, step id, actor, record, the step's inputs and role,
/// the tool and the run.
type Row = (
    i64,
    String,
    i64,
    i64,
    String,
    String,
    Option<String>,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

impl Store {
    /// Every call decided since `since_ms` (of `tenant`'s chain, or of every chain), oldest
    /// first, handed to `visit` one at a time; how many records were read.
    pub async fn recorded_calls(
        &self,
        tenant: Option<&str>,
        since_ms: i64,
        mut visit: impl FnMut(RecordedCall),
    ) -> Result<usize, StoreError> {
        if tenant.is_some_and(|t| crate::audit::chain_of_tenant(Some(t)).is_err()) {
            // A reserved name is no tenant's chain: nothing of a tenant's to read.
            return Ok(0);
        }
        let Some(first) = self.audit_seq_at(since_ms).await? else {
            return Ok(0);
        };
        let grants = self.grants_by_id(tenant).await?;
        let mut after = first - 1;
        let mut read = 0;
        loop {
            let rows = self.recorded_page(tenant, after, RECORDED_PAGE).await?;
            let Some(last) = rows.last().map(|r| r.0) else {
                return Ok(read);
            };
            after = last;
            let full = rows.len() as i64 == RECORDED_PAGE;
            for row in rows {
                read += 1;
                if let Some(call) = call_of(row, &grants) {
                    visit(call);
                }
            }
            if !full {
                return Ok(read);
            }
        }
    }

    async fn recorded_page(
        &self,
        tenant: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Row>, StoreError> {
        let sql = "SELECT a.pos, a.chain, a.seq, a.at, a.event, a.step_id, a.actor, a.record, \
                          s.inputs, s.role, a.tool, a.run_id \
                     FROM audit a JOIN steps s ON s.id = a.step_id \
                    WHERE a.pos > $1 AND ($2 IS NULL OR a.chain = $2) \
                      AND a.event IN ('decided', 'succeeded', 'failed') \
                    ORDER BY a.pos LIMIT $3";
        let rows: Vec<Row> = on_pool!(self, |p| {
            sqlx::query_as(sql)
                .bind(after)
                .bind(tenant)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// The standing authorizations (of `tenant`, or every tenant), in any state, by
    /// (tenant, id): a replay needs the grant as it was, revoked since or not.
    async fn grants_by_id(
        &self,
        tenant: Option<&str>,
    ) -> Result<HashMap<(String, String), StandingAuthorization>, StoreError> {
        Ok(self
            .list_standing(tenant)
            .await?
            .into_iter()
            .filter_map(|s| Some(((s.tenant.clone(), s.id.clone()), s.to_policy()?)))
            .collect())
    }
}

/// The call a row records, if it records a decision (a `decided` record, or an outcome that
/// folds one).
fn call_of(
    row: Row,
    grants: &HashMap<(String, String), StandingAuthorization>,
) -> Option<RecordedCall> {
    let (_, chain, seq, at, event, step_id, actor, record, inputs, step_role, tool, run_id) = row;
    let record: Value = serde_json::from_str(&record).ok()?;
    let detail = record.get("detail")?;
    if event != AuditEvent::Decided.as_str() && !folds_decision(detail) {
        return None;
    }
    let actor = actor.unwrap_or_default();
    let token = |name: &str| {
        actor
            .split_whitespace()
            .find_map(|t| t.strip_prefix(name))
            .map(str::to_string)
    };
    let arguments: Value = serde_json::from_str(&inputs).ok()?;
    Some(RecordedCall {
        record: Some((chain.clone(), seq)),
        step_id,
        run_id,
        agent_id: token("agent:").unwrap_or_default(),
        role: token("role:").unwrap_or(step_role),
        tool: tool.unwrap_or_default(),
        arguments,
        task_origin: detail
            .get("task_origin")
            .and_then(Value::as_str)
            .and_then(TaskOrigin::parse)
            // Unreadable: the least trusted, as the pipeline reads it.
            .unwrap_or(TaskOrigin::External),
        at: DateTime::from_timestamp_millis(at)?,
        inputs: detail
            .get(POLICY_INPUTS)
            .and_then(|i| recorded_inputs(i, &chain, grants)),
        tenant: chain,
    })
}

fn folds_decision(detail: &Value) -> bool {
    detail
        .get(FOLDED)
        .and_then(Value::as_array)
        .is_some_and(|e| e.iter().any(|e| e == AuditEvent::Decided.as_str()))
}

/// The recorded policy inputs (version 1), or `None` when unreadable or a grant is missing.
fn recorded_inputs(
    v: &Value,
    tenant: &str,
    grants: &HashMap<(String, String), StandingAuthorization>,
) -> Option<RecordedInputs> {
    if v.get("v").and_then(Value::as_i64) != Some(1) {
        return None;
    }
    let resources = v.get("resources")?;
    let resources_withheld = resources.is_null();
    let resources: Vec<ResourceFact> = if resources_withheld {
        Vec::new()
    } else {
        serde_json::from_value(resources.clone()).ok()?
    };
    let mut held = Vec::new();
    for id in v.get("grants")?.as_array()? {
        held.push(
            grants
                .get(&(tenant.to_string(), id.as_str()?.to_string()))?
                .clone(),
        );
    }
    Some(RecordedInputs {
        now: v
            .get("now_ms")
            .and_then(Value::as_i64)
            .and_then(DateTime::from_timestamp_millis),
        resources_withheld,
        party: v.get("party").and_then(Value::as_str).map(str::to_string),
        approved: v.get("approval").and_then(Value::as_str) == Some("approved"),
        resources,
        grants: held,
    })
}
