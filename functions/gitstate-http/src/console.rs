//! The web console at `/ui/`: server-rendered pages over the same backend and Basic
//! authentication as the API. One handler per resource:
//!
//! - `GET /ui/`: the states the caller may read (`?q=` filters by name);
//! - `GET /ui/states/<name>[?page=N]`: versions newest first with what each changed, the current
//!   resources, the lock;
//! - `POST /ui/unlock/<name>`, `POST /ui/restore/<name>`: admin actions, same-origin only, with
//!   the form token and a confirmation;
//! - `GET /ui/style.css`.
//!
//! Pages never show attribute or output values: only addresses, types, names and serials. Every
//! answer carries a strict Content-Security-Policy; no page needs JavaScript.

use askama::Template;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use sha2::Sha256;

use super::{
    ApiError, App, MAX_QUERY_BYTES, SCHEME_HEADER, now_seconds, percent_decode, read_body,
};
use crate::StateName;
use crate::access::{Caller, Role};
use crate::changes::Changes;
use crate::ports::HeldLock;
use crate::service::{Selector, ServiceError, StatePage, StateRow};

/// Where the console lives.
pub const PREFIX: &str = "/ui";

/// Versions on one page of a state (`?per_page=` up to 100).
const PER_PAGE: usize = 20;

const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

const STYLE: &str = include_str!("../../templates/style.css");

/// Whether `path` is the console's.
pub fn addresses(path: &str) -> bool {
    path == PREFIX || path.starts_with("/ui/")
}

/// The console's answer to one request by an authenticated caller.
pub async fn serve(
    app: &App,
    caller: &Caller,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let query = uri.query().unwrap_or_default();
    if query.len() > MAX_QUERY_BYTES {
        return Err(ApiError::QueryTooLong);
    }
    let params = Form::parse(query.as_bytes())?;
    let path = percent_decode(uri.path())?;
    let get = method == Method::GET || method == Method::HEAD;
    let not_allowed = |allowed: &'static str| ApiError::Method {
        method: method.to_string(),
        allowed,
    };
    if path == PREFIX {
        return Ok((StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, "/ui/")]).into_response());
    }
    if path == "/ui/" {
        return if get {
            list_page(app, caller, &params).await
        } else {
            Err(not_allowed("GET"))
        };
    }
    if path == "/ui/style.css" {
        if !get {
            return Err(not_allowed("GET"));
        }
        let mut response = (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
            STYLE,
        )
            .into_response();
        secure(response.headers_mut(), "private, max-age=3600");
        return Ok(response);
    }
    let state = |prefix: &str| {
        path.strip_prefix(prefix)
            .map(|name| StateName::parse(name).map_err(ServiceError::from))
            .transpose()
    };
    if let Some(name) = state("/ui/states/")? {
        return if get {
            state_page(app, caller, &name, &params).await
        } else {
            Err(not_allowed("GET"))
        };
    }
    for (prefix, action) in [
        ("/ui/unlock/", Action::Unlock),
        ("/ui/restore/", Action::Restore),
    ] {
        if let Some(name) = state(prefix)? {
            if method != Method::POST {
                return Err(not_allowed("POST"));
            }
            return act(app, caller, headers, body, &name, action).await;
        }
    }
    Err(ApiError::NoRoute)
}

/// Query or form parameters, each at most once.
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let mut params: Vec<(String, String)> = Vec::new();
        for (key, value) in form_urlencoded::parse(bytes) {
            if params.iter().any(|(k, _)| *k == key) {
                return Err(ApiError::Query(format!("parameter {key:?} is given twice")));
            }
            params.push((key.into_owned(), value.into_owned()));
        }
        Ok(Self(params))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Headers every console answer carries.
fn secure(headers: &mut HeaderMap, cache: &'static str) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it a browser sends `Origin: null` even on same-origin posts.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
}

fn html(page: &impl Template) -> Result<Response, ApiError> {
    let text = page.render().map_err(ApiError::Render)?;
    let mut response = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        text,
    )
        .into_response();
    secure(response.headers_mut(), "no-store");
    Ok(response)
}

/// The form token of a caller: an HMAC of the user name keyed by the user's stored argon2 hash,
/// which never leaves the server. A cross-site page cannot know it, a leaked page does not let
/// anyone test password guesses at HMAC speed; every Lambda container and every restart computes
/// the same one; it changes with the password.
fn form_token(app: &App, caller: &Caller) -> Result<String, ApiError> {
    let phc = app
        .access
        .stored_hash(&caller.user)
        .ok_or(ApiError::FormToken)?;
    Ok(token_for(phc.expose(), &caller.user))
}

