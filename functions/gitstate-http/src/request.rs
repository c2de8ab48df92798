//! What a request addresses: its path, percent-decoded once before routing
//! ([`decode_path_layer`]), and its [`Target`]: the resource of the route it matched, the state
//! the path names, and the query parameters, each given at most once and only those the route
//! takes.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{FromRequestParts, MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::MethodRouter;
use gitstate_core::StateName;
use gitstate_core::service::ServiceError;
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{Method, Uri, header};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

use crate::ApiError;

/// Longest query string accepted.
pub const MAX_QUERY_BYTES: usize = 4096;

/// The routes of the table in [`crate::router`] (the console's are its own, under `/ui`).
pub(crate) mod route {
    /// Named by the rest of the path, see [`super::named`].
    pub const STATE: &str = "/states/";
    pub const LOCK: &str = "/locks/";
    pub const HISTORY: &str = "/history/";
    pub const STATES: &str = "/states";
    pub const LOCKS: &str = "/locks";
    pub const HEALTH: &str = "/health";
    /// The seed tool's address: `/?type=git&repository=<url>&ref=<branch>&state=<name>`.
    pub const SEED: &str = "/";
    /// Where the console lives; every route under it is the console's.
    pub const CONSOLE: &str = "/ui";
    /// The console's routes named by the rest of the path: a state's page, its versions'
    /// downloads, its unlock and restore forms.
    pub const CONSOLE_NAMED: [&str; 4] = [
        "/ui/states/",
        "/ui/download/",
        "/ui/unlock/",
        "/ui/restore/",
    ];
}

/// How a route spells "the rest of the path names the state".
const NAME: &str = "{*name}";

/// Route `prefix<name>` to `handler`: `prefix{*name}`, and `prefix` alone, so that the empty
/// name is refused as a name rather than as an unknown route (a catch-all matches no empty
/// rest).
pub(crate) fn named<S>(router: Router<S>, prefix: &str, handler: MethodRouter<S>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router
        .route(&format!("{prefix}{NAME}"), handler.clone())
        .route(prefix, handler)
}

/// Whether the route `prefix` (without [`NAME`]) is one that [`named`] made.
fn is_named(prefix: &str) -> bool {
    [route::STATE, route::LOCK, route::HISTORY].contains(&prefix)
        || route::CONSOLE_NAMED.contains(&prefix)
}

/// The resource a route serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    State,
    Lock,
    History,
    StateList,
    LockList,
    Health,
    /// The seed tool's address of a state.
    Seed,
    /// The web console's pages, which read their parameters themselves.
    Console,
}

impl Resource {
    /// The resource of a route of the table, given without [`NAME`].
    fn of(route: &str) -> Option<Self> {
        Some(match route {
            route::STATE => Self::State,
            route::LOCK => Self::Lock,
            route::HISTORY => Self::History,
            route::STATES => Self::StateList,
            route::LOCKS => Self::LockList,
            route::HEALTH => Self::Health,
            route::SEED => Self::Seed,
            console if console.starts_with(route::CONSOLE) => Self::Console,
            _ => return None,
        })
    }

    /// The query parameters an address of this resource takes beyond [`LOCATION_PARAMETERS`].
    fn parameters(self) -> &'static [&'static str] {
        match self {
            // Terraform adds `?ID=` to the address of a write under its lock.
            Self::State => &["ID"],
            Self::Seed => &["type", "state", "ID"],
            Self::History => &["page", "per_page", "at", "restore"],
            Self::Lock | Self::StateList | Self::LockList | Self::Health | Self::Console => &[],
        }
    }
}

/// Query or form parameters, each at most once.
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let mut params: Vec<(String, String)> = Vec::new();
        for (key, value) in form_urlencoded::parse(bytes) {
            if params.iter().any(|(k, _)| *k == key) {
                return Err(ApiError::Query(format!("parameter {key:?} is given twice")));
            }
            params.push((key.into_owned(), value.into_owned()));
        }
        Ok(Self(params))
    }

    /// The parameters of `uri`'s query, refused whole when it is too long.
    pub fn of_query(uri: &Uri) -> Result<Self, ApiError> {
        let query = uri.query().unwrap_or_default();
        if query.len() > MAX_QUERY_BYTES {
            return Err(ApiError::QueryTooLong);
        }
        Self::parse(query.as_bytes())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every parameter is one of `known` (matched exactly: Terraform sends `ID`, not `id`) and has
    /// a value.
    fn check(&self, known: &[&str]) -> Result<(), ApiError> {
        for (key, value) in &self.0 {
            if !known.contains(&key.as_str()) {
                let guess = nearest(key, known)
                    .map(|n| format!(" (did you mean {n:?}?)"))
                    .unwrap_or_default();
                let takes = match known {
                    [] => "no parameters".to_owned(),
                    known => known.join(", "),
                };
                return Err(ApiError::UnknownParameter {
                    name: key.chars().take(40).collect(),
                    hint: format!("{guess}; this address takes {takes}"),
                });
            }
            if value.is_empty() {
                return Err(ApiError::Query(format!(
                    "parameter {key:?} is empty: give it a value or leave it out"
                )));
            }
        }
        Ok(())
    }
}

