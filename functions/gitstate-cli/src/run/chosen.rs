//! The state a run serves and where its name came from. A `state` in a settings file names the
//! state of the configuration beside that file: found from a directory below it (`cd`), or
//! with Terraform sent elsewhere (`-chdir`, `env -C`, `--workdir`), it would be another
//! configuration's state, and Terraform would plan to replace that configuration's resources
//! with its own. So a state from a file that was found, not named with `--config`, is taken
//! only where Terraform runs in that file's directory; the rest of the file (repository,
//! branch, …) is project-wide and holds from any directory below it. The run says at start
//! which state, repository and branch it uses, each with where it came from.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use gitstate_app::Settings;
use gitstate_app::layers::seed::HCL_KEYS;
use gitstate_app::layers::{Layered, Origin, SETTINGS, redact_userinfo};

const STATE: &str = "GITSTATE_STATE";

/// The state a run serves.
#[derive(Debug)]
pub struct Chosen {
    pub state: String,
    /// The file (and its key) the name was read from, when that file was found rather than
    /// named with `--config`.
    found_in: Option<(PathBuf, &'static str)>,
    /// What the run says at start: the state, the repository and the branch, each with its
    /// origin.
    pub start_line: String,
}

impl Chosen {
    /// `--state`, else the `state` setting; `named` is the file `--config` gave, if any.
    pub fn new(
        flag: Option<&str>,
        layered: &Layered,
        settings: &Settings,
        named: Option<&Path>,
    ) -> anyhow::Result<Self> {
        if let Some(state) = flag {
            return Ok(Self {
                state: state.to_owned(),
                found_in: None,
                start_line: start_line(state, "--state", layered, settings),
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
        let start_line = start_line(&state, &origin(STATE, layered), layered, settings);
        Ok(Self {
            state,
            found_in,
            start_line,
        })
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

/// The line a run prints at start: the state, the repository (or the embedded one) and the
/// branch, each with its origin. A URL's credentials are never shown.
fn start_line(state: &str, from: &str, layered: &Layered, settings: &Settings) -> String {
    let repository = match layered.get("GITSTATE_REPOSITORY") {
        Some(url) => format!(
            "repository {} ({})",
            redact_userinfo(&url),
            origin("GITSTATE_REPOSITORY", layered)
        ),
        None => format!(
            "embedded repository {} ({})",
            settings.git.local_repository.display(),
            origin("GITSTATE_LOCAL_REPOSITORY", layered)
        ),
    };
    format!(
        "gitstate run: state {state} ({from}), {repository}, branch {} ({})",
        settings.git.branch,
        origin("GITSTATE_REF", layered)
    )
}

/// Where `var`'s value came from, in the words a user would look for: the flag, the variable,
/// the file and key, or `default`.
fn origin(var: &str, layered: &Layered) -> String {
    let Some(spec) = SETTINGS.iter().find(|s| s.var == var) else {
        return "default".to_owned();
    };
    match layered.origin(var) {
        None => "default".to_owned(),
        Some(Origin::Flag) => format!("--{}", spec.flag()),
        Some(Origin::Env) => var.to_owned(),
        Some(Origin::File(path)) => format!("`{}` in {}", spec.key(), path.display()),
        Some(Origin::SeedEnv(name)) => (*name).to_owned(),
        Some(Origin::SeedFile(path)) => {
            let key = HCL_KEYS
                .iter()
                .find(|(_, v)| *v == var)
                .map_or("?", |(k, _)| k);
            format!("`{key}` in {}", path.display())
        }
        Some(other) => other.to_string(),
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
    use gitstate_app::Runtime;
    use gitstate_app::layers::seed::Seed;

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
            let settings = layered.settings(Runtime::Local).expect("settings");
            let found = Chosen::new(None, &layered, &settings, None).expect("a state");
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
            let named = Chosen::new(None, &layered, &settings, Some(&file)).expect("a state");
            assert!(named.check_dir(dir).is_ok(), "--config names it on purpose");
            let flag =
                Chosen::new(Some("app.tfstate"), &layered, &settings, None).expect("a state");
            assert!(flag.check_dir(dir).is_ok());
        }
    }

    /// The start line names state, repository and branch with their origins, for each source
    /// a value can come from (flag, GITSTATE_* variable, gitstate.toml, the seed's variable and
    /// file, the defaults), and never a token.
    #[test]
    fn the_start_line_says_each_value_and_where_it_came_from() {
        let url = "https://git.example/o/states.git";
        let file = Path::new("/p/gitstate.toml");
        // Flag, variable, file; a token that must not show.
        let env = |v: &str| match v {
            "GITSTATE_REPOSITORY" => Some(url.to_owned()),
            "GITSTATE_GIT_TOKEN" => Some("tok-secret-1".to_owned()),
            _ => None,
        };
        let layered = Layered::build(
            |v| (v == "GITSTATE_REF").then(|| "dev".to_owned()),
            env,
            Some((file, "state = \"a.tfstate\"\n")),
        )
        .expect("valid");
        let settings = layered.settings(Runtime::Local).expect("settings");
        let line = Chosen::new(None, &layered, &settings, None)
            .expect("a state")
            .start_line;
        assert_eq!(
            line,
            format!(
                "gitstate run: state a.tfstate (`state` in /p/gitstate.toml), repository {url} \
                 (GITSTATE_REPOSITORY), branch dev (--ref)"
            )
        );
        // The seed's variable and file, and its default branch.
        let seed_env = |v: &str| (v == "TF_BACKEND_GIT_GIT_STATE").then(|| "b.tfstate".to_owned());
        let hcl_text = format!("git.repository = \"{url}\"\n");
        let layered = Layered::build(|_| None, |_| None, None)
            .expect("valid")
            .with_seed(&Seed {
                env: &seed_env,
                hcl: Some((Path::new("terraform-backend-git.hcl"), &hcl_text)),
                interface: false,
            })
            .expect("valid");
        let settings = layered.settings(Runtime::Local).expect("settings");
        let line = Chosen::new(None, &layered, &settings, None)
            .expect("a state")
            .start_line;
        assert_eq!(
            line,
            format!(
                "gitstate run: state b.tfstate (TF_BACKEND_GIT_GIT_STATE), repository {url} \
                 (`git.repository` in terraform-backend-git.hcl), branch master \
                 (terraform-backend-git's default)"
            )
        );
        // --state, the embedded repository and the branch by default.
        let layered = Layered::build(|_| None, |_| None, None).expect("valid");
        let settings = layered.settings(Runtime::Local).expect("settings");
        let line = Chosen::new(Some("c.tfstate"), &layered, &settings, None)
            .expect("a state")
            .start_line;
        assert_eq!(
            line,
            format!(
                "gitstate run: state c.tfstate (--state), embedded repository {} (default), \
                 branch main (default)",
                settings.git.local_repository.display()
            )
        );
    }
}