fn token_for(phc: &str, user: &str) -> String {
    // HMAC accepts keys of any length; this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(phc.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(b"gitstate console form\0");
    mac.update(user.as_bytes());
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

/// Refuse anything a browser marks as coming from another site, or that names no origin at all.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let text = |name: header::HeaderName| {
        headers
            .get(name)
            .map(|v| v.to_str().map_err(|_| ApiError::CrossSite))
            .transpose()
    };
    let site = text(header::HeaderName::from_static("sec-fetch-site"))?;
    let (origin, host) = (text(header::ORIGIN)?, text(header::HOST)?);
    tracing::debug!(?site, ?origin, ?host, "console form post");
    if site.is_some_and(|site| site != "same-origin") {
        return Err(ApiError::CrossSite);
    }
    // The scheme too: `http://host` is another origin than an https deployment's.
    let scheme = match text(header::HeaderName::from_static(SCHEME_HEADER))? {
        Some(proto) if proto.eq_ignore_ascii_case("https") => "https://",
        _ => "http://",
    };
    match (origin, host) {
        (Some(origin), Some(host)) => {
            let origin_host = origin
                .get(..scheme.len())
                .filter(|s| s.eq_ignore_ascii_case(scheme))
                .and_then(|_| origin.get(scheme.len()..));
            if origin_host.is_some_and(|h| h.eq_ignore_ascii_case(host)) {
                Ok(())
            } else {
                Err(ApiError::CrossSite)
            }
        }
        // A browser that sends Sec-Fetch-Site: same-origin but no Origin is still same-origin.
        (None, _) if site.is_some() => Ok(()),
        _ => Err(ApiError::CrossSite),
    }
}

#[derive(Clone, Copy)]
enum Action {
    Unlock,
    Restore,
}

async fn act(
    app: &App,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
    name: &StateName,
    action: Action,
) -> Result<Response, ApiError> {
    same_origin(headers)?;
    let body: Bytes = read_body(headers, body, MAX_QUERY_BYTES).await?;
    let form = Form::parse(&body)?;
    let expected = form_token(app, caller)?;
    let sent = form.get("token").unwrap_or_default();
    // Compared in constant time.
    let matches = sent.len() == expected.len()
        && sent
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !matches {
        return Err(ApiError::FormToken);
    }
    if form.get("confirm") != Some("yes") {
        return Err(ApiError::Unconfirmed);
    }
    let backend = &app.backend;
    let at = backend.locate(None, None)?;
    let done = match action {
        Action::Unlock => {
            // Release the very lock the page showed: if it changed meanwhile, 409.
            let id = form
                .get("lock")
                .filter(|id| !id.is_empty())
                .ok_or_else(|| ApiError::Query("the form names no lock".into()))?;
            let info = serde_json::json!({ "ID": id }).to_string();
            backend.unlock(caller, &at, name, info.as_bytes()).await?;
            "unlocked"
        }
        Action::Restore => {
            let version = form
                .get("version")
                .ok_or_else(|| ApiError::Query("the form names no version".into()))?;
            backend
                .restore(caller, &at, name, &Selector::parse(version)?)
                .await?;
            "restored"
        }
    };
    let location = format!("/ui/states/{name}?done={done}");
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
    secure(response.headers_mut(), "no-store");
    Ok(response)
}

/// A time as the pages show it.
fn when(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|_| seconds.to_string())
}

fn datetime(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// `45 s`, `12 min`, `3 h 5 min`, `2 d 4 h`.
fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86400, s % 86400 / 3600),
    }
}

/// A lock as the pages show it.
struct LockView {
    id: String,
    who: String,
    user: String,
    operation: String,
    since: String,
    age: String,
}

impl LockView {
    fn of(held: &HeldLock, now: i64) -> Self {
        Self {
            id: held.info.id().to_owned(),
            who: held.info.who().to_owned(),
            user: held.owner.clone().unwrap_or_else(|| "unknown".into()),
            operation: held.info.operation().to_owned(),
            since: held.created.map(when).unwrap_or_default(),
            age: held
                .created
                .map(|c| age(now.saturating_sub(c)))
                .unwrap_or_else(|| "unknown".into()),
        }
    }
}

struct Row {
    name: String,
    serial: String,
    when: String,
    datetime: String,
    author: String,
    operation: String,
    lock: Option<LockView>,
}

#[derive(Template)]
#[template(path = "list.html")]
struct ListPage {
    user: String,
    filter: String,
    total: usize,
    rows: Vec<Row>,
}

