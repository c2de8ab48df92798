//! `GET /states` (every state the caller may read, with its last change and lock) and `GET
//! /locks` (every lock the caller may read). The method is checked before the location.

use axum::extract::State;
use axum::response::Response;
use gitstate_core::StateName;
use gitstate_core::api::{ListedLock, ListedState};
use gitstate_core::ports::HeldLock;
use http::{Method, StatusCode};

use crate::call::{Authenticated, Read};
use crate::request::Target;
use crate::{ApiError, App, json, not_allowed, now_seconds, to_json};

fn listed_lock(name: &StateName, held: &HeldLock, now: i64) -> ListedLock {
    ListedLock {
        state: name.as_str().to_owned(),
        id: held.info.id().to_owned(),
        who: held.info.who().to_owned(),
        operation: held.info.operation().to_owned(),
        user: held.owner.clone(),
        created: held.created,
        age_seconds: held.created.map(|c| now.saturating_sub(c).max(0)),
    }
}

pub(crate) async fn states(
    State(app): State<App>,
    Authenticated(caller): Authenticated,
    Read(read): Read,
    target: Target,
    method: Method,
) -> Result<Response, ApiError> {
    if method != Method::GET && method != Method::HEAD {
        return Err(not_allowed(&method, "GET"));
    }
    let at = &app.backend.locate(target.repository(), target.branch())?;
    let rows = app.backend.list_states(&caller, at, &read).await?;
    let now = now_seconds();
    let listed: Vec<ListedState> = rows
        .iter()
        .map(|row| {
            let entry = row.entry.as_ref();
            ListedState {
                state: row.name.as_str().to_owned(),
                serial: entry.and_then(|e| e.serial),
                lineage: entry.and_then(|e| e.lineage.clone()),
                updated: entry.map(|e| e.time),
                author: entry.map(|e| e.author.clone()),
                operation: entry.map(|e| e.operation.clone()),
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
    State(app): State<App>,
    Authenticated(caller): Authenticated,
    target: Target,
    method: Method,
) -> Result<Response, ApiError> {
    if method != Method::GET {
        return Err(not_allowed(&method, "GET"));
    }
    let at = &app.backend.locate(target.repository(), target.branch())?;
    let locks = app.backend.list_locks(&caller, at).await?;
    let now = now_seconds();
    let listed: Vec<ListedLock> = locks
        .iter()
        .map(|(name, held)| listed_lock(name, held, now))
        .collect();
    Ok(json(StatusCode::OK, to_json(&listed)?))
}
