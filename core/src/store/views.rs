//! Read-only queries behind the dashboard's run list, run timeline, audit search and gate
//! metrics.
//!
//! Invariants:
//! * Every query here only reads. Filters are bound parameters, never spliced into SQL text;
//!   the SQL text is assembled only from fixed fragments.
//! * A tenant scope, when given, confines results to that tenant's runs (plus, for the
//!   audit trail, records that belong to no run and name no tenant or this one: operational
//!   events such as a registry import, this tenant's standing grants and batch approvals). Callers pass the signed-in person's tenant; a person without one sees nothing
//!   (the callers refuse before asking).
//! * The audit search pages by keyset on `pos` (the order records were written in, across
//!   chains; never OFFSET), newest first; each filter column has an index with `pos`
//!   (migration 0016), so a page costs its own rows.
//! * A time range is searched as a `pos` range: `at` never decreases along a chain (the
//!   appender seals at max(now, head's `at`), see `crate::audit`), and chains are sealed from
//!   one clock per process, so the records at or after a time are those from the first `pos`
//!   at or after it ([`Store::audit_seq_at`], one index probe on `audit_at`); a chain whose
//!   head ran ahead of another's clock can leave a record within that skew of a bound out. The `at` conditions are still checked as a guard (in
//!   Rust for the search, in SQL for the export): a record outside the range is never
//!   returned, even in a chain written before the rule. Filter indexes with `seq` then serve
//!   "actor + time range" as one index range.

use super::{Run, Store, StoreError, on_pool};
use crate::audit::AuditRecord;

/// The most records with shadow hits the gate metrics read (the newest of the window).
pub const SHADOW_RECORDS: i64 = 20_000;

/// What the audit search filters on. `None` / empty = no condition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only records whose run belongs to this tenant (or to no run).
    pub tenant: Option<String>,
    /// The run id.
    pub run: Option<String>,
    /// The tool.
    pub tool: Option<String>,
    /// The actor, exactly as recorded (`agent:… role:… tenant:…`, `person:ISS#SUB`, …).
    pub actor: Option<String>,
    /// Records of steps this person decided: a `sub`, `ISS#SUB` or `person:ISS#SUB`.
    pub approver: Option<String>,
    /// The event (`proposed`, `approved`, `unknown`…).
    pub event: Option<String>,
    /// The policy rule.
    pub rule: Option<String>,
    /// Records at or after this time (Unix ms).
    pub from_ms: Option<i64>,
    /// Records before this time (Unix ms).
    pub to_ms: Option<i64>,
}

/// Where an audit page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditCursor {
    /// The newest records.
    Newest,
    /// Records older than this `seq` (the next page down).
    Before(i64),
    /// Records newer than this `seq` (the page above), still returned newest first.
    After(i64),
}

enum Bind {
    Text(String),
    Int(i64),
}

const A_COLUMNS: &str = "a.chain, a.seq, a.pos, a.at, a.event, a.run_id, a.step_id, a.tool, \
     a.actor, a.rule, a.record, a.prev, a.hash";

impl AuditFilter {
    /// Whether a record at `at` (Unix ms) lies in the filter's time range.
    fn covers_time(&self, at: i64) -> bool {
        self.from_ms.is_none_or(|t| at >= t) && self.to_ms.is_none_or(|t| at < t)
    }
}

fn present(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The approver text as (`iss`, `sub`): `sub`, `ISS#SUB` or `person:ISS#SUB`.
pub fn approver_parts(text: &str) -> (Option<&str>, &str) {
    let text = text.trim();
    let text = text.strip_prefix("person:").unwrap_or(text);
    match text.rsplit_once('#') {
        Some((iss, sub)) if !iss.is_empty() => (Some(iss), sub),
        _ => (None, text),
    }
}

/// `text` with LIKE's wildcards and its escape character escaped (`ESCAPE '\'`).
fn like_escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

/// The `seq` range a filter's time range covers: `seq >= from` and `seq < to` when set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SeqRange {
    from: Option<i64>,
    to: Option<i64>,
}

