//! State of the built-in demo target systems (the finance ERP, StillOn's partner systems).
//!
//! These stand in for real target systems, so they behave like good ones: objects are
//! versioned (a change underneath is visible), and an effect is applied at most once per
//! idempotency key — the effect row and the object writes commit in one transaction, and a
//! second call with the same key gets the first call's result back.

use super::{Pool, Store, StoreError, on_pool};

/// One stored object of a demo system.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DemoObject {
    /// System (`erp`, `stillon`).
    pub system: String,
    /// Kind (`invoice`, `reservation`).
    pub kind: String,
    /// Id within the kind.
    pub id: String,
    /// Tenant the record belongs to.
    pub tenant: String,
    /// JSON text.
    pub data: String,
    /// Bumped on every write.
    pub version: i64,
}

/// An effect a demo system applied, by key.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DemoEffect {
    /// System.
    pub system: String,
    /// The idempotency key it was applied under.
    pub idem_key: String,
    /// Operation name.
    pub operation: String,
    /// The request's JSON text.
    pub request: String,
    /// The result's JSON text.
    pub result: String,
    /// Unix ms.
    pub at: i64,
}

/// A write to an object, applied with an effect.
#[derive(Debug, Clone)]
pub struct ObjectWrite {
    /// Kind.
    pub kind: String,
    /// Id.
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// New JSON text.
    pub data: String,
    /// The version the writer read (`None` = the object must not exist yet). A different
    /// current version refuses the whole effect.
    pub expected_version: Option<i64>,
}

/// The answer to [`Store::demo_apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Applied now; the result given.
    Now,
    /// The key was applied before: this is the stored result.
    Before(DemoEffect),
    /// An object changed underneath (version mismatch): nothing applied.
    Changed,
}

const OBJECT_COLUMNS: &str = "system, kind, id, tenant, data, version";
const EFFECT_COLUMNS: &str = "system, idem_key, operation, request, result, at";

/// The SQL of [`Store::demo_get_many`] for `n` objects: binds the system, then each object's
/// kind and id. One whole-key lookup per object, joined by UNION ALL: every arm reaches its
/// row by the primary key in any plan. (Written as one WHERE with ORs, Postgres's generic
/// plan — chosen after five executions while the table was small, and kept — looked up only
/// `system` in the key and filtered every object of the system: 1.35 ms a call once the demo
/// ERP held ~20,000 notes; docs/performance.md.) Public so that a test can plan it as the
/// server does.
pub fn demo_lookup_sql(n: usize) -> String {
    let arms: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "SELECT {OBJECT_COLUMNS} FROM demo_objects \
                 WHERE system = $1 AND kind = ${} AND id = ${}",
                2 * i + 2,
                2 * i + 3
            )
        })
        .collect();
    arms.join(" UNION ALL ")
}

