use super::*;
use crate::SCHEME_HEADER;

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
    let hash = gitstate_core::password::hash_secret(b"right").expect("hash");
    let text = format!("[users.ann]\nhash = \"{hash}\"\ngrants = [\"admin:*\"]\n");
    let access = gitstate_core::auth::Access::new(
        std::sync::Arc::new(gitstate_core::testing::MemoryStore::default()),
        gitstate_core::ports::Location {
            repository: "r".into(),
            branch: gitstate_core::BranchName::parse("main").expect("valid"),
        },
        gitstate_core::auth::AccessOptions {
            source: gitstate_core::auth::AccessSource::Text(text),
            bootstrap: None,
            refresh: std::time::Duration::from_secs(10),
            hash_memory_kib: gitstate_core::password::MAX_MEMORY_KIB,
        },
        std::sync::Arc::new(gitstate_core::password::Argon2id),
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
