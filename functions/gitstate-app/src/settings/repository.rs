//! Which repository URLs gitstate serves: every form the git adapter connects to (smart HTTP(S),
//! and SSH in each of git's spellings, read by the adapter's own parser) and nothing else. The
//! settings, `gitstate doctor` and the seed's standalone server all ask [`repository_url`].

use gitstate_core::secret::{credentials_in_url, is_ssh_scheme};
use gitstate_git::transport::{self, ConnectError};

/// How the git adapter reaches a repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `https://…` or `http://…`: smart HTTP.
    Http,
    /// `ssh://…`, `git+ssh://…`, `ssh+git://…` or `[user@]host:path`: the system `ssh`.
    Ssh,
}

/// The forms [`repository_url`] accepts, as its refusals name them.
pub const URL_FORMS: &str = "https://host/path, http://host/path, ssh://[user@]host[:port]/path \
                             (or git+ssh://, ssh+git://) or [user@]host:path";

/// How `url` is reached, or why gitstate does not serve it. A reason names the scheme at fault,
/// never the URL, so it repeats no credential.
pub fn repository_url(url: &str) -> Result<Wire, String> {
    let wire = wire(url)?;
    if let Some(reason) = credentials_in_url(url) {
        return Err(match wire {
            Wire::Http => format!(
                "{reason}: set GITSTATE_GIT_USERNAME / GITSTATE_GIT_TOKEN instead (or, for local \
                 use, let `git credential` supply them)"
            ),
            Wire::Ssh => format!(
                "{reason}, which ssh does not take: it authenticates with keys (ssh-agent, \
                 ~/.ssh/config, GIT_SSH_COMMAND or SSH_PRIVATE_KEY)"
            ),
        });
    }
    // The adapter's own reading, so that what passes here is what it connects to.
    match transport::check_url(url) {
        Ok(()) => Ok(wire),
        Err(ConnectError::SshUrl { why, .. }) => Err(format!("not an SSH remote git reads: {why}")),
        Err(ConnectError::Url(why)) => Err(format!("not a URL: {why}")),
        Err(other) => Err(other.to_string()),
    }
}

/// The wire `url`'s form asks for: its scheme, or git's scp-like form; what the adapter has no
/// wire for is refused with what to use instead.
fn wire(url: &str) -> Result<Wire, String> {
    let Some(scheme) = scheme(url) else {
        if url.contains(char::is_whitespace) || url.contains(char::is_control) {
            return Err("holds white space or control characters".into());
        }
        if transport::ssh::is_ssh(url) {
            return Ok(Wire::Ssh);
        }
        return Err(if url.starts_with(['/', '.', '~']) {
            "a local path is not a repository URL: the local repository is the embedded one, \
             GITSTATE_LOCAL_REPOSITORY (leave the repository URL unset)"
                .to_owned()
        } else {
            format!("neither a URL nor user@host:path; use {URL_FORMS}")
        });
    };
    match scheme {
        "https" | "http" => Ok(Wire::Http),
        ssh if is_ssh_scheme(ssh) && ssh.bytes().all(|b| !b.is_ascii_uppercase()) => Ok(Wire::Ssh),
        "git" => Err(
            "git:// (git's unauthenticated daemon protocol) is not served: it takes \
                      no push; use the repository's https:// or ssh:// URL"
                .into(),
        ),
        "file" => Err(
            "file:// is not served: the local repository is the embedded one, \
                       GITSTATE_LOCAL_REPOSITORY (leave the repository URL unset)"
                .into(),
        ),
        other if other.bytes().any(|b| b.is_ascii_uppercase()) => Err(format!(
            "the scheme {other:?} is not one git knows: schemes are lower case"
        )),
        other => Err(format!(
            "the scheme {other:?} is not served; use {URL_FORMS}"
        )),
    }
}

/// The scheme of `scheme://…`, if `url` starts with one (a letter, then letters, digits, `+`,
/// `-` or `.`).
fn scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once("://")?;
    let mut bytes = scheme.bytes();
    let first = bytes.next()?;
    (first.is_ascii_alphabetic()
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')))
    .then_some(scheme)
}

#[cfg(test)]
mod tests {
    //! The URL forms as a class: generated from their parts, each with the verdict a model of
    //! git's URL syntax gives, read through the settings parser for both repository settings.

    use std::collections::HashMap;

    use super::Wire;
    use crate::settings::{Runtime, Settings};

    const SSH_SCHEMES: [&str; 3] = ["ssh", "git+ssh", "ssh+git"];

