//! Where each setting comes from for local use: a command-line flag, then its `GITSTATE_*`
//! variable, then a TOML file (`gitstate.toml` or `--config PATH`). The result is a lookup that
//! [`Settings::from_lookup`] reads like the environment, so a new setting is one line of
//! [`SETTINGS`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::settings::{ConfigError, Runtime, Settings};

pub mod concerns;
mod names;
pub mod seed;
mod specs;

pub use concerns::Concern;
pub use names::{check_environment, nearest};
pub use specs::{SETTINGS, Spec};

/// `GITSTATE_*` variables gitstate reads that are not settings: the origin of an ssh command
/// gitstate made from terraform-backend-git's variables.
pub const OTHER_VARIABLES: &[&str] = &[seed::ssh::SEED_SSH_ORIGIN];

/// Where an effective value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Flag,
    Env,
    File(PathBuf),
    /// One of terraform-backend-git's variables ([`seed::SEED_VARIABLES`]).
    SeedEnv(&'static str),
    /// terraform-backend-git's `terraform-backend-git.hcl`.
    SeedFile(PathBuf),
    /// terraform-backend-git's default, where its interface is used.
    SeedDefault,
    /// The store found in this directory above the working directory ([`find_root`]).
    Found(PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flag => f.write_str("flag"),
            Self::Env => f.write_str("environment"),
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::SeedEnv(var) => write!(f, "env {var} (terraform-backend-git)"),
            Self::SeedFile(path) => write!(f, "file {} (terraform-backend-git)", path.display()),
            Self::SeedDefault => f.write_str("terraform-backend-git's default"),
            Self::Found(root) => write!(f, "the store found in {}", root.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not valid TOML: {reason}", path.display())]
    Syntax { path: PathBuf, reason: String },
    #[error("{}: unknown key `{key}`{hint}", path.display())]
    UnknownKey {
        path: PathBuf,
        key: String,
        hint: String,
    },
    #[error("{}: `{key}` must be a string, number, boolean or list of strings", path.display())]
    BadValue { path: PathBuf, key: String },
    #[error("{}: `{key}` is empty: give it a value or remove the line", path.display())]
    EmptyValue { path: PathBuf, key: String },
    #[error("the flag --{flag} is empty: give it a value or leave it out")]
    EmptyFlag { flag: String },
    #[error("{0}")]
    Environment(String),
    #[error("{0}")]
    Seed(String),
}

/// What marks the directory a store belongs to: its settings file, or its embedded repository.
pub const CONFIG_FILE: &str = "gitstate.toml";
pub const EMBEDDED_REPOSITORY: &str = ".gitstate/repo.git";

/// The directory of the store a process started in `start` uses, found as git finds `.git`:
/// `start` or its nearest parent holding `gitstate.toml` or `.gitstate/repo.git`. The same
/// store from any subdirectory, and through Terraform's `-chdir`.
pub fn find_root(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|dir| dir.join(CONFIG_FILE).is_file() || dir.join(EMBEDDED_REPOSITORY).is_dir())
        .map(Path::to_path_buf)
}

/// The file found for this run: `--config PATH` (must exist), or the `gitstate.toml` of the
/// [`find_root`] of the working directory (if there is one).
pub fn find_file(explicit: Option<&Path>) -> Result<Option<(PathBuf, String)>, LayerError> {
    let found = || {
        let cwd = std::env::current_dir().ok()?;
        let root = find_root(&cwd)?;
        // Shown relative when it is the working directory's own, as before.
        Some(if root == cwd {
            PathBuf::from(CONFIG_FILE)
        } else {
            root.join(CONFIG_FILE)
        })
    };
    let (path, required) = match explicit {
        Some(path) => (path.to_path_buf(), true),
        None => match found() {
            Some(path) => (path, false),
            None => return Ok(None),
        },
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some((path, text))),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LayerError::Read { path, source }),
    }
}

/// The effective raw values of [`SETTINGS`] and their origins.
#[derive(Clone, Default)]
pub struct Layered {
    values: BTreeMap<&'static str, (String, Origin)>,
    /// terraform-backend-git's Basic-auth password, hashed into `GITSTATE_ADMIN_HASH` when the
    /// settings are read.
    seed_password: Option<gitstate_core::secret::Secret>,
    /// terraform-backend-git's sops variables ([`seed::SEED_SOPS_VARIABLES`]) as set, read by
    /// the encryption settings under their own names.
    seed_sops: BTreeMap<&'static str, String>,
}