impl Store {
    /// Inserts an object unless one with that id exists (seeding). Returns whether it did.
    pub async fn demo_seed(
        &self,
        system: &str,
        kind: &str,
        id: &str,
        tenant: &str,
        data: &str,
    ) -> Result<bool, StoreError> {
        let n = on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO demo_objects (system, kind, id, tenant, data, version)
                 VALUES ($1, $2, $3, $4, $5, 1) ON CONFLICT (system, kind, id) DO NOTHING",
            )
            .bind(system)
            .bind(kind)
            .bind(id)
            .bind(tenant)
            .bind(data)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(n == 1)
    }

    /// Writes an object whatever its version (tests and fault injection: "change state
    /// underneath"). Returns the new version.
    pub async fn demo_put(
        &self,
        system: &str,
        kind: &str,
        id: &str,
        tenant: &str,
        data: &str,
    ) -> Result<i64, StoreError> {
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO demo_objects (system, kind, id, tenant, data, version)
                 VALUES ($1, $2, $3, $4, $5, 1)
                 ON CONFLICT (system, kind, id)
                 DO UPDATE SET data = excluded.data, tenant = excluded.tenant,
                               version = demo_objects.version + 1",
            )
            .bind(system)
            .bind(kind)
            .bind(id)
            .bind(tenant)
            .bind(data)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(self
            .demo_get(system, kind, id)
            .await?
            .map(|o| o.version)
            .unwrap_or(0))
    }

    /// One object.
    pub async fn demo_get(
        &self,
        system: &str,
        kind: &str,
        id: &str,
    ) -> Result<Option<DemoObject>, StoreError> {
        let sql = format!(
            "SELECT {OBJECT_COLUMNS} FROM demo_objects WHERE system = $1 AND kind = $2 AND id = $3"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(system)
                .bind(kind)
                .bind(id)
                .fetch_optional(p)
                .await?
        }))
    }

    /// Objects of `system` in one round trip, one answer per `(kind, id)` asked (in order):
    /// what a demo target reads for one call (the operation's injected fault and latency, and
    /// the record it serves).
    pub async fn demo_get_many(
        &self,
        system: &str,
        wanted: &[(&str, &str)],
    ) -> Result<Vec<Option<DemoObject>>, StoreError> {
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let sql = demo_lookup_sql(wanted.len());
        let rows: Vec<DemoObject> = on_pool!(self, |p| {
            let mut q = sqlx::query_as(&sql).bind(system);
            for (kind, id) in wanted {
                q = q.bind(*kind).bind(*id);
            }
            q.fetch_all(p).await?
        });
        Ok(wanted
            .iter()
            .map(|(kind, id)| {
                rows.iter()
                    .find(|o| o.kind == *kind && o.id == *id)
                    .cloned()
            })
            .collect())
    }

    /// Every object of a kind, by id.
    pub async fn demo_list(&self, system: &str, kind: &str) -> Result<Vec<DemoObject>, StoreError> {
        let sql = format!(
            "SELECT {OBJECT_COLUMNS} FROM demo_objects WHERE system = $1 AND kind = $2 ORDER BY id"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(system)
                .bind(kind)
                .fetch_all(p)
                .await?
        }))
    }

    /// How many objects of a kind exist.
    pub async fn demo_count(&self, system: &str, kind: &str) -> Result<i64, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar("SELECT COUNT(*) FROM demo_objects WHERE system = $1 AND kind = $2")
                .bind(system)
                .bind(kind)
                .fetch_one(p)
                .await?
        }))
    }

    /// The effect applied under `idem_key`, if any.
    pub async fn demo_effect(
        &self,
        system: &str,
        idem_key: &str,
    ) -> Result<Option<DemoEffect>, StoreError> {
        let sql = format!(
            "SELECT {EFFECT_COLUMNS} FROM demo_effects WHERE system = $1 AND idem_key = $2"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(system)
                .bind(idem_key)
                .fetch_optional(p)
                .await?
        }))
    }

    /// Every effect of one operation, oldest first (what the target "did").
    pub async fn demo_effects(
        &self,
        system: &str,
        operation: &str,
    ) -> Result<Vec<DemoEffect>, StoreError> {
        let sql = format!(
            "SELECT {EFFECT_COLUMNS} FROM demo_effects WHERE system = $1 AND operation = $2 ORDER BY at, idem_key"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(system)
                .bind(operation)
                .fetch_all(p)
                .await?
        }))
    }

    /// Applies one effect under `idem_key`: records it and performs `writes`, all or nothing.
    /// A key seen before returns the stored effect and writes nothing; a write whose object
    /// version moved refuses the whole effect.
    pub async fn demo_apply(
        &self,
        effect: &DemoEffect,
        writes: &[ObjectWrite],
    ) -> Result<Applied, StoreError> {
        macro_rules! apply_in {
            ($pool:expr, $begin:expr) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let sql = format!(
                    "SELECT {EFFECT_COLUMNS} FROM demo_effects WHERE system = $1 AND idem_key = $2"
                );
                let before: Option<DemoEffect> = sqlx::query_as(&sql)
                    .bind(&effect.system)
                    .bind(&effect.idem_key)
                    .fetch_optional(&mut *tx)
                    .await?;
                if let Some(before) = before {
                    return Ok(Applied::Before(before));
                }
                let inserted = sqlx::query(
                    "INSERT INTO demo_effects (system, idem_key, operation, request, result, at)
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (system, idem_key) DO NOTHING",
                )
                .bind(&effect.system)
                .bind(&effect.idem_key)
                .bind(&effect.operation)
                .bind(&effect.request)
                .bind(&effect.result)
                .bind(effect.at)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if inserted == 0 {
                    // Lost a race for this key (Postgres): the winner's row is committed.
                    drop(tx);
                    return match self.demo_effect(&effect.system, &effect.idem_key).await? {
                        Some(before) => Ok(Applied::Before(before)),
                        None => Err(StoreError::Conflict("effect key raced and vanished".into())),
                    };
                }
                for w in writes {
                    let n = match w.expected_version {
                        None => sqlx::query(
                            "INSERT INTO demo_objects (system, kind, id, tenant, data, version)
                             VALUES ($1, $2, $3, $4, $5, 1) ON CONFLICT (system, kind, id) DO NOTHING",
                        )
                        .bind(&effect.system)
                        .bind(&w.kind)
                        .bind(&w.id)
                        .bind(&w.tenant)
                        .bind(&w.data)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected(),
                        Some(v) => sqlx::query(
                            "UPDATE demo_objects SET data = $1, version = version + 1
                             WHERE system = $2 AND kind = $3 AND id = $4 AND version = $5",
                        )
                        .bind(&w.data)
                        .bind(&effect.system)
                        .bind(&w.kind)
                        .bind(&w.id)
                        .bind(v)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected(),
                    };
                    if n != 1 {
                        tx.rollback().await?;
                        return Ok(Applied::Changed);
                    }
                }
                tx.commit().await?;
                Ok(Applied::Now)
            }};
        }
        match &self.pool {
            Pool::Sqlite(p) => apply_in!(p, "BEGIN IMMEDIATE"),
            Pool::Postgres(p) => apply_in!(p, "BEGIN"),
        }
    }
}
