//! `/states/<name>` (and the seed format's `/?type=git&…&state=<name>`): read, write and remove a
//! state; `LOCK` and `UNLOCK` go to [`crate::locks`].

use axum::response::{IntoResponse, Response};
use gitstate_core::service::{ServiceError, WriteRequest};
use gitstate_core::{BranchName, SEED_BRANCH};
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
            let state = match app.backend.get_state(caller, at, name, read).await {
                // The seed's address without `ref=` meant its default branch to the seed: a state
                // there is never "no state" here.
                Err(e @ (ServiceError::NotFound | ServiceError::StatesElsewhere { .. }))
                    if target.is_seed_without_ref() =>
                {
                    let seed_branch =
                        BranchName::parse(SEED_BRANCH).map_err(ServiceError::Branch)?;
                    app.backend
                        .absent_beside(at, name, &seed_branch, read)
                        .await?;
                    return Err(e.into());
                }
                other => other?,
            };
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