impl fmt::Debug for Layered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.report()
                    .into_iter()
                    .map(|(spec, shown, _)| (spec.var, shown)),
            )
            .finish()
    }
}

impl Layered {
    /// Flags first, then the environment, then the file (path and text).
    pub fn build(
        flag: impl Fn(&str) -> Option<String>,
        env: impl Fn(&str) -> Option<String>,
        file: Option<(&Path, &str)>,
    ) -> Result<Self, LayerError> {
        let from_file = match file {
            Some((path, text)) => parse_file(path, text)?,
            None => BTreeMap::new(),
        };
        let mut values = BTreeMap::new();
        for spec in SETTINGS {
            let flagged = flag(spec.var);
            if flagged.as_ref().is_some_and(|v| v.trim().is_empty()) {
                return Err(LayerError::EmptyFlag { flag: spec.flag() });
            }
            let from_env = env(spec.var);
            if from_env.as_ref().is_some_and(|v| v.trim().is_empty()) {
                return Err(LayerError::Environment(format!(
                    "{} is set but empty: give it a value or unset it",
                    spec.var
                )));
            }
            let chosen = flagged
                .map(|v| (v, Origin::Flag))
                .or_else(|| from_env.map(|v| (v, Origin::Env)))
                .or_else(|| {
                    let (path, value) = (file?.0, from_file.get(spec.var)?.clone());
                    Some((value, Origin::File(path.to_path_buf())))
                });
            if let Some(chosen) = chosen {
                values.insert(spec.var, chosen);
            }
        }
        Ok(Self {
            values,
            seed_password: None,
            seed_sops: BTreeMap::new(),
        })
    }

    pub fn get(&self, var: &str) -> Option<String> {
        self.values.get(var).map(|(v, _)| v.clone())
    }

    /// The embedded repository of the store found above the working directory: set as the
    /// `GITSTATE_LOCAL_REPOSITORY` when nothing else sets it and `root` is not the working
    /// directory itself (where the default already points). A relative value from a file is
    /// taken relative to that file's directory, so it names one place from anywhere.
    pub fn with_root(mut self, root: Option<&Path>) -> Self {
        const VAR: &str = "GITSTATE_LOCAL_REPOSITORY";
        match self.values.get_mut(VAR) {
            Some((value, Origin::File(file))) if Path::new(value.as_str()).is_relative() => {
                if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                    *value = dir.join(value.as_str()).display().to_string();
                }
            }
            Some(_) => {}
            None => {
                let cwd = std::env::current_dir().ok();
                if let Some(root) = root.filter(|r| Some(*r) != cwd.as_deref()) {
                    self.values.insert(
                        VAR,
                        (
                            root.join(EMBEDDED_REPOSITORY).display().to_string(),
                            Origin::Found(root.to_path_buf()),
                        ),
                    );
                }
            }
        }
        self
    }

    pub fn origin(&self, var: &str) -> Option<&Origin> {
        self.values.get(var).map(|(_, o)| o)
    }

    /// Whether a yes/no setting is on (`true`/`1`); anything else but `false`/`0` is an error.
    pub fn flag_on(&self, var: &'static str) -> Result<bool, ConfigError> {
        match self.get(var).as_deref().map(str::trim) {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(ConfigError::Invalid {
                var,
                reason: format!("{other:?} is not true or false"),
            }),
        }
    }

    pub fn settings(&self, runtime: Runtime) -> Result<Settings, ConfigError> {
        let seed_hash = match (&self.seed_password, self.origin("GITSTATE_ADMIN_HASH")) {
            (Some(password), Some(Origin::SeedEnv(_))) => Some(
                gitstate_core::password::hash_secret(password.expose().as_bytes()).map_err(
                    |e| ConfigError::Invalid {
                        var: "GITSTATE_ADMIN_HASH",
                        reason: format!("hashing {}: {e}", seed::SEED_PASSWORD),
                    },
                )?,
            ),
            _ => None,
        };
        Settings::from_lookup(runtime, |var| match (var, &seed_hash) {
            ("GITSTATE_ADMIN_HASH", Some(hash)) => Some(hash.clone()),
            _ => self.get(var).or_else(|| self.seed_sops.get(var).cloned()),
        })
    }

    /// Every setting with the value to show (secrets and URL passwords redacted; `None` when
    /// unset, i.e. the default applies) and its origin.
    pub fn report(&self) -> Vec<(&'static Spec, Option<String>, Option<&Origin>)> {
        SETTINGS
            .iter()
            .map(|spec| {
                let shown = self.values.get(spec.var).map(|(value, _)| {
                    if spec.secret {
                        "***".to_owned()
                    } else {
                        redact_userinfo(value)
                    }
                });
                (spec, shown, self.origin(spec.var))
            })
            .collect()
    }
}

