//! Layers around the whole router, so that every answer passes through them whatever route (or
//! error, or redirect) produced it:
//!
//! - [`cross_site_writes`]: a state-changing request that a browser marks as coming from another
//!   site (`Sec-Fetch-Site` other than `same-origin` or `none`, or an `Origin` that is not this
//!   backend's scheme and `Host`) is refused with 403 before authentication, whatever its body's
//!   type. Terraform, OpenTofu and curl send neither header and pass.
//! - [`security_headers`]: the Content-Security-Policy, `X-Frame-Options`, `nosniff`,
//!   `Referrer-Policy` and (unless the answer set its own) `Cache-Control: no-store`.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, header};

use crate::{ApiError, SCHEME_HEADER};

/// The console's pages need nothing but their own stylesheet; no page may frame them.
pub(crate) const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
                              form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Where a browser says a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Site {
    /// `Sec-Fetch-Site: same-origin`, or an `Origin` equal to this backend's.
    SameOrigin,
    /// `Sec-Fetch-Site: none`: the user's own action (a typed address, a bookmark).
    User,
    /// Another site: `Sec-Fetch-Site` `same-site` or `cross-site` (or unreadable), or another
    /// `Origin` (`null` included).
    Cross,
    /// Neither header: not a browser (Terraform, curl), or a very old one.
    Unmarked,
}

/// Read `Sec-Fetch-Site`, `Origin`, `Host` and the listener's scheme.
pub(crate) fn site(headers: &HeaderMap) -> Site {
    let text = |name: &header::HeaderName| headers.get(name).map(|v| v.to_str().ok());
    let fetch_site = match text(&header::HeaderName::from_static("sec-fetch-site")) {
        None => None,
        Some(Some(site @ ("same-origin" | "none"))) => Some(site),
        Some(_) => return Site::Cross,
    };
    match text(&header::ORIGIN) {
        Some(Some(origin)) if same_origin(origin, headers) => Site::SameOrigin,
        Some(_) => Site::Cross,
        None => match fetch_site {
            Some("same-origin") => Site::SameOrigin,
            Some(_) => Site::User,
            None => Site::Unmarked,
        },
    }
}

/// Whether `origin` is `<scheme>://<Host>` of this request; the scheme is the one whatever
/// serves the router set (`https` behind TLS and on Lambda, `http` on a plain listener).
fn same_origin(origin: &str, headers: &HeaderMap) -> bool {
    let scheme = match headers.get(SCHEME_HEADER).and_then(|v| v.to_str().ok()) {
        Some(proto) if proto.eq_ignore_ascii_case("https") => "https://",
        _ => "http://",
    };
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    origin
        .get(..scheme.len())
        .filter(|s| s.eq_ignore_ascii_case(scheme))
        .and_then(|_| origin.get(scheme.len()..))
        .is_some_and(|h| h.eq_ignore_ascii_case(host))
}

/// Refuse a state-changing request from another site (see the module).
pub(crate) async fn cross_site_writes(request: Request, next: Next) -> Response {
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if !safe && site(request.headers()) == Site::Cross {
        tracing::warn!(
            method = %request.method(),
            origin = ?request.headers().get(header::ORIGIN),
            "cross-site write refused"
        );
        return ApiError::CrossSite.into_response();
    }
    next.run(request).await
}

/// The security headers on every answer (see the module).
pub(crate) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it a browser sends `Origin: null` even on same-origin posts.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of `Sec-Fetch-Site`, `Origin` and listener scheme: a request is
    /// cross-site exactly when either header names another site, unmarked when it has neither.
    #[test]
    fn site_over_every_combination_of_the_headers() {
        let fetch_sites = [
            None,
            Some("same-origin"),
            Some("none"),
            Some("same-site"),
            Some("cross-site"),
        ];
        let origins = [
            None,
            Some("http://127.0.0.1:8080"),
            Some("https://127.0.0.1:8080"),
            Some("http://127.0.0.1:9999"),
            Some("http://evil.example"),
            Some("null"),
        ];
        let mut cases = 0;
        for fetch_site in fetch_sites {
            for origin in origins {
                for scheme in ["http", "https"] {
                    let mut headers = HeaderMap::new();
                    headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
                    headers.insert(SCHEME_HEADER, HeaderValue::from_static(scheme));
                    if let Some(v) = fetch_site {
                        headers.insert("sec-fetch-site", HeaderValue::from_static(v));
                    }
                    if let Some(v) = origin {
                        headers.insert(header::ORIGIN, HeaderValue::from_static(v));
                    }
                    let own = format!("{scheme}://127.0.0.1:8080");
                    let other_site = matches!(fetch_site, Some("same-site" | "cross-site"))
                        || origin.is_some_and(|o| o != own);
                    let expected = if other_site {
                        Site::Cross
                    } else if origin.is_some() || fetch_site == Some("same-origin") {
                        Site::SameOrigin
                    } else if fetch_site == Some("none") {
                        Site::User
                    } else {
                        Site::Unmarked
                    };
                    assert_eq!(
                        site(&headers),
                        expected,
                        "{fetch_site:?} {origin:?} {scheme}"
                    );
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 60);
    }
}
