//! Every error variant, generated with random contents: its status, its body and headers, and
//! what the log layer is handed.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use gitstate_core::access::{Denied, Role};
use gitstate_core::auth::AuthError;
use gitstate_core::ports::{BoxError, HeldLock, SealError, StoreError};
use gitstate_core::refs::{Clash, RefRefused};
use gitstate_core::service::ServiceError;
use gitstate_core::{LockInfo, LockInfoError, NameError};
use http::StatusCode;
use http_body_util::BodyExt as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use super::*;

/// Text that must never reach a client of a 5xx: it stands for what broke inside.
const SECRET: &str = "inner-detail-7f3a";

fn word(rng: &mut StdRng) -> String {
    let len = rng.random_range(1..12);
    (0..len).map(|_| rng.random_range('a'..='z')).collect()
}

fn inner(rng: &mut StdRng) -> BoxError {
    Box::new(std::io::Error::other(format!("{SECRET} {}", word(rng))))
}

fn held(rng: &mut StdRng) -> HeldLock {
    let id = word(rng);
    let info = serde_json::json!({"ID": id, "Who": word(rng), "Operation": "apply"});
    HeldLock {
        info: LockInfo::parse(Bytes::from(info.to_string())).expect("valid"),
        token: word(rng),
        owner: rng.random_bool(0.5).then(|| word(rng)),
        created: rng
            .random_bool(0.5)
            .then(|| rng.random_range(0..2_000_000_000)),
    }
}

fn store_error(rng: &mut StdRng) -> StoreError {
    match rng.random_range(0..9) {
        8 => StoreError::Copied {
            branch: word(rng),
            of: word(rng),
        },
        7 => StoreError::Diverged,
        6 => StoreError::ProtocolMismatch {
            setting: "GITSTATE_LOCK_REF_PREFIX",
            ours: word(rng),
            recorded: word(rng),
        },
        0 => StoreError::Unavailable(inner(rng)),
        1 => StoreError::Remote(inner(rng)),
        2 => StoreError::Incompatible(word(rng)),
        3 => StoreError::Contention {
            attempts: rng.random_range(1..100),
        },
        4 => StoreError::Corrupt(format!("{SECRET} {}", word(rng))),
        _ => StoreError::Internal(inner(rng)),
    }
}

fn seal_error(rng: &mut StdRng) -> SealError {
    match rng.random_range(0..5) {
        0 => SealError::Unavailable(inner(rng)),
        1 => SealError::Refused(inner(rng)),
        2 => SealError::Integrity(inner(rng)),
        3 => SealError::ForeignKey(inner(rng)),
        _ => SealError::Unreadable(inner(rng)),
    }
}

fn service_error(rng: &mut StdRng) -> ServiceError {
    use ServiceError as S;
    match rng.random_range(0..29) {
        28 if rng.random_bool(0.5) => S::StatesElsewhere {
            branch: word(rng),
            holding: (0..rng.random_range(1..4)).map(|_| word(rng)).collect(),
        },
        28 => S::SealedWithoutKeys,
        27 => S::OnAnotherBranch {
            name: word(rng),
            branch: word(rng),
            elsewhere: word(rng),
        },
        26 => S::Diverged,
        25 if rng.random_bool(0.3) => S::BranchBesideStates {
            branch: word(rng),
            holding: (0..rng.random_range(1..4)).map(|_| word(rng)).collect(),
        },
        25 => S::NoBranch {
            branch: word(rng),
            default: rng.random_bool(0.5).then(|| word(rng)),
            setting: "GITSTATE_REF",
        },
        24 => S::Unlocked,
        22 => S::LockRequestToState("a LockInfo was sent as the state"),
        23 => S::NotAState("the file is empty"),
        0 => S::Name(NameError::BadCharacter(word(rng))),
        1 => S::Branch(NameError::Empty),
        2 => S::LockBody(LockInfoError::MissingId),
        3 => S::InvalidState(word(rng)),
        4 => S::RepositoryNotAllowed(word(rng)),
        5 => S::RefNotAllowed(RefRefused {
            branch: word(rng),
            reason: word(rng),
        }),
        6 => S::Clash(Clash::Folder(word(rng))),
        7 => S::Locked(held(rng)),
        8 => S::LockMismatch(held(rng)),
        9 => S::NotLocked { id: word(rng) },
        10 => S::Stale {
            stored: rng.random(),
            sent: rng.random(),
        },
        11 => S::NotFound,
        12 => S::NoLock,
        13 => S::Exists,
        14 => S::NoSuchVersion(word(rng)),
        15 if rng.random_bool(0.3) => S::BadSelector(word(rng)),
        15 if rng.random() => S::SharedSerial {
            serial: rng.random(),
            state: word(rng),
            revisions: (0..rng.random_range(2..12)).map(|_| word(rng)).collect(),
        },
        15 => S::AmbiguousVersion {
            prefix: word(rng),
            count: rng.random_range(2..9),
        },
        16 => S::Forbidden(Denied {
            user: word(rng),
            role: [Role::Read, Role::Write, Role::Admin][rng.random_range(0..3)],
            state: word(rng),
        }),
        17 | 18 => S::Store(store_error(rng)),
        19 => S::Seal(seal_error(rng)),
        20 => S::Unprotected { format: "plain" },
        _ => S::NoKeys,
    }
}

