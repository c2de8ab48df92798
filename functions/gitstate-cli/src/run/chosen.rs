//! The state a run serves and where its name came from. A `state` in a settings file names the
//! state of the configuration beside that file: found from a directory below it (`cd`), or
//! with Terraform sent elsewhere (`-chdir`, `env -C`, `--workdir`), it would be another
//! configuration's state, and Terraform would plan to replace that configuration's resources
//! with its own. So a state from a file that was found, not named with `--config`, is taken
//! only where Terraform runs in that file's directory; the rest of the file (repository,
//! branch, …) is project-wide and holds from any directory below it.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use gitstate_app::layers::{Layered, Origin};

const STATE: &str = "GITSTATE_STATE";

/// The state a run serves.
#[derive(Debug)]
pub struct Chosen {
    pub state: String,
    /// The file (and its key) the name was read from, when that file was found rather than
    /// named with `--config`.
    found_in: Option<(PathBuf, &'static str)>,
}

impl Chosen {
    /// `--state`, else the `state` setting; `named` is the file `--config` gave, if any.
    pub fn new(
        flag: Option<&str>,
        layered: &Layered,
        named: Option<&Path>,
    ) -> anyhow::Result<Self> {
        if let Some(state) = flag {
            return Ok(Self {
                state: state.to_owned(),
                found_in: None,
            });
        }
        let state = layered.get(STATE).context(
            "no state: give --state, `state` in gitstate.toml, git.state in \
             terraform-backend-git.hcl or TF_BACKEND_GIT_GIT_STATE",
        )?;
        let found_in = match layered.origin(STATE) {
            Some(Origin::File(path)) if Some(path.as_path()) != named => {
                Some((path.clone(), "state"))
            }
            Some(Origin::SeedFile(path)) if Some(path.as_path()) != named => {
                Some((path.clone(), "git.state"))
            }
            _ => None,
        };
        Ok(Self { state, found_in })
    }

    /// Refuse a state read from a found file when Terraform runs in `dir`, not in that file's
    /// directory: one line naming the file, the state and the fix.
    pub fn check_dir(&self, dir: &Path) -> anyhow::Result<()> {
        let Some((file, key)) = &self.found_in else {
            return Ok(());
        };
        let file_dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let (file_dir, dir) = (absolute(file_dir), absolute(dir));
        if file_dir == dir {
            return Ok(());
        }
        bail!(
            "gitstate run: refusing to start the program: `{key}` in {} names {:?}, the state of \
             the configuration in {}, but Terraform runs in {}. Name this configuration's state \
             with --state NAME (or GITSTATE_STATE)",
            absolute(file).display(),
            self.state,
            file_dir.display(),
            dir.display()
        )
    }
}

/// `path` with links resolved, or as given made absolute when it cannot be resolved.
fn absolute(path: &Path) -> PathBuf {
    path.canonicalize()
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layered(file: &Path) -> Layered {
        Layered::build(
            |_| None,
            |_| None,
            Some((file, "state = \"network/prod.tfstate\"\n")),
        )
        .expect("valid")
    }

    /// Every relation between the file's directory and Terraform's (the same, below, above,
    /// beside, the same through a link), for a found file, a named one and `--state`.
    #[test]
    fn a_found_files_state_holds_only_in_its_own_directory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("mono");
        let (below, beside) = (root.join("infra/app"), tmp.path().join("other"));
        for dir in [&below, &beside] {
            std::fs::create_dir_all(dir).expect("dir");
        }
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&root, &link).expect("symlink");
        let file = root.join("gitstate.toml");
        std::fs::write(&file, "").expect("file");
        let layered = layered(&file);
        for (dir, ok) in [
            (&root, true),
            (&link, true),
            (&below, false),
            (&tmp.path().to_path_buf(), false),
            (&beside, false),
        ] {
            let found = Chosen::new(None, &layered, None).expect("a state");
            assert_eq!(found.state, "network/prod.tfstate");
            let checked = found.check_dir(dir);
            assert_eq!(checked.is_ok(), ok, "{}: {checked:?}", dir.display());
            if let Err(e) = checked {
                let e = e.to_string();
                assert!(
                    e.contains(&file.display().to_string())
                        && e.contains("--state")
                        && !e.contains('\n'),
                    "{e}"
                );
            }
            let named = Chosen::new(None, &layered, Some(&file)).expect("a state");
            assert!(named.check_dir(dir).is_ok(), "--config names it on purpose");
            let flag = Chosen::new(Some("app.tfstate"), &layered, None).expect("a state");
            assert!(flag.check_dir(dir).is_ok());
        }
    }
}
