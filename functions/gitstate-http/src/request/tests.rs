use http::StatusCode;
use rand::{Rng as _, SeedableRng as _};

use super::*;

/// The target of `uri` as the route table would route it (by its decoded path, as
/// [`decode_path_layer`] lets it).
fn parse_target(uri: &Uri) -> Result<Target, ApiError> {
    let path = decode(uri.path());
    let decoded = path.as_deref().unwrap_or(uri.path());
    let route = [route::STATE, route::LOCK, route::HISTORY]
        .into_iter()
        .find(|prefix| decoded.starts_with(prefix))
        .or_else(|| {
            [route::STATES, route::LOCKS, route::HEALTH, route::SEED]
                .into_iter()
                .find(|route| *route == decoded)
        });
    Target::read(route, path, uri)
}

/// A request naming a repository with credentials in it is 400 before anything looks it up,
/// and the reason does not repeat the secret.
#[test]
fn repository_parameter_with_credentials_is_400() {
    for url in [
        "https://u:tok-1@h.example/o/r.git",
        "https://tok-1@h.example/o/r.git",
        "http://u%40x:tok-1@127.0.0.1:9/r.git",
        "ssh://git:tok-1@h.example/r.git",
    ] {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("type", "git")
            .append_pair("repository", url)
            .append_pair("state", "x.tfstate")
            .finish();
        let uri: Uri = format!("/?{query}").parse().expect("uri");
        match parse_target(&uri) {
            Err(error @ ApiError::Query(_)) => {
                assert_eq!(error.status(), StatusCode::BAD_REQUEST);
                assert!(!error.to_string().contains("tok-1"), "{error}");
            }
            Err(other) => panic!("{url}: {other}"),
            Ok(_) => panic!("{url} accepted"),
        }
    }
    let uri: Uri = "/?type=git&repository=ssh%3A%2F%2Fgit%40h%2Fr&state=x"
        .parse()
        .expect("uri");
    assert!(parse_target(&uri).is_ok(), "an ssh user name is no secret");
}

/// Random paths of any Unicode, percent-encoded byte by byte (all, some or none of them),
/// decode to what was encoded.
#[test]
fn encoded_paths_decode_to_what_was_encoded() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1313);
    for _ in 0..2000 {
        let len = rng.random_range(0..24);
        let text: String = (0..len)
            .map(|_| match rng.random_range(0..4) {
                0 => rng.random_range('a'..='z'),
                1 => ['/', '.', '-', '_', '%', ' ', '?', '#'][rng.random_range(0..8)],
                2 => rng.random_range('\u{80}'..='\u{7ff}'),
                _ => rng.random::<char>(),
            })
            .collect();
        let keep = rng.random_range(0..3);
        let mut encoded = String::from("/");
        for byte in text.bytes() {
            let plain = byte.is_ascii_alphanumeric() || b"/.-_".contains(&byte);
            if plain && (keep == 0 || (keep == 1 && rng.random_bool(0.5))) {
                encoded.push(char::from(byte));
            } else if rng.random_bool(0.5) {
                encoded.push_str(&format!("%{byte:02X}"));
            } else {
                encoded.push_str(&format!("%{byte:02x}"));
            }
        }
        let decoded = decode_path(&encoded).unwrap_or_else(|e| panic!("{encoded}: {e}"));
        assert_eq!(decoded, format!("/{text}"), "{encoded}");
    }
}

/// A `%` without two hex digits after it, or escapes that spell no UTF-8, are refused.
#[test]
fn malformed_escapes_and_non_utf8_are_refused() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(77);
    for _ in 0..500 {
        let tail: String = (0..rng.random_range(0..3))
            .map(|_| ['g', 'z', '%', '/', '+', '-', ' '][rng.random_range(0..7)])
            .collect();
        let path = format!("/states/a%{tail}");
        if tail.len() == 2 && tail.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        assert!(
            matches!(decode_path(&path), Err(ApiError::Query(_))),
            "{path:?}"
        );
    }
    for path in ["/a%ff", "/a%c3", "/a%e2%82", "/a%80", "/%c3%28"] {
        let error = decode_path(path).expect_err(path);
        assert_eq!(
            error.to_string(),
            "bad query: the path is not UTF-8",
            "{path}"
        );
    }
    assert_eq!(decode_path("/a%2Fb%20c").expect("valid"), "/a/b c");
}

/// Every parameter may come once; a repeated one is refused whatever its value.
#[test]
fn parameters_come_once() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..200 {
        let keys = ["ref", "ID", "page", "at", "x"];
        let key = keys[rng.random_range(0..keys.len())];
        let query = format!(
            "{key}={}&{key}={}",
            rng.random::<u16>(),
            rng.random::<u16>()
        );
        let uri: Uri = format!("/states/s?{query}").parse().expect("uri");
        assert!(
            matches!(parse_target(&uri), Err(ApiError::Query(_))),
            "{query}"
        );
    }
    let uri: Uri = "/states/s?ref=main&ID=L1".parse().expect("uri");
    let target = parse_target(&uri).expect("valid");
    assert_eq!(target.resource, Resource::State);
    assert_eq!(target.name.as_ref().map(StateName::as_str), Some("s"));
    assert_eq!(target.branch(), Some("main"));
    assert_eq!(target.param("ID"), Some("L1"));
    let uri: Uri = "/history/s?ref=main&page=2&per_page=3&at=4&restore=5"
        .parse()
        .expect("uri");
    let q = parse_target(&uri).expect("valid");
    assert_eq!(
        ["page", "per_page", "at", "restore"].map(|key| q.param(key).unwrap_or_default()),
        ["2", "3", "4", "5"]
    );
}
