//! A pool in front of sqlx's that lends a connection again without sqlx's round trip on its
//! return.
//!
//! sqlx 0.8 pings every connection it takes back into its pool (a `Sync` and its answer on
//! Postgres; a message to the connection's worker thread and back on SQLite): one round trip
//! more per statement on the request path and per committer batch, about a sixth of a read's
//! CPU on Postgres (docs/performance.md, 2026-12-07 night). This pool keeps the connections
//! that finished their work cleanly in a free list of its own, still checked out of sqlx's
//! pool, and lends them again without that round trip.
//!
//! Invariants:
//! * A connection enters the free list only after the statement it ran completed without
//!   error, or the transaction it ran committed ([`LeanTx`]): nothing is in flight on it and
//!   no transaction is open. A use dropped mid-way (a cancelled request), a failed one, and a
//!   transaction rolled back, failed or dropped go back through sqlx, which pings the
//!   connection and closes it if it is broken (its ping also sends a dropped transaction's
//!   queued ROLLBACK).
//! * A connection in the free list is still counted by sqlx's pool: `max_connections` bounds
//!   lent, free and sqlx-idle connections together.
//! * While a borrower waits on sqlx's pool, a connection that finishes goes back through sqlx,
//!   whose queue serves the oldest waiter: nothing is parked then, so a parked connection
//!   never leaves a borrower waiting (no stall at the pool's size), and under overload the
//!   pool is as fair as sqlx's (it pays sqlx's ping again). Borrowers and returns decide under
//!   one lock.
//! * A connection idle here for [`PING_AFTER_IDLE`] is pinged before it is lent again (one a
//!   firewall or a database restart may have cut): the rule of sqlx's own acquire
//!   (`pg_pool_options` in the store module). One that fails or does not answer, or whose
//!   borrower goes away meanwhile, is detached from sqlx's pool and dropped (its place freed
//!   at once, no second check that could hang). A whole lend, checks and sqlx's acquire
//!   together, is bounded by the acquire timeout.
//! * A connection whose `BEGIN` was sent but not answered (its borrower went away, or the
//!   connection broke) is detached and dropped too: it may be in a transaction sqlx does not
//!   know of. (SQLite's worker thread then finishes that `BEGIN`, rolls it back and closes
//!   its handle on its own: briefly one connection more than the pool's size.)
//! * A connection idle here for about [`IDLE_AT_MOST`] (checked at every lend and park and by
//!   a sweep twice in that time), or found in circulation for longer than [`KEPT_AT_MOST`]
//!   when it is parked, goes back through sqlx, whose idle and lifetime rules then apply to
//!   it.
//! * After [`LeanPool::close`] nothing is parked or lent: the free list is emptied, a
//!   connection whose statement ends later goes back to sqlx, and a borrower gets
//!   `PoolClosed`; sqlx's close then waits only for statements in flight.
//! * Code that takes connections from sqlx's pool directly (migrations) first empties the free
//!   list ([`LeanPool::unparked`]).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_core::future::BoxFuture;
use futures_core::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt, stream};
use sqlx::pool::PoolConnection;
use sqlx::{
    Connection, Database, Describe, Either, Error, Execute, Executor, Pool, TransactionManager,
};

/// How long a pooled connection may sit idle before it is pinged on acquire (sqlx's pool, for
/// Postgres; the lean pool's free list, for both backends). Under
/// load connections are reused within milliseconds and never pinged; after any pause (a
/// database restart included: the connections that failed during it are closed, the others
/// have been idle) the next use of each one is checked first.
pub(crate) const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// How long a connection may stay in the free list's circulation before it goes back through
/// sqlx's pool (which closes one past its lifetime and replaces it).
pub(crate) const KEPT_AT_MOST: Duration = Duration::from_secs(5 * 60);

/// How long a connection may wait in the free list before it goes back through sqlx's pool
/// (whose idle timeout then closes the ones a quiet server does not need).
pub(crate) const IDLE_AT_MOST: Duration = Duration::from_secs(60);

/// sqlx's pool with a free list of connections lent without a round trip on return.
pub struct LeanPool<DB: Database> {
    shared: Arc<Shared<DB>>,
}

struct Shared<DB: Database> {
    sqlx: Pool<DB>,
    free: Mutex<Free<DB>>,
}

