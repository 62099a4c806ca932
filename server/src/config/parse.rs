//! Parsing of the values that are not plain text or numbers: origins, durations, role maps.

use std::time::Duration;

use countersign_core::AppRole;
use url::Url;

/// Whether `url` names a loopback host (`localhost`, 127.0.0.0/8, `::1`).
pub fn loopback_host(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Whether `url` is `https`, or `http` on a loopback host.
pub fn secure_or_loopback(url: &Url) -> bool {
    url.scheme() == "https" || (url.scheme() == "http" && loopback_host(url))
}

/// Parses an origin (`http(s)://host[:port]`, no path) into the form browsers send in the
/// `Origin` header (default ports dropped, host lower-cased); `None` if it is not one.
pub fn parse_origin(text: &str) -> Option<String> {
    let url = Url::parse(text.trim()).ok()?;
    let bare = url.path() == "/" && url.query().is_none() && url.fragment().is_none();
    let plain = url.username().is_empty() && url.password().is_none();
    (matches!(url.scheme(), "http" | "https") && url.host_str().is_some() && bare && plain)
        .then(|| url.origin().ascii_serialization())
}

/// `800ms` or `15s`: a whole number of milliseconds or seconds.
pub(super) fn parse_duration(text: &str) -> Option<Duration> {
    let (digits, ms) = match text.strip_suffix("ms") {
        Some(d) => (d, true),
        None => (text.strip_suffix('s')?, false),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(if ms {
        Duration::from_millis(n)
    } else {
        Duration::from_secs(n)
    })
}

/// Parses `GROUP=ROLE,GROUP=ROLE`; a group may map to several roles by repeating it.
pub fn parse_role_map(text: &str) -> Result<Vec<(String, AppRole)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (group, role) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not GROUP=ROLE"))?;
            let role = AppRole::parse(role.trim()).ok_or_else(|| {
                format!(
                    "{pair:?}: unknown role; expected approver, manager, admin, auditor or \
                     platform_admin"
                )
            })?;
            let group = group.trim();
            if group.is_empty() {
                return Err(format!("{pair:?} names no group"));
            }
            Ok((group.to_string(), role))
        })
        .collect()
}
