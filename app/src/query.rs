//! The page's query string (`?error=…`, `?done=…`, filters), read so that a server render
//! always sees its own request's.
//!
//! On the server the query comes from the request itself (the `RequestUrl` that
//! `leptos_axum` provides), parsed once when the component is created and kept as a plain
//! value: no reactive read happens later, at render time, when Leptos' thread-local owner and
//! arena may belong to another request (a gate page once rendered without its `?error=`
//! alert in CI that way; see `server/src/http/render.rs`). In the browser it is the router's
//! reactive query map, so client-side navigation updates the page.
//!
//! Invariant: on the server, a missing request URL means an empty query (no message shown,
//! no filter applied), never a guess.

use leptos_router::params::ParamsMap;

/// A handle on the current page's query string; cheap to clone into closures.
#[derive(Clone)]
pub struct PageQuery {
    #[cfg(feature = "ssr")]
    map: std::sync::Arc<ParamsMap>,
    #[cfg(not(feature = "ssr"))]
    map: leptos::prelude::Memo<ParamsMap>,
}

impl PageQuery {
    /// The value of `key`, if the query has it.
    pub fn get(&self, key: &str) -> Option<String> {
        #[cfg(feature = "ssr")]
        {
            self.map.get(key)
        }
        #[cfg(not(feature = "ssr"))]
        {
            use leptos::prelude::Read;
            self.map.read().get(key)
        }
    }
}

/// The current page's query string (see the module doc).
pub fn use_page_query() -> PageQuery {
    #[cfg(feature = "ssr")]
    {
        use leptos::prelude::use_context;
        use leptos_router::location::RequestUrl;
        let map = use_context::<RequestUrl>()
            .and_then(|url| url.parse().ok())
            .map(|url| url.search_params().clone())
            .unwrap_or_default();
        PageQuery {
            map: std::sync::Arc::new(map),
        }
    }
    #[cfg(not(feature = "ssr"))]
    {
        PageQuery {
            map: leptos_router::hooks::use_query_map(),
        }
    }
}

#[cfg(all(test, feature = "ssr"))]
mod tests {
    use super::*;
    use leptos::prelude::{Owner, provide_context};
    use leptos_router::location::RequestUrl;

    fn query_of(url: &str) -> (Owner, PageQuery) {
        let owner = Owner::new();
        let query = owner.with(|| {
            provide_context(RequestUrl::new(url));
            use_page_query()
        });
        (owner, query)
    }

    #[test]
    fn reads_the_requests_own_query_whatever_owner_is_current_later() {
        let (_ours, query) = query_of("http://leptos.dev/inbox/s1?error=reason&done=x");
        // Another request's render holds the thread when the page is rendered.
        let (other, _) = query_of("http://leptos.dev/inbox/s2?error=verdict");
        other.set();
        assert_eq!(query.get("error").as_deref(), Some("reason"));
        assert_eq!(query.get("done").as_deref(), Some("x"));
        assert_eq!(query.get("missing"), None);
    }

    #[test]
    fn without_a_request_url_the_query_is_empty() {
        let owner = Owner::new();
        let query = owner.with(use_page_query);
        assert_eq!(query.get("error"), None);
    }
}

/// The message a page shows after one of its forms: the fixed text `error` gives for
/// `?error=` (an alert) or else the one `done` gives for `?done=` (a status). Only texts
/// from those tables are shown, never the query's own words.
pub fn coded_message(
    error: fn(&str) -> Option<&'static str>,
    done: fn(&str) -> Option<&'static str>,
) -> impl Fn() -> Option<leptos::prelude::AnyView> + Clone + Send + 'static {
    use leptos::prelude::*;
    let query = use_page_query();
    move || {
        if let Some(text) = query.get("error").and_then(|c| error(&c)) {
            return Some(
                view! { <p role="alert" data-testid="error" class="rounded border border-red-300 bg-red-50 p-3 font-medium text-red-900">{text}</p> }
                    .into_any(),
            );
        }
        query.get("done").and_then(|c| done(&c)).map(|text| {
            view! { <p role="status" data-testid="notice" class="rounded border border-emerald-300 bg-emerald-50 p-3 text-emerald-900">{text}</p> }
                .into_any()
        })
    }
}
