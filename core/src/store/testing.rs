//! Test support (feature `test-support`): a fresh, migrated database per test on each
//! backend, so every store test runs on SQLite and on Postgres.
//!
//! Postgres comes from `COUNTERSIGN_TEST_POSTGRES_URL` (default: the local server on
//! 127.0.0.1:5432). When it is unreachable the Postgres half is skipped with a loud
//! message, except under `CI=true`, where that is a failure.
#![allow(clippy::panic, clippy::expect_used)] // test support: failing loudly is the point.

use std::path::PathBuf;
use std::sync::Arc;

use sqlx::Connection;
use uuid::Uuid;

use super::{Backend, ConnectOptions, Store};
use crate::clock::Clock;
use crate::secret::Secret;

/// Default admin URL of the local test Postgres.
pub const DEFAULT_TEST_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The admin URL tests create their databases through.
pub fn postgres_admin_url() -> String {
    std::env::var("COUNTERSIGN_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| DEFAULT_TEST_POSTGRES_URL.to_string())
}

pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A database created for one test; [`FreshDb::drop_db`] removes it.
#[derive(Debug)]
pub struct FreshDb {
    /// Which backend.
    pub backend: Backend,
    /// A URL that reaches it.
    pub url: Secret<String>,
    cleanup: Cleanup,
}

#[derive(Debug)]
enum Cleanup {
    SqliteDir(PathBuf),
    Postgres { admin: String, name: String },
}

impl FreshDb {
    /// Creates an empty database on `backend`. `None` only when Postgres is unreachable
    /// outside CI (after printing a loud warning).
    pub async fn create(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("countersign-test-{}", Uuid::new_v4()));
                std::fs::create_dir_all(&dir).expect("create temp dir");
                let url = format!("sqlite://{}", dir.join("test.db").display());
                Some(Self {
                    backend,
                    url: Secret::new(url),
                    cleanup: Cleanup::SqliteDir(dir),
                })
            }
            Backend::Postgres => {
                let admin = postgres_admin_url();
                let mut conn = match sqlx::PgConnection::connect(&admin).await {
                    Ok(c) => c,
                    Err(e) => {
                        let shown = super::redact_url(&admin);
                        if in_ci() {
                            panic!(
                                "Postgres at {shown} is unreachable ({e}) and CI=true: \
                                 the Postgres half of the store tests must run in CI"
                            );
                        }
                        eprintln!(
                            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                             !!! Postgres at {shown} is unreachable: {e}\n\
                             !!! the POSTGRES HALF OF THIS TEST WAS SKIPPED.\n\
                             !!! Set COUNTERSIGN_TEST_POSTGRES_URL or start Postgres.\n\
                             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
                        );
                        return None;
                    }
                };
                let name = format!("cs_test_{}", Uuid::new_v4().simple());
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .expect("CREATE DATABASE");
                let _ = conn.close().await;
                let mut url = url::Url::parse(&admin).expect("admin URL parses");
                url.set_path(&format!("/{name}"));
                Some(Self {
                    backend,
                    url: Secret::new(url.to_string()),
                    cleanup: Cleanup::Postgres { admin, name },
                })
            }
        }
    }

    /// Connects and migrates a store on this database.
    pub async fn store(&self, clock: Arc<dyn Clock>) -> Store {
        let store = Store::connect(&self.url, &ConnectOptions::default(), clock)
            .await
            .expect("connect to fresh test database");
        store.migrate().await.expect("migrate fresh test database");
        store
    }

    /// Removes the database (best effort).
    pub async fn drop_db(self) {
        match self.cleanup {
            Cleanup::SqliteDir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::Postgres { admin, name } => {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                    let _ = conn.close().await;
                }
            }
        }
    }
}

/// Runs `test` against a fresh, migrated store on SQLite, then on Postgres.
pub async fn each_backend<F, Fut>(clock: Arc<dyn Clock>, test: F)
where
    F: Fn(Store) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(db) = FreshDb::create(backend).await else {
            continue;
        };
        let store = db.store(clock.clone()).await;
        test(store.clone()).await;
        store.close().await;
        db.drop_db().await;
    }
}