    /// Every URL form gitstate serves, with its wire: git's three SSH schemes and https/http,
    /// each with and without a user, a port, on a host name, IPv4 and IPv6 addresses, and
    /// paths absolute or under a home (`~user`, `~`); the scp-like form likewise.
    fn served() -> Vec<(String, Wire)> {
        let hosts = [
            "h.example",
            "git-1.h.example",
            "127.0.0.1",
            "[::1]",
            "[2001:db8::7]",
        ];
        let mut out = Vec::new();
        for scheme in SSH_SCHEMES {
            for user in ["", "git@", "deploy.bot@"] {
                for host in hosts {
                    for port in ["", ":22", ":2222"] {
                        for path in ["/o/r.git", "/srv/git/states", "/~alice/r.git", "/~/r.git"] {
                            let url = format!("{scheme}://{user}{host}{port}{path}");
                            out.push((url, Wire::Ssh));
                        }
                    }
                }
            }
        }
        for user in ["", "git@", "deploy.bot@"] {
            for host in ["h.example", "git-1.h.example", "127.0.0.1"] {
                for path in ["o/r.git", "/srv/r.git", "~alice/r.git", "~/r.git"] {
                    out.push((format!("{user}{host}:{path}"), Wire::Ssh));
                }
            }
        }
        for scheme in ["https", "http"] {
            for host in hosts {
                for port in ["", ":8443"] {
                    for path in ["/o/r.git", "/o/r", "/scm/r.git/"] {
                        out.push((format!("{scheme}://{host}{port}{path}"), Wire::Http));
                    }
                }
            }
        }
        out
    }

    /// Forms the adapter has no wire for, or that ssh would misread, each with a word its
    /// refusal must say.
    fn refused() -> Vec<(String, &'static str)> {
        let mut out = Vec::new();
        for scheme in SSH_SCHEMES {
            for host in ["h.example", "[::1]:22"] {
                out.push((format!("{scheme}://git:pw-31@{host}/o/r.git"), "password"));
                out.push((format!("{scheme}://{host}"), "path"));
                out.push((format!("{scheme}://{host}/"), "path"));
                out.push((format!("{scheme}://{host}/-oProxyCommand=x"), "path"));
            }
            out.push((format!("{scheme}://-oProxyCommand=x/r"), "host"));
            out.push((format!("{scheme}://h.example:port/r"), "SSH"));
            let upper = scheme.to_ascii_uppercase();
            out.push((format!("{upper}://h.example/o/r.git"), "lower case"));
        }
        for host in ["h.example", "127.0.0.1", "[::1]"] {
            out.push((format!("git://{host}/o/r.git"), "git://"));
            out.push((format!("ftp://{host}/o/r.git"), "\"ftp\""));
            out.push((format!("git+https://{host}/o/r.git"), "\"git+https\""));
            out.push((format!("HTTPS://{host}/o/r.git"), "lower case"));
        }
        for host in ["h.example", "127.0.0.1"] {
            out.push((format!("git@{host}:-oProxyCommand=x"), "path"));
        }
        // git's scp-like form with a user cannot bracket an IPv6 host.
        out.push(("git@[::1]:o/r.git".to_owned(), "not an SSH remote"));
        for local in [
            "/srv/r.git",
            "./r.git",
            "../states.git",
            "~/r.git",
            "file:///srv/r.git",
        ] {
            out.push((local.to_owned(), "GITSTATE_LOCAL_REPOSITORY"));
        }
        for other in ["r.git", "codecommit::eu-west-1://r", "h.example/o/r.git"] {
            out.push((other.to_owned(), "user@host:path"));
        }
        out.push(("git@h.example:o/r git".to_owned(), "white space"));
        out
    }

    fn read(runtime: Runtime, var: &str, url: &str) -> Result<Settings, String> {
        let ok = "https://ok.example/r.git";
        let vars = HashMap::from(if var == "GITSTATE_REPOSITORY" {
            [
                (var.to_owned(), url.to_owned()),
                ("GITSTATE_REF".into(), "main".into()),
            ]
        } else {
            [
                (var.to_owned(), format!("{ok},{url}")),
                ("GITSTATE_REPOSITORY".into(), ok.to_owned()),
            ]
        });
        Settings::from_lookup(runtime, |k| vars.get(k).cloned()).map_err(|e| e.to_string())
    }

    #[test]
    fn every_form_the_adapter_serves_and_nothing_else() {
        let served = served();
        assert!(served.len() > 500, "{}", served.len());
        for (url, wire) in &served {
            assert_eq!(super::repository_url(url), Ok(*wire), "{url}");
            let local = read(Runtime::Local, "GITSTATE_REPOSITORY", url).expect(url);
            assert_eq!(local.git.repository.as_deref(), Some(url.as_str()));
            let allowed = read(Runtime::Local, "GITSTATE_ALLOWED_REPOSITORIES", url).expect(url);
            assert_eq!(allowed.git.allowed_repositories.last(), Some(url));
            let lambda = read(Runtime::Lambda, "GITSTATE_REPOSITORY", url);
            match wire {
                Wire::Http => assert!(lambda.is_ok(), "{url}: {lambda:?}"),
                Wire::Ssh => {
                    let error = lambda.err().unwrap_or_default();
                    assert!(error.contains("no ssh"), "{url}: {error}");
                }
            }
        }
        let refused = refused();
        assert!(refused.len() > 40, "{}", refused.len());
        for (url, says) in &refused {
            for var in ["GITSTATE_REPOSITORY", "GITSTATE_ALLOWED_REPOSITORIES"] {
                for runtime in [Runtime::Local, Runtime::Lambda] {
                    let error = read(runtime, var, url).err().unwrap_or_default();
                    assert!(error.starts_with(var), "{url} in {var}: {error:?}");
                    assert!(error.contains(says), "{url}: {error:?} lacks {says:?}");
                    assert!(!error.contains("pw-31"), "{error}");
                }
            }
        }
    }
}