/// The free list (oldest parked first), how many borrowers wait on sqlx's pool, and whether
/// the pool was closed.
struct Free<DB: Database> {
    parked: Vec<Parked<DB>>,
    waiting: usize,
    closed: bool,
}

impl<DB: Database> Free<DB> {
    /// Takes out the connections parked too long ago (the oldest parked are first).
    fn stale(&mut self) -> Vec<Parked<DB>> {
        let fresh = self
            .parked
            .iter()
            .position(|p| p.idle_since.elapsed() < IDLE_AT_MOST)
            .unwrap_or(self.parked.len());
        self.parked.drain(..fresh).collect()
    }
}

impl<DB: Database> Shared<DB> {
    fn free(&self) -> MutexGuard<'_, Free<DB>> {
        // Push, pop and drain only: a panic elsewhere cannot leave the list half-changed.
        self.free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Hands the stale parked connections back to sqlx (outside the lock).
    fn sweep(&self) {
        let stale = self.free().stale();
        drop(stale);
    }
}

/// A connection in the free list: since when it waits, and since when this pool keeps it.
struct Parked<DB: Database> {
    conn: PoolConnection<DB>,
    idle_since: Instant,
    kept_since: Instant,
}

impl<DB: Database> Clone for LeanPool<DB> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<DB: Database> std::fmt::Debug for LeanPool<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeanPool")
            .field("parked", &self.shared.free().parked.len())
            .finish_non_exhaustive()
    }
}

impl<DB: Database> LeanPool<DB> {
    /// A lean pool over `sqlx`, with its sweep (a task that ends with the pool). Call within
    /// a Tokio runtime.
    pub fn new(sqlx: Pool<DB>) -> Self {
        let shared = Arc::new(Shared {
            sqlx,
            free: Mutex::new(Free {
                parked: Vec::new(),
                waiting: 0,
                closed: false,
            }),
        });
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(IDLE_AT_MOST / 2);
            every.tick().await;
            loop {
                every.tick().await;
                let Some(shared) = weak.upgrade() else { break };
                shared.sweep();
            }
        });
        Self { shared }
    }

    /// sqlx's pool itself, the free list emptied first (migrations take their connections
    /// from sqlx's pool, where a parked connection would never come back).
    pub(crate) fn unparked(&self) -> &Pool<DB> {
        let parked: Vec<Parked<DB>> = std::mem::take(&mut self.shared.free().parked);
        drop(parked);
        &self.shared.sqlx
    }

    /// A connection: the free list's most recently parked one, else sqlx's pool's. The whole
    /// lend (each idle connection's check, then sqlx's acquire) is bounded by the pool's
    /// acquire timeout, and one idle check by a quarter of it (a silent parked connection
    /// leaves time for a fresh one).
    async fn lend(&self) -> Result<Lent<DB>, Error> {
        let within = self.shared.sqlx.options().get_acquire_timeout();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let (next, stale) = {
                let mut free = self.shared.free();
                if free.closed {
                    return Err(Error::PoolClosed);
                }
                let stale = free.stale();
                let next = match free.parked.pop() {
                    Some(p) => Next::Parked(p),
                    None => Next::Sqlx(Waiting::counted(&mut free, &self.shared)),
                };
                (next, stale)
            };
            drop(stale);
            let p = match next {
                Next::Parked(p) => p,
                Next::Sqlx(waiting) => {
                    let conn = tokio::time::timeout_at(deadline, self.shared.sqlx.acquire()).await;
                    drop(waiting);
                    let conn = conn.map_err(|_| Error::PoolTimedOut)??;
                    return Ok(Lent::new(conn, Instant::now(), &self.shared));
                }
            };
            let lent = Lent::new(p.conn, p.kept_since, &self.shared);
            if p.idle_since.elapsed() < PING_AFTER_IDLE {
                return Ok(lent);
            }
            let by = deadline.min(tokio::time::Instant::now() + within / 4);
            if let Some(lent) = Self::answering(lent, by).await? {
                return Ok(lent);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::PoolTimedOut);
            }
        }
    }

    /// The idle check of a parked connection: it, once it answered a ping by `by`; `None`
    /// when it failed or stayed silent. Broken, silent, or its borrower gone meanwhile, it
    /// drops doubtful: closed, and its place in sqlx's pool freed at once.
    async fn answering(
        mut lent: Lent<DB>,
        by: tokio::time::Instant,
    ) -> Result<Option<Lent<DB>>, Error> {
        lent.doubtful = true;
        let pinged = tokio::time::timeout_at(by, lent.conn()?.ping()).await;
        if !matches!(pinged, Ok(Ok(()))) {
            return Ok(None);
        }
        lent.doubtful = false;
        Ok(Some(lent))
    }

    /// A transaction begun with `statement` on a lent connection.
    pub async fn begin_with(
        &self,
        statement: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Result<LeanTx<DB>, Error> {
        LeanTx::begin(self.lend().await?, Some(statement.into())).await
    }

    /// A transaction begun with the database's plain `BEGIN`.
    pub async fn begin(&self) -> Result<LeanTx<DB>, Error> {
        LeanTx::begin(self.lend().await?, None).await
    }

    /// Stops parking and lending, empties the free list, then closes sqlx's pool (which
    /// waits for the statements in flight).
    pub async fn close(&self) {
        let parked: Vec<Parked<DB>> = {
            let mut free = self.shared.free();
            free.closed = true;
            std::mem::take(&mut free.parked)
        };
        drop(parked);
        self.shared.sqlx.close().await;
    }

    /// Connections in the free list now (tests).
    #[cfg(test)]
    fn parked_now(&self) -> usize {
        self.shared.free().parked.len()
    }
}