/// Any error of the HTTP layer, with random contents.
fn api_error(rng: &mut StdRng) -> ApiError {
    match rng.random_range(0..23) {
        22 => ApiError::NoPage,
        21 => ApiError::ConsoleNotFound,
        0..=3 => ApiError::Service(service_error(rng)),
        4 => ApiError::Auth(match rng.random_range(0..3) {
            0 => AuthError::Unauthenticated,
            1 => AuthError::Throttled {
                retry_after: Duration::from_millis(rng.random_range(1..100_000)),
            },
            _ => AuthError::Unavailable(store_error(rng)),
        }),
        5 => ApiError::NoRoute,
        6 => ApiError::Method {
            method: word(rng).to_uppercase(),
            allowed: "GET, POST",
        },
        7 => ApiError::TooLarge {
            limit: rng.random_range(0..usize::MAX),
        },
        8 => ApiError::BodyRead,
        9 => ApiError::ContentMd5("does not match the body (corrupted in transit?)"),
        10 => ApiError::MediaType(word(rng)),
        11 => ApiError::Query(format!("{}\n{}", word(rng), word(rng))),
        12 => ApiError::QueryTooLong,
        13 => ApiError::Deadline {
            seconds: rng.random_range(0.0..900.0),
        },
        14 => ApiError::CrossSite,
        15 => ApiError::FormToken,
        16 => ApiError::Unconfirmed,
        17 => ApiError::Render(askama::Error::custom(std::io::Error::other(SECRET))),
        18 => ApiError::UnknownParameter {
            name: word(rng),
            hint: format!("; this address takes {}", word(rng)),
        },
        _ => ApiError::ResponseTooLarge {
            size: rng.random_range(0..usize::MAX),
            limit: rng.random_range(0..usize::MAX),
        },
    }
}