/// `WHERE …` conditions and their binds for `f` within `seqs` (placeholders numbered from 1);
/// with `guard_at`, the `at` guards of the time range as well (see [`Store::search_audit`]
/// for why the search leaves them out).
fn conditions(f: &AuditFilter, seqs: SeqRange, guard_at: bool) -> (Vec<String>, Vec<Bind>) {
    let mut conds = Vec::new();
    let mut binds = Vec::new();
    fn add(cond: &str, value: Bind, conds: &mut Vec<String>, binds: &mut Vec<Bind>) {
        binds.push(value);
        conds.push(cond.replace('?', &format!("${}", binds.len())));
    }
    if let Some(t) = &f.tenant
        && crate::audit::chain_of_tenant(Some(t)).is_err()
    {
        // A tenant named like a reserved chain (`_system`, `_legacy`) is no tenant: nothing.
        conds.push("1 = 0".to_string());
    } else if let Some(t) = &f.tenant {
        // A record of no run is shown when it names no tenant (a global operational event)
        // or names this one: standing grants and batch approvals carry `"tenant":"T"` in
        // their canonical detail, an agent's refused call ends its actor with ` tenant:T`.
        // Anything else naming a tenant is another tenant's (fail closed).
        let escaped = like_escape(t);
        binds.push(Bind::Text(t.clone()));
        let n_run = binds.len();
        binds.push(Bind::Text(format!("%\"tenant\":\"{escaped}\"%")));
        let n_record = binds.len();
        binds.push(Bind::Text(format!("% tenant:{escaped}")));
        let n_actor = binds.len();
        // The tenant's own chain; of the system and legacy chains (shared), what the rule
        // above shows.
        conds.push(format!(
            "(a.chain = ${n_run} OR (a.chain IN ('{system}', '{legacy}') AND ( \
             EXISTS (SELECT 1 FROM runs r WHERE r.id = a.run_id AND r.tenant = ${n_run}) \
             OR (a.run_id IS NULL AND ( \
                 (a.record NOT LIKE '%\"tenant\":%' AND COALESCE(a.actor, '') NOT LIKE '% tenant:%') \
                 OR a.record LIKE ${n_record} ESCAPE '\\' \
                 OR a.actor LIKE ${n_actor} ESCAPE '\\')))))",
            system = crate::audit::SYSTEM_CHAIN,
            legacy = crate::audit::LEGACY_CHAIN,
        ));
    }
    for (value, cond) in [
        (&f.run, "a.run_id = ?"),
        (&f.tool, "a.tool = ?"),
        (&f.actor, "a.actor = ?"),
        (&f.event, "a.event = ?"),
        (&f.rule, "a.rule = ?"),
    ] {
        if let Some(v) = present(value) {
            add(cond, Bind::Text(v.to_string()), &mut conds, &mut binds);
        }
    }
    if let Some(text) = present(&f.approver) {
        let (iss, sub) = approver_parts(text);
        match iss {
            Some(iss) => {
                // Two binds in one condition: number them by hand.
                binds.push(Bind::Text(sub.to_string()));
                let n_sub = binds.len();
                binds.push(Bind::Text(iss.to_string()));
                let n_iss = binds.len();
                conds.push(format!(
                    "a.step_id IN (SELECT step_id FROM approvals WHERE approver_sub = ${n_sub} \
                     AND approver_iss = ${n_iss})"
                ));
            }
            None => add(
                "a.step_id IN (SELECT step_id FROM approvals WHERE approver_sub = ?)",
                Bind::Text(sub.to_string()),
                &mut conds,
                &mut binds,
            ),
        }
    }
    if let Some(from) = seqs.from {
        add("a.pos >= ?", Bind::Int(from), &mut conds, &mut binds);
    }
    if let Some(to) = seqs.to {
        add("a.pos < ?", Bind::Int(to), &mut conds, &mut binds);
    }
    if guard_at {
        // Written `a.at + 0` so that no planner serves them from `audit_at`: the seq range
        // above is the access path.
        if let Some(from) = f.from_ms {
            add("a.at + 0 >= ?", Bind::Int(from), &mut conds, &mut binds);
        }
        if let Some(to) = f.to_ms {
            add("a.at + 0 < ?", Bind::Int(to), &mut conds, &mut binds);
        }
    }
    (conds, binds)
}

