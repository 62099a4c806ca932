//! MCP sessions shared by every replica: the database holds them (`mcp_sessions`), each
//! process keeps only a cache of the ones it serves.
//!
//! rmcp keeps a session's protocol state in the process that opened it; with
//! [`DbSessions`] as its session store it records each opened session and, when a request
//! names a session this process has not seen, restores it from the row by replaying the
//! client's `initialize`. What a session must remember beyond that — its agent, and through
//! it its run (`pipeline::run` keys a session's run by agent and session id in the database)
//! — is in the row too.
//!
//! Invariants:
//! * Every store operation runs inside a request the guard admitted, in a [`Scope`] naming
//!   that request's agent credential and tenant; outside one it fails (nothing is recorded,
//!   restored or ended for nobody).
//! * A request naming a session this process has not tied to its agent reaches rmcp only
//!   after the database says the session is that agent's, in its tenant, and live (not ended,
//!   touched within [`DB_IDLE`]): the guard touches its row first, which is also what rmcp's
//!   restore replays. Otherwise the answer is as for a session that does not exist (404).
//! * A session is touched in the database at its first request on a replica and then at most
//!   every [`TOUCH_EVERY`] (and once more when rmcp fails a request because its copy here
//!   closed meanwhile: below); a touch that finds it ended or idle closes this process's copy
//!   and answers 404. A touch never revives an idle session.
//! * An `initialize` whose session could not be recorded does not open one: the guard closes
//!   it, ends its row if there is one, and answers 500 (a session only this process knew would
//!   break on any other).
//! * A request whose session this process closes while rmcp takes it is answered 404 when
//!   the session is over in the database (ended elsewhere, idle), as the next request would
//!   be: rmcp answers 500 only when it could not hand the message to the session, so the
//!   message reached none. A copy closed while its row lives (shutdown, a failed worker)
//!   keeps rmcp's 500: the next request restores it.
//! * A session ended on one replica (`DELETE /mcp`) is refused by every other replica within
//!   [`ENDED_POLL`] when the replicas' clocks agree within [`ENDED_OVERLAP`], and in any case
//!   at its next touch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use countersign_core::Store;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::session::store::{
    SessionState, SessionStore, SessionStoreError,
};
use tokio_util::sync::CancellationToken;

/// The most live MCP sessions one agent credential may hold, on all replicas together.
pub const MAX_SESSIONS_PER_AGENT: usize = 32;

/// How long a session may go without a request before rmcp closes this process's copy.
pub const IDLE: Duration = SessionConfig::DEFAULT_KEEP_ALIVE;

/// How often a replica serving a session notes in its row that a request touched it.
pub const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// How long a session's row stays live without being touched: a session used within
/// [`IDLE`] on some replica was touched within `IDLE + TOUCH_EVERY`.
pub const DB_IDLE: Duration = Duration::from_secs(IDLE.as_secs() + TOUCH_EVERY.as_secs());

/// How often each replica looks for sessions ended elsewhere.
pub const ENDED_POLL: Duration = Duration::from_secs(2);

/// How far back each poll looks again (ends are stamped with the ending replica's clock and
/// may commit late): replicas' clocks must agree within this for [`ENDED_POLL`] to hold.
pub const ENDED_OVERLAP: Duration = Duration::from_secs(10);

/// How long rows of sessions nobody touches are kept (for diagnosis) before they are deleted.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// What this process knows of sessions: which agent owns each session it serves (and when
/// it last noted a touch in the database), and per agent the `initialize` requests under way
/// (counted against the cap before their session exists).
#[derive(Debug, Default)]
pub struct Owners {
    owners: Mutex<HashMap<String, Owner>>,
    opening: Mutex<HashMap<String, usize>>,
}

/// The agent that owns a session, and when this process last touched its row.
#[derive(Debug, Clone)]
struct Owner {
    agent: String,
    touched: Instant,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Whether a request names a session this process knows, and whose.
#[derive(Debug, PartialEq, Eq)]
pub enum Known {
    /// Not served here yet (the store restores it, or it does not exist).
    Unknown,
    /// Another agent's.
    Foreign,
    /// The caller's; `touch` when its row should be touched now.
    Own { touch: bool },
}

impl Owners {
    /// Records that `agent` owns session `id` (touched just now).
    pub fn insert(&self, id: &str, agent: &str) {
        locked(&self.owners).insert(
            id.to_string(),
            Owner {
                agent: agent.to_string(),
                touched: Instant::now(),
            },
        );
    }

    /// Forgets session `id`.
    pub fn remove(&self, id: &str) {
        locked(&self.owners).remove(id);
    }

