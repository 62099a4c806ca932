//! The session store: tower-sessions records in the `tower_sessions` table through
//! [`countersign_core::Store`], so expiry follows the injected clock.
//!
//! The database expiry of a record is the `expires_at` value (ms) the sign-in code puts in the
//! session data; a record without one (none is written before sign-in: a sign-in in progress
//! lives in a cookie, `super::pending`) lives [`ANONYMOUS_TTL_MS`]. Expired records are never
//! loaded.

use async_trait::async_trait;
use countersign_core::Store;
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{Error, Result, SessionStore};

/// Lifetime of a session record that carries no `expires_at`.
pub const ANONYMOUS_TTL_MS: i64 = 10 * 60 * 1000;
/// The session data key holding the record's expiry in ms since the epoch.
pub const EXPIRES_AT: &str = "expires_at";

/// tower-sessions over the Countersign store.
#[derive(Debug, Clone)]
pub struct DbSessionStore {
    store: Store,
}

impl DbSessionStore {
    /// A store over `store`'s database and clock.
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    fn encode(&self, record: &Record) -> Result<(Vec<u8>, i64)> {
        let data = serde_json::to_vec(&record.data).map_err(|e| Error::Encode(e.to_string()))?;
        let expires_ms = record
            .data
            .get(EXPIRES_AT)
            .and_then(serde_json::Value::as_i64)
            .unwrap_or_else(|| self.store.clock().now_ms() + ANONYMOUS_TTL_MS);
        Ok((data, expires_ms / 1000))
    }
}

fn backend(e: countersign_core::StoreError) -> Error {
    Error::Backend(e.to_string())
}

#[async_trait]
impl SessionStore for DbSessionStore {
    async fn create(&self, record: &mut Record) -> Result<()> {
        let (data, expiry) = self.encode(record)?;
        // A 128-bit random id practically never collides; if it does, draw another rather
        // than overwrite someone else's session.
        for _ in 0..8 {
            if self
                .store
                .session_insert(&record.id.to_string(), &data, expiry)
                .await
                .map_err(backend)?
            {
                return Ok(());
            }
            record.id = Id::default();
        }
        Err(Error::Backend("could not allocate a session id".into()))
    }

    async fn save(&self, record: &Record) -> Result<()> {
        let (data, expiry) = self.encode(record)?;
        self.store
            .session_save(&record.id.to_string(), &data, expiry)
            .await
            .map_err(backend)
    }

    async fn load(&self, id: &Id) -> Result<Option<Record>> {
        let Some(bytes) = self
            .store
            .session_load(&id.to_string())
            .await
            .map_err(backend)?
        else {
            return Ok(None);
        };
        let data = serde_json::from_slice(&bytes).map_err(|e| Error::Decode(e.to_string()))?;
        Ok(Some(Record {
            id: *id,
            data,
            // tower-sessions only uses this for the cookie when the expiry is not
            // `OnSessionEnd`; ours is, and the database enforces the real expiry.
            expiry_date: time::OffsetDateTime::UNIX_EPOCH,
        }))
    }

    async fn delete(&self, id: &Id) -> Result<()> {
        self.store
            .session_delete(&id.to_string())
            .await
            .map_err(backend)
    }
}
