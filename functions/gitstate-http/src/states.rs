//! `/states/<name>` (and the seed format's `/?type=git&…&state=<name>`): read, write and remove a
//! state; `LOCK` and `UNLOCK` go to [`crate::locks`].

use axum::response::{IntoResponse, Response};
use gitstate_core::service::{ServiceError, WriteRequest};
use http::StatusCode;

use crate::call::Call;
use crate::{ApiError, json, locks, not_allowed};

pub(crate) async fn serve(call: Call) -> Result<Response, ApiError> {
    let Call {
        ref app,
        ref caller,
        ref at,
        ref name,
        ref target,
        ref method,
        ref body,
        ref read,
    } = call;
    let lock_id = target.param("ID");
    match method.as_str() {
        "GET" => {
            let state = app.backend.get_state(caller, at, name, read).await?;
            app.limits.check_response(&state)?;
            Ok(json(StatusCode::OK, state))
        }
        "POST" | "PUT" => {
            // What is accepted can be read back: the same estimate and 413 as the read.
            app.limits.check_response(body)?;
            app.backend
                .put_state(WriteRequest::new(caller, at, name, body.clone(), read).lock_id(lock_id))
                .await?;
            Ok(StatusCode::OK.into_response())
        }
        "DELETE" => {
            // Terraform's DELETE of a state carries no body; one with a body (a LockInfo) is an
            // unlock sent to the state's address.
            if !body.is_empty() {
                return Err(ServiceError::LockRequestToState("a DELETE with a body").into());
            }
            app.backend
                .delete_state(caller, at, name, lock_id, read)
                .await?;
            Ok(StatusCode::OK.into_response())
        }
        "LOCK" => locks::lock(&call).await,
        "UNLOCK" => locks::unlock(&call).await,
        _ => Err(not_allowed(method, "GET, POST, PUT, DELETE, LOCK, UNLOCK")),
    }
}
