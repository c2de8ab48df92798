//! terraform-backend-git's SSH variables: `SSH_PRIVATE_KEY` (the path of a key, or the key's
//! text itself, as CI secrets often carry it) and `StrictHostKeyChecking` (`no`: any host key
//! is accepted, and none is recorded). gitstate reaches SSH remotes through the system `ssh`
//! named by `GIT_SSH_COMMAND`; these variables become that command when neither
//! `GIT_SSH_COMMAND` nor `GIT_SSH` is set (gitstate's and git's own names win).

use std::path::{Path, PathBuf};

use gitstate_core::secret::Secret;

use crate::layers::LayerError;

/// The seed's key variable.
pub const SEED_SSH_KEY: &str = "SSH_PRIVATE_KEY";
/// The seed's host key switch (spelt as ssh's option).
pub const SEED_HOST_KEY_CHECKING: &str = "StrictHostKeyChecking";
/// Set by gitstate on the process it runs with the command made here: which seed variables it
/// came from (no secret), for `gitstate config`.
pub const SEED_SSH_ORIGIN: &str = "GITSTATE_SEED_SSH";

/// The key `SSH_PRIVATE_KEY` names.
pub enum SshKey {
    Path(PathBuf),
    /// The key's text: written to a private file for `ssh -i`, never shown.
    Text(Secret),
}

/// What the seed's SSH variables ask of `ssh`.
pub struct SeedSsh {
    pub key: Option<SshKey>,
    /// `yes`, `no`, `accept-new`, `ask` or `off`.
    pub host_key_checking: Option<String>,
}

impl SeedSsh {
    /// The seed's SSH variables in `env`, unless `GIT_SSH_COMMAND` or `GIT_SSH` is set or
    /// neither variable is. A path that does not exist, or a host key value ssh does not know,
    /// is an error now rather than an ssh failure later.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Self>, LayerError> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if set("GIT_SSH_COMMAND").is_some() || set("GIT_SSH").is_some() {
            return Ok(None);
        }
        let key = match set(SEED_SSH_KEY) {
            Some(text) if text.contains("-----BEGIN ") => Some(SshKey::Text(Secret::new(text))),
            Some(path) => {
                let path = PathBuf::from(path.trim());
                if !path.is_file() {
                    return Err(LayerError::Seed(format!(
                        "{SEED_SSH_KEY}: {} is not a file (give the key's path or its text)",
                        path.display()
                    )));
                }
                Some(SshKey::Path(path))
            }
            None => None,
        };
        let host_key_checking = match set(SEED_HOST_KEY_CHECKING) {
            Some(value) => {
                let value = value.trim().to_ascii_lowercase();
                if !["yes", "no", "accept-new", "ask", "off"].contains(&value.as_str()) {
                    return Err(LayerError::Seed(format!(
                        "{SEED_HOST_KEY_CHECKING}: {value:?} is none of yes, no, accept-new, \
                         ask, off"
                    )));
                }
                Some(value)
            }
            None => None,
        };
        if key.is_none() && host_key_checking.is_none() {
            return Ok(None);
        }
        Ok(Some(Self {
            key,
            host_key_checking,
        }))
    }

    /// The variables this came from, for `gitstate config`.
    pub fn origin(&self) -> String {
        let names: Vec<&str> = [
            self.key.as_ref().map(|_| SEED_SSH_KEY),
            self.host_key_checking
                .as_ref()
                .map(|_| SEED_HOST_KEY_CHECKING),
        ]
        .into_iter()
        .flatten()
        .collect();
        names.join(", ")
    }

    /// `GIT_SSH_COMMAND` for these variables, the key at `key_file` (where a key given as text
    /// was written; a key given as a path is used where it is). Never prompts (`BatchMode`),
    /// as the seed never did; `no` also records no host key, as the seed recorded none.
    pub fn command(&self, key_file: Option<&Path>) -> String {
        let mut command = String::from("ssh -o BatchMode=yes");
        let key = match &self.key {
            Some(SshKey::Path(path)) => Some(path.as_path()),
            Some(SshKey::Text(_)) => key_file,
            None => None,
        };
        if let Some(path) = key {
            command.push_str(" -i ");
            command.push_str(&shell_quote(&path.to_string_lossy()));
        }
        if let Some(checking) = &self.host_key_checking {
            command.push_str(&format!(" -o StrictHostKeyChecking={checking}"));
            if checking == "no" || checking == "off" {
                command.push_str(" -o UserKnownHostsFile=/dev/null");
            }
        }
        command
    }
}

