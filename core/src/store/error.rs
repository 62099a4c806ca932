//! What a store operation can fail with, and how a failed write is read: answered (nothing
//! written), or sent without an answer (outcome unknown, never retried).
//!
//! Invariants:
//! * A write whose connection failed after it may have reached the server is
//!   [`StoreError::OutcomeUnknown`], never a plain error a caller could retry.
//! * A look-up that must name at most one row refuses two ([`at_most_one`]), never picks one.

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL names no backend Countersign supports.
    #[error("unsupported database URL {url}: expected sqlite://PATH or postgres://…")]
    UnsupportedUrl {
        /// The URL with any password hidden.
        url: String,
    },
    /// The URL could not be parsed.
    #[error("malformed database URL {url}: {source}")]
    MalformedUrl {
        /// The URL with any password hidden.
        url: String,
        /// What the driver said.
        source: sqlx::Error,
    },
    /// The database could not be reached.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// The URL with any password hidden.
        url: String,
        /// What the driver said.
        source: sqlx::Error,
    },
    /// Migrations failed.
    #[error("migrating the database failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database was migrated by a newer Countersign: this binary does not start on it
    /// (docs/deploy.md, "Rolling a new version").
    #[error(
        "the database's schema has migration {found}, newer than this binary knows (up to \
         {known}): run a Countersign at least as new as the one that migrated it"
    )]
    SchemaNewer {
        /// The first applied migration this binary does not know.
        found: i64,
        /// The newest migration this binary knows.
        known: i64,
    },
    /// A row that was looked up does not exist.
    #[error("not found")]
    NotFound,
    /// A uniqueness or check constraint refused the write.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Anything else the database reported.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// A write went out but its connection failed before the server's answer: it may have
    /// committed, or may still commit. Never retried (a retry could write it twice); what it
    /// would have written is then found as after a crash (a `running` step is reconciled by
    /// its key).
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
}

impl StoreError {
    /// What a failed COMMIT (or autocommitted write) means: an answer from the server is an
    /// abort (nothing written); no answer, or a session ended by the server, leaves the
    /// outcome unknown ([`StoreError::OutcomeUnknown`]) unless the write never left
    /// ([`sent_maybe`]).
    pub(crate) fn from_commit(e: sqlx::Error) -> Self {
        if sent_maybe(&e) && !answered(&e) {
            StoreError::OutcomeUnknown(e.to_string())
        } else {
            e.into()
        }
    }
}

/// Whether a failed statement may have reached the server: anything but a failure to get a
/// connection at all.
pub(crate) fn sent_maybe(e: &sqlx::Error) -> bool {
    !matches!(
        e,
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Configuration(_)
    )
}

/// Whether the server answered a statement with an error that aborted it: any database error
/// but a lost connection (class 08) or a session the server ended (57P01-57P05), which can
/// come after the commit (a FATAL during a synchronous-standby wait).
pub(crate) fn answered(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => !db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

impl From<crate::audit::ReservedTenant> for StoreError {
    fn from(e: crate::audit::ReservedTenant) -> Self {
        StoreError::Conflict(e.to_string())
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::RowNotFound => StoreError::NotFound,
            sqlx::Error::Database(db) if db.is_unique_violation() || db.is_check_violation() => {
                StoreError::Conflict(db.message().to_string())
            }
            _ => StoreError::Database(e),
        }
    }
}

/// The one row a look-up that must name at most one found (fetched with `LIMIT 2`), or none;
/// two rows are refused as ambiguous (`why`), never one of them picked.
pub(crate) fn at_most_one<T>(
    mut rows: Vec<T>,
    why: impl FnOnce() -> String,
) -> Result<Option<T>, StoreError> {
    if rows.len() > 1 {
        return Err(StoreError::Conflict(why()));
    }
    Ok(rows.pop())
}
