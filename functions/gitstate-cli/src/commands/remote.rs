//! Commands that read or act through a running backend: history, show, restore, list, locks.
//! `--json` prints the backend's answer as it came; otherwise a table of the typed answer.

use gitstate_core::api::{HistoryAnswer, ListedLock, ListedState, Restored};

use crate::client::{self, RemoteArgs};
use crate::tables;

pub async fn history(
    name: &str,
    page: usize,
    per_page: usize,
    remote: &RemoteArgs,
) -> anyhow::Result<()> {
    let answer = remote
        .remote()?
        .get(&format!("/history/{name}?page={page}&per_page={per_page}"))
        .await?;
    if remote.json {
        println!("{answer}");
    } else {
        println!(
            "{}",
            tables::history(&client::read::<HistoryAnswer>(&answer)?)
        );
    }
    Ok(())
}

/// One revision's state, always as the backend sent it.
pub async fn show(target: &str, remote: &RemoteArgs) -> anyhow::Result<()> {
    let (name, selector) = client::split_target(target)?;
    let answer = remote
        .remote()?
        .get(&format!("/history/{name}?at={selector}"))
        .await?;
    println!("{answer}");
    Ok(())
}

pub async fn restore(target: &str, remote: &RemoteArgs) -> anyhow::Result<()> {
    let (name, selector) = client::split_target(target)?;
    let answer = remote
        .remote()?
        .post(&format!("/history/{name}?restore={selector}"))
        .await?;
    if remote.json {
        println!("{answer}");
    } else {
        let restored: Restored = client::read(&answer)?;
        println!(
            "restored {name} from {} as serial {}",
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
