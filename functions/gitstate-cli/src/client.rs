//! Talking to a running backend: where it is, who we are, and its answers as typed values.

use anyhow::{Context, bail};
use gitstate_app::layers::{Layered, Origin};
use serde::de::DeserializeOwned;

use crate::settings::{SettingsFor, uses};

/// The backend and the credentials of the commands that call it.
#[derive(clap::Args)]
pub struct RemoteArgs {
    #[command(flatten)]
    settings: SettingsFor<{ uses::REMOTE }>,
    /// Your user name on the backend (the password is read from TF_HTTP_PASSWORD alone).
    #[arg(long, env = "TF_HTTP_USERNAME", help_heading = "Backend")]
    user: Option<String>,
    /// Taken from TF_HTTP_PASSWORD only, never from the command line.
    #[arg(skip = std::env::var("TF_HTTP_PASSWORD").ok())]
    password: Option<String>,
    /// Print the backend's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl RemoteArgs {
    pub fn remote(&self) -> anyhow::Result<Remote> {
        let layered = self.settings.layered()?;
        let (url, from) = backend_url(&layered);
        let mut remote = Remote::new(url, self.user.clone(), self.password.clone())?;
        remote.from = from;
        Ok(remote)
    }
}

/// The backend's URL and where it came from: the `url` setting, else `listen` (what `gitstate
/// serve` here would listen on), else the default.
fn backend_url(layered: &Layered) -> (String, String) {
    let from = |var: &str, key: &str| match layered.origin(var) {
        Some(Origin::Flag) => format!("--{key}"),
        Some(Origin::Env) => var.to_owned(),
        Some(Origin::File(path)) => format!("`{key}` in {}", path.display()),
        Some(other) => other.to_string(),
        None => "the default".to_owned(),
    };
    if let Some(url) = layered.get("GITSTATE_URL") {
        return (url, from("GITSTATE_URL", "url"));
    }
    if let Some(listen) = layered.get("GITSTATE_LISTEN") {
        let scheme = if layered.get("GITSTATE_TLS_CERT").is_some() {
            "https"
        } else {
            "http"
        };
        // What serve binds on every address is reached on loopback.
        let listen = listen
            .replacen("0.0.0.0:", "127.0.0.1:", 1)
            .replacen("[::]:", "[::1]:", 1);
        return (
            format!("{scheme}://{listen}"),
            format!(
                "{}, as `gitstate serve` listens",
                from("GITSTATE_LISTEN", "listen")
            ),
        );
    }
    (DEFAULT_URL.to_owned(), "the default".to_owned())
}

const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// Where the backend is and who we are to it.
pub struct Remote {
    pub url: String,
    /// Where the URL came from, for the message when it cannot be reached.
    pub from: String,
    pub user: String,
    pub password: String,
    http: reqwest::Client,
}

impl Remote {
    pub fn new(
        url: String,
        user: Option<String>,
        password: Option<String>,
    ) -> anyhow::Result<Self> {
        let user = user.context("no user: pass --user or set TF_HTTP_USERNAME")?;
        let password = password.context("no password: set TF_HTTP_PASSWORD")?;
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            from: "the default".to_owned(),
            user,
            password,
            http: reqwest::Client::new(),
        })
    }

    /// One request; any answer, with its status. Not reaching the backend is one line that says
    /// which URL was tried, where it came from and how to set it.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<String>,
    ) -> anyhow::Result<(reqwest::StatusCode, Answer)> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .query(query)
            .basic_auth(&self.user, Some(&self.password));
        if let Some(body) = body {
            request = request
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let branch = response
            .headers()
            .get(gitstate_http::BRANCH_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.text().await.context("reading the answer")?;
        Ok((status, Answer { body, branch }))
    }

    fn unreachable(&self, error: &reqwest::Error) -> anyhow::Error {
        let mut cause: &dyn std::error::Error = error;
        while let Some(source) = cause.source() {
            cause = source;
        }
        anyhow::anyhow!(
            "cannot reach the backend at {} (from {}): {cause}; start it with `gitstate serve`, \
             or name it with --url, GITSTATE_URL or `url` in gitstate.toml",
            self.url,
            self.from
        )
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<Answer> {
        let (status, answer) = self.send(method, path, query, None).await?;
        if !status.is_success() {
            bail!("{status}: {}", answer.body.trim());
        }
        Ok(answer)
    }

    /// The answer's text, as the backend sent it.
    pub async fn get(&self, path: &str) -> anyhow::Result<String> {
        Ok(self.call(reqwest::Method::GET, path, &[]).await?.body)
    }

    /// A GET with query parameters, and the branch the backend says it read.
    pub async fn get_on(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<Answer> {
        self.call(reqwest::Method::GET, path, query).await
    }

    /// A POST with query parameters, and the branch the backend says it wrote.
    pub async fn post_on(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<Answer> {
        self.call(reqwest::Method::POST, path, query).await
    }
}

/// A successful answer: its text, and the branch it came from when the backend says.
pub struct Answer {
    pub body: String,
    pub branch: Option<String>,
}

impl Answer {
    /// The branch as printed: the backend's word, else what was asked for, else its default.
    pub fn branch(&self, asked: Option<&str>) -> String {
        self.branch
            .clone()
            .or_else(|| asked.map(str::to_owned))
            .unwrap_or_else(|| "the backend's default branch".to_owned())
    }
}

/// A JSON answer as `T` (one of `gitstate_core::api`).
pub fn read<T: DeserializeOwned>(answer: &str) -> anyhow::Result<T> {
    serde_json::from_str(answer).context("the backend's answer")
}

/// `name@selector` → (name, selector); a selector is a serial or a commit id (prefix), so an `@`
/// followed by anything else is part of the name.
pub fn split_target(target: &str) -> (&str, Option<&str>) {
    match target.rsplit_once('@') {
        Some((name, selector))
            if !name.is_empty() && selector.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            (name, Some(selector).filter(|s| !s.is_empty()))
        }
        _ => (target, None),
    }
}

/// `90s`, `30m`, `2h`, `1d` or plain seconds.
pub fn parse_duration(text: &str) -> anyhow::Result<i64> {
    let (number, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, "s"),
    };
    let number: i64 = number
        .parse()
        .with_context(|| format!("{text:?} is not a duration like 90s, 30m, 2h or 1d"))?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => bail!("{text:?}: the unit must be s, m, h or d"),
    };
    Ok(number.saturating_mul(factor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_durations() {
        assert_eq!(parse_duration("2h").expect("valid"), 7200);
        assert_eq!(parse_duration("45").expect("valid"), 45);
        assert_eq!(parse_duration("1d").expect("valid"), 86400);
        assert!(parse_duration("2w").is_err());
        assert!(parse_duration("h").is_err());
        assert_eq!(split_target("a/b.tfstate@12"), ("a/b.tfstate", Some("12")));
        assert_eq!(
            split_target("a@b/c.tfstate@deadbeef"),
            ("a@b/c.tfstate", Some("deadbeef"))
        );
        assert_eq!(split_target("a/b.tfstate"), ("a/b.tfstate", None));
        assert_eq!(split_target("a/b.tfstate@"), ("a/b.tfstate", None));
        assert_eq!(split_target("team@x/b.tfstate"), ("team@x/b.tfstate", None));
        assert_eq!(split_target("@12"), ("@12", None));
    }
}
