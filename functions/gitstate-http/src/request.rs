//! What a request addresses and carries: the target from the path and query (percent-decoded),
//! query parameters given at most once, the body within its limit, `Content-MD5` and the media
//! type.

use axum::body::Body;
use bytes::Bytes;
use gitstate_core::StateName;
use gitstate_core::service::ServiceError;
use http::{HeaderMap, Method, Uri, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::ApiError;

/// Longest query string accepted.
pub const MAX_QUERY_BYTES: usize = 4096;

/// The resource a request addresses.
pub(crate) enum Resource {
    State(StateName),
    Lock(StateName),
    History(StateName),
    StateList,
    LockList,
    Health,
}

/// The query parameters a handler of one state may read.
#[derive(Default)]
pub(crate) struct Query {
    /// Terraform's `?ID=` on writes.
    pub lock_id: Option<String>,
    pub page: Option<String>,
    pub per_page: Option<String>,
    pub at: Option<String>,
    pub restore: Option<String>,
}

/// A request's target, decoded from its path and query.
pub(crate) struct Addressed {
    pub resource: Resource,
    pub repository: Option<String>,
    pub branch: Option<String>,
    pub query: Query,
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

    fn take(&self, key: &str) -> Option<String> {
        self.get(key).map(str::to_owned)
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

/// The query parameters every address takes: which repository and branch it means.
const LOCATION_PARAMETERS: [&str; 2] = ["ref", "repository"];

impl Resource {
    /// The query parameters an address of this resource takes beyond [`LOCATION_PARAMETERS`].
    fn parameters(&self) -> &'static [&'static str] {
        match self {
            // Terraform adds `?ID=` to the address of a write under its lock.
            Self::State(_) => &["ID"],
            Self::History(_) => &["page", "per_page", "at", "restore"],
            Self::Lock(_) | Self::StateList | Self::LockList => &[],
            Self::Health => &[],
        }
    }
}

/// Read the target of `uri`: the resource, the repository and branch it names, the parameters.
/// A path that names no route, a parameter the route does not take and an empty value are
/// refused: an address with a typo must fail, never read as "no state" (see [`ApiError::NoRoute`]).
pub(crate) fn parse_target(uri: &Uri) -> Result<Addressed, ApiError> {
    let params = Params::of_query(uri)?;
    let path = decode_path(uri.path())?;
    let resource = match path.as_str() {
        "/" => seed_address(&params)?,
        // `/states/` and `/locks/` name the state "" (refused), not the lists.
        "/states" => Resource::StateList,
        "/locks" => Resource::LockList,
        "/health" => Resource::Health,
        path => {
            let named = [
                ("/states/", Resource::State as fn(StateName) -> Resource),
                ("/locks/", Resource::Lock),
                ("/history/", Resource::History),
            ];
            let (name, resource) = named
                .into_iter()
                .find_map(|(prefix, resource)| Some((path.strip_prefix(prefix)?, resource)))
                .ok_or(ApiError::NoRoute)?;
            resource(state_name(name)?)
        }
    };
    let seed: &[&str] = if path == "/" { &SEED_PARAMETERS } else { &[] };
    let known: Vec<&str> = match resource {
        Resource::Health => Vec::new(),
        ref other => LOCATION_PARAMETERS
            .iter()
            .chain(seed)
            .chain(other.parameters())
            .copied()
            .collect(),
    };
    params.check(&known)?;
    let repository = params.take("repository");
    if let Some(reason) = repository
        .as_deref()
        .and_then(gitstate_core::secret::credentials_in_url)
    {
        return Err(ApiError::Query(format!("repository=: {reason}")));
    }
    Ok(Addressed {
        resource,
        repository,
        branch: params.take("ref"),
        query: Query {
            lock_id: params.take("ID"),
            page: params.take("page"),
            per_page: params.take("per_page"),
            at: params.take("at"),
            restore: params.take("restore"),
        },
    })
}

/// The parameters of the seed tool's address besides [`LOCATION_PARAMETERS`].
const SEED_PARAMETERS: [&str; 2] = ["type", "state"];

/// The seed tool's address format: `/?type=git&repository=<url>&ref=<branch>&state=<name>`.
/// Its `ref=` may be left out (the configured branch); `type`, `repository` and `state` may not.
fn seed_address(params: &Params) -> Result<Resource, ApiError> {
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
    Ok(Resource::State(state_name(state)?))
}

pub(crate) fn state_name(text: &str) -> Result<StateName, ApiError> {
    Ok(StateName::parse(text).map_err(ServiceError::from)?)
}

/// The path with its percent-escapes decoded; it must be UTF-8.
pub(crate) fn decode_path(path: &str) -> Result<String, ApiError> {
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
        return Err(ApiError::Query("bad percent-encoding in the path".into()));
    }
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| ApiError::Query("the path is not UTF-8".into()))
}

/// The body of a request that carries one (any method but GET and HEAD): of an accepted media
/// type, within `limit`, and matching its `Content-MD5` if it sends one.
pub(crate) async fn write_body(
    method: &Method,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    if matches!(*method, Method::GET | Method::HEAD) {
        return Ok(Bytes::new());
    }
    check_media_type(headers)?;
    let body = read_body(headers, body, limit).await?;
    check_content_md5(headers, &body)?;
    Ok(body)
}

pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    // One buffer of the declared size, filled frame by frame: collecting the frames first and
    // joining them after would hold every large state twice.
    let declared = declared.and_then(|d| usize::try_from(d).ok()).unwrap_or(0);
    let mut buffer = Vec::with_capacity(declared.min(limit));
    let mut body = Limited::new(body, limit);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BodyRead
            }
        })?;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buffer))
}

/// RFC 1864: when a request carries `Content-MD5` (Terraform sends it with every body), it must
/// be the base64 of the body's MD5, or the request changes nothing.
fn check_content_md5(headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
    use base64::Engine;
    use md5::Digest;
    let mut values = headers.get_all("content-md5").iter();
    let Some(value) = values.next() else {
        return Ok(());
    };
    if values.next().is_some() {
        return Err(ApiError::ContentMd5("is given twice"));
    }
    let sent = base64::engine::general_purpose::STANDARD
        .decode(value.as_bytes().trim_ascii())
        .ok()
        .filter(|digest| digest.len() == 16)
        .ok_or(ApiError::ContentMd5(
            "is not the base64 of a 16-byte MD5 digest",
        ))?;
    if sent.as_slice() != md5::Md5::digest(body).as_slice() {
        return Err(ApiError::ContentMd5(
            "does not match the body (corrupted in transit?)",
        ));
    }
    Ok(())
}

fn check_media_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::MediaType("<not ASCII>".into()))?;
    let essence = text
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.is_empty() {
        Ok(())
    } else {
        Err(ApiError::MediaType(text.chars().take(100).collect()))
    }
}

#[cfg(test)]
mod tests;