    /// What session `id` is to `agent`; a touch is due once every [`TOUCH_EVERY`] (a touch
    /// that succeeds is recorded by [`Owners::insert`]).
    pub fn known(&self, id: &str, agent: &str) -> Known {
        match locked(&self.owners).get(id) {
            None => Known::Unknown,
            Some(o) if o.agent != agent => Known::Foreign,
            Some(o) => Known::Own {
                touch: o.touched.elapsed() >= TOUCH_EVERY,
            },
        }
    }

    /// Keeps only the sessions `live` says rmcp still serves here.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        locked(&self.owners).retain(|id, _| live(id));
    }

    /// Counts one more `initialize` of `agent` under way; returns how many are (this one
    /// included).
    fn reserve(&self, agent: &str) -> usize {
        let mut opening = locked(&self.opening);
        let pending = opening.entry(agent.to_string()).or_default();
        *pending += 1;
        *pending
    }

    /// Gives back a slot taken by [`Owners::reserve`].
    fn release(&self, agent: &str) {
        let mut opening = locked(&self.opening);
        if let Some(n) = opening.get_mut(agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                opening.remove(agent);
            }
        }
    }
}

/// A slot of [`Owners`] taken for an `initialize` under way, given back when dropped: on
/// every way out of the guard, including the client going away mid-request.
pub struct Reservation {
    owners: Arc<Owners>,
    agent: String,
}

impl Reservation {
    /// One of `agent`'s slots, and how many of its `initialize` requests are under way in
    /// this process (this one included). Taken before the live sessions are counted, so of
    /// two concurrent `initialize` requests at least one counts the other: the caller refuses
    /// when live sessions plus these exceed the cap.
    pub fn take(owners: &Arc<Owners>, agent: &str) -> (Self, usize) {
        let pending = owners.reserve(agent);
        (
            Self {
                owners: owners.clone(),
                agent: agent.to_string(),
            },
            pending,
        )
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.owners.release(&self.agent);
    }
}

/// The request a store operation belongs to: its agent credential and tenant, and what the
/// store did for it (read back by the guard once rmcp has answered).
#[derive(Debug)]
pub struct Scope {
    tenant: String,
    agent: String,
    done: Mutex<Done>,
    /// A session the guard found live and the caller's (its id and `initialize` parameters),
    /// for rmcp's restore to replay without asking the database again.
    restore: Mutex<Option<(String, String)>>,
}

/// What the session store did within one request.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// An opened session was recorded (`Some(false)`: recording it failed).
    pub opened: Option<bool>,
    /// A session was ended in the database (`Some(false)`: it was not a live session of the
    /// caller's).
    pub ended: Option<bool>,
    /// The database could not be asked.
    pub failed: bool,
}

tokio::task_local! {
    static SCOPE: Arc<Scope>;
}

impl Scope {
    /// The scope of a request by agent credential `agent` of `tenant`.
    pub fn new(tenant: &str, agent: &str) -> Arc<Self> {
        Arc::new(Self {
            tenant: tenant.to_string(),
            agent: agent.to_string(),
            done: Mutex::default(),
            restore: Mutex::default(),
        })
    }

    /// Hands session `id`'s `initialize` parameters (just read with its touch) to a restore.
    pub fn stash(&self, id: &str, params: String) {
        *locked(&self.restore) = Some((id.to_string(), params));
    }

    /// Runs `f` (rmcp serving the request) inside this scope.
    pub async fn run<F: std::future::Future>(self: &Arc<Self>, f: F) -> F::Output {
        SCOPE.scope(self.clone(), f).await
    }

    /// The caller's tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The caller's agent credential id.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// What the store did within this scope so far.
    pub fn done(&self) -> Done {
        *locked(&self.done)
    }

    fn record(&self, f: impl FnOnce(&mut Done)) {
        f(&mut locked(&self.done));
    }
}

/// The current request's scope, or the error every store operation outside one fails with.
fn scope() -> Result<Arc<Scope>, SessionStoreError> {
    SCOPE
        .try_with(Arc::clone)
        .map_err(|_| "an MCP session store operation outside an admitted request".into())
}

/// rmcp's session store over the database.
#[derive(Debug, Clone)]
pub struct DbSessions {
    store: Store,
    owners: Arc<Owners>,
}

impl DbSessions {
    /// The store over `store`'s `mcp_sessions`, noting restored sessions' owners in `owners`.
    pub fn new(store: Store, owners: Arc<Owners>) -> Self {
        Self { store, owners }
    }
}