async fn list_page(app: &App, caller: &Caller, params: &Form) -> Result<Response, ApiError> {
    let at = app.backend.locate(None, None)?;
    let rows: Vec<StateRow> = app.backend.list_states(caller, &at).await?;
    let filter = params.get("q").unwrap_or_default().trim().to_owned();
    let needle = filter.to_lowercase();
    let now = now_seconds();
    let total = rows.len();
    let rows = rows
        .iter()
        .filter(|row| row.name.as_str().to_lowercase().contains(&needle))
        .map(|row| {
            let entry = row.entry.as_ref();
            Row {
                name: row.name.to_string(),
                serial: entry
                    .and_then(|e| e.serial)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "–".into()),
                when: entry.map(|e| when(e.time)).unwrap_or_default(),
                datetime: entry.map(|e| datetime(e.time)).unwrap_or_default(),
                author: entry.map(|e| e.author.clone()).unwrap_or_default(),
                operation: entry.map(|e| e.operation.clone()).unwrap_or_default(),
                lock: row.lock.as_ref().map(|held| LockView::of(held, now)),
            }
        })
        .collect();
    html(&ListPage {
        user: caller.user.clone(),
        filter,
        total,
        rows,
    })
}

struct VersionView {
    version: String,
    short: String,
    serial: String,
    when: String,
    datetime: String,
    author: String,
    operation: String,
    deleted: bool,
    /// `None`: not readable as a Terraform state.
    changes: Option<Changes>,
    restorable: bool,
}

struct ResourceView {
    address: String,
    kind: String,
    mode: String,
}

#[derive(Template)]
#[template(path = "state.html")]
struct StatePageView {
    user: String,
    name: String,
    notice: Option<&'static str>,
    admin: bool,
    token: String,
    lock: Option<LockView>,
    versions: Vec<VersionView>,
    page: usize,
    per_page: usize,
    more: bool,
    resources: Option<Vec<ResourceView>>,
}