/// Where a borrower's connection comes from: the free list, or sqlx's pool (counted as
/// waiting on it).
enum Next<'a, DB: Database> {
    Parked(Parked<DB>),
    Sqlx(Waiting<'a, DB>),
}

/// A borrower counted as waiting on sqlx's pool until this drops (its acquire ended or was
/// cancelled).
struct Waiting<'a, DB: Database>(&'a Shared<DB>);

impl<'a, DB: Database> Waiting<'a, DB> {
    /// Counts a borrower under the lock that found the free list empty: the guard exists
    /// from the moment the count does.
    fn counted(free: &mut Free<DB>, shared: &'a Shared<DB>) -> Self {
        free.waiting += 1;
        Self(shared)
    }
}

impl<DB: Database> Drop for Waiting<'_, DB> {
    fn drop(&mut self) {
        let mut free = self.0.free();
        free.waiting = free.waiting.saturating_sub(1);
    }
}

/// A connection lent by a [`LeanPool`]: back into the free list once [`Lent::finished`]
/// says its work completed, otherwise back through sqlx's pool.
struct Lent<DB: Database> {
    conn: Option<PoolConnection<DB>>,
    kept_since: Instant,
    shared: Arc<Shared<DB>>,
    finished: bool,
    /// Its state is in doubt (its idle check or a `BEGIN` did not finish): if it drops so,
    /// it is detached from sqlx's pool and closed, not handed to sqlx (whose check of it
    /// could hang on a silent network, and would not see a transaction it does not know of).
    doubtful: bool,
}

impl<DB: Database> Lent<DB> {
    fn new(conn: PoolConnection<DB>, kept_since: Instant, shared: &Arc<Shared<DB>>) -> Self {
        Self {
            conn: Some(conn),
            kept_since,
            shared: Arc::clone(shared),
            finished: false,
            doubtful: false,
        }
    }

    /// The connection, to run one statement on.
    fn conn(&mut self) -> Result<&mut DB::Connection, Error> {
        self.conn.as_deref_mut().ok_or_else(handed_on)
    }

    /// The statement completed without error: the connection may be lent again as it is.
    fn finished(mut self) {
        self.finished = true;
    }
}

/// The error of using a [`Lent`] whose connection was already handed on (`conn` is taken
/// only by its `drop`: never seen in practice).
fn handed_on() -> Error {
    Error::Protocol("lean pool: connection already handed on".into())
}

impl<DB: Database> Drop for Lent<DB> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.doubtful {
            drop(conn.detach());
            return;
        }
        if !self.finished {
            return; // `conn` drops here: sqlx pings it and keeps or closes it
        }
        if self.kept_since.elapsed() >= KEPT_AT_MOST {
            return; // `conn` drops here: back through sqlx, its lifetime rule
        }
        let stale = {
            let mut free = self.shared.free();
            if free.closed || free.waiting > 0 {
                // `conn` drops here (after the lock): back to sqlx, which closes it or hands
                // it to its oldest waiter.
                return;
            }
            free.parked.push(Parked {
                conn,
                idle_since: Instant::now(),
                kept_since: self.kept_since,
            });
            free.stale()
        };
        drop(stale);
    }
}

