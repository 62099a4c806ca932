//! The few plain HTML pages of sign-in (outside the Leptos app, so they work before and
//! without a session).

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

/// The banner every page shows while the demo sign-in is on.
pub const DEMO_BANNER: &str = countersign_app::DEMO_BANNER;

/// Escapes text for HTML.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A page with `title` and `body_html` (already escaped where needed).
pub fn page(status: StatusCode, title: &str, body_html: &str, demo: bool) -> Response {
    let banner = if demo {
        format!(
            "<p role=\"note\" class=\"demo-banner bg-amber-300 px-4 py-2 text-center text-sm \
             font-semibold text-slate-900\">{DEMO_BANNER}</p>"
        )
    } else {
        String::new()
    };
    let title = escape(title);
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · Countersign</title>\
         <link rel=\"stylesheet\" href=\"/pkg/countersign.css\"></head>\
         <body class=\"min-h-screen bg-slate-50 text-slate-900 antialiased\">{banner}\
         <main id=\"main\" class=\"mx-auto max-w-xl space-y-4 px-4 py-12\">\
         <h1 class=\"text-2xl font-semibold\">{title}</h1><div>{body_html}</div></main></body></html>"
    );
    (status, [("cache-control", "no-store")], Html(html)).into_response()
}