/// `text` as one word for `sh`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The key's text as `ssh` reads a key file: line breaks restored when the variable carried
/// them as `\n`, and a final one.
pub fn key_file_text(text: &str) -> String {
    let text = if text.contains('\n') {
        text.replace("\r\n", "\n")
    } else {
        text.replace("\\n", "\n")
    };
    format!("{}\n", text.trim())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Option<SeedSsh>, LayerError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        SeedSsh::from_env(&|name| map.get(name).cloned())
    }

    const KEY: &str =
        "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----";

    /// Every combination of the four variables: git's names win, the seed's make a command
    /// that quotes the path and never holds the key's text.
    #[test]
    fn the_seed_variables_become_an_ssh_command_unless_git_names_win() {
        let dir = std::env::temp_dir();
        let path = dir.join("gitstate ssh 'key");
        std::fs::write(&path, KEY).expect("key file");
        let path_text = path.display().to_string();
        let keys = [None, Some(KEY), Some(path_text.as_str())];
        let checks = [None, Some("no"), Some("accept-new"), Some("yes")];
        let gits = [
            None,
            Some(("GIT_SSH_COMMAND", "ssh -v")),
            Some(("GIT_SSH", "x")),
        ];
        for key in keys {
            for check in checks {
                for git in gits {
                    let mut vars = Vec::new();
                    vars.extend(key.map(|k| (SEED_SSH_KEY, k)));
                    vars.extend(check.map(|c| (SEED_HOST_KEY_CHECKING, c)));
                    vars.extend(git);
                    let seed = from(&vars).expect("valid");
                    let Some(seed) = seed else {
                        assert!(git.is_some() || (key.is_none() && check.is_none()));
                        continue;
                    };
                    assert!(git.is_none());
                    let command = seed.command(Some(Path::new("/run/k")));
                    assert!(!command.contains("AAAA"), "{command}");
                    assert!(command.starts_with("ssh -o BatchMode=yes"), "{command}");
                    match key {
                        Some(KEY) => assert!(command.contains(" -i '/run/k'"), "{command}"),
                        Some(_) => assert!(
                            command.contains(&format!(" -i {}", shell_quote(&path_text))),
                            "{command}"
                        ),
                        None => assert!(!command.contains(" -i "), "{command}"),
                    }
                    match check {
                        Some(c) => {
                            assert!(command.contains(&format!("StrictHostKeyChecking={c}")));
                            assert_eq!(command.contains("/dev/null"), c == "no", "{command}");
                        }
                        None => assert!(!command.contains("StrictHostKeyChecking")),
                    }
                    assert_eq!(
                        seed.origin().contains(SEED_SSH_KEY),
                        key.is_some(),
                        "{}",
                        seed.origin()
                    );
                }
            }
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_missing_key_file_or_an_unknown_checking_value_is_refused() {
        let missing = from(&[(SEED_SSH_KEY, "/nonexistent/id_rsa")]);
        assert!(
            matches!(&missing, Err(LayerError::Seed(m)) if m.contains("/nonexistent/id_rsa")),
            "refused"
        );
        let bad = from(&[(SEED_HOST_KEY_CHECKING, "maybe")]);
        assert!(matches!(&bad, Err(LayerError::Seed(m)) if m.contains("maybe")));
    }

    #[test]
    fn key_text_gets_its_line_breaks_back() {
        let flat = KEY.replace('\n', "\\n");
        assert_eq!(key_file_text(&flat), format!("{KEY}\n"));
        assert_eq!(key_file_text(&format!("{KEY}\r\n")), format!("{KEY}\n"));
        assert_eq!(key_file_text(&format!("  {KEY}")), format!("{KEY}\n"));
    }
}