#[async_trait::async_trait]
impl SessionStore for DbSessions {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let scope = scope()?;
        let stashed = locked(&scope.restore)
            .take()
            .filter(|(id, _)| id == session_id)
            .map(|(_, params)| params);
        let params = match stashed {
            Some(params) => params,
            None => match touch(&self.store, &scope.tenant, session_id, &scope.agent).await? {
                Some(params) => params,
                None => return Ok(None),
            },
        };
        self.owners.insert(session_id, &scope.agent);
        Ok(Some(SessionState::new(serde_json::from_str(&params)?)))
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let scope = scope()?;
        let recorded = async {
            let params = serde_json::to_string(&state.initialize_params)?;
            self.store
                .mcp_session_open(&scope.tenant, session_id, &scope.agent, &params)
                .await?;
            Ok::<_, SessionStoreError>(())
        }
        .await;
        scope.record(|d| {
            d.opened = Some(recorded.is_ok());
            d.failed |= recorded.is_err();
        });
        recorded
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        let scope = scope()?;
        let ended = self
            .store
            .mcp_session_end(&scope.tenant, session_id, &scope.agent)
            .await;
        scope.record(|d| {
            d.ended = Some(matches!(ended, Ok(true)));
            d.failed |= ended.is_err();
        });
        ended.map(|_| ()).map_err(Into::into)
    }
}

/// Notes in session `id`'s row that a request of `agent` (of `tenant`) touched it: its
/// `initialize` parameters while it is that agent's and live, `None` otherwise.
pub async fn touch(
    store: &Store,
    tenant: &str,
    id: &str,
    agent: &str,
) -> Result<Option<String>, countersign_core::StoreError> {
    store
        .mcp_session_touch(tenant, id, agent, millis(DB_IDLE))
        .await
}

/// Ends session `id`'s row (best effort: an `initialize` whose session could not be kept).
pub async fn end_row(store: &Store, tenant: &str, id: &str, agent: &str) {
    if let Err(e) = store.mcp_session_end(tenant, id, agent).await {
        tracing::warn!(error = %e, "mcp: ending an unkept session's row failed");
    }
}

/// How many live sessions `agent` of `tenant` holds on every replica.
pub async fn held(store: &Store, tenant: &str, agent: &str) -> Result<usize, String> {
    store
        .mcp_sessions_live(tenant, agent, millis(DB_IDLE))
        .await
        .map_err(|e| e.to_string())
}

/// Every [`ENDED_POLL`], closes this process's copies of sessions ended on any replica, and
/// now and then deletes rows untouched for [`FORGET_AFTER`]; stops when `shutdown` fires.
pub fn spawn_ended_poll(
    store: Store,
    sessions: Arc<LocalSessionManager>,
    owners: Arc<Owners>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Each round reads again what ended in the last ENDED_OVERLAP (stamped by other
        // replicas' clocks, committed late): closing twice is harmless.
        let mut since = store_now(&store) - millis(ENDED_OVERLAP);
        let mut every = tokio::time::interval(ENDED_POLL);
        let mut rounds: u64 = 0;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = shutdown.cancelled() => return,
            }
            rounds += 1;
            let now = store_now(&store);
            match store.mcp_sessions_ended_since(since).await {
                Ok(ended) => {
                    for (id, _) in &ended {
                        close_here(&sessions, &owners, id).await;
                    }
                    since = now - millis(ENDED_OVERLAP);
                }
                Err(e) => tracing::warn!(error = %e, "mcp: polling ended sessions failed"),
            }
            forget_gone(&sessions, &owners).await;
            // About once an hour.
            let hourly = 3600 / ENDED_POLL.as_secs();
            if rounds.is_multiple_of(hourly)
                && let Err(e) = store.mcp_sessions_forget(now - millis(FORGET_AFTER)).await
            {
                tracing::warn!(error = %e, "mcp: deleting old session rows failed");
            }
        }
    })
}

fn store_now(store: &Store) -> i64 {
    store.clock().now_ms()
}

/// Whether rmcp serves session `id` in this process now.
pub async fn served_here(sessions: &LocalSessionManager, id: &str) -> bool {
    let key: rmcp::transport::streamable_http_server::session::SessionId = Arc::from(id);
    sessions.sessions.read().await.contains_key(&key)
}

/// Closes this process's copy of session `id`, if it has one, then forgets its owner (in
/// this order: a request meanwhile still finds the owner, or no session).
pub async fn close_here(sessions: &LocalSessionManager, owners: &Owners, id: &str) {
    if served_here(sessions, id).await {
        let key: rmcp::transport::streamable_http_server::session::SessionId = Arc::from(id);
        use rmcp::transport::streamable_http_server::session::SessionManager;
        if let Err(e) = sessions.close_session(&key).await {
            tracing::warn!(error = %e, "mcp: closing a session ended elsewhere failed");
        } else {
            tracing::debug!(session = %id, "mcp: a session ended elsewhere closed here");
        }
    }
    owners.remove(id);
}

/// Forgets the owners of sessions rmcp no longer serves here (ended by their idle timeout):
/// their next request, if any, is checked against the database again.
pub async fn forget_gone(sessions: &LocalSessionManager, owners: &Owners) {
    let live = sessions.sessions.read().await;
    owners.retain(|id| live.contains_key(id));
}
