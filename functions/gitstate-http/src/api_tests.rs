//! The server's own JSON, produced by the router over the in-memory store, read into the api
//! types and written again byte for byte.

use std::sync::Arc;

use ::http::{Method, Request, StatusCode};
use axum::body::Body;
use http_body_util::BodyExt as _;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::ServiceExt as _;

use crate::{Limits, router as http_router};
use gitstate_core::BranchName;
use gitstate_core::api::*;
use gitstate_core::auth::{Access, AccessOptions, AccessSource};
use gitstate_core::password::PasswordVerifier;
use gitstate_core::ports::Location;
use gitstate_core::service::{Backend, Identity, Repositories};
use gitstate_core::testing::MemoryStore;

const HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$0Yp3mXH6Ee0zI9BcqdqplmhCgEVMvS/FcwkKo7Y1kpE";
const AUTH: &str = "Basic YWRtaW46cHc="; // admin:pw

/// Accepts the password "pw": these tests are about the answers, not argon2.
struct Plain;

impl PasswordVerifier for Plain {
    fn verify(&self, _phc: &str, secret: &[u8]) -> bool {
        secret == b"pw"
    }
}

fn router() -> axum::Router {
    let store = Arc::new(MemoryStore::default());
    let branch = BranchName::parse("main").expect("valid");
    let repositories = Repositories {
        primary: "https://git.example/org/state.git".into(),
        default_branch: branch.clone(),
        allowed: Vec::new(),
    };
    let identity = Identity {
        name: "gitstate".into(),
        email: "gitstate@localhost".into(),
    };
    let access = Access::new(
        store.clone(),
        Location {
            repository: repositories.primary.clone(),
            branch,
        },
        AccessOptions {
            source: AccessSource::Text(format!(
                "[users.admin]\nhash = \"{HASH}\"\ngrants = [\"admin:*\"]\n"
            )),
            bootstrap: None,
            refresh: std::time::Duration::from_secs(10),
            hash_memory_kib: gitstate_core::password::MAX_MEMORY_KIB,
        },
        Arc::new(Plain),
    )
    .expect("valid access");
    // The writes here are about the wire types, not the lock rule.
    let backend = Backend::new(store, repositories, identity).with_unlocked_writes(true);
    http_router(
        Arc::new(backend),
        Arc::new(access),
        Limits {
            max_body_bytes: 1 << 20,
            max_response_bytes: None,
            request_deadline: std::time::Duration::from_secs(30),
        },
    )
}

async fn call(app: &axum::Router, method: &str, path: &str, body: String) -> Vec<u8> {
    let request = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(path)
        .header("authorization", AUTH)
        .body(Body::from(body))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(
        status,
        StatusCode::OK,
        "{method} {path}: {}",
        String::from_utf8_lossy(&bytes)
    );
    bytes.to_vec()
}

/// `wire` read as `T` and written again is the same bytes; the value is returned.
fn round_trip<T: Serialize + DeserializeOwned>(wire: &[u8]) -> T {
    let value: T = serde_json::from_slice(wire).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(wire));
    });
    let again = serde_json::to_vec(&value).expect("serialises");
    assert_eq!(
        String::from_utf8_lossy(&again),
        String::from_utf8_lossy(wire)
    );
    value
}

/// Text a client may send as a lock holder or lineage: quotes, escapes, controls, unicode.
fn odd_text(rng: &mut impl Rng) -> String {
    const POOL: &[char] = &[
        'a', 'Z', '9', ' ', '"', '\\', '/', '\n', '\u{1b}', 'é', '雪', '🙂', '\u{202e}', '<', '&',
    ];
    let len = rng.random_range(1..16);
    (0..len)
        .map(|_| POOL[rng.random_range(0..POOL.len())])
        .collect()
}

