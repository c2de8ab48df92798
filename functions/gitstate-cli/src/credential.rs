//! Git credentials for local use: for a repository without a configured token, ask
//! `git credential fill` as git itself would, so a developer's existing login works. What it
//! returns is never printed.

use std::io::IsTerminal;
use std::process::Stdio;
use std::time::Duration;

use gitstate_app::settings::GitSettings;
use gitstate_core::secret::Secret;
use tokio::io::AsyncWriteExt;

/// How long a credential helper may take when nobody can answer a prompt.
const HELPER_TIMEOUT: Duration = Duration::from_secs(20);

/// Fill `settings.username`/`token` from `git credential fill` when the repository is
/// http(s) and has no token (nor a KMS-wrapped one). Failures leave the settings as they were:
/// a public repository needs no credential, and the git request will say if one was needed.
pub async fn fill(settings: &mut GitSettings) {
    let Some(url) = settings.repository.clone() else {
        return;
    };
    if settings.token.is_some()
        || settings.token_kms.is_some()
        || !(url.starts_with("https://") || url.starts_with("http://"))
    {
        return;
    }
    match ask(&url, settings.username.as_deref()).await {
        Ok(Some((user, password))) => {
            tracing::info!(
                "using the git credential helper's login for {}",
                redacted(&url)
            );
            settings.username.get_or_insert(user);
            settings.token = Some(password);
        }
        Ok(None) => tracing::debug!("git credential fill gave no password"),
        Err(e) => tracing::debug!("git credential fill: {e}"),
    }
}

fn redacted(url: &str) -> String {
    gitstate_app::layers::redact_userinfo(url)
}

async fn ask(url: &str, user: Option<&str>) -> std::io::Result<Option<(String, Secret)>> {
    let mut request = format!("url={url}\n");
    if let Some(user) = user {
        request += &format!("username={user}\n");
    }
    request.push('\n');
    let interactive = std::io::stdin().is_terminal();
    let mut command = tokio::process::Command::new("git");
    command
        .args(["credential", "fill"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if !interactive {
        command.env("GIT_TERMINAL_PROMPT", "0");
    }
    let mut child = command.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(request.as_bytes()).await?;
    }
    let output = if interactive {
        child.wait_with_output().await?
    } else {
        tokio::time::timeout(HELPER_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| std::io::Error::other("the credential helper timed out"))??
    };
    if !output.status.success() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_owned)
    };
    Ok(match (field("username"), field("password")) {
        (Some(user), Some(password)) if !password.is_empty() => Some((user, Secret::new(password))),
        _ => None,
    })
}
