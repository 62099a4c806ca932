//! Browser session records in the `tower_sessions` table (migration 0001), for the server's
//! session store.
//!
//! Invariants:
//! * A record whose expiry is not after the store clock's now is never returned.
//! * [`Store::session_insert`] never overwrites: a colliding id is reported, not replaced.
//! * [`Store::session_save`] never creates: a deleted session stays deleted.
//! * Expiry is stored in the layout of migration 0001: unix seconds (SQLite `INTEGER`),
//!   `TIMESTAMPTZ` (Postgres).

use crate::store::{Store, StoreError, on_pool};

impl Store {
    /// The data of session `id` if it exists and has not expired.
    pub async fn session_load(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let now = self.clock.now_ms() / 1000;
        Ok(match &self.pool {
            crate::store::Pool::Sqlite(p) => {
                sqlx::query_scalar(
                    "SELECT data FROM tower_sessions WHERE id = $1 AND expiry_date > $2",
                )
                .bind(id)
                .bind(now)
                .fetch_optional(p)
                .await?
            }
            crate::store::Pool::Postgres(p) => {
                sqlx::query_scalar(
                    "SELECT data FROM tower_sessions.session
                      WHERE id = $1 AND expiry_date > to_timestamp($2::double precision)",
                )
                .bind(id)
                .bind(now)
                .fetch_optional(p)
                .await?
            }
        })
    }

    /// Inserts a new session; `false` (and nothing written) if the id is taken.
    pub async fn session_insert(
        &self,
        id: &str,
        data: &[u8],
        expiry_s: i64,
    ) -> Result<bool, StoreError> {
        let sql_sqlite = "INSERT INTO tower_sessions (id, data, expiry_date) VALUES ($1, $2, $3)
                          ON CONFLICT (id) DO NOTHING";
        let sql_pg = "INSERT INTO tower_sessions.session (id, data, expiry_date)
                      VALUES ($1, $2, to_timestamp($3::double precision)) ON CONFLICT (id) DO NOTHING";
        let n = match &self.pool {
            crate::store::Pool::Sqlite(p) => sqlx::query(sql_sqlite)
                .bind(id)
                .bind(data)
                .bind(expiry_s)
                .execute(p)
                .await?
                .rows_affected(),
            crate::store::Pool::Postgres(p) => sqlx::query(sql_pg)
                .bind(id)
                .bind(data)
                .bind(expiry_s)
                .execute(p)
                .await?
                .rows_affected(),
        };
        Ok(n == 1)
    }

    /// Updates session `id`, if it still exists: a session deleted meanwhile (signed out,
    /// ended by an operator) is not written back by a request that loaded it before (new
    /// sessions come through [`Store::session_insert`]).
    pub async fn session_save(
        &self,
        id: &str,
        data: &[u8],
        expiry_s: i64,
    ) -> Result<(), StoreError> {
        let sql_sqlite = "UPDATE tower_sessions SET data = $2, expiry_date = $3 WHERE id = $1";
        let sql_pg = "UPDATE tower_sessions.session
                         SET data = $2, expiry_date = to_timestamp($3::double precision)
                       WHERE id = $1";
        match &self.pool {
            crate::store::Pool::Sqlite(p) => {
                sqlx::query(sql_sqlite)
                    .bind(id)
                    .bind(data)
                    .bind(expiry_s)
                    .execute(p)
                    .await?;
            }
            crate::store::Pool::Postgres(p) => {
                sqlx::query(sql_pg)
                    .bind(id)
                    .bind(data)
                    .bind(expiry_s)
                    .execute(p)
                    .await?;
            }
        }
        Ok(())
    }

    /// Deletes session `id` (no error if it does not exist).
    pub async fn session_delete(&self, id: &str) -> Result<(), StoreError> {
        on_pool!(self, |p| {
            let sql = match self.backend() {
                crate::store::Backend::Sqlite => "DELETE FROM tower_sessions WHERE id = $1",
                crate::store::Backend::Postgres => {
                    "DELETE FROM tower_sessions.session WHERE id = $1"
                }
            };
            sqlx::query(sql).bind(id).execute(p).await?;
        });
        Ok(())
    }

    /// Deletes every session that has expired (pending sign-ins left unfinished, sessions
    /// never signed out); returns how many. Expired rows are never read, only kept.
    pub async fn session_delete_expired(&self) -> Result<u64, StoreError> {
        let now = self.clock.now_ms() / 1000;
        Ok(match &self.pool {
            crate::store::Pool::Sqlite(p) => {
                sqlx::query("DELETE FROM tower_sessions WHERE expiry_date <= $1")
                    .bind(now)
                    .execute(p)
                    .await?
                    .rows_affected()
            }
            crate::store::Pool::Postgres(p) => sqlx::query(
                "DELETE FROM tower_sessions.session
                      WHERE expiry_date <= to_timestamp($1::double precision)",
            )
            .bind(now)
            .execute(p)
            .await?
            .rows_affected(),
        })
    }

    /// Whether a session row with `id` exists at all, expired or not (tests check that
    /// sign-out deleted it server-side).
    pub async fn session_exists(&self, id: &str) -> Result<bool, StoreError> {
        let n: i64 = on_pool!(self, |p| {
            let sql = match self.backend() {
                crate::store::Backend::Sqlite => {
                    "SELECT COUNT(*) FROM tower_sessions WHERE id = $1"
                }
                crate::store::Backend::Postgres => {
                    "SELECT COUNT(*) FROM tower_sessions.session WHERE id = $1"
                }
            };
            sqlx::query_scalar(sql).bind(id).fetch_one(p).await?
        });
        Ok(n > 0)
    }

    /// Every session row, expired or not: (id, data), for an operator ending one person's
    /// sessions (an expired row it deletes too was dead already). Never shown.
    pub async fn sessions_all(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(on_pool!(self, |p| {
            let sql = match self.backend() {
                crate::store::Backend::Sqlite => "SELECT id, data FROM tower_sessions",
                crate::store::Backend::Postgres => "SELECT id, data FROM tower_sessions.session",
            };
            sqlx::query_as(sql).fetch_all(p).await?
        }))
    }

    /// Number of session rows (tests: "no session was created").
    pub async fn session_count(&self) -> Result<i64, StoreError> {
        Ok(on_pool!(self, |p| {
            let sql = match self.backend() {
                crate::store::Backend::Sqlite => "SELECT COUNT(*) FROM tower_sessions",
                crate::store::Backend::Postgres => "SELECT COUNT(*) FROM tower_sessions.session",
            };
            sqlx::query_scalar(sql).fetch_one(p).await?
        }))
    }
}
