//! What every handler is given: the caller ([`Authenticated`], the one place that authenticates),
//! the request's [`ReadContext`] ([`Read`]), and for a resource of one state the whole [`Call`];
//! and the two layers every request passes through on its way to them: its deadline
//! ([`within_deadline`]) and the one that makes its read context ([`with_read_context`]).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use gitstate_core::access::{Caller, Role};
use gitstate_core::ports::Location;
use gitstate_core::service::ServiceError;
use gitstate_core::{ReadContext, StateName};
use http::request::Parts;
use http::{HeaderValue, Method, header};

use crate::body::write_body;
use crate::request::Target;
use crate::{ApiError, App, ClientAddr, Deadline, Limits};

/// The caller, authenticated by the Basic credentials of a user of the access policy (the
/// access file read under the request's [`ReadContext`]).
pub(crate) struct Authenticated(pub Caller);

impl FromRequestParts<App> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, ApiError> {
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        let caller = app
            .access
            .authenticate(authorization, client_address(parts), &read_context(parts))
            .await?;
        Ok(Self(caller))
    }
}

/// The request's [`ReadContext`], for handlers whose service calls read the store.
pub(crate) struct Read(pub ReadContext);

impl<S: Send + Sync> FromRequestParts<S> for Read {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Self(read_context(parts)))
    }
}

/// The context [`with_read_context`] made for this request. A request that did not pass that
/// layer (none of the router's) is read as outside any request: nothing is reused, which costs
/// requests to the remote but never freshness.
pub(crate) fn read_context(parts: &Parts) -> ReadContext {
    parts
        .extensions
        .get::<ReadContext>()
        .cloned()
        .unwrap_or_else(ReadContext::no_request)
}

fn client_address(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ClientAddr>()
        .map(|c| c.0)
        .or_else(|| {
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip())
        })
}

/// A request to a resource of one state: authenticated, then its target read and located, the
/// write grant required of a method that carries a body, and that body read and checked, in
/// that order.
pub(crate) struct Call {
    pub app: App,
    pub caller: Caller,
    pub at: Location,
    pub name: StateName,
    /// The query parameters of the route.
    pub target: Target,
    pub method: Method,
    pub body: Bytes,
    /// What the store's reads for this request may reuse.
    pub read: ReadContext,
}

impl FromRequest<App> for Call {
    type Rejection = ApiError;

    async fn from_request(request: Request, app: &App) -> Result<Self, ApiError> {
        let (mut parts, body) = request.into_parts();
        let Authenticated(caller) = Authenticated::from_request_parts(&mut parts, app).await?;
        let mut target = Target::from_request_parts(&mut parts, app).await?;
        let name = target.name.take().ok_or(ApiError::NoRoute)?;
        let at = app.backend.locate(target.repository(), target.branch())?;
        // Every method that carries a body changes the state or its lock, and takes at least
        // the write grant: a caller without it is refused before the body is read (up to the
        // limit, megabytes, held while it trickles in).
        if !matches!(parts.method, Method::GET | Method::HEAD) {
            caller
                .require(Role::Write, &name)
                .map_err(ServiceError::from)?;
        }
        let limit = app.limits.max_body_bytes;
        let body = write_body(&parts.method, &parts.headers, body, limit).await?;
        let read = read_context(&parts);
        Ok(Self {
            app: app.clone(),
            caller,
            at,
            name,
            target,
            method: parts.method,
            body,
            read,
        })
    }
}

/// Every request within its deadline, or a 504: [`Limits::request_deadline`], or the
/// transport's [`Deadline`] if that comes first.
pub(crate) async fn within_deadline(
    State(limits): State<Limits>,
    request: Request,
    next: Next,
) -> Response {
    let started = tokio::time::Instant::now();
    let mut due = started + limits.request_deadline;
    if let Some(Deadline(at)) = request.extensions().get::<Deadline>() {
        due = due.min(tokio::time::Instant::from_std(*at));
    }
    // Every operation is safe to cut short: a push lands whole or not at all, and a retried LOCK
    // with the same ID, write of the same bytes or UNLOCK of a released lock succeeds.
    match tokio::time::timeout_at(due, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Deadline {
            seconds: due.duration_since(started).as_secs_f64(),
        }
        .into_response(),
    }
}

/// Every request with its [`ReadContext`], kept in its extensions for the extractors: when it
/// began, and the state it reads when it is a `GET` of a state at the configured location with
/// credentials (its blob may then come with the access file's, see
/// `gitstate_core::read_context`). Its [`Target`] is read here, once, and kept for the handler,
/// whose extractors report what is wrong with it after authentication.
pub(crate) async fn with_read_context(request: Request, next: Next) -> Response {
    let began = std::time::Instant::now();
    let (mut parts, body) = request.into_parts();
    let target = Target::parse(&parts);
    let reads = target
        .as_ref()
        .ok()
        .and_then(|target| target.reads(&parts))
        .cloned();
    Target::keep(target, &mut parts);
    parts.extensions.insert(ReadContext::request(began, reads));
    next.run(Request::from_parts(parts, body)).await
}
