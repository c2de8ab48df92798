//! The git protocol (v0) over the system `ssh`, for `ssh://user@host[:port]/path` and
//! `user@host:path` remotes: each operation is one `ssh host git-upload-pack|git-receive-pack
//! 'path'`, read and written as the smart-HTTP client's stateless requests, so the same
//! request bodies, parsers and guarantees (create-only lock, compare-and-swap, `atomic`) apply.
//! `GIT_SSH_COMMAND` (a shell command) or `GIT_SSH` (a program) replace `ssh`, as for git.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::Error;
use crate::pkt;
use crate::smart::Service;

/// How the smart client reaches a remote other than over HTTP: the advertisement (as smart HTTP
/// returns it, service announcement included) and one request/response exchange.
#[async_trait::async_trait]
pub trait Wire: Send + Sync {
    async fn advertise(&self, service: Service) -> Result<Vec<u8>, Error>;
    async fn exchange(&self, service: Service, request: Vec<u8>) -> Result<Vec<u8>, Error>;
}

/// Whether `url` names an SSH remote.
pub fn is_ssh(url: &str) -> bool {
    url.starts_with("ssh://") || url.starts_with("git+ssh://") || scp_like(url).is_some()
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
}

impl Ssh {
    pub fn parse(url: &str, timeout: Duration) -> Result<Self, Error> {
        let bad = |why: &str| Error::Config(format!("ssh repository {url:?}: {why}"));
        let (host, port, path) = if let Some(rest) = url
            .strip_prefix("ssh://")
            .or_else(|| url.strip_prefix("git+ssh://"))
        {
            let (authority, path) = rest
                .split_once('/')
                .ok_or_else(|| bad("no path after the host"))?;
            let (host, port) = match authority.rsplit_once(':') {
                Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => (
                    host,
                    Some(
                        port.parse::<u16>()
                            .map_err(|_| bad("the port is not a number"))?,
                    ),
                ),
                _ => (authority, None),
            };
            (host, port, format!("/{path}"))
        } else if let Some((host, path)) = scp_like(url) {
            (host, None, path.to_owned())
        } else {
            return Err(bad(
                "neither ssh://user@host[:port]/path nor user@host:path",
            ));
        };
        // A host starting with `-` would be read by ssh as an option.
        if host.is_empty() || host.starts_with('-') || host.contains(char::is_whitespace) {
            return Err(bad("the host is not a host name"));
        }
        if path.len() <= 1 || path.contains(['\n', '\0']) {
            return Err(bad("the path is empty or holds control characters"));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
            path,
            timeout,
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
        let mut command = match (
            std::env::var("GIT_SSH_COMMAND")
                .ok()
                .filter(|c| !c.trim().is_empty()),
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
    ) -> Result<(Vec<u8>, Vec<u8>), Error> {
        let work = async {
            let mut child = self.command(service).spawn().map_err(|e| {
                Error::Config(format!(
                    "cannot start ssh (GIT_SSH_COMMAND, GIT_SSH or ssh): {e}"
                ))
            })?;
            let mut stdout = child
                .stdout
                .take()
                .ok_or_else(|| Error::Protocol("no stdout".into()))?;
            let mut stdin = child
                .stdin
                .take()
                .ok_or_else(|| Error::Protocol("no stdin".into()))?;
            let mut stderr = child
                .stderr
                .take()
                .ok_or_else(|| Error::Protocol("no stderr".into()))?;
            let errors = tokio::spawn(async move {
                let mut text = Vec::new();
                let _ = stderr.read_to_end(&mut text).await;
                text
            });
            let advert = match read_advertisement(&mut stdout).await {
                Ok(advert) => advert,
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
            stdout.read_to_end(&mut rest).await?;
            let status = child.wait().await?;
            let text = errors.await.unwrap_or_default();
            if !status.success() && rest.is_empty() {
                return Err(session_error(&text).unwrap_or_else(|| {
                    Error::Remote(format!("{} over ssh ended with {status}", service.name()))
                }));
            }
            Ok((advert, rest))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| Error::Remote(format!("ssh: no answer within {:?}", self.timeout)))?
    }
}

/// The last line ssh or the remote wrote on stderr, as the error.
fn session_error(stderr: &[u8]) -> Option<Error> {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(Error::Remote(format!("ssh: {}", line.trim())))
}

/// pkt-lines up to and including the flush that ends the advertisement.
async fn read_advertisement(stdout: &mut (impl AsyncRead + Unpin)) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    loop {
        let mut header = [0u8; 4];
        stdout
            .read_exact(&mut header)
            .await
            .map_err(|_| Error::Protocol("the ssh session ended before the refs".into()))?;
        let len = std::str::from_utf8(&header)
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .ok_or_else(|| Error::Protocol("bad pkt-line header over ssh".into()))?;
        out.extend_from_slice(&header);
        match len {
            0 => return Ok(out),
            1..=3 => return Err(Error::Protocol("bad pkt-line length over ssh".into())),
            _ => {
                let start = out.len();
                out.resize(start + len - 4, 0);
                stdout.read_exact(&mut out[start..]).await?;
            }
        }
        if out.len() > 64 * 1024 * 1024 {
            return Err(Error::Protocol("ref advertisement over 64 MiB".into()));
        }
    }
}

#[async_trait::async_trait]
impl Wire for Ssh {
    async fn advertise(&self, service: Service) -> Result<Vec<u8>, Error> {
        let (advert, _) = self.session(service, None).await?;
        let mut body = Vec::new();
        pkt::write(
            &mut body,
            format!("# service={}\n", service.name()).as_bytes(),
        );
        pkt::flush(&mut body);
        body.extend_from_slice(&advert);
        Ok(body)
    }

    async fn exchange(&self, service: Service, request: Vec<u8>) -> Result<Vec<u8>, Error> {
        let (_, response) = self.session(service, Some(request)).await?;
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
                    timeout: t
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
        for bad in [
            "ssh://-oProxyCommand=x/r",
            "-oProxyCommand=x:r",
            "ssh://h",
            "ssh://h:port/r",
            "ssh://h/",
            "h:",
            "https://h/r",
        ] {
            assert!(ssh(bad).is_err(), "{bad}");
        }
        assert!(is_ssh("git@github.com:o/r.git") && is_ssh("ssh://h/r"));
        assert!(!is_ssh("https://h/r") && !is_ssh("http://h:80/r") && !is_ssh("/local/path"));
    }
}
