//! Errors as pages for people: a browser (a request that accepts `text/html`) that meets a
//! refusal reads it on a styled page that says what happened and links back to the states.
//! Statuses, headers and every other client's answer are left as they are: Terraform never
//! sends `Accept: text/html`, and reads a 404 as "no state" whatever its body.

use askama::Template;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode, header};

use super::browser;

/// Longest error body turned into a page; the router's reasons are one line.
const MAX_REASON_BYTES: usize = 16 * 1024;

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    /// No one is named: the page may answer before or without authentication.
    user: String,
    code: u16,
    title: &'static str,
    reason: String,
    advice: &'static str,
}

/// What each refusal is called, and what a person can do about it.
fn wording(status: StatusCode) -> (&'static str, &'static str) {
    match status {
        StatusCode::FORBIDDEN => (
            "Not allowed",
            "Your user's grants do not cover this, or the request did not come from this \
             console's own pages. An administrator can extend the grants in the access file.",
        ),
        StatusCode::NOT_FOUND => (
            "Not found",
            "There is no page at this address, or no state by this name on this branch. The \
             list of states shows every state you may read.",
        ),
        StatusCode::METHOD_NOT_ALLOWED => ("Not here", "This address does not take that request."),
        s if s.is_server_error() => (
            "Something failed",
            "The backend could not answer. Retrying is safe; if it keeps failing, its log says why.",
        ),
        _ => ("Not understood", "The request was refused as it was sent."),
    }
}

/// The layer: a browser's error answer (4xx but 401, or 5xx) in plain text becomes a page.
pub(crate) async fn for_browsers(request: Request, next: Next) -> Response {
    let wants_page = browser(request.headers()) && *request.method() != Method::HEAD;
    let response = next.run(request).await;
    let status = response.status();
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    // A 401 keeps its text: the browser asks for credentials, and the page's stylesheet
    // would be refused without them.
    let refused = (status.is_client_error() && status != StatusCode::UNAUTHORIZED)
        || status.is_server_error();
    if !(wants_page && plain && refused) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let reason = match axum::body::to_bytes(body, MAX_REASON_BYTES).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let (title, advice) = wording(status);
    let page = ErrorPage {
        user: String::new(),
        code: status.as_u16(),
        title,
        reason,
        advice,
    };
    let Ok(text) = page.render() else {
        // Not reached with this template; the status still says what happened.
        return Response::from_parts(parts, Body::empty());
    };
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(text))
}
