//! Secret values (passwords, tokens, password hashes): never printed, zeroised when dropped.

use std::fmt;

use zeroize::Zeroize;

/// A secret value: `Debug` and `Display` print `***`, and its bytes are overwritten on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// git's URL schemes for SSH: `ssh`, and its legacy spellings `git+ssh` and `ssh+git`.
pub const SSH_SCHEMES: [&str; 3] = ["ssh", "git+ssh", "ssh+git"];

/// Whether `scheme` (the part before `://`) is one of git's [`SSH_SCHEMES`].
pub fn is_ssh_scheme(scheme: &str) -> bool {
    SSH_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme))
}

/// Why `url` carries a credential, if it does: any user part of an http(s) URL (a token is often
/// sent as the user name alone), a password in an SSH URL (`ssh://`, `git+ssh://`, `ssh+git://`).
/// The user name of an SSH remote (`git@host:path`, `ssh://git@host/path`) is not a secret. The
/// reason never repeats the URL.
pub fn credentials_in_url(url: &str) -> Option<&'static str> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let (userinfo, _) = authority.rsplit_once('@')?;
    if is_ssh_scheme(scheme) {
        userinfo
            .contains(':')
            .then_some("the URL carries a password (user:password@)")
    } else {
        Some("the URL carries credentials (user@ or user:token@)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_printed() {
        let secret = Secret::new("s3cr3t-value".into());
        let shown = format!("{secret:?} {secret} {secret:#?} {:?}", Some(&secret));
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert_eq!(secret.expose(), "s3cr3t-value");
    }

    /// Each of git's SSH schemes keeps its user name and refuses a password, as `ssh://` does;
    /// any user part of another scheme is a credential.
    #[test]
    fn ssh_schemes_keep_the_user_name() {
        for scheme in SSH_SCHEMES {
            for spelt in [scheme.to_owned(), scheme.to_ascii_uppercase()] {
                let user = format!("{spelt}://git@h.example:22/o/r.git");
                assert_eq!(credentials_in_url(&user), None, "{user}");
                assert_eq!(credentials_in_url(&format!("{spelt}://h/r")), None);
                let password = format!("{spelt}://git:pw@h.example/o/r.git");
                assert!(credentials_in_url(&password).is_some(), "{password}");
            }
        }
        for scheme in ["https", "http", "git", "ftp", "sshx", "git+https"] {
            let url = format!("{scheme}://git@h.example/o/r.git");
            assert!(credentials_in_url(&url).is_some(), "{url}");
        }
    }
}