/// The known name closest to `name` (by edit distance, ignoring case), when one is close enough
/// to be a likely typo: at most a third of its letters differ.
pub(crate) fn nearest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let name = name.to_lowercase();
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(&name, &k.to_lowercase()), *k))
        .filter(|(distance, k)| *distance <= k.chars().count().div_ceil(3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

/// The query parameters every address but `/health` takes: which repository and branch it
/// means.
const LOCATION_PARAMETERS: [&str; 2] = ["ref", "repository"];

/// What a request addresses, read once per request (by [`crate::call::with_read_context`], for
/// the handler's extractor to take): the resource of the route it matched, the state its path
/// (or the seed address's `state=`) names, and its query parameters.
///
/// A path that names no route, a parameter the route does not take and an empty value are
/// refused: an address with a typo must fail, never read as "no state" (see
/// [`ApiError::NoRoute`]). The console's routes take any parameter: its pages read their own.
pub(crate) struct Target {
    pub resource: Resource,
    /// The state named, for the routes that name one.
    pub name: Option<StateName>,
    params: Params,
}

impl Target {
    /// Read the target of a request, by the route it matched.
    pub fn parse(parts: &Parts) -> Result<Self, ApiError> {
        #[cfg(test)]
        PARSES.with(|count| count.set(count.get() + 1));
        let route = parts
            .extensions
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        Self::read(route, decoded(parts), &parts.uri)
    }

    /// Read the target of a request to `uri` that matched `route` (`None`: no route matched),
    /// its path decoded as `path`.
    fn read(
        route: Option<&str>,
        path: Result<Cow<'_, str>, &'static str>,
        uri: &Uri,
    ) -> Result<Self, ApiError> {
        let params = Params::of_query(uri)?;
        let path = path.map_err(|reason| ApiError::Query(reason.into()))?;
        let route = route.map(|route| route.trim_end_matches(NAME));
        let resource = route.and_then(Resource::of).ok_or(ApiError::NoRoute)?;
        let name = match route.filter(|route| is_named(route)) {
            _ if resource == Resource::Seed => Some(seed_address(&params)?),
            // Routing saw the path with the same literal prefix (see `decode_path_layer`).
            Some(prefix) => Some(state_name(path.strip_prefix(prefix).unwrap_or_default())?),
            None => None,
        };
        if resource != Resource::Console {
            let known: Vec<&str> = match resource {
                Resource::Health => Vec::new(),
                other => LOCATION_PARAMETERS
                    .iter()
                    .chain(other.parameters())
                    .copied()
                    .collect(),
            };
            params.check(&known)?;
            if let Some(repository) = params.get("repository") {
                if repository.contains(char::is_whitespace) {
                    // Most often a `+` (as in git+ssh://) that the query read as a space.
                    return Err(ApiError::Query(
                        "repository=: a repository URL holds no white space; a query reads `+` \
                         as a space, so write git+ssh:// as git%2Bssh://"
                            .into(),
                    ));
                }
                if let Some(reason) = gitstate_core::secret::credentials_in_url(repository) {
                    return Err(ApiError::Query(format!("repository=: {reason}")));
                }
            }
        }
        Ok(Self {
            resource,
            name,
            params,
        })
    }

    /// `?repository=`: another repository than the configured one.
    pub fn repository(&self) -> Option<&str> {
        self.params.get("repository")
    }

    /// `?ref=`: another branch than the configured one.
    pub fn branch(&self) -> Option<&str> {
        self.params.get("ref")
    }

    /// The seed tool's address format without `ref=` (which the seed read as its default
    /// branch, and gitstate as the configured one).
    pub fn is_seed_without_ref(&self) -> bool {
        self.resource == Resource::Seed && self.branch().is_none()
    }

    /// A query parameter the route takes, such as Terraform's `?ID=` on writes.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params.get(key)
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The state a `GET` of it reads at the configured location, if that is what `parts` is
    /// with credentials (see `gitstate_core::read_context`).
    pub fn reads(&self, parts: &Parts) -> Option<&StateName> {
        let plain = self.resource == Resource::State
            && self.repository().is_none()
            && self.branch().is_none();
        let read = parts.method == Method::GET && parts.headers.contains_key(header::AUTHORIZATION);
        self.name.as_ref().filter(|_| plain && read)
    }

    /// Keep what [`Target::parse`] made of `parts` for the handler's extractor.
    pub fn keep(parsed: Result<Self, ApiError>, parts: &mut Parts) {
        parts
            .extensions
            .insert(Parsed(Arc::new(Mutex::new(Some(parsed)))));
    }
}

#[cfg(test)]
thread_local! {
    /// How many times [`Target::parse`] ran on this thread (the router's tests count them).
    pub(crate) static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A target parsed before the handler's extractors ran, taken by the [`Target`] extractor once
/// (extensions must be `Clone`; the error is not).
#[derive(Clone)]
struct Parsed(Arc<Mutex<Option<Result<Target, ApiError>>>>);

impl<S: Sync> FromRequestParts<S> for Target {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let kept = parts
            .extensions
            .remove::<Parsed>()
            .and_then(|Parsed(slot)| slot.lock().ok()?.take());
        kept.unwrap_or_else(|| Self::parse(parts))
    }
}

/// The seed tool's address format: `/?type=git&repository=<url>&ref=<branch>&state=<name>`.
/// Its `ref=` may be left out (the configured branch); `type`, `repository` and `state` may not.
fn seed_address(params: &Params) -> Result<StateName, ApiError> {
    match params.get("type") {
        Some("git") => {}
        Some(other) => {
            return Err(ApiError::Query(format!(
                "type {other:?} is not supported (only type=git)"
            )));
        }
        None if params.is_empty() => return Err(ApiError::NoRoute),
        None => {
            return Err(ApiError::Query(
                "the seed address format needs type=git".into(),
            ));
        }
    }
    if params.get("repository").is_none() {
        return Err(ApiError::Query(
            "the seed address format needs repository=<url>".into(),
        ));
    }
    let state = params
        .get("state")
        .ok_or_else(|| ApiError::Query("the seed address format needs state=<path>".into()))?;
    state_name(state)
}

pub(crate) fn state_name(text: &str) -> Result<StateName, ApiError> {
    Ok(StateName::parse(text).map_err(ServiceError::from)?)
}

/// The path of a request as [`decode_path_layer`] decoded it (or, for a request that did not
/// pass it, as decoded now).
fn decoded(parts: &Parts) -> Result<Cow<'_, str>, &'static str> {
    match parts.extensions.get::<DecodedPath>() {
        Some(DecodedPath(Ok(path))) => Ok(Cow::Borrowed(path)),
        Some(DecodedPath(Err(reason))) => Err(reason),
        None => decode(parts.uri.path()),
    }
}

/// A request's path with its percent-escapes decoded, or why it cannot be.
#[derive(Clone)]
struct DecodedPath(Result<String, &'static str>);

/// What stays encoded in the path routing sees: all but letters, digits, `/` and the unreserved
/// marks, so that the route words are literal and nothing decoded changes where the path ends.
const ROUTED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'/')
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Before routing: decode the path once, keep it for [`Target`], and let the route table see it
/// with only the escapes it needs, so that `/%73tates/a` routes as `/states/a` and a name's
/// `%2F` as the `/` it means, as they read. A path that does not decode routes as it is, and its
/// handler refuses it after authentication.
pub(crate) async fn decode_path_layer(mut request: Request, next: Next) -> Response {
    let raw = request.uri().path();
    let decoded = decode(raw).map(Cow::into_owned);
    if let Some(path) = decoded.as_ref().ok().filter(|path| *path != raw) {
        let routed = percent_encoding::utf8_percent_encode(path, ROUTED).to_string();
        let with_query = match request.uri().query() {
            Some(query) => format!("{routed}?{query}"),
            None => routed,
        };
        let mut uri = request.uri().clone().into_parts();
        if let Ok(path_and_query) = PathAndQuery::try_from(with_query) {
            uri.path_and_query = Some(path_and_query);
            if let Ok(uri) = Uri::from_parts(uri) {
                *request.uri_mut() = uri;
            }
        }
    }
    request.extensions_mut().insert(DecodedPath(decoded));
    next.run(request).await
}

/// The path with its percent-escapes decoded; it must be UTF-8.
#[cfg(test)]
fn decode_path(path: &str) -> Result<String, ApiError> {
    decode(path)
        .map(Cow::into_owned)
        .map_err(|reason| ApiError::Query(reason.into()))
}

fn decode(path: &str) -> Result<Cow<'_, str>, &'static str> {
    // The decoder passes a `%` without two hex digits through: refuse it, as the path would
    // mean something else than it says.
    let bytes = path.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(i, b)| {
        *b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return Err("bad percent-encoding in the path");
    }
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| "the path is not UTF-8")
}

#[cfg(test)]
mod tests;