async fn state_page(
    app: &App,
    caller: &Caller,
    name: &StateName,
    params: &Form,
) -> Result<Response, ApiError> {
    let at = app.backend.locate(None, None)?;
    let page = match params.get("page") {
        None => 0,
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| ApiError::Query(format!("{text:?} is not a page number")))?,
    };
    let per_page = match params.get("per_page") {
        None => PER_PAGE,
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| ApiError::Query(format!("{text:?} is not a number of versions")))?,
    }
    .clamp(1, crate::service::MAX_PAGE);
    let found: StatePage = app
        .backend
        .state_page(caller, &at, name, page, per_page)
        .await?;
    let admin = caller.may(Role::Admin, name);
    let now = now_seconds();
    let notice = match params.get("done") {
        Some("unlocked") => Some("The lock was released."),
        Some("restored") => Some("The version was restored as the newest version."),
        _ => None,
    };
    let versions = found
        .versions
        .into_iter()
        .enumerate()
        .map(|(i, v)| VersionView {
            short: v.info.version.chars().take(10).collect(),
            serial: v
                .info
                .serial
                .map(|s| s.to_string())
                .unwrap_or_else(|| "–".into()),
            when: when(v.info.time),
            datetime: datetime(v.info.time),
            author: v.info.author,
            operation: v.info.operation,
            deleted: v.info.deleted,
            changes: v.changes,
            restorable: admin && !v.info.deleted && !(page == 0 && i == 0),
            version: v.info.version,
        })
        .collect();
    html(&StatePageView {
        user: caller.user.clone(),
        name: name.to_string(),
        notice,
        admin,
        // Only admins get a form, so only they need the token.
        token: if admin {
            form_token(app, caller)?
        } else {
            String::new()
        },
        lock: found.lock.as_ref().map(|held| LockView::of(held, now)),
        versions,
        page,
        per_page,
        more: found.more,
        resources: found.resources.map(|list| {
            list.into_iter()
                .map(|r| ResourceView {
                    address: r.address,
                    kind: r.kind,
                    mode: r.mode,
                })
                .collect()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_str(v).expect("ascii"));
        }
        map
    }

    #[test]
    fn only_same_origin_posts_pass() {
        let host = ("host", "127.0.0.1:8080");
        let plain = (SCHEME_HEADER, "http");
        let ok = [
            vec![host, plain, ("origin", "http://127.0.0.1:8080")],
            vec![host, ("origin", "http://127.0.0.1:8080")],
            vec![
                host,
                (SCHEME_HEADER, "https"),
                ("origin", "https://127.0.0.1:8080"),
            ],
            vec![
                host,
                ("sec-fetch-site", "same-origin"),
                ("origin", "http://127.0.0.1:8080"),
            ],
            vec![host, ("sec-fetch-site", "same-origin")],
        ];
        for case in ok {
            assert!(same_origin(&headers(&case)).is_ok(), "{case:?}");
        }
        let refused = [
            vec![host],
            vec![host, ("origin", "http://evil.example")],
            vec![host, ("origin", "http://127.0.0.1:8080.evil.example")],
            vec![host, ("origin", "null")],
            vec![
                host,
                ("sec-fetch-site", "cross-site"),
                ("origin", "http://127.0.0.1:8080"),
            ],
            vec![host, ("sec-fetch-site", "same-site")],
            vec![host, ("sec-fetch-site", "none")],
            vec![("origin", "http://127.0.0.1:8080")],
        ];
        for case in refused {
            assert!(
                matches!(same_origin(&headers(&case)), Err(ApiError::CrossSite)),
                "{case:?}"
            );
        }
    }

    /// Every host, both schemes of the deployment and of the Origin: only the same scheme and
    /// host pass, with or without `Sec-Fetch-Site: same-origin`.
    #[test]
    fn the_origin_scheme_must_be_the_deployments() {
        use rand::{Rng as _, SeedableRng as _};
        let mut rng = rand::rngs::StdRng::seed_from_u64(203);
        for _ in 0..300 {
            let host = format!(
                "{}.example:{}",
                rng.random_range(0..1000),
                rng.random_range(1..65535)
            );
            for deployed in ["http", "https", "HTTPS"] {
                for sent in ["http", "https", "HTTP", "Https"] {
                    let origin = format!("{sent}://{host}");
                    let same = deployed.eq_ignore_ascii_case(sent);
                    for site in [None, Some("same-origin")] {
                        let mut case = vec![
                            ("host", host.as_str()),
                            (SCHEME_HEADER, deployed),
                            ("origin", origin.as_str()),
                        ];
                        case.extend(site.map(|s| ("sec-fetch-site", s)));
                        assert_eq!(same_origin(&headers(&case)).is_ok(), same, "{case:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn form_tokens_are_keyed_by_the_stored_hash_per_user() {
        use rand::{Rng as _, SeedableRng as _};
        let mut rng = rand::rngs::StdRng::seed_from_u64(172);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let user = format!("u{}", rng.random::<u32>());
            let other = format!("{user}x");
            let salt = rng.random::<u64>();
            let phc = format!(
                "$argon2id$v=19$m=19456,t=2,p=1${salt:x}$hash{}",
                rng.random::<u64>()
            );
            let rehashed = format!(
                "$argon2id$v=19$m=19456,t=2,p=1${salt:x}$hash{}",
                rng.random::<u64>()
            );
            let token = token_for(&phc, &user);
            assert_eq!(token, token_for(&phc, &user), "the same in every process");
            assert_ne!(
                token,
                token_for(&rehashed, &user),
                "changes with the password"
            );
            assert_ne!(
                token,
                token_for(&phc, &other),
                "never valid for another user"
            );
            assert!(seen.insert(token.clone()));
            assert!(!token.contains(&salt.to_string()));
        }
    }

    #[tokio::test]
    async fn the_token_key_is_the_policy_hash_not_the_sent_password() {
        let hash = crate::password::hash_secret(b"right").expect("hash");
        let text = format!("[users.ann]\nhash = \"{hash}\"\ngrants = [\"admin:*\"]\n");
        let access = crate::auth::Access::new(
            std::sync::Arc::new(crate::testing::MemoryStore::default()),
            crate::ports::Location {
                repository: "r".into(),
                branch: crate::BranchName::parse("main").expect("valid"),
            },
            crate::auth::AccessOptions {
                source: crate::auth::AccessSource::Text(text),
                bootstrap: None,
                refresh: std::time::Duration::from_secs(10),
            },
            std::sync::Arc::new(crate::password::Argon2id),
        )
        .expect("valid");
        let stored = access.stored_hash("ann").expect("ann exists");
        assert_eq!(stored.expose(), hash);
        assert!(access.stored_hash("bob").is_none(), "no key, no token");
        // Nothing a page shows lets a guess be checked with an HMAC of the password.
        let token = token_for(stored.expose(), "ann");
        for guess in ["right", "wrong", ""] {
            assert_ne!(token, token_for(guess, "ann"));
        }
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(age(-5), "0 s");
        assert_eq!(age(59), "59 s");
        assert_eq!(age(61), "1 min");
        assert_eq!(age(3 * 3600 + 5 * 60), "3 h 5 min");
        assert_eq!(age(2 * 86400 + 4 * 3600), "2 d 4 h");
    }
}
