//! Impact preview over the database (issue 33): the calls recorded in a window, replayed
//! through the bundle in force and a proposed one ([`countersign_core::preview`]), for the
//! `registry preview` command and the admin page's proposals.
//!
//! Invariants:
//! * Only reads: nothing is executed, no adapter is called, nothing is written.
//! * A tenant scope reads that tenant's records only; `None` (the platform's view: the
//!   operator's CLI, a platform admin) reads every tenant's.
//! * The base is the version in force now, read from the database (not this process's copy):
//!   a proposal is previewed against what its approval would replace.

use countersign_core::Store;
use countersign_core::StoreError;
use countersign_core::bundle::{Bundle, BundleSources};
use countersign_core::preview::{Replay, Report};
use countersign_core::store::{Change, apply_changes};

/// The window a preview replays when none is given.
pub const DEFAULT_DAYS: i64 = 30;

/// The longest window a preview replays.
pub const MAX_DAYS: i64 = 366;

const DAY_MS: i64 = 86_400_000;

/// Which recorded calls a preview replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The last N days (1 to [`MAX_DAYS`]).
    Days(i64),
    /// Everything recorded since this instant (Unix ms; an operator's explicit choice, so
    /// not bounded by [`MAX_DAYS`]).
    Since(i64),
}

/// A preview's report and what it covered.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Preview {
    /// The version in force the proposal was compared with.
    pub base_version: i64,
    /// Days replayed, back from now.
    pub days: i64,
    /// The tenant whose calls were replayed (`None`: every tenant's).
    pub tenant: Option<String>,
    /// What changes.
    #[serde(flatten)]
    pub report: Report,
}

/// Why a preview could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The database holds no registry yet.
    #[error("the database holds no registry yet: nothing to compare with")]
    NoRegistry,
    /// The proposed or stored bundle does not load.
    #[error("{0}")]
    Invalid(String),
    /// The window is outside 1..=366 days.
    #[error("the window must be 1 to {MAX_DAYS} days")]
    Window,
    /// The window starts now or later.
    #[error("the window must start in the past")]
    Future,
    /// The proposal was made against another version than the one in force: replaying it
    /// on this one would not show what it proposed.
    #[error(
        "superseded: the registry changed since it was proposed (it was made against version {proposed_on}, version {current} is in force)"
    )]
    Superseded {
        /// The version it was made against.
        proposed_on: i64,
        /// The version in force.
        current: i64,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The bundle in force, its version and texts.
async fn base(store: &Store) -> Result<(i64, BundleSources, Bundle), PreviewError> {
    let (version, sources) = store
        .current_bundle()
        .await?
        .ok_or(PreviewError::NoRegistry)?;
    let bundle = Bundle::load(sources.clone()).map_err(|e| {
        PreviewError::Invalid(format!("registry version {version} does not load: {e}"))
    })?;
    Ok((version, sources, bundle))
}

/// What `proposed` would have decided differently over the last `days` days of `tenant`'s
/// (or every tenant's) recorded calls.
pub async fn preview(
    store: &Store,
    tenant: Option<&str>,
    proposed: BundleSources,
    window: Window,
) -> Result<Preview, PreviewError> {
    let since = since_ms(store, window)?;
    let proposed = Bundle::load(proposed)
        .map_err(|e| PreviewError::Invalid(crate::registry::problem_lines(&e).join("\n")))?;
    let (base_version, _, base) = base(store).await?;
    replay_window(store, tenant, base_version, &base, &proposed, since).await
}

/// The preview of a proposal's `changes` applied to the version in force — refused as
/// [`PreviewError::Superseded`] when it was made against another version (`proposed_on`).
pub async fn preview_changes(
    store: &Store,
    tenant: Option<&str>,
    proposed_on: Option<i64>,
    changes: &[Change],
    window: Window,
) -> Result<Preview, PreviewError> {
    let since = since_ms(store, window)?;
    let (base_version, sources, base) = base(store).await?;
    if let Some(proposed_on) = proposed_on.filter(|v| *v != base_version) {
        return Err(PreviewError::Superseded {
            proposed_on,
            current: base_version,
        });
    }
    let proposed = apply_changes(&sources, changes)
        .and_then(|s| Bundle::load(s).map_err(|e| e.to_string()))
        .map_err(PreviewError::Invalid)?;
    replay_window(store, tenant, base_version, &base, &proposed, since).await
}

/// The first instant `window` replays, checked against [`MAX_DAYS`].
fn since_ms(store: &Store, window: Window) -> Result<i64, PreviewError> {
    let now = store.clock().now_ms();
    let since = match window {
        Window::Days(days) if (1..=MAX_DAYS).contains(&days) => now - days * DAY_MS,
        Window::Since(at) if at < now => at,
        Window::Since(_) => return Err(PreviewError::Future),
        Window::Days(_) => return Err(PreviewError::Window),
    };
    Ok(since)
}

async fn replay_window(
    store: &Store,
    tenant: Option<&str>,
    base_version: i64,
    base: &Bundle,
    proposed: &Bundle,
    since: i64,
) -> Result<Preview, PreviewError> {
    let days = (store.clock().now_ms() - since + DAY_MS - 1) / DAY_MS;
    let mut replay = Replay::new(base, proposed);
    store
        .recorded_calls(tenant, since, |call| replay.call(&call))
        .await?;
    Ok(Preview {
        base_version,
        days,
        tenant: tenant.map(str::to_string),
        report: replay.finish(),
    })
}