macro_rules! fetch_records {
    ($store:expr, $sql:expr, $binds:expr) => {{
        let sql: &str = $sql;
        let rows: Vec<AuditRecord> = on_pool!($store, |p| {
            let mut q = sqlx::query_as::<_, AuditRecord>(sql);
            for b in $binds {
                q = match b {
                    Bind::Text(s) => q.bind(s.clone()),
                    Bind::Int(i) => q.bind(*i),
                };
            }
            q.fetch_all(p).await?
        });
        rows
    }};
}

impl Store {
    /// The first `seq` whose record is at or after `at_ms` (Unix ms), if any: two probes of
    /// the `audit_at` index. Exact because `at` never decreases along `seq` (module docs).
    ///
    /// Written as MIN over MIN, not `ORDER BY at, seq LIMIT 1`: given the bound value, SQLite's
    /// planner (STAT4 statistics, bundled) estimated that most of the table matches a time
    /// early in the chain and sorted a full scan instead (250 ms over 1,000,000 records); a
    /// MIN over an index range is one seek in every planner.
    pub async fn audit_seq_at(&self, at_ms: i64) -> Result<Option<i64>, StoreError> {
        let seq: Option<i64> = on_pool!(self, |p| {
            sqlx::query_scalar(
                "SELECT MIN(pos) FROM audit \
                 WHERE at = (SELECT MIN(at) FROM audit WHERE at >= $1)",
            )
            .bind(at_ms)
            .fetch_one(p)
            .await?
        });
        Ok(seq)
    }

    /// The `seq` range of `f`'s time range, or `None` when no record can be in it.
    async fn seq_range(&self, f: &AuditFilter) -> Result<Option<SeqRange>, StoreError> {
        let mut range = SeqRange::default();
        if let Some(from) = f.from_ms {
            match self.audit_seq_at(from).await? {
                Some(seq) => range.from = Some(seq),
                // Nothing at or after `from`.
                None => return Ok(None),
            }
        }
        if let Some(to) = f.to_ms {
            // None: every record is before `to`, no upper bound.
            range.to = self.audit_seq_at(to).await?;
        }
        if let (Some(from), Some(to)) = (range.from, range.to)
            && from >= to
        {
            return Ok(None);
        }
        Ok(Some(range))
    }

    /// One page of audit records matching `f`, newest first: at most `limit` records from
    /// `cursor`.
    ///
    /// The time range's `at` guards are applied here, not in SQL: with them in the query the
    /// planners (Postgres's above all) estimate a handful of matches and read every record of
    /// the filter's index range to sort it, a 5-minute window of a busy chain being hundreds
    /// of thousands of records; without them the `(column, seq)` index is walked backwards
    /// and stops after `limit` records. In a chain that keeps the time order nothing is
    /// dropped; in one that does not (written before the rule), the pages read on until the
    /// page is full, so none comes back short.
    pub async fn search_audit(
        &self,
        f: &AuditFilter,
        cursor: AuditCursor,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let Some(seqs) = self.seq_range(f).await? else {
            return Ok(Vec::new());
        };
        let limit = limit.max(0);
        let want = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut page = Vec::new();
        let mut cursor = cursor;
        loop {
            let rows = self.audit_page(f, seqs, cursor, limit).await?;
            let read = rows.len();
            // `rows` is in the order the query walked (newest first unless `After`).
            let last = rows.last().map(|r| r.pos);
            page.extend(rows.into_iter().filter(|r| f.covers_time(r.at)));
            match last {
                Some(seq) if page.len() < want && read == want => {
                    cursor = match cursor {
                        AuditCursor::After(_) => AuditCursor::After(seq),
                        AuditCursor::Newest | AuditCursor::Before(_) => AuditCursor::Before(seq),
                    };
                }
                _ => break,
            }
        }
        page.truncate(want);
        if matches!(cursor, AuditCursor::After(_)) {
            page.reverse();
        }
        Ok(page)
    }

