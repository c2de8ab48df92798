//! `/history/<name>`: the revisions of a state, newest first (`?page=&per_page=`), one revision's
//! state (`?at=<commit|serial>`), and restoring one on top (`POST ?restore=<commit|serial>`).

use axum::response::Response;
use gitstate_core::api::HistoryAnswer;
use gitstate_core::service::Selector;
use http::{HeaderValue, StatusCode};

use crate::call::Call;
use crate::{ApiError, json, not_allowed, to_json};

/// Versions on one page when `?per_page=` does not say.
const PER_PAGE: usize = 20;

/// The branch an answer of this route read or wrote, for clients to say which it was.
pub const BRANCH_HEADER: &str = "gitstate-branch";

pub(crate) async fn serve(call: Call) -> Result<Response, ApiError> {
    let mut response = match (call.method.as_str(), call.target.param("at")) {
        ("GET", Some(selector)) => version(&call, selector).await,
        ("GET", None) => page(&call).await,
        ("POST", _) => restore(&call).await,
        _ => Err(not_allowed(&call.method, "GET, POST")),
    }?;
    if let Ok(value) = HeaderValue::from_str(&call.at.branch.to_string()) {
        response.headers_mut().insert(BRANCH_HEADER, value);
    }
    Ok(response)
}

/// One revision's state, its commit id in `gitstate-version`.
async fn version(call: &Call, selector: &str) -> Result<Response, ApiError> {
    let Call {
        app,
        caller,
        at,
        name,
        ..
    } = call;
    let selector = Selector::parse(selector)?;
    let (version, state) = app.backend.get_version(caller, at, name, &selector).await?;
    app.limits.check_response(&state)?;
    let mut response = json(StatusCode::OK, state);
    if let Ok(value) = HeaderValue::from_str(&version) {
        response.headers_mut().insert("gitstate-version", value);
    }
    Ok(response)
}

async fn page(call: &Call) -> Result<Response, ApiError> {
    let Call {
        app,
        caller,
        at,
        name,
        target,
        ..
    } = call;
    let number = |text: Option<&str>, default: usize| match text {
        None => Ok(default),
        Some(t) => t
            .parse::<usize>()
            .map_err(|_| ApiError::Query(format!("{t:?} is not a page number"))),
    };
    let page = number(target.param("page"), 0)?;
    let per_page = number(target.param("per_page"), PER_PAGE)?;
    let (versions, more) = app
        .backend
        .history(caller, at, name, page, per_page)
        .await?;
    let answer = HistoryAnswer {
        state: name.as_str().to_owned(),
        page,
        versions,
        next_page: more.then_some(page + 1),
    };
    Ok(json(StatusCode::OK, to_json(&answer)?))
}

/// Write the selected revision again as the newest (admin only).
async fn restore(call: &Call) -> Result<Response, ApiError> {
    let Call {
        app,
        caller,
        at,
        name,
        target,
        read,
        ..
    } = call;
    let selector = target
        .param("restore")
        .ok_or_else(|| ApiError::Query("restore needs ?restore=<commit id or serial>".into()))?;
    let restored = app
        .backend
        .restore(caller, at, name, &Selector::parse(selector)?, read)
        .await?;
    Ok(json(StatusCode::OK, to_json(&restored)?))
}
