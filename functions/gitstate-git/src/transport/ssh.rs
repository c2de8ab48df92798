//! The git protocol (v0) over the system `ssh`, for `ssh://user@host[:port]/path` and
//! `user@host:path` remotes: each operation is one `ssh host git-upload-pack|git-receive-pack
//! 'path'`, carrying the same stateless requests as smart HTTP, so the same request bodies,
//! parsers and guarantees (create-only lock, compare-and-swap, `atomic`) apply.
//! `GIT_SSH_COMMAND` (a shell command) or `GIT_SSH` (a program) replace `ssh`, as for git.

use std::process::Stdio;
use std::time::Duration;

use gix_packetline::PacketLineRef;
use gix_packetline::decode::{self, PacketLineOrWantedSize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{ConnectError, Error, Framing, Service, Wire};

/// The most of ssh's stderr kept (for the error message); the rest is read and dropped.
const MAX_STDERR_BYTES: u64 = 64 * 1024;

/// Whether `url` names an SSH remote (for git: `ssh://`, `git+ssh://`, `ssh+git://`, or
/// `[user@]host:path`); [`Ssh::parse`] reads it.
pub fn is_ssh(url: &str) -> bool {
    ["ssh://", "git+ssh://", "ssh+git://"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
        || scp_like(url).is_some()
}

/// Why an ssh repository URL is refused.
#[derive(Debug, thiserror::Error)]
pub enum BadSshUrl {
    /// What git's URL syntax (`gix-url`) says is wrong.
    #[error("{0}")]
    Syntax(String),
    #[error("neither ssh://user@host[:port]/path nor user@host:path")]
    NotSsh,
    #[error("the host is not a host name")]
    Host,
    #[error("the user name is empty or would be read as an option")]
    User,
    #[error("a password in an ssh URL is not used: ssh authenticates with keys")]
    Password,
    #[error("the path is empty, starts with '-' or holds control characters")]
    Path,
}

/// `[user@]host:path` (no scheme, a colon before any slash).
fn scp_like(url: &str) -> Option<(&str, &str)> {
    if url.contains("://") {
        return None;
    }
    let (host, path) = url.split_once(':')?;
    (!host.is_empty() && !host.contains('/') && !path.is_empty()).then_some((host, path))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ssh {
    /// `user@host` or `host`.
    host: String,
    port: Option<u16>,
    path: String,
    timeout: Duration,
    /// Tests: a GIT_SSH_COMMAND of their own, without touching the process environment.
    #[cfg(test)]
    shell: Option<String>,
}

impl Ssh {
    /// `url` as git reads it (`gix-url`), refused when ssh would read a part of it as an
    /// option (a host or path starting with `-`), when it carries a password (ssh takes none
    /// from a URL) or when its path is empty or holds control characters.
    pub fn parse(url: &str, timeout: Duration) -> Result<Self, ConnectError> {
        let bad = |why: BadSshUrl| ConnectError::SshUrl {
            url: url.to_owned(),
            why,
        };
        let parsed = gix_url::parse(url)
            .map_err(|e| bad(BadSshUrl::Syntax(e.probable_cause().to_string())))?;
        if parsed.scheme != gix_url::Scheme::Ssh {
            return Err(bad(BadSshUrl::NotSsh));
        }
        let host = parsed
            .host_argument_safe()
            .filter(|host| !host.is_empty() && !host.contains(char::is_whitespace))
            .ok_or(bad(BadSshUrl::Host))?;
        if parsed.password().is_some() {
            return Err(bad(BadSshUrl::Password));
        }
        let host = match parsed.user() {
            Some(user) if user.is_empty() || user.starts_with('-') || user.contains('@') => {
                return Err(bad(BadSshUrl::User));
            }
            Some(user) => format!("{user}@{host}"),
            None => host.to_owned(),
        };
        let path = String::from_utf8(parsed.path.to_vec())
            .ok()
            .filter(|path| {
                !path.trim_start_matches('/').is_empty()
                    && !path.trim_start_matches('/').starts_with('-')
                    && !path.contains(char::is_control)
            })
            .ok_or(bad(BadSshUrl::Path))?;
        Ok(Self {
            host,
            port: parsed.port,
            path,
            timeout,
            #[cfg(test)]
            shell: None,
        })
    }

    /// `ssh [-p port] host "git-upload-pack 'path'"`, with GIT_SSH_COMMAND / GIT_SSH honoured.
    fn command(&self, service: Service) -> tokio::process::Command {
        let quoted = format!("'{}'", self.path.replace('\'', "'\\''"));
        let remote = format!("{} {quoted}", service.name());
        let mut args: Vec<String> = Vec::new();
        if let Some(port) = self.port {
            args.extend(["-p".to_owned(), port.to_string()]);
        }
        args.extend([self.host.clone(), remote]);
        let shell = std::env::var("GIT_SSH_COMMAND").ok();
        #[cfg(test)]
        let shell = self.shell.clone().or(shell);
        let mut command = match (
            shell.filter(|c| !c.trim().is_empty()),
            std::env::var_os("GIT_SSH").filter(|c| !c.is_empty()),
        ) {
            (Some(shell), _) => {
                let mut command = tokio::process::Command::new("sh");
                command
                    .arg("-c")
                    .arg(format!("{shell} \"$@\""))
                    .arg("gitstate-ssh");
                command
            }
            (None, Some(program)) => tokio::process::Command::new(program),
            (None, None) => tokio::process::Command::new("ssh"),
        };
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Run one session: read the advertisement, then send `request` (or a flush to end the
    /// session), then read everything the server sends until it closes.
    async fn session(
        &self,
        service: Service,
        request: Option<Vec<u8>>,
        limit: u64,
    ) -> Result<(Vec<u8>, Vec<u8>), Error> {
        let work = async {
            let mut child = self.command(service).spawn().map_err(Error::SshStart)?;
            let mut stdout = child
                .stdout
                .take()
                .ok_or(Error::Framing(Framing::NoPipe("stdout")))?;
            let mut stdin = child
                .stdin
                .take()
                .ok_or(Error::Framing(Framing::NoPipe("stdin")))?;
            let mut stderr = child
                .stderr
                .take()
                .ok_or(Error::Framing(Framing::NoPipe("stderr")))?;
            let errors = tokio::spawn(async move {
                let mut text = Vec::new();
                let _ = (&mut stderr)
                    .take(MAX_STDERR_BYTES)
                    .read_to_end(&mut text)
                    .await;
                // Drained, so a chatty ssh never blocks on a full pipe.
                let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
                text
            });
            let advert = match read_advertisement(&mut stdout, limit).await {
                Ok(advert) => advert,
                // Over the size limit: the child, perhaps still writing, is killed when dropped.
                Err(e @ Error::TooLarge { .. }) => return Err(e),
                Err(e) => {
                    let _ = child.wait().await;
                    let text = errors.await.unwrap_or_default();
                    return Err(session_error(&text).unwrap_or(e));
                }
            };
            let body = request.unwrap_or_else(|| b"0000".to_vec());
            stdin.write_all(&body).await?;
            stdin.flush().await?;
            drop(stdin);
            let mut rest = Vec::new();
            (&mut stdout)
                .take(limit.saturating_add(1))
                .read_to_end(&mut rest)
                .await?;
            if rest.len() as u64 > limit {
                // The child is killed when dropped.
                return Err(Error::too_large(
                    format!("{} response", service.name()),
                    limit,
                ));
            }
            let status = child.wait().await?;
            let text = errors.await.unwrap_or_default();
            if !status.success() && rest.is_empty() {
                return Err(session_error(&text).unwrap_or(Error::SshEnded {
                    service: service.name(),
                    status,
                }));
            }
            Ok((advert, rest))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| Error::SshTimeout(self.timeout))?
    }
}

/// The last line ssh or the remote wrote on stderr, as the error.
fn session_error(stderr: &[u8]) -> Option<Error> {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(Error::SshSaid(line.trim().to_owned()))
}

/// pkt-lines up to and including the flush that ends the advertisement.
async fn read_advertisement(
    stdout: &mut (impl AsyncRead + Unpin),
    limit: u64,
) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    loop {
        let mut header = [0u8; 4];
        stdout
            .read_exact(&mut header)
            .await
            .map_err(|_| Error::Framing(Framing::SshEndedBeforeRefs))?;
        out.extend_from_slice(&header);
        // The length prefix, decoded by `gix-packetline`: a flush ends the refs; a delimiter,
        // a response end, length 3 or 4, or what is not hex cannot come here.
        match decode::hex_prefix(&header) {
            Ok(PacketLineOrWantedSize::Line(PacketLineRef::Flush)) => return Ok(out),
            Ok(PacketLineOrWantedSize::Line(_)) => {
                return Err(Error::Framing(Framing::SshLength));
            }
            Err(_) => return Err(Error::Framing(Framing::SshHeader)),
            Ok(PacketLineOrWantedSize::Wanted(len)) => {
                let start = out.len();
                let len = usize::from(len);
                if (start + len) as u64 > limit {
                    return Err(Error::too_large("ref advertisement", limit));
                }
                out.resize(start + len, 0);
                stdout.read_exact(&mut out[start..]).await?;
            }
        }
    }
}

#[async_trait::async_trait]
impl Wire for Ssh {
    async fn advertise(&self, service: Service, limit: u64) -> Result<Vec<u8>, Error> {
        let (advert, _) = self.session(service, None, limit).await?;
        Ok(advert)
    }

    async fn exchange(
        &self,
        service: Service,
        request: Vec<u8>,
        limit: u64,
    ) -> Result<Vec<u8>, Error> {
        let (_, response) = self.session(service, Some(request), limit).await?;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_url_forms_and_refuses_option_injection() {
        let t = Duration::from_secs(1);
        let ssh = |url| Ssh::parse(url, t);
        let ok = |url, host: &str, port, path: &str| {
            assert_eq!(
                ssh(url).expect(url),
                Ssh {
                    host: host.into(),
                    port,
                    path: path.into(),
                    timeout: t,
                    shell: None,
                }
            );
        };
        ok(
            "ssh://git@h.example/o/r.git",
            "git@h.example",
            None,
            "/o/r.git",
        );
        ok(
            "ssh://git@127.0.0.1:2222/srv/r.git",
            "git@127.0.0.1",
            Some(2222),
            "/srv/r.git",
        );
        ok("git+ssh://h/r", "h", None, "/r");
        ok(
            "git@github.com:acme/state.git",
            "git@github.com",
            None,
            "acme/state.git",
        );
        ok("me@host:/abs/r.git", "me@host", None, "/abs/r.git");
        // What git reads differently from a split at the colon: an IPv6 host, the home
        // directory of a user, `ssh+git://`.
        ok(
            "ssh://git@[::1]:2222/r.git",
            "git@::1",
            Some(2222),
            "/r.git",
        );
        ok("ssh://h.example/~me/r.git", "h.example", None, "~me/r.git");
        ok("ssh+git://h/r", "h", None, "/r");
        for bad in [
            "ssh://-oProxyCommand=x/r",
            "-oProxyCommand=x:r",
            "ssh://-u@h/r",
            "h:-r",
            "ssh://h/-r",
            "ssh://u:pw@h/r",
            "ssh://h",
            "ssh://h:port/r",
            "ssh://h/",
            "ssh://h/a\nb",
            "h:",
            "https://h/r",
        ] {
            assert!(ssh(bad).is_err(), "{bad}");
        }
        assert!(is_ssh("git@github.com:o/r.git") && is_ssh("ssh://h/r"));
        assert!(!is_ssh("https://h/r") && !is_ssh("http://h:80/r") && !is_ssh("/local/path"));
    }

    /// An `ssh` that is a shell script: `advert` bytes of pkt-lines, then (after reading the
    /// request) `response` bytes, `stderr` bytes on stderr, and the exit status.
    fn fake(advert: usize, response: usize, stderr: usize, status: u8) -> Ssh {
        let mut ssh =
            Ssh::parse("ssh://git@127.0.0.1/r.git", Duration::from_secs(20)).expect("valid");
        // 65520-byte pkt-lines (`fff0`) and one shorter line, then a flush.
        let line = |n: usize| {
            format!(
                "printf '%04x' {}; head -c {} /dev/zero | tr '\\0' a;",
                n + 4,
                n
            )
        };
        let mut script = String::new();
        let mut left = advert;
        while left > 0 {
            let n = left.min(65516);
            script.push_str(&line(n));
            left -= n;
        }
        script.push_str("printf 0000; cat >/dev/null;");
        script.push_str(&format!(
            "head -c {response} /dev/zero | tr '\\0' b; head -c {stderr} /dev/zero | tr '\\0' e >&2; echo >&2; echo 'the last line' >&2; exit {status}; true"
        ));
        ssh.shell = Some(script);
        ssh
    }

    /// Over SSH the advertisement is the refs as the server sends them, with no smart-HTTP
    /// service announcement before them: what the protocol parses is what came.
    #[tokio::test]
    async fn the_advertisement_is_the_refs_as_sent() {
        let oid = "1111111111111111111111111111111111111111";
        let line = format!("{oid} refs/heads/main\\0report-status atomic\\n");
        let mut ssh =
            Ssh::parse("ssh://git@127.0.0.1/r.git", Duration::from_secs(20)).expect("valid");
        // `printf` expands the escapes; the length counts the 4 header bytes and the expanded
        // NUL and LF.
        let length =
            4 + oid.len() + " refs/heads/main".len() + 1 + "report-status atomic".len() + 1;
        ssh.shell = Some(format!(
            "printf '%04x' {length}; printf '{line}'; printf 0000; cat >/dev/null; true"
        ));
        let body = ssh
            .advertise(Service::ReceivePack, 1 << 20)
            .await
            .expect("advertised");
        let advert = crate::protocol::Advert::parse_refs(&body).expect("refs");
        assert_eq!(
            advert.tip("refs/heads/main").map(|id| id.to_string()),
            Some(oid.to_owned())
        );
        assert!(advert.has_cap("atomic") && advert.has_cap("report-status"));
        assert!(!body.starts_with(b"001e# service="), "no announcement");
    }

    const REASON: &str = "bytes (GITSTATE_GIT_MAX_RESPONSE_BYTES)";

    /// Advertisements and responses of generated sizes around the limit: up to it they arrive
    /// whole, past it they are refused with the HTTP wire's reason (a 502), never read on.
    #[tokio::test]
    async fn answers_past_the_size_limit_are_refused() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut seen = [0; 3];
        for _ in 0..24 {
            let limit: u64 = rng.random_range(1_000..300_000);
            let size = |rng: &mut rand::rngs::StdRng| {
                let delta: i64 = rng.random_range(-2_000..2_000);
                usize::try_from(limit as i64 + delta).unwrap_or(0)
            };
            let (advert, response) = (size(&mut rng), size(&mut rng));
            // The advertisement's pkt-lines count 4 header bytes each, and the flush 4.
            let advert_bytes = advert + 4 * advert.div_ceil(65516) + 4;
            let got = fake(advert, response, 0, 0)
                .exchange(Service::UploadPack, b"0000".to_vec(), limit)
                .await;
            match got {
                Ok(body) => {
                    assert!(advert_bytes as u64 <= limit && response as u64 <= limit);
                    assert_eq!(body.len(), response);
                    seen[0] += 1;
                }
                Err(error @ Error::TooLarge { .. }) => {
                    let reason = error.to_string();
                    assert!(reason.contains(REASON), "{reason}");
                    assert!(
                        advert_bytes as u64 > limit || response as u64 > limit,
                        "{advert_bytes} {response} <= {limit}: {reason}"
                    );
                    let (what, i) = if advert_bytes as u64 > limit {
                        ("ref advertisement", 1)
                    } else {
                        ("git-upload-pack response", 2)
                    };
                    assert!(reason.contains(what), "{reason}");
                    seen[i] += 1;
                }
                Err(other) => panic!("{other:?}"),
            }
        }
        assert!(
            seen.iter().all(|n| *n > 0),
            "accepted, advertisement, response: {seen:?}"
        );
    }

    /// A remote that floods stderr and fails: the error is its stderr's last kept line, from at
    /// most 64 KiB of it, and the session ends (the rest is drained, so ssh never blocks).
    #[tokio::test]
    async fn stderr_is_capped() {
        let err = fake(10, 0, 4 << 20, 1)
            .exchange(Service::UploadPack, b"0000".to_vec(), 1 << 20)
            .await
            .expect_err("failed");
        let Error::SshSaid(reason) = err else {
            panic!("{err:?}")
        };
        assert!(reason.len() <= 64 * 1024 + 16, "{}", reason.len());
        assert!(!reason.contains("the last line"));
        let err = fake(10, 0, 100, 1)
            .exchange(Service::UploadPack, b"0000".to_vec(), 1 << 20)
            .await
            .expect_err("failed");
        assert!(
            matches!(err, Error::SshSaid(ref r) if r == "the last line"),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "git remote reports: ssh: the last line");
        assert!(err.refused());
    }
}