    /// At most `limit` records of `f` within `seqs` from `cursor`, in the order walked:
    /// newest first, oldest first for [`AuditCursor::After`]. No `at` guards.
    async fn audit_page(
        &self,
        f: &AuditFilter,
        seqs: SeqRange,
        cursor: AuditCursor,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let (mut conds, mut binds) = conditions(f, seqs, false);
        let order = match cursor {
            AuditCursor::Newest => "DESC",
            AuditCursor::Before(seq) => {
                binds.push(Bind::Int(seq));
                conds.push(format!("a.pos < ${}", binds.len()));
                "DESC"
            }
            AuditCursor::After(seq) => {
                binds.push(Bind::Int(seq));
                conds.push(format!("a.pos > ${}", binds.len()));
                "ASC"
            }
        };
        binds.push(Bind::Int(limit));
        let sql = format!(
            "SELECT {A_COLUMNS} FROM audit a {} ORDER BY a.pos {order} LIMIT ${}",
            where_clause(&conds),
            binds.len()
        );
        Ok(fetch_records!(self, &sql, &binds))
    }

    /// Records matching `f` with `seq > after`, oldest first, at most `limit` (the export).
    pub async fn audit_matching_after(
        &self,
        f: &AuditFilter,
        after: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let Some(seqs) = self.seq_range(f).await? else {
            return Ok(Vec::new());
        };
        let (mut conds, mut binds) = conditions(f, seqs, true);
        binds.push(Bind::Int(after));
        conds.push(format!("a.pos > ${}", binds.len()));
        binds.push(Bind::Int(limit.max(0)));
        let sql = format!(
            "SELECT {A_COLUMNS} FROM audit a {} ORDER BY a.pos ASC LIMIT ${}",
            where_clause(&conds),
            binds.len()
        );
        Ok(fetch_records!(self, &sql, &binds))
    }

