//! Commands that read or act through a running backend: history, show, restore, list, locks.
//! `--json` prints the backend's answer as it came; otherwise a table of the typed answer.

use gitstate_core::api::{HistoryAnswer, ListedLock, ListedState, Restored};

use anyhow::Context;

use crate::client::{self, Remote, RemoteArgs};
use crate::tables;

/// `?ref=` when a branch is named.
pub fn on(branch: Option<&str>) -> Vec<(&str, &str)> {
    branch.map(|b| ("ref", b)).into_iter().collect()
}

pub async fn history(
    name: &str,
    page: usize,
    per_page: usize,
    branch: Option<&str>,
    remote: &RemoteArgs,
) -> anyhow::Result<()> {
    let (page, per_page) = (page.to_string(), per_page.to_string());
    let mut query = on(branch);
    query.extend([("page", page.as_str()), ("per_page", per_page.as_str())]);
    let answer = remote
        .remote()?
        .get_on(&format!("/history/{name}"), &query)
        .await?;
    if remote.json {
        println!("{}", answer.body);
    } else {
        println!("{name} on branch {}", answer.branch(branch));
        println!(
            "{}",
            tables::history(&client::read::<HistoryAnswer>(&answer.body)?)
        );
    }
    Ok(())
}

/// One revision's state, always as the backend sent it (standard output); which one, and from
/// which branch, on standard error. Without `@`, the newest revision.
pub async fn show(target: &str, branch: Option<&str>, remote: &RemoteArgs) -> anyhow::Result<()> {
    let (name, selector) = client::split_target(target);
    let remote = remote.remote()?;
    let newest;
    let selector = match selector {
        Some(selector) => selector,
        None => {
            newest = newest_version(&remote, name, branch).await?;
            newest.as_str()
        }
    };
    let mut query = on(branch);
    query.push(("at", selector));
    let answer = remote.get_on(&format!("/history/{name}"), &query).await?;
    eprintln!("{name}@{selector} on branch {}", answer.branch(branch));
    println!("{}", answer.body);
    Ok(())
}

/// The newest revision of `name`: it must hold the state (a removal is said as such).
async fn newest_version(
    remote: &Remote,
    name: &str,
    branch: Option<&str>,
) -> anyhow::Result<String> {
    let mut query = on(branch);
    query.extend([("page", "0"), ("per_page", "1")]);
    let answer = remote.get_on(&format!("/history/{name}"), &query).await?;
    let history: HistoryAnswer = client::read(&answer.body)?;
    match history.versions.first() {
        None => anyhow::bail!(
            "{name} has no revisions on branch {}",
            answer.branch(branch)
        ),
        Some(newest) if newest.deleted => anyhow::bail!(
            "{name} was removed by {} (revision {}); `gitstate history {name}` lists the \
             revisions before, `gitstate restore {name}@<revision>` brings one back",
            tables::printable(&newest.author),
            newest.version
        ),
        Some(newest) => Ok(newest.version.clone()),
    }
}

pub async fn restore(
    target: &str,
    branch: Option<&str>,
    remote: &RemoteArgs,
) -> anyhow::Result<()> {
    let (name, selector) = client::split_target(target);
    let selector = selector.with_context(|| {
        format!("name the revision to restore: {name}@<serial or commit id> (`gitstate history {name}` lists them)")
    })?;
    let mut query = on(branch);
    query.push(("restore", selector));
    let answer = remote
        .remote()?
        .post_on(&format!("/history/{name}"), &query)
        .await?;
    if remote.json {
        println!("{}", answer.body);
    } else {
        let restored: Restored = client::read(&answer.body)?;
        println!(
            "restored {name} on branch {} from {} as serial {}",
            answer.branch(branch),
            tables::printable(&restored.from),
            restored.serial
        );
    }
    Ok(())
}

pub async fn list(filter: Option<&str>, remote: &RemoteArgs) -> anyhow::Result<()> {
    let answer = remote.remote()?.get("/states").await?;
    if remote.json {
        println!("{answer}");
    } else {
        let states: Vec<ListedState> = client::read(&answer)?;
        let table = tables::states(&states, filter.unwrap_or_default());
        println!("{}", table.as_deref().unwrap_or("no states"));
    }
    Ok(())
}

pub async fn locks(older_than: &str, remote: &RemoteArgs) -> anyhow::Result<()> {
    let stale_after = client::parse_duration(older_than)?;
    let answer = remote.remote()?.get("/locks").await?;
    if remote.json {
        println!("{answer}");
    } else {
        let locks: Vec<ListedLock> = client::read(&answer)?;
        let table = tables::locks(&locks, stale_after);
        println!("{}", table.as_deref().unwrap_or("no locks held"));
    }
    Ok(())
}