fn parse_file(path: &Path, text: &str) -> Result<BTreeMap<&'static str, String>, LayerError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| LayerError::Syntax {
        path: path.to_path_buf(),
        reason: e.message().to_owned(),
    })?;
    let mut out = BTreeMap::new();
    for (key, value) in table {
        let Some(spec) = SETTINGS.iter().find(|s| s.key() == key) else {
            let hint = nearest(&key.trim_start_matches("GITSTATE_").to_ascii_lowercase())
                .map_or_else(String::new, |n| format!(" (did you mean `{n}`?)"));
            return Err(LayerError::UnknownKey {
                path: path.to_path_buf(),
                key,
                hint,
            });
        };
        let bad = || LayerError::BadValue {
            path: path.to_path_buf(),
            key: key.clone(),
        };
        let text = match value {
            toml::Value::String(s) if s.trim().is_empty() => {
                return Err(LayerError::EmptyValue {
                    path: path.to_path_buf(),
                    key,
                });
            }
            toml::Value::String(s) => s,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    toml::Value::String(s) => Ok(s),
                    _ => Err(bad()),
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(","),
            _ => return Err(bad()),
        };
        out.insert(spec.var, text);
    }
    Ok(out)
}

/// `https://user:secret@host/…` shown as `https://user:***@host/…`, and `https://token@host/…`
/// (a token sent as the user name) as `https://***@host/…`; only an SSH user name is shown.
/// Each URL of a comma-separated list is redacted. Such URLs are refused at start-up anyway
/// (`gitstate_core::secret::credentials_in_url`), but `gitstate config` shows what it was given.
pub fn redact_userinfo(value: &str) -> String {
    value
        .split(',')
        .map(redact_one)
        .collect::<Vec<_>>()
        .join(",")
}