    /// The newest runs of `tenant`, newest first, older than `before` (`created_at`, `id`)
    /// when given; at most `limit`.
    pub async fn runs_page(
        &self,
        tenant: &str,
        before: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<Run>, StoreError> {
        let cols = super::run_model::RUN_COLUMNS;
        let rows: Vec<super::run_model::RunRow> = match before {
            None => {
                let sql = format!(
                    "SELECT {cols} FROM runs WHERE tenant = $1 \
                     ORDER BY created_at DESC, id DESC LIMIT $2"
                );
                on_pool!(self, |p| {
                    sqlx::query_as(&sql)
                        .bind(tenant)
                        .bind(limit)
                        .fetch_all(p)
                        .await?
                })
            }
            Some((at, id)) => {
                let sql = format!(
                    "SELECT {cols} FROM runs WHERE tenant = $1 \
                     AND (created_at < $2 OR (created_at = $2 AND id < $3)) \
                     ORDER BY created_at DESC, id DESC LIMIT $4"
                );
                on_pool!(self, |p| {
                    sqlx::query_as(&sql)
                        .bind(tenant)
                        .bind(at)
                        .bind(id)
                        .bind(limit)
                        .fetch_all(p)
                        .await?
                })
            }
        };
        rows.into_iter().map(Run::try_from).collect()
    }

    /// How many steps of each run in `run_ids` are in each status: (run, status, count).
    pub async fn step_status_counts(
        &self,
        run_ids: &[String],
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        if run_ids.is_empty() {
            return Ok(Vec::new());
        }
        let placeholders: Vec<String> = (1..=run_ids.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT run_id, status, CAST(COUNT(*) AS BIGINT) FROM steps \
             WHERE run_id IN ({}) GROUP BY run_id, status",
            placeholders.join(", ")
        );
        let rows: Vec<(String, String, i64)> = on_pool!(self, |p| {
            let mut q = sqlx::query_as(&sql);
            for id in run_ids {
                q = q.bind(id);
            }
            q.fetch_all(p).await?
        });
        Ok(rows)
    }

    /// The gate records (`waiting_approval`, `approved`, `rejected`, `expired`) at or after
    /// `since_ms` (from the first `seq` at or after it, [`Store::audit_seq_at`]), in chain
    /// order, scoped to `tenant`'s runs when given.
    pub async fn gate_records(
        &self,
        tenant: Option<&str>,
        since_ms: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let Some(first) = self.audit_seq_at(since_ms).await? else {
            return Ok(Vec::new());
        };
        let mut conds = vec![
            "a.event IN ('waiting_approval', 'approved', 'rejected', 'expired')".to_string(),
            "a.pos >= $1".to_string(),
        ];
        let mut binds = vec![Bind::Int(first)];
        if let Some(t) = tenant {
            binds.push(Bind::Text(t.to_string()));
            conds.push(format!(
                "EXISTS (SELECT 1 FROM runs r WHERE r.id = a.run_id AND r.tenant = ${})",
                binds.len()
            ));
        }
        let sql = format!(
            "SELECT {A_COLUMNS} FROM audit a {} ORDER BY a.pos",
            where_clause(&conds)
        );
        Ok(fetch_records!(self, &sql, &binds))
    }

    /// The decisions since `since_ms` of `tenant`'s chain that a shadow rule would have made
    /// otherwise (records carrying a `shadow` member), in chain order.
    pub async fn shadow_records(
        &self,
        tenant: &str,
        since_ms: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let Ok(chain) = crate::audit::chain_of_tenant(Some(tenant)) else {
            return Ok(Vec::new());
        };
        let Some(first) = self.audit_seq_at(since_ms).await? else {
            return Ok(Vec::new());
        };
        // The newest SHADOW_RECORDS at most, returned oldest first: a broad shadow rule's
        // counts cover the newest of its window rather than loading every decision.
        let sql = format!(
            "SELECT * FROM (SELECT {A_COLUMNS} FROM audit a WHERE a.pos >= $1 AND a.chain = $2 \
               AND a.event IN ('decided', 'succeeded', 'failed') AND a.record LIKE $3 \
               ORDER BY a.pos DESC LIMIT $4) newest ORDER BY pos"
        );
        let binds = [
            Bind::Int(first),
            Bind::Text(chain),
            Bind::Text(format!("%\"{}\":[%", crate::audit::members::SHADOW)),
            Bind::Int(SHADOW_RECORDS),
        ];
        Ok(fetch_records!(self, &sql, &binds))
    }

    /// The stored record of chain `chain` at `seq`, if any.
    pub async fn audit_record(
        &self,
        chain: &str,
        seq: i64,
    ) -> Result<Option<AuditRecord>, StoreError> {
        let sql = format!("SELECT {A_COLUMNS} FROM audit a WHERE a.chain = $1 AND a.seq = $2");
        let row: Option<AuditRecord> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(chain)
                .bind(seq)
                .fetch_optional(p)
                .await?
        });
        Ok(row)
    }
}

fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns_match_the_tenant_literally() {
        assert_eq!(like_escape("acme"), "acme");
        assert_eq!(like_escape("a%b_c\\d"), "a\\%b\\_c\\\\d");
    }

    #[test]
    fn approver_text_forms() {
        assert_eq!(approver_parts("ana"), (None, "ana"));
        assert_eq!(approver_parts("person:urn:x#ana"), (Some("urn:x"), "ana"));
        assert_eq!(approver_parts("urn:x#ana"), (Some("urn:x"), "ana"));
    }

    #[test]
    fn filters_become_numbered_placeholders_never_text() {
        let f = AuditFilter {
            tenant: Some("acme".into()),
            tool: Some("x'; DROP TABLE audit; --".into()),
            approver: Some("urn:x#ana".into()),
            from_ms: Some(5),
            ..AuditFilter::default()
        };
        let seqs = SeqRange {
            from: Some(3),
            to: Some(9),
        };
        let (conds, binds) = conditions(&f, seqs, true);
        let sql = conds.join(" AND ");
        assert!(!sql.contains("DROP"), "{sql}");
        // The tenant scope takes three (the tenant, and its two LIKE patterns).
        assert_eq!(binds.len(), 9);
        for n in 1..=9 {
            assert!(sql.contains(&format!("${n}")), "{sql}");
        }
        assert!(!sql.contains('?'), "{sql}");
    }
}
