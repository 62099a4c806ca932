//! Reading the trail: a chain's records by `seq` (verification, exports), every chain's in the
//! order written (`pos`), a run's and a step's records, and a run's failures in a row.

use super::{AuditEvent, AuditRecord};
use crate::store::{Store, StoreError};

pub(crate) const COLUMNS: &str =
    "chain, seq, pos, at, event, run_id, step_id, tool, actor, rule, record, prev, hash";

/// The statement [`Store::audit_for_step`] runs (binds: step id, run id, limit); public so
/// a test can ask each backend's planner how it reads it.
pub fn audit_for_step_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM audit WHERE step_id = $1 AND run_id = $2
          ORDER BY pos DESC LIMIT $3"
    )
}

/// Records per page when counting a run's failures in a row.
pub(crate) const FAILURE_PAGE: i64 = 16;

/// A scalar subquery: the newest `{limit}` ([`FAILURE_PAGE`]) records of run `{run}` as
/// `pos:event`, comma-separated, newest first (events are plain words); NULL when it has none.
/// Read by [`parse_recent_events`].
pub(crate) const RECENT_EVENTS_SQL: &str = "(SELECT string_agg(x.pos || ':' || x.event, ','
       ORDER BY x.pos DESC) FROM (SELECT pos, event FROM audit WHERE run_id = {run}
       ORDER BY pos DESC LIMIT {limit}) x)";

/// [`RECENT_EVENTS_SQL`]'s text as `(pos, event)` pairs; `None` if it is not that shape.
pub(crate) fn parse_recent_events(text: Option<&str>) -> Option<Vec<(i64, String)>> {
    let Some(text) = text else {
        return Some(Vec::new());
    };
    text.split(',')
        .map(|item| {
            let (seq, event) = item.split_once(':')?;
            Some((seq.parse().ok()?, event.to_string()))
        })
        .collect()
}

impl Store {
    /// Records of `chain` with `seq >= from`, in order, at most `limit`.
    pub async fn audit_records(
        &self,
        chain: &str,
        from: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM audit WHERE chain = $1 AND seq >= $2 ORDER BY seq LIMIT $3"
        );
        let rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(chain)
                .bind(from)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// Records of every chain with `pos >= from`, in the order they were written, at most
    /// `limit`.
    pub async fn audit_in_order(
        &self,
        from: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM audit WHERE pos >= $1 ORDER BY pos LIMIT $2");
        let rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(from)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// A run's records, in the order they were written.
    pub async fn audit_for_run(&self, run_id: &str) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM audit WHERE run_id = $1 ORDER BY pos");
        let rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(run_id).fetch_all(p).await?
        });
        Ok(rows)
    }

    /// The newest `limit` records of step `step_id` (of run `run_id`), in the order they were
    /// written, through the `(step_id, pos)` index: what a gate's history shows, however long
    /// its run's trail (one MCP session is one run), its latest request and decision included.
    pub async fn audit_for_step(
        &self,
        run_id: &str,
        step_id: &str,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = audit_for_step_sql();
        let mut rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(step_id)
                .bind(run_id)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.reverse();
        Ok(rows)
    }

    /// How many attempts of run `run_id` failed in a row since its last success (looking at
    /// no more than `limit` outcome records, newest first).
    ///
    /// Reads the run's records newest first, a page at a time, through the `(run_id, seq)`
    /// index alone, and stops at the first success or after `limit` outcomes: the cost
    /// follows the run's recent records, never the size of the whole log. (Filtering on
    /// `event` in SQL let the planner combine the `(event, seq)` index, which holds every
    /// success of every run: its cost grew with the log, measured in `docs/benchmarks.md`.)
    pub async fn failures_in_a_row(&self, run_id: &str, limit: i64) -> Result<i64, StoreError> {
        self.failures_in_a_row_from(run_id, limit, None).await
    }

    /// [`Store::failures_in_a_row`] starting from `newest`, the run's newest records as
    /// `(seq, event)`, newest first, as [`RECENT_EVENTS_SQL`] reads them (a full page is
    /// [`FAILURE_PAGE`] long); further pages are read only when that one does not decide.
    pub async fn failures_in_a_row_from(
        &self,
        run_id: &str,
        limit: i64,
        mut newest: Option<Vec<(i64, String)>>,
    ) -> Result<i64, StoreError> {
        let mut before = i64::MAX;
        // Every outcome met before a success is a failure: one count serves for both.
        let mut failed = 0_i64;
        while failed < limit {
            let page: Vec<(i64, String)> = match newest.take() {
                Some(page) => page,
                None => crate::store::on_pool!(self, |p| {
                    sqlx::query_as(
                        "SELECT pos, event FROM audit WHERE run_id = $1 AND pos < $2
                         ORDER BY pos DESC LIMIT $3",
                    )
                    .bind(run_id)
                    .bind(before)
                    .bind(FAILURE_PAGE)
                    .fetch_all(p)
                    .await?
                }),
            };
            for (seq, event) in &page {
                before = *seq;
                if event == AuditEvent::Succeeded.as_str()
                    || event == AuditEvent::Reconciled.as_str()
                {
                    return Ok(failed);
                }
                if event == AuditEvent::Failed.as_str() {
                    failed += 1;
                    if failed >= limit {
                        break;
                    }
                }
            }
            if (page.len() as i64) < FAILURE_PAGE {
                break;
            }
        }
        Ok(failed)
    }

    /// The first `seq` of chain `chain` whose record is at or after `at_ms`, if any. Exports
    /// `--since` start there and run to the head, so they are contiguous.
    pub async fn audit_first_seq_since(
        &self,
        chain: &str,
        at_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let seq: Option<i64> = crate::store::on_pool!(self, |p| {
            sqlx::query_scalar("SELECT MIN(seq) FROM audit WHERE chain = $1 AND at >= $2")
                .bind(chain)
                .bind(at_ms)
                .fetch_one(p)
                .await?
        });
        Ok(seq)
    }
}
