//! terraform-backend-git's `SSH_PRIVATE_KEY` and `StrictHostKeyChecking` for this process.
//!
//! gitstate's git client runs the ssh command `GIT_SSH_COMMAND` names in the process
//! environment, which a running process cannot change (no unsafe code): when the seed's
//! variables ask for a key or a host key rule, the same command line runs again as a child with
//! `GIT_SSH_COMMAND` made from them ([`SeedSsh::command`]). A key given as text goes to a file
//! only this user can read, in a directory of its own, removed when the child ends; its text
//! never reaches a log, the child's environment or `gitstate config`.

use std::io::{IsTerminal, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use gitstate_app::layers::seed::ssh::{
    SEED_SSH_KEY, SEED_SSH_ORIGIN, SeedSsh, SshKey, key_file_text,
};
use rustix::process::{Pid, Signal, kill_process};
use tokio::signal::unix::{SignalKind, signal};

/// A key written for ssh: removed (with its directory) on drop.
struct KeyFile {
    dir: PathBuf,
    file: PathBuf,
}

impl KeyFile {
    fn write(text: &str) -> anyhow::Result<Self> {
        // A random name: another user cannot have made it first.
        let nonce: String = gitstate_core::password::generate_token()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(16)
            .collect();
        let dir = std::env::temp_dir().join(format!("gitstate-ssh-{}-{nonce}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let key = Self {
            file: dir.join("key"),
            dir,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key.file)
            .with_context(|| format!("writing the {SEED_SSH_KEY} key file"))?;
        file.write_all(key_file_text(text).as_bytes())
            .with_context(|| format!("writing the {SEED_SSH_KEY} key file"))?;
        Ok(key)
    }

    fn path(&self) -> &Path {
        &self.file
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// When the seed's SSH variables apply (and neither `GIT_SSH_COMMAND` nor `GIT_SSH` is set):
/// run this command line again with the ssh command they make, and return its exit code.
/// `None`: nothing to do, carry on in this process.
pub async fn rerun() -> anyhow::Result<Option<i32>> {
    let Some(seed) = SeedSsh::from_env(&|name| std::env::var(name).ok())? else {
        return Ok(None);
    };
    let key = match &seed.key {
        Some(SshKey::Text(text)) => Some(KeyFile::write(text.expose())?),
        _ => None,
    };
    let command = seed.command(key.as_ref().map(KeyFile::path));
    let mut child = tokio::process::Command::new(
        std::env::current_exe().context("finding the gitstate binary")?,
    );
    child
        .args(std::env::args_os().skip(1))
        .env("GIT_SSH_COMMAND", &command)
        .env(SEED_SSH_ORIGIN, seed.origin());
    if key.is_some() {
        // The text is in the file now; the child and what it runs need no copy of it.
        child.env_remove(SEED_SSH_KEY);
    }
    // The handlers come first: a signal between the spawn and them would end this process and
    // leave the key file behind.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    // At a terminal, Ctrl-C reaches the child from the terminal itself; elsewhere only this
    // process gets it, and passes it on.
    let at_terminal = std::io::stdin().is_terminal();
    let mut child = child
        .spawn()
        .context("running gitstate again with the ssh key")?;
    let pid = child.id().and_then(|id| Pid::from_raw(id as i32));
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.context("waiting for gitstate")?,
            _ = terminate.recv() => forward(pid, Signal::TERM),
            _ = hangup.recv() => forward(pid, Signal::HUP),
            _ = interrupt.recv() => if !at_terminal { forward(pid, Signal::INT) },
        }
    };
    drop(key);
    Ok(Some(exit_code(status)))
}

fn forward(pid: Option<Pid>, signal: Signal) {
    if let Some(pid) = pid {
        let _ = kill_process(pid, signal);
    }
}

/// The child's exit code, or 128 + the signal that ended it, as a shell reports it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// `gitstate config`'s line for the ssh command: where it came from, its value only when
/// gitstate made it (a command of the user's own may hold anything).
pub fn report() -> Option<(String, String)> {
    let command = std::env::var("GIT_SSH_COMMAND")
        .ok()
        .filter(|c| !c.trim().is_empty())?;
    Some(match std::env::var(SEED_SSH_ORIGIN) {
        Ok(origin) => (command, format!("env {origin} (terraform-backend-git)")),
        Err(_) => {
            let ignored = [SEED_SSH_KEY, "StrictHostKeyChecking"]
                .iter()
                .filter(|v| std::env::var_os(v).is_some())
                .copied()
                .collect::<Vec<_>>();
            let note = if ignored.is_empty() {
                String::new()
            } else {
                format!(" ({} ignored: it wins)", ignored.join(", "))
            };
            ("(set)".to_owned(), format!("env GIT_SSH_COMMAND{note}"))
        }
    })
}
