use base64::Engine;

use super::{authorization, private_roots, same_origin, tls_error};
use crate::settings::GitAuth;

#[test]
fn origins_are_scheme_host_and_port() {
    for (a, b, same) in [
        ("https://h/a.git", "https://h/b.git", true),
        ("https://h/a.git", "https://h:443/b.git", true),
        ("https://h/a.git", "http://h/a.git", false),
        ("https://h/a.git", "https://h:8443/a.git", false),
        ("https://h/a.git", "https://g/a.git", false),
        ("https://h/a.git", "https://h.evil/a.git", false),
        ("http://127.0.0.1:1/a", "http://127.0.0.1:2/a", false),
        ("http://127.0.0.1:1/a", "http://localhost:1/a", false),
        ("https://h/a.git", "not a url", false),
        ("file:///a", "file:///a", false),
    ] {
        assert_eq!(same_origin(a, b), same, "{a} vs {b}");
    }
}

#[test]
fn authorization_schemes() {
    let basic = authorization(GitAuth::Basic, Some("x-token-auth"), "t0k").expect("valid");
    assert_eq!(
        basic.to_str().expect("ascii"),
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("x-token-auth:t0k")
        )
    );
    let bearer = authorization(GitAuth::Bearer, Some("ignored"), "t0k").expect("valid");
    assert_eq!(bearer.to_str().expect("ascii"), "Bearer t0k");
    assert!(basic.is_sensitive() && bearer.is_sensitive());
    assert!(authorization(GitAuth::Bearer, None, "a\nb").is_err());
}

/// However deep the connector nests the TLS error in `io::Error`s, it is found.
#[test]
fn finds_the_tls_error_in_nested_io_errors() {
    let unknown = || rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
    for depth in 0..4 {
        let mut error: Box<dyn std::error::Error + Send + Sync> = Box::new(unknown());
        for _ in 0..depth {
            error = Box::new(std::io::Error::other(error));
        }
        assert_eq!(tls_error(error.as_ref()), Some(&unknown()), "depth {depth}");
    }
    let plain = std::io::Error::other("connection refused");
    assert_eq!(tls_error(&plain), None);
}

#[test]
fn private_roots_need_a_certificate() {
    assert!(private_roots("no pem here").is_err());
}
