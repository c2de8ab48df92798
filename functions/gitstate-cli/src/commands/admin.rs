//! `gitstate unlock` and `gitstate remove`: what an administrator does to a state without a
//! Terraform directory, through a running backend.

use anyhow::bail;
use reqwest::{Method, StatusCode};

use crate::client::{Remote, RemoteArgs};
use crate::commands::remote::on;
use crate::tables;

/// Release the lock on `name`: the one with `id`, or the one held when this looks (a
/// force-unlock, which the backend allows administrators alone).
pub async fn unlock(
    name: &str,
    id: Option<&str>,
    branch: Option<&str>,
    remote: &RemoteArgs,
) -> anyhow::Result<()> {
    let remote = remote.remote()?;
    let query = on(branch);
    let path = format!("/locks/{name}");
    let (status, held) = remote.send(Method::GET, &path, &query, None).await?;
    if status == StatusCode::CONFLICT {
        println!("no lock held on {name} on branch {}", held.branch(branch));
        return Ok(());
    }
    if !status.is_success() {
        bail!("{status}: {}", held.body.trim());
    }
    let holder = describe(&held.body);
    // Without --id, the lock just read is the one released: a lock taken since (another run's)
    // stays, and the answer says so.
    let read: serde_json::Value = serde_json::from_str(&held.body).unwrap_or_default();
    let id = id.or_else(|| read["ID"].as_str().filter(|id| !id.is_empty()));
    let body = id.map(|id| serde_json::json!({ "ID": id }).to_string());
    let (status, answer) = remote.send(Method::DELETE, &path, &query, body).await?;
    if !status.is_success() {
        bail!("{status}: {}", answer.body.trim());
    }
    println!(
        "released the lock on {name} on branch {}: {holder}",
        answer.branch(branch)
    );
    Ok(())
}

/// `ID … held by WHO for OPERATION`, from a LockInfo.
fn describe(lock_info: &str) -> String {
    let info: serde_json::Value = serde_json::from_str(lock_info).unwrap_or_default();
    let field = |key: &str| tables::printable(info[key].as_str().unwrap_or("?"));
    format!(
        "ID {} held by {} ({})",
        field("ID"),
        field("Who"),
        field("Operation")
    )
}

/// Remove `name` from the branch (admin), under a lock of its own. The commit that removes it is
/// one more revision: the state stays in the history and `restore` brings it back.
pub async fn remove(
    name: &str,
    yes: bool,
    branch: Option<&str>,
    remote: &RemoteArgs,
) -> anyhow::Result<()> {
    if !yes {
        bail!(
            "removing {name} makes Terraform see no state there: pass --yes to remove it (it \
             stays in the git history, and `gitstate restore` brings it back)"
        );
    }
    let remote = remote.remote()?;
    let id = format!(
        "gitstate-remove-{}-{}",
        std::process::id(),
        jiff::Timestamp::now().as_nanosecond()
    );
    let lock = serde_json::json!({
        "ID": id,
        "Operation": "OperationTypeRemove",
        "Info": "gitstate remove",
        "Who": format!("{}@gitstate-cli", remote.user),
        "Created": jiff::Timestamp::now().to_string(),
        "Path": "",
    })
    .to_string();
    let lock_path = format!("/locks/{name}");
    let query = on(branch);
    let (status, answer) = remote
        .send(Method::POST, &lock_path, &query, Some(lock.clone()))
        .await?;
    if status == StatusCode::LOCKED || status == StatusCode::CONFLICT {
        bail!(
            "{name} is locked: {}; if that run is gone, `gitstate unlock {name}` first",
            describe(&answer.body)
        );
    }
    if !status.is_success() {
        bail!("{status}: {}", answer.body.trim());
    }
    let removed = delete(&remote, name, &id, &query).await;
    // The lock goes whatever the removal did: none is left behind.
    let (status, answer) = remote
        .send(Method::DELETE, &lock_path, &query, Some(lock))
        .await?;
    let branch = removed?;
    if !status.is_success() {
        bail!(
            "{name} was removed, but its lock {id} was not released ({status}: {}): `gitstate unlock {name}`",
            answer.body.trim()
        );
    }
    println!(
        "removed {name} from branch {branch}. It stays in the git history: `gitstate history \
         {name}` lists its revisions, `gitstate restore {name}@<revision>` brings one back"
    );
    Ok(())
}

/// `DELETE /states/<name>` under lock `id`; the branch it was removed from.
async fn delete(
    remote: &Remote,
    name: &str,
    id: &str,
    query: &[(&str, &str)],
) -> anyhow::Result<String> {
    let mut query = query.to_vec();
    query.push(("ID", id));
    let (status, answer) = remote
        .send(Method::DELETE, &format!("/states/{name}"), &query, None)
        .await?;
    if status == StatusCode::NOT_FOUND {
        bail!(
            "no state {name} to remove on branch {}",
            answer.branch(None)
        );
    }
    if !status.is_success() {
        bail!("{status}: {}", answer.body.trim());
    }
    Ok(answer.branch(query.iter().find(|(k, _)| *k == "ref").map(|(_, v)| *v)))
}
