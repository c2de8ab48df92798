//! Talking to a running backend: where it is, who we are, and its answers as typed values.

use anyhow::{Context, bail};
use serde::de::DeserializeOwned;

/// The backend and the credentials of the commands that call it.
#[derive(clap::Args)]
pub struct RemoteArgs {
    /// The backend's base URL.
    #[arg(long, env = "GITSTATE_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    #[arg(long, env = "TF_HTTP_USERNAME")]
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
        Remote::new(self.url.clone(), self.user.clone(), self.password.clone())
    }
}

/// Where the backend is and who we are to it.
pub struct Remote {
    pub url: String,
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
            user,
            password,
            http: reqwest::Client::new(),
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<Answer> {
        let response = self
            .http
            .request(method, format!("{}{path}", self.url))
            .query(query)
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .with_context(|| format!("reaching {}", self.url))?;
        let status = response.status();
        let branch = response
            .headers()
            .get(gitstate_http::BRANCH_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.text().await.context("reading the answer")?;
        if !status.is_success() {
            bail!("{status}: {}", body.trim());
        }
        Ok(Answer { body, branch })
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

/// `name@selector` → (name, selector).
pub fn split_target(target: &str) -> anyhow::Result<(&str, &str)> {
    target
        .rsplit_once('@')
        .filter(|(n, s)| !n.is_empty() && !s.is_empty())
        .context("write the revision as <state>@<serial or commit id>, e.g. app/prod.tfstate@12")
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
        assert_eq!(
            split_target("a/b.tfstate@12").expect("valid"),
            ("a/b.tfstate", "12")
        );
        assert_eq!(
            split_target("a@b/c.tfstate@deadbeef").expect("valid"),
            ("a@b/c.tfstate", "deadbeef")
        );
        assert!(split_target("a/b.tfstate").is_err());
        assert!(split_target("a/b.tfstate@").is_err());
    }
}