fn redact_one(value: &str) -> String {
    let Some(scheme_end) = value.find("://").map(|i| i + 3) else {
        return value.to_owned();
    };
    let rest = &value[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return value.to_owned();
    };
    let ssh = gitstate_core::secret::is_ssh_scheme(value[..scheme_end - 3].trim());
    let user = rest[..at].split(':').next().unwrap_or_default();
    let password = rest[..at].contains(':');
    let user = if password || ssh { user } else { "***" };
    format!(
        "{}{user}{}@{}",
        &value[..scheme_end],
        if password { ":***" } else { "" },
        &rest[at + 1..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Every variable the settings read is listed, so every setting can come from a flag or a file.
    #[test]
    fn every_variable_of_the_settings_is_listed() {
        let sources = [
            include_str!("settings/mod.rs"),
            include_str!("settings/server.rs"),
            include_str!("settings/git.rs"),
            include_str!("settings/encryption.rs"),
            include_str!("settings/access.rs"),
            include_str!("settings/limits.rs"),
        ];
        let mut seen = 0;
        for source in sources {
            let mut rest = source;
            while let Some(i) = rest.find("\"GITSTATE_") {
                let tail = &rest[i + 1..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                    .unwrap_or(tail.len());
                let var = &tail[..end];
                rest = &tail[end..];
                if !rest.starts_with('"') {
                    continue; // inside a message, e.g. "GITSTATE_REF: …"
                }
                assert!(
                    SETTINGS.iter().any(|s| s.var == var),
                    "{var} is read by the settings but missing from layers::SETTINGS"
                );
                seen += 1;
            }
        }
        assert!(seen > 20, "the settings read {seen} variables?");
        let mut keys: Vec<String> = SETTINGS.iter().map(Spec::key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), SETTINGS.len(), "two settings share a key");
    }

    /// For every setting and every combination of layers, the flag wins over the environment,
    /// the environment over the file; the origin says which.
    #[test]
    fn precedence_for_every_setting_and_layer_combination() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(16);
        for spec in SETTINGS {
            for mask in 0..8u8 {
                let mut value = |layer: &str| format!("{layer}-{}", rng.random::<u32>());
                let (f, e, t) = (value("flag"), value("env"), value("file"));
                let (with_flag, with_env) = ([(spec.var, f.as_str())], [(spec.var, e.as_str())]);
                let flags = map(if mask & 1 != 0 { &with_flag } else { &[] });
                let env = map(if mask & 2 != 0 { &with_env } else { &[] });
                let text = if mask & 4 != 0 {
                    format!("{} = {:?}\n", spec.key(), t)
                } else {
                    String::new()
                };
                let path = Path::new("gitstate.toml");
                let layered = Layered::build(
                    |v| flags.get(v).cloned(),
                    |v| env.get(v).cloned(),
                    Some((path, &text)),
                )
                .expect("valid file");
                let expected = match mask {
                    m if m & 1 != 0 => Some((f.clone(), Origin::Flag)),
                    m if m & 2 != 0 => Some((e.clone(), Origin::Env)),
                    4 => Some((t.clone(), Origin::File(path.into()))),
                    _ => None,
                };
                assert_eq!(
                    layered.values.get(spec.var).cloned(),
                    expected,
                    "{} mask {mask}",
                    spec.var
                );
            }
        }
    }

    #[test]
    fn file_values_of_every_scalar_type() {
        let text = "max_body_bytes = 1024\nresponse_streaming = true\n\
                    allowed_repositories = [\"https://a/x.git\", \"https://b/y.git\"]\nref = \"states\"\n";
        let layered =
            Layered::build(|_| None, |_| None, Some((Path::new("g.toml"), text))).expect("valid");
        let s = layered.settings(Runtime::Local).expect("settings");
        assert_eq!(s.limits.max_body_bytes, 1024);
        assert!(s.server.response_streaming);
        assert_eq!(
            s.git.allowed_repositories,
            ["https://a/x.git", "https://b/y.git"]
        );
        assert_eq!(s.git.branch.as_str(), "states");
        for bad in ["ref = 1.5\n", "ref = [1]\n", "ref = { a = 1 }\n"] {
            let e = Layered::build(|_| None, |_| None, Some((Path::new("g.toml"), bad)))
                .expect_err(bad)
                .to_string();
            assert!(e.contains("`ref`"), "{e}");
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        for (text, key, hint) in [
            ("repositry = \"x\"\n", "repositry", Some("repository")),
            ("GITSTATE_REF = \"x\"\n", "GITSTATE_REF", Some("ref")),
            ("git-token = \"x\"\n", "git-token", Some("git_token")),
            ("[serve]\nlisten = \"x\"\n", "serve", None),
        ] {
            let e = Layered::build(|_| None, |_| None, Some((Path::new("g.toml"), text)))
                .expect_err(text)
                .to_string();
            assert!(e.contains(&format!("unknown key `{key}`")), "{e}");
            if let Some(hint) = hint {
                assert!(e.contains(&format!("did you mean `{hint}`")), "{e}");
            }
        }
        let e = Layered::build(|_| None, |_| None, Some((Path::new("g.toml"), "ref = ")))
            .expect_err("syntax")
            .to_string();
        assert!(e.starts_with("g.toml is not valid TOML"), "{e}");
    }

    /// One random edit (insert, delete, swap, replace) of `name`'s part after `keep` characters.
    fn misspell(rng: &mut rand::rngs::StdRng, name: &str, keep: usize) -> String {
        let mut chars: Vec<char> = name.chars().collect();
        let alphabet: Vec<char> = if name.starts_with("GITSTATE_") {
            "ABCDEFGHIJKLMNOPQRSTUVWXYZ_".chars().collect()
        } else {
            "abcdefghijklmnopqrstuvwxyz_".chars().collect()
        };
        let at = rng.random_range(keep..chars.len());
        let letter = alphabet[rng.random_range(0..alphabet.len())];
        match rng.random_range(0..4) {
            0 => chars.insert(at, letter),
            1 if chars.len() > keep + 1 => {
                chars.remove(at);
            }
            2 if at + 1 < chars.len() => chars.swap(at, at + 1),
            _ => chars[at] = letter,
        }
        chars.into_iter().collect()
    }

    /// Generated misspellings of every variable and file key, and empty values of every setting
    /// in each layer: each is an error that names it (and a known name near it).
    #[test]
    fn misspelt_and_empty_settings_are_named() {
        let seed = std::env::var("GITSTATE_SETTINGS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random::<u64>);
        println!("seed {seed} (GITSTATE_SETTINGS_SEED)");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let known_key = |k: &str| SETTINGS.iter().any(|s| s.key() == k);
        let mut cases = 0;
        for _ in 0..4 {
            for spec in SETTINGS {
                let var = misspell(&mut rng, spec.var, "GITSTATE_".len());
                if !SETTINGS.iter().any(|s| s.var == var)
                    && !OTHER_VARIABLES.contains(&var.as_str())
                {
                    let e = check_environment([(var.clone(), "x".to_owned())], true)
                        .expect_err(&var)
                        .to_string();
                    assert!(
                        e.contains(&format!("unknown variable {var} (did you mean `GITSTATE_")),
                        "{e}"
                    );
                    cases += 1;
                }
                let key = misspell(&mut rng, &spec.key(), 0);
                if !known_key(&key) && !key.is_empty() {
                    let text = format!("{key} = \"x\"\n");
                    let e = Layered::build(|_| None, |_| None, Some((Path::new("g.toml"), &text)))
                        .expect_err(&text)
                        .to_string();
                    assert!(
                        e.contains(&format!("unknown key `{key}` (did you mean `")),
                        "{e}"
                    );
                    cases += 1;
                }
                let blank = [" ", "", "\t"][rng.random_range(0..3)];
                let e = check_environment([(spec.var.to_owned(), blank.to_owned())], false)
                    .expect_err(spec.var)
                    .to_string();
                assert!(e.contains(&format!("{} is set but empty", spec.var)), "{e}");
                let e = Layered::build(
                    |_| None,
                    |v| (v == spec.var).then(|| blank.to_owned()),
                    None,
                )
                .expect_err(spec.var)
                .to_string();
                assert!(e.contains(spec.var), "{e}");
                let e = Layered::build(
                    |v| (v == spec.var).then(|| blank.to_owned()),
                    |_| None,
                    None,
                )
                .expect_err(spec.var)
                .to_string();
                assert!(e.contains(&format!("--{}", spec.flag())), "{e}");
                let text = format!("{} = \"{blank}\"\n", spec.key());
                let e = Layered::build(|_| None, |_| None, Some((Path::new("g.toml"), &text)))
                    .expect_err(&text)
                    .to_string();
                assert!(e.contains(&format!("`{}` is empty", spec.key())), "{e}");
                cases += 5;
            }
        }
        println!("{cases} generated cases");
        // A near miss names the setting it misses.
        let e = check_environment([("GITSTATE_REPOSITRY".into(), "x".into())], true)
            .expect_err("typo")
            .to_string();
        assert!(e.contains("did you mean `GITSTATE_REPOSITORY`"), "{e}");
        check_environment([("GITSTATE_REF".into(), String::new())], true)
            .expect("Lambda allows empties");
        check_environment(
            [
                ("OTHER".into(), String::new()),
                ("GITSTATE_URL".into(), "u".into()),
            ],
            false,
        )
        .expect("other names and GITSTATE_URL");
        assert_eq!(
            SETTINGS
                .iter()
                .find(|s| s.var == "GITSTATE_REF")
                .and_then(Spec::default_value),
            Some("main")
        );
    }

    #[test]
    fn report_redacts_secrets_and_url_passwords() {
        let env = map(&[
            ("GITSTATE_GIT_TOKEN", "tok-123"),
            ("GITSTATE_PASSPHRASE", "pass-456"),
            (
                "GITSTATE_REPOSITORY",
                "https://bot:url-789@h.example/o/r.git",
            ),
        ]);
        let layered = Layered::build(|_| None, |v| env.get(v).cloned(), None).expect("valid");
        let shown = format!("{:?} {:?}", layered.report(), layered);
        for secret in ["tok-123", "pass-456", "url-789"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("https://bot:***@h.example/o/r.git"),
            "{shown}"
        );
        for (input, output) in [
            ("https://h/x@y", "https://h/x@y"),
            ("https://u@h/x", "https://***@h/x"),
            ("ssh://git@h/x", "ssh://git@h/x"),
            ("git+ssh://git@h/x", "git+ssh://git@h/x"),
            ("ssh+git://git@[::1]:22/x", "ssh+git://git@[::1]:22/x"),
            ("git+ssh://git:pw@h/x", "git+ssh://git:***@h/x"),
            ("git://u@h/x", "git://***@h/x"),
            ("git@h:x", "git@h:x"),
            (
                "https://a/x.git, https://u:p@b/y.git,https://t@c/z",
                "https://a/x.git, https://u:***@b/y.git,https://***@c/z",
            ),
            ("https://u:p@q@h/x", "https://u:***@h/x"),
            ("plain", "plain"),
        ] {
            assert_eq!(redact_userinfo(input), output);
        }
    }
}