/// The status each variant must get, by a match without wildcards: a new variant does not
/// compile until it is given one here. The label names the arm, to check every arm is reached.
fn expected(error: &ApiError) -> (StatusCode, &'static str) {
    use ServiceError as S;
    use StatusCode as C;
    match error {
        ApiError::Service(service) => match service {
            S::Name(_) => (C::BAD_REQUEST, "name"),
            S::Branch(_) => (C::BAD_REQUEST, "branch"),
            S::LockBody(_) => (C::BAD_REQUEST, "lock body"),
            S::InvalidState(_) => (C::BAD_REQUEST, "invalid state"),
            S::LockRequestToState(_) => (C::BAD_REQUEST, "lock request to state"),
            S::NotAState(_) => (C::INTERNAL_SERVER_ERROR, "not a state"),
            S::RepositoryNotAllowed(_) => (C::FORBIDDEN, "repository"),
            S::RefNotAllowed(_) => (C::FORBIDDEN, "ref"),
            S::Clash(_) => (C::CONFLICT, "clash"),
            S::Locked(_) => (C::LOCKED, "locked"),
            S::LockMismatch(_) => (C::CONFLICT, "lock mismatch"),
            S::NotLocked { .. } => (C::CONFLICT, "not locked"),
            S::Unlocked => (C::PRECONDITION_REQUIRED, "unlocked"),
            S::NoBranch { .. } => (C::BAD_REQUEST, "no branch"),
            S::OnAnotherBranch { .. } => (C::BAD_REQUEST, "on another branch"),
            S::BranchBesideStates { .. } => (C::BAD_REQUEST, "branch beside states"),
            S::StatesElsewhere { .. } => (C::BAD_REQUEST, "states elsewhere"),
            S::Stale { .. } => (C::CONFLICT, "stale"),
            S::NotFound => (C::NOT_FOUND, "not found"),
            S::NoLock => (C::CONFLICT, "no lock"),
            S::Exists => (C::CONFLICT, "exists"),
            S::NoSuchVersion(_) => (C::BAD_REQUEST, "no such version"),
            S::BadSelector(_) => (C::BAD_REQUEST, "selector"),
            S::AmbiguousVersion { .. } => (C::BAD_REQUEST, "ambiguous version"),
            S::SharedSerial { .. } => (C::CONFLICT, "shared serial"),
            S::Forbidden(_) => (C::FORBIDDEN, "forbidden"),
            S::Store(store) => match store {
                StoreError::Unavailable(_) => (C::SERVICE_UNAVAILABLE, "store unavailable"),
                StoreError::Remote(_) => (C::BAD_GATEWAY, "remote"),
                StoreError::Incompatible(_) => (C::BAD_GATEWAY, "incompatible"),
                StoreError::Contention { .. } => (C::SERVICE_UNAVAILABLE, "contention"),
                StoreError::Corrupt(_) => (C::INTERNAL_SERVER_ERROR, "corrupt"),
                StoreError::ProtocolMismatch { .. } => (C::PRECONDITION_FAILED, "protocol"),
                StoreError::Internal(_) => (C::INTERNAL_SERVER_ERROR, "internal"),
                StoreError::Diverged => (C::CONFLICT, "diverged"),
                StoreError::Copied { .. } => (C::BAD_REQUEST, "copied"),
            },
            S::Seal(seal) => match seal {
                SealError::Unavailable(_) => (C::SERVICE_UNAVAILABLE, "kms unavailable"),
                SealError::Refused(_) => (C::BAD_GATEWAY, "kms refused"),
                SealError::Integrity(_) => (C::INTERNAL_SERVER_ERROR, "integrity"),
                SealError::ForeignKey(_) => (C::INTERNAL_SERVER_ERROR, "foreign key"),
                SealError::Unreadable(_) => (C::INTERNAL_SERVER_ERROR, "unreadable"),
            },
            S::Unprotected { .. } => (C::CONFLICT, "unprotected"),
            S::NoKeys => (C::INTERNAL_SERVER_ERROR, "no keys"),
            S::SealedWithoutKeys => (C::INTERNAL_SERVER_ERROR, "sealed without keys"),
            S::Diverged => (C::CONFLICT, "diverged"),
        },
        ApiError::Auth(auth) => match auth {
            AuthError::Unauthenticated => (C::UNAUTHORIZED, "unauthenticated"),
            AuthError::Throttled { .. } => (C::TOO_MANY_REQUESTS, "throttled"),
            AuthError::Unavailable(_) => (C::SERVICE_UNAVAILABLE, "policy unavailable"),
        },
        ApiError::NoRoute => (C::BAD_REQUEST, "no route"),
        ApiError::UnknownParameter { .. } => (C::BAD_REQUEST, "unknown parameter"),
        ApiError::Method { .. } => (C::METHOD_NOT_ALLOWED, "method"),
        ApiError::TooLarge { .. } => (C::PAYLOAD_TOO_LARGE, "too large"),
        ApiError::BodyRead => (C::BAD_REQUEST, "body read"),
        ApiError::ContentMd5(_) => (C::BAD_REQUEST, "md5"),
        ApiError::MediaType(_) => (C::UNSUPPORTED_MEDIA_TYPE, "media type"),
        ApiError::Query(_) => (C::BAD_REQUEST, "query"),
        ApiError::QueryTooLong => (C::URI_TOO_LONG, "query too long"),
        ApiError::Deadline { .. } => (C::GATEWAY_TIMEOUT, "deadline"),
        ApiError::CrossSite => (C::FORBIDDEN, "cross site"),
        ApiError::FormToken => (C::FORBIDDEN, "form token"),
        ApiError::Unconfirmed => (C::BAD_REQUEST, "unconfirmed"),
        ApiError::ConsoleNotFound => (C::BAD_REQUEST, "console not found"),
        ApiError::NoPage => (C::NOT_FOUND, "no page"),
        ApiError::Render(_) => (C::INTERNAL_SERVER_ERROR, "render"),
        ApiError::ResponseTooLarge { .. } => (C::PAYLOAD_TOO_LARGE, "response too large"),
    }
}

