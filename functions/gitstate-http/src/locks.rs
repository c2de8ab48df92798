//! `/locks/<name>`: the current lock (`GET`), taking it (`POST` or `LOCK`) and releasing it
//! (`DELETE` or `UNLOCK`).

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

use crate::call::Call;
use crate::{ApiError, json, not_allowed, now_seconds};

/// Headers of `GET /locks/<name>` that describe the lock beyond Terraform's LockInfo.
pub const LOCK_USER_HEADER: &str = "gitstate-lock-user";
pub const LOCK_CREATED_HEADER: &str = "gitstate-lock-created";
pub const LOCK_AGE_HEADER: &str = "gitstate-lock-age";

pub(crate) async fn serve(call: Call) -> Result<Response, ApiError> {
    match call.method.as_str() {
        "GET" => current(&call).await,
        "POST" | "LOCK" => lock(&call).await,
        "DELETE" | "UNLOCK" => unlock(&call).await,
        _ => Err(not_allowed(&call.method, "GET, POST, DELETE, LOCK, UNLOCK")),
    }
}

/// Take the lock described by the LockInfo in `body`.
pub(crate) async fn lock(call: &Call) -> Result<Response, ApiError> {
    let Call {
        app,
        caller,
        at,
        name,
        ..
    } = call;
    app.backend
        .lock(caller, at, name, call.body.clone())
        .await?;
    Ok(StatusCode::OK.into_response())
}

/// Release the lock whose ID `body` names (or any, for an admin's force-unlock).
pub(crate) async fn unlock(call: &Call) -> Result<Response, ApiError> {
    let Call {
        app,
        caller,
        at,
        name,
        ..
    } = call;
    app.backend.unlock(caller, at, name, &call.body).await?;
    Ok(StatusCode::OK.into_response())
}

/// The holder's LockInfo, with who took it and when in headers.
async fn current(call: &Call) -> Result<Response, ApiError> {
    let Call {
        app,
        caller,
        at,
        name,
        ..
    } = call;
    let held = app.backend.get_lock(caller, at, name).await?;
    let mut response = json(StatusCode::OK, held.info.as_bytes().clone());
    let headers = response.headers_mut();
    if let Some(value) = held.owner.and_then(|o| HeaderValue::from_str(&o).ok()) {
        headers.insert(LOCK_USER_HEADER, value);
    }
    if let Some(created) = held.created {
        headers.insert(LOCK_CREATED_HEADER, HeaderValue::from(created));
        let age = now_seconds().saturating_sub(created).max(0);
        headers.insert(LOCK_AGE_HEADER, HeaderValue::from(age));
    }
    Ok(response)
}
