//! The people directory: the display name each signed-in person last had, so that pages name
//! people rather than their identity provider's subjects.
//!
//! Invariants:
//! * Display only: nothing here is consulted for a decision (roles, tenant and identity come
//!   from the session, which comes from the identity provider).
//! * Written only at sign-in, from the provider's claims (or the demo sign-in's list), one row
//!   per (tenant, issuer, subject), the latest name winning; read per tenant.

use super::{Store, StoreError, on_pool};

/// The longest display name kept (longer names are cut at a character boundary).
pub const MAX_DISPLAY_NAME: usize = 120;

impl Store {
    /// Remembers `name` as the display name of `iss`#`sub` in `tenant`.
    pub async fn remember_person(
        &self,
        tenant: &str,
        iss: &str,
        sub: &str,
        name: &str,
    ) -> Result<(), StoreError> {
        let name: String = name.trim().chars().take(MAX_DISPLAY_NAME).collect();
        if name.is_empty() {
            return Ok(());
        }
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO people (tenant, iss, sub, name, seen_at) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (tenant, iss, sub)
                 DO UPDATE SET name = excluded.name, seen_at = excluded.seen_at",
            )
            .bind(tenant)
            .bind(iss)
            .bind(sub)
            .bind(&name)
            .bind(now)
            .execute(p)
            .await?;
        });
        Ok(())
    }

    /// `tenant`'s people as (issuer, subject, display name).
    pub async fn people_of(
        &self,
        tenant: &str,
    ) -> Result<Vec<(String, String, String)>, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as("SELECT iss, sub, name FROM people WHERE tenant = $1")
                .bind(tenant)
                .fetch_all(p)
                .await?
        }))
    }
}
