//! `GET /states` (every state the caller may read, with its last change and lock) and `GET
//! /locks` (every lock the caller may read). The method is checked before the location.

use axum::response::Response;
use gitstate_core::StateName;
use gitstate_core::access::Caller;
use gitstate_core::ports::{HeldLock, Location};
use gitstate_core::service::ServiceError;
use http::{Method, StatusCode};

use crate::{ApiError, App, json, not_allowed, now_seconds, to_json};

/// A lock as `GET /locks` lists it.
#[derive(Debug, serde::Serialize)]
struct ListedLock<'a> {
    state: &'a str,
    id: &'a str,
    who: &'a str,
    operation: &'a str,
    user: Option<&'a str>,
    created: Option<i64>,
    age_seconds: Option<i64>,
}

/// A state as `GET /states` lists it.
#[derive(Debug, serde::Serialize)]
struct ListedState<'a> {
    state: &'a str,
    serial: Option<u64>,
    lineage: Option<&'a str>,
    /// When it last changed (Unix seconds), by whom and how; absent for a lock on a state not
    /// written yet.
    updated: Option<i64>,
    author: Option<&'a str>,
    operation: Option<&'a str>,
    lock: Option<ListedLock<'a>>,
}

fn listed_lock<'a>(name: &'a StateName, held: &'a HeldLock, now: i64) -> ListedLock<'a> {
    ListedLock {
        state: name.as_str(),
        id: held.info.id(),
        who: held.info.who(),
        operation: held.info.operation(),
        user: held.owner.as_deref(),
        created: held.created,
        age_seconds: held.created.map(|c| now.saturating_sub(c).max(0)),
    }
}

pub(crate) async fn states(
    app: &App,
    caller: &Caller,
    method: &Method,
    locate: impl FnOnce() -> Result<Location, ServiceError>,
) -> Result<Response, ApiError> {
    if *method != Method::GET && *method != Method::HEAD {
        return Err(not_allowed(method, "GET"));
    }
    let at = &locate()?;
    let rows = app.backend.list_states(caller, at).await?;
    let now = now_seconds();
    let listed: Vec<ListedState<'_>> = rows
        .iter()
        .map(|row| {
            let entry = row.entry.as_ref();
            ListedState {
                state: row.name.as_str(),
                serial: entry.and_then(|e| e.serial),
                lineage: entry.and_then(|e| e.lineage.as_deref()),
                updated: entry.map(|e| e.time),
                author: entry.map(|e| e.author.as_str()),
                operation: entry.map(|e| e.operation.as_str()),
                lock: row
                    .lock
                    .as_ref()
                    .map(|held| listed_lock(&row.name, held, now)),
            }
        })
        .collect();
    Ok(json(StatusCode::OK, to_json(&listed)?))
}

pub(crate) async fn locks(
    app: &App,
    caller: &Caller,
    method: &Method,
    locate: impl FnOnce() -> Result<Location, ServiceError>,
) -> Result<Response, ApiError> {
    if *method != Method::GET {
        return Err(not_allowed(method, "GET"));
    }
    let at = &locate()?;
    let locks = app.backend.list_locks(caller, at).await?;
    let now = now_seconds();
    let listed: Vec<ListedLock<'_>> = locks
        .iter()
        .map(|(name, held)| listed_lock(name, held, now))
        .collect();
    Ok(json(StatusCode::OK, to_json(&listed)?))
}
