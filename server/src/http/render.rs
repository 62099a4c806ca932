//! Keeps each dashboard request (pages, server functions) on its own reactive owner, whichever thread polls it.
//!
//! Leptos 0.8 keeps "the current reactive owner" (contexts, and the arena its signals and memos
//! live in) in a thread-local. A page render sets its root owner there once and never clears
//! it. When tokio's work-stealing scheduler resumed a render on another worker thread, code that
//! captures the current owner while it builds the page (leptos_router's route loaders do, and
//! `Owner::with` switches the arena without switching it back) picked up whatever that thread
//! last held: another request's owner, with that request's URL (upstream: leptos-rs/leptos#3671).
//! Seen in CI: `/inbox/{id}?error=reason` rendered without its alert. The interleaving was not
//! reproduced on demand; `inbox::concurrent_gate_pages_each_show_their_own_message` guards the
//! behaviour, and the unit test below the invariant itself.
//!
//! Invariants:
//! * every poll of a request's future, once Leptos has created the request's root owner, runs
//!   with that owner current on the polling thread;
//! * after each poll the owner is taken off the thread again, so no later task on that thread
//!   can pick it up;
//! * the owner slot is per request (a task-local), never shared between requests.

use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use leptos::prelude::Owner;

tokio::task_local! {
    static ROOT: Arc<Mutex<Option<Owner>>>;
}

/// Records the request's root owner. Called from the Leptos context closure, which runs inside
/// that owner; outside [`pin_owner`] it does nothing.
pub fn remember_owner() {
    let _ = ROOT.try_with(|slot| {
        if let Ok(mut root) = slot.lock() {
            *root = Owner::current();
        }
    });
}

/// Middleware: polls the rest of the request with its root owner current (see the module doc).
pub async fn pin_owner(req: Request, next: Next) -> Response {
    pinned(next.run(req)).await
}

/// Polls `fut` with the owner it remembers (through [`remember_owner`]) current on whichever
/// thread polls it, and takes that owner off the thread after each poll.
async fn pinned<F: Future>(fut: F) -> F::Output {
    let slot = Arc::new(Mutex::new(None::<Owner>));
    let root = || slot.lock().ok().and_then(|root| root.clone());
    let mut inner = std::pin::pin!(ROOT.scope(slot.clone(), fut));
    std::future::poll_fn(|cx| {
        if let Some(owner) = root() {
            owner.set();
        }
        let polled = inner.as_mut().poll(cx);
        if let Some(owner) = root() {
            owner.unset();
        }
        if polled.is_ready() {
            // The request is answered: its owner (and everything it owns) goes now.
            if let Ok(mut root) = slot.lock() {
                root.take();
            }
        }
        polled
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_poll_runs_under_the_remembered_owner_and_leaves_it_behind() {
        let ours = Owner::new();
        let (seen, foreign) = pinned({
            let ours = ours.clone();
            async move {
                ours.set();
                remember_owner();
                // Another request's render takes this thread's owner while we wait.
                let foreign = Owner::new();
                foreign.set();
                tokio::task::yield_now().await;
                (Owner::current(), foreign)
            }
        })
        .await;
        assert!(seen == Some(ours.clone()), "resumed under another owner");
        assert!(seen != Some(foreign));
        assert!(
            Owner::current() != Some(ours),
            "the request's owner stayed on the thread after it finished"
        );
    }

    #[tokio::test]
    async fn outside_a_request_remembering_does_nothing() {
        let owner = Owner::new();
        owner.set();
        remember_owner();
        assert!(Owner::current() == Some(owner));
    }
}
