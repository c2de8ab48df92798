//! `GET /ui/download/<name>?at=<version|serial>[&ref=<branch>]`: one version's state as a file
//! to save. The same read as `/history/<name>?at=` (read grant, the same selector, the same
//! response limit), answered as an attachment named after the state and the version.

use axum::response::Response;
use gitstate_core::StateName;
use gitstate_core::access::Caller;
use gitstate_core::service::Selector;
use http::{HeaderValue, StatusCode, header};

use crate::request::Params;
use crate::{ApiError, App, json};

/// The serial of a state, read without keeping anything else.
#[derive(serde::Deserialize)]
struct Serial {
    serial: Option<u64>,
}

pub(super) async fn version(
    app: &App,
    caller: &Caller,
    name: &StateName,
    params: &Params,
) -> Result<Response, ApiError> {
    let at = app.backend.locate(None, params.get("ref"))?;
    let selector = params
        .get("at")
        .ok_or_else(|| ApiError::Query("a download needs ?at=<version id or serial>".into()))?;
    let (version, state) = app
        .backend
        .get_version(caller, &at, name, &Selector::parse(selector)?)
        .await?;
    app.limits.check_response(&state)?;
    let serial = serde_json::from_slice::<Serial>(&state)
        .ok()
        .and_then(|s| s.serial);
    let file = file_name(name, &version, serial);
    let mut response = json(StatusCode::OK, state);
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{file}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    if let Ok(value) = HeaderValue::from_str(&version) {
        headers.insert("gitstate-version", value);
    }
    Ok(response)
}

/// `prod-serial-7.tfstate` for version 7 of `net/prod.tfstate`; `prod-<version>.tfstate` when
/// the content names no serial. State names are made of `[A-Za-z0-9._-/]`, so the result needs
/// no quoting.
pub(super) fn file_name(name: &StateName, version: &str, serial: Option<u64>) -> String {
    let last = name.as_str().rsplit('/').next().unwrap_or_default();
    let stem = last.strip_suffix(".tfstate").unwrap_or(last);
    let stem = if stem.is_empty() { "state" } else { stem };
    match serial {
        Some(serial) => format!("{stem}-serial-{serial}.tfstate"),
        None => {
            let short: String = version
                .chars()
                .filter(char::is_ascii_hexdigit)
                .take(10)
                .collect();
            format!("{stem}-{short}.tfstate")
        }
    }
}