/// The arms of [`expected`].
const ARMS: usize = 63;

#[tokio::test]
async fn every_error_variant_maps_to_its_status_body_and_headers() {
    let mut rng = StdRng::seed_from_u64(1301);
    let mut reached = BTreeSet::new();
    for _ in 0..5000 {
        let error = api_error(&mut rng);
        let (status, arm) = expected(&error);
        reached.insert(arm);
        let shown = format!("{error:?}");
        assert_eq!(error.status(), status, "{shown}");
        // Terraform reads 404 and 204 on GET as "no state": only an absent state answers so,
        // and a console address a browser asked for (Terraform never sends Accept: text/html).
        assert_eq!(
            matches!(status, StatusCode::NOT_FOUND | StatusCode::NO_CONTENT),
            matches!(
                error,
                ApiError::Service(ServiceError::NotFound) | ApiError::NoPage
            ),
            "{shown}"
        );
        let lock_body = match &error {
            ApiError::Service(ServiceError::Locked(h) | ServiceError::LockMismatch(h)) => {
                Some(h.info.as_bytes().clone())
            }
            _ => None,
        };
        let chain = gitstate_core::report::chain(&error);
        let retry = match &error {
            ApiError::Auth(AuthError::Throttled { retry_after }) => {
                Some(retry_after.as_secs_f64().ceil().max(1.0).to_string())
            }
            _ if matches!(status.as_u16(), 503 | 504) => Some("1".to_owned()),
            _ => None,
        };
        let is_method = matches!(error, ApiError::Method { .. });
        let response = error.into_response();
        assert_eq!(response.status(), status, "{shown}");
        let headers = response.headers().clone();
        let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(text("retry-after").map(str::to_owned), retry, "{shown}");
        assert_eq!(text("allow").is_some(), is_method, "{shown}");
        assert_eq!(
            text("www-authenticate").is_some(),
            status == StatusCode::UNAUTHORIZED,
            "{shown}"
        );
        match response.extensions().get::<Outcome>() {
            Some(Outcome::Failed(logged)) if status.is_server_error() => {
                assert_eq!(logged, &chain);
            }
            Some(Outcome::Refused(_)) if !status.is_server_error() => {}
            other => panic!("{shown}: outcome {other:?}"),
        }
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        if let Some(info) = lock_body {
            // Terraform reads the holder's LockInfo from a 423 or 409.
            assert_eq!(body, info, "{shown}");
            continue;
        }
        let body = String::from_utf8(body.to_vec()).expect("utf-8");
        assert!(
            body.ends_with('\n') && body.lines().count() == 1,
            "{shown}: {body:?}"
        );
        assert!(!body.trim().is_empty(), "{shown}");
        if status.is_server_error() {
            assert!(!body.contains(SECRET), "{shown}: {body}");
        }
    }
    assert_eq!(reached.len(), ARMS, "arms never generated: {reached:?}");
}

/// The log layer writes one line for a failed request, and the body is not in it.
#[test]
fn server_errors_hand_the_whole_chain_to_the_log_and_a_hint_to_the_client() {
    let error = ApiError::Service(ServiceError::Store(StoreError::Remote(Box::new(
        std::io::Error::other("HTTP 401 from the remote"),
    ))));
    let response = error.into_response();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    match response.extensions().get::<Outcome>() {
        Some(Outcome::Failed(chain)) => assert_eq!(
            chain,
            "the git remote answered unexpectedly: HTTP 401 from the remote"
        ),
        other => panic!("{other:?}"),
    }
}