#[tokio::test]
async fn the_servers_answers_read_into_the_api_types_and_write_back_identically() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut restores = 0;
    for round in 0..8 {
        let app = router();
        let names: Vec<String> = (0..rng.random_range(1..5))
            .map(|i| format!("r{round}/s{i}-{}.tfstate", rng.random::<u16>()))
            .collect();
        let mut written = 0;
        for name in &names {
            let lineage = odd_text(&mut rng);
            let serials = rng.random_range(1..4u64);
            for serial in 1..=serials {
                let state = serde_json::json!({"version": 4, "lineage": lineage, "serial": serial});
                call(&app, "POST", &format!("/states/{name}"), state.to_string()).await;
                written += 1;
            }
            if rng.random_bool(0.5) {
                let info = serde_json::json!({
                    "ID": format!("id-{}", rng.random::<u32>()),
                    "Operation": odd_text(&mut rng),
                    "Who": odd_text(&mut rng),
                });
                call(&app, "LOCK", &format!("/states/{name}"), info.to_string()).await;
            }
        }
        let states: Vec<ListedState> =
            round_trip(&call(&app, "GET", "/states", String::new()).await);
        assert_eq!(states.len(), names.len());
        assert!(
            states
                .iter()
                .all(|s| s.serial.is_some() && s.updated.is_some())
        );
        let locks: Vec<ListedLock> = round_trip(&call(&app, "GET", "/locks", String::new()).await);
        assert_eq!(
            locks.len(),
            states.iter().filter(|s| s.lock.is_some()).count()
        );
        assert!(locks.iter().all(|l| l.user.as_deref() == Some("admin")));

        let name = &names[0];
        let path = format!("/history/{name}?per_page=1");
        let page: HistoryAnswer = round_trip(&call(&app, "GET", &path, String::new()).await);
        assert_eq!((page.state.as_str(), page.page), (name.as_str(), 0));
        assert_eq!(page.versions.len(), 1);
        let all: HistoryAnswer =
            round_trip(&call(&app, "GET", &format!("/history/{name}"), String::new()).await);
        assert_eq!(all.next_page, None);
        assert_eq!(page.next_page.is_some(), all.versions.len() > 1);
        assert!(written >= all.versions.len());

        let listed = states.iter().find(|s| &s.state == name).expect("listed");
        if listed.lock.is_none() {
            restores += 1;
            let oldest = all.versions.last().expect("written once");
            let path = format!("/history/{name}?restore={}", oldest.version);
            let restored: Restored = round_trip(&call(&app, "POST", &path, String::new()).await);
            assert_eq!(restored.from, oldest.version);
            assert!(restored.serial > all.versions[0].serial.unwrap_or(0));
        }
    }
    assert!(restores > 0, "the seed exercises a restore");
}

/// Versions and restore answers with generated hostile text, serialised, read back and written again unchanged.
#[test]
fn version_and_restore_answers_round_trip_through_json_byte_for_byte() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    for _ in 0..200 {
        let version = gitstate_core::service::VersionInfo {
            version: format!("{:040x}", rng.random::<u128>()),
            time: rng.random_range(-1_000_000_000..4_000_000_000),
            author: odd_text(&mut rng),
            operation: odd_text(&mut rng),
            serial: rng.random_bool(0.8).then(|| rng.random()),
            lineage: rng.random_bool(0.8).then(|| odd_text(&mut rng)),
            deleted: rng.random(),
            restored_from: rng
                .random_bool(0.3)
                .then(|| format!("{:040x}", rng.random::<u128>())),
        };
        let wire = serde_json::to_vec(&version).expect("serialises");
        let read: VersionInfo = round_trip(&wire);
        assert_eq!(read.version, version.version);
        assert_eq!(read.restored_from, version.restored_from);
        let restored = gitstate_core::service::Restored {
            from: version.version.clone(),
            serial: rng.random(),
        };
        let read: Restored = round_trip(&serde_json::to_vec(&restored).expect("serialises"));
        assert_eq!(read.serial, restored.serial);
    }
}