/// A transaction on a lent connection. Committed, its connection is lent again as a finished
/// statement's is (no round trip on its return); rolled back, failed or dropped, it goes back
/// through sqlx, a dropped one's ROLLBACK queued first (sqlx's check of the connection sends
/// it), as with sqlx's own transactions.
pub struct LeanTx<DB: Database> {
    lent: Lent<DB>,
    open: bool,
}

impl<DB: Database> LeanTx<DB> {
    async fn begin(
        mut lent: Lent<DB>,
        statement: Option<std::borrow::Cow<'static, str>>,
    ) -> Result<Self, Error> {
        // Cancelled between sending `BEGIN` and its answer, the connection would be in a
        // transaction its depth count does not show (no ROLLBACK queued, none sent by sqlx's
        // check): doubtful until the answer came.
        lent.doubtful = true;
        let begun = DB::TransactionManager::begin(lent.conn()?, statement).await;
        // Answered, even with the database's refusal (SQLite busy past its timeout), the
        // connection is in a known state and goes on as any other (back through sqlx on an
        // error); failing without an answer, it is closed.
        lent.doubtful = match &begun {
            Ok(()) => false,
            Err(e) => e.as_database_error().is_none(),
        };
        begun?;
        Ok(Self { lent, open: true })
    }

    /// Commits; the connection is then lent again without a round trip.
    pub async fn commit(mut self) -> Result<(), Error> {
        DB::TransactionManager::commit(self.lent.conn()?).await?;
        self.open = false;
        self.lent.finished = true;
        Ok(())
    }

    /// Rolls back; the connection goes back through sqlx.
    pub async fn rollback(mut self) -> Result<(), Error> {
        DB::TransactionManager::rollback(self.lent.conn()?).await?;
        self.open = false;
        Ok(())
    }
}

impl<DB: Database> Drop for LeanTx<DB> {
    fn drop(&mut self) {
        if self.open
            && let Ok(conn) = self.lent.conn()
        {
            DB::TransactionManager::start_rollback(conn);
        }
    }
}

impl<DB: Database> std::ops::Deref for LeanTx<DB> {
    type Target = DB::Connection;

    // The connection leaves a `Lent` only in its `drop`: a transaction's is always there.
    #[allow(clippy::expect_used)]
    fn deref(&self) -> &DB::Connection {
        self.lent
            .conn
            .as_deref()
            .expect("a transaction's connection")
    }
}

impl<DB: Database> std::ops::DerefMut for LeanTx<DB> {
    #[allow(clippy::expect_used)]
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.lent
            .conn
            .as_deref_mut()
            .expect("a transaction's connection")
    }
}

impl<'p, DB: Database> Executor<'p> for &'_ LeanPool<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    type Database = DB;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<DB::QueryResult, DB::Row>, Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, DB>,
    {
        let pool = self.clone();
        // Every statement of the store reads its whole answer (no caller streams), so the
        // rows are collected before the connection is handed back.
        stream::once(async move {
            let mut lent = pool.lend().await?;
            let items: Vec<Either<DB::QueryResult, DB::Row>> =
                lent.conn()?.fetch_many(query).try_collect().await?;
            lent.finished();
            Ok::<_, Error>(stream::iter(items.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<DB::Row>, Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, DB>,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lent = pool.lend().await?;
            let row = lent.conn()?.fetch_optional(query).await?;
            lent.finished();
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [DB::TypeInfo],
    ) -> BoxFuture<'e, Result<DB::Statement<'q>, Error>>
    where
        'p: 'e,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lent = pool.lend().await?;
            let statement = lent.conn()?.prepare_with(sql, parameters).await?;
            lent.finished();
            Ok(statement)
        })
    }

    fn describe<'e, 'q: 'e>(self, sql: &'q str) -> BoxFuture<'e, Result<Describe<DB>, Error>>
    where
        'p: 'e,
    {
        let pool = self.clone();
        Box::pin(async move {
            let mut lent = pool.lend().await?;
            let described = lent.conn()?.describe(sql).await?;
            lent.finished();
            Ok(described)
        })
    }
}

#[cfg(test)]
mod tests;
