//! Before `gitstate run` starts its program: where Terraform will really run (behind `env`,
//! `sh -c` and other launchers, and `-chdir`), and proof that the backend it will use there is
//! this run's: the generated block, or a user's `backend "http"` block that leaves the address
//! and credentials to the run. Anything else is refused, naming the file and line to look at.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use hcl_edit::Span;

use crate::backend_blocks::{self, line_of};

/// The file added next to a configuration without a backend block, for the length of one run.
pub const GENERATED_FILE: &str = "gitstate_run_backend.tf";
/// Its text, byte for byte: a file of that name with anything else was not written by a run.
pub const GENERATED: &str = "# Added by `gitstate run` for the length of one run; removed afterwards.\n\
                             terraform {\n  backend \"http\" {}\n}\n";

/// The http backend's settings the run passes through `TF_HTTP_*`: a block, a `-backend-config`
/// or a saved `.terraform/` configuration that sets one of them sends Terraform elsewhere.
pub const RUN_KEYS: &[&str] = &[
    "address",
    "lock_address",
    "unlock_address",
    "lock_method",
    "unlock_method",
    "username",
    "password",
];

/// How deep launchers may nest (`env … sh -c "timeout … terraform …"`).
const MAX_DEPTH: usize = 8;

/// What the check proved: where Terraform runs, and whether the run must add its backend file.
#[derive(Debug, PartialEq, Eq)]
pub struct Proof {
    pub dir: PathBuf,
    pub add_file: bool,
}

/// Terraform's invocation as found behind the launchers.
#[derive(Debug, Default)]
struct Invocation {
    /// The directory the program starts in (`env -C`), before `-chdir`.
    cwd: PathBuf,
    /// Terraform's arguments after its own name; `None` when a `--workdir` stands for a program
    /// the run cannot read.
    args: Option<Vec<String>>,
    /// Variables set on the way (`env NAME=VALUE`, `NAME=VALUE` in `sh -c`).
    env: Vec<(String, String)>,
}

/// Prove that `program` (as given after `--`) runs Terraform on this run's backend. `workdir`
/// names the directory when the program is one the run cannot see into (a script, `make`);
/// `env` reads the process environment.
pub fn prove(
    program: &[String],
    workdir: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Proof> {
    let invocation = match resolve(program, Invocation::default(), 0)? {
        Some(found) => found,
        None => match workdir {
            Some(dir) => Invocation {
                cwd: dir.to_path_buf(),
                ..Invocation::default()
            },
            None => bail!(
                "cannot tell where `{}` runs Terraform: run `gitstate run … -- terraform …` (or \
                 tofu; env, sh -c, timeout, nice, nohup and time in front are understood), or \
                 name the directory with --workdir DIR",
                program.first().map_or("", String::as_str)
            ),
        },
    };
    let lookup = |name: &str| {
        invocation
            .env
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .or_else(|| env(name))
    };
    let mut dir = match workdir {
        Some(dir) if invocation.args.is_some() => dir.to_path_buf(),
        _ => invocation.cwd.clone(),
    };
    let mut subcommand = None;
    let mut sub_args = Vec::new();
    if let Some(args) = &invocation.args {
        let mut rest = args.iter();
        for arg in rest.by_ref() {
            if let Some(chdir) = arg
                .strip_prefix("-chdir=")
                .or_else(|| arg.strip_prefix("--chdir="))
            {
                dir = dir.join(chdir);
            } else if !arg.starts_with('-') {
                subcommand = Some(arg.clone());
                break;
            }
        }
        sub_args.extend(rest.cloned());
    }
    if dir.as_os_str().is_empty() {
        dir = PathBuf::from(".");
    }
    if !dir.is_dir() {
        bail!(
            "{}: Terraform's working directory does not exist",
            dir.display()
        );
    }
    let flags = terraform_flags(&sub_args, subcommand.as_deref(), &lookup)?;
    check_flags(&flags, &dir)?;
    let data_dir = lookup("TF_DATA_DIR").map_or_else(|| dir.join(".terraform"), |d| dir.join(d));
    let reinit = subcommand.as_deref() == Some("init")
        && flags.iter().any(|(_, f)| {
            let f = f.trim_start_matches('-');
            f == "reconfigure" || f == "migrate-state" || f.starts_with("migrate-state=")
        });
    check_data_dir(&data_dir, reinit)?;
    let add_file = !declares_http(&dir)?;
    Ok(Proof { dir, add_file })
}

/// Terraform's arguments after its command, and those of `TF_CLI_ARGS` and
/// `TF_CLI_ARGS_<command>` (which are Terraform's own arguments too), each with where it came
/// from.
fn terraform_flags(
    sub_args: &[String],
    subcommand: Option<&str>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut flags: Vec<(String, String)> = sub_args
        .iter()
        .map(|a| ("the command line".to_owned(), a.clone()))
        .collect();
    let mut names = vec!["TF_CLI_ARGS".to_owned()];
    if let Some(sub) = subcommand {
        names.push(format!("TF_CLI_ARGS_{sub}"));
    }
    for name in names {
        if let Some(value) = lookup(&name) {
            let words = shlex::split(&value)
                .with_context(|| format!("{name}: cannot split {value:?} into arguments"))?;
            flags.extend(words.into_iter().map(|w| (name.clone(), w)));
        }
    }
    Ok(flags)
}

fn base_name(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// Terraform's invocation behind launchers; `None` for a program the run cannot see into.
fn resolve(
    program: &[String],
    mut found: Invocation,
    depth: usize,
) -> anyhow::Result<Option<Invocation>> {
    if depth > MAX_DEPTH {
        bail!("launchers nested more than {MAX_DEPTH} deep: run Terraform more directly");
    }
    let Some((first, rest)) = program.split_first() else {
        bail!("a launcher with no program after it");
    };
    let name = base_name(first);
    let rest: Vec<String> = rest.to_vec();
    match name {
        _ if name.starts_with("terraform") || name.starts_with("tofu") || name == "opentofu" => {
            found.args = Some(rest);
            Ok(Some(found))
        }
        "env" => {
            let program = env_options(rest, &mut found)?;
            resolve(&program, found, depth + 1)
        }
        "timeout" => {
            let i = skip_options(&rest, &["-s", "--signal", "-k", "--kill-after"]);
            // The duration, then the program.
            resolve(rest.get(i + 1..).unwrap_or_default(), found, depth + 1)
        }
        "nice" => {
            let i = skip_options(&rest, &["-n", "--adjustment"]);
            resolve(&rest[i..], found, depth + 1)
        }
        "time" => {
            let i = skip_options(&rest, &["-f", "--format", "-o", "--output"]);
            resolve(&rest[i..], found, depth + 1)
        }
        "nohup" | "setsid" | "command" | "exec" => {
            let i = skip_options(&rest, &[]);
            resolve(&rest[i..], found, depth + 1)
        }
        "sh" | "bash" | "dash" | "zsh" | "ksh" => match shell_words(name, &rest, &mut found)? {
            Some(words) => resolve(&words, found, depth + 1),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// `env`'s options and `NAME=VALUE` words (the variables and directory they set go to `found`):
/// the program after them.
fn env_options(mut rest: Vec<String>, found: &mut Invocation) -> anyhow::Result<Vec<String>> {
    let mut i = 0;
    while i < rest.len() {
        let arg = rest[i].clone();
        let value = |i: usize| -> anyhow::Result<String> {
            rest.get(i + 1)
                .cloned()
                .with_context(|| format!("env {arg}: a value must follow"))
        };
        match arg.as_str() {
            "-i" | "--ignore-environment" | "-" => bail!(
                "`env {arg}` would drop the TF_HTTP_* variables that lead Terraform to \
                 this run's backend"
            ),
            "-0" | "--null" | "-v" | "--debug" => {}
            "--" => {
                i += 1;
                break;
            }
            "-u" | "--unset" => {
                unset(&value(i)?)?;
                i += 1;
            }
            "-C" | "--chdir" => {
                found.cwd = found.cwd.join(value(i)?);
                i += 1;
            }
            "-S" | "--split-string" => {
                let words = shlex::split(&value(i)?).context("env -S: cannot split its string")?;
                rest.splice(i..i + 2, words);
                continue;
            }
            _ if arg.starts_with("--unset=") => unset(&arg["--unset=".len()..])?,
            _ if arg.starts_with("-u") => unset(&arg[2..])?,
            _ if arg.starts_with("--chdir=") => {
                found.cwd = found.cwd.join(&arg["--chdir=".len()..]);
            }
            _ if arg.starts_with("-C") => found.cwd = found.cwd.join(&arg[2..]),
            _ if arg.starts_with('-') => {
                bail!("env {arg}: an option gitstate run does not know; refusing to guess")
            }
            _ => match arg.split_once('=') {
                Some((name, value)) => {
                    found.env.push((name.to_owned(), value.to_owned()));
                }
                None => break,
            },
        }
        i += 1;
    }
    Ok(rest.get(i..).unwrap_or_default().to_vec())
}

/// The command of `sh -c SCRIPT` (its leading `NAME=VALUE` words go to `found`); `None` for a
/// shell running a script file.
fn shell_words(
    name: &str,
    rest: &[String],
    found: &mut Invocation,
) -> anyhow::Result<Option<Vec<String>>> {
    let Some(at) = rest
        .iter()
        .position(|a| a.starts_with('-') && !a.starts_with("--") && a.ends_with('c'))
    else {
        return Ok(None);
    };
    let script = rest
        .get(at + 1)
        .with_context(|| format!("{name} -c: no script follows"))?;
    if script.contains([';', '&', '|', '<', '>', '(', ')', '$', '`', '\n', '*', '?']) {
        bail!(
            "cannot tell where `{name} -c {script:?}` runs Terraform (a script with \
             several commands, redirections or expansions): run `gitstate run … -- \
             terraform …` directly, or name the directory with --workdir DIR"
        );
    }
    let mut words =
        shlex::split(script).with_context(|| format!("{name} -c: cannot split {script:?}"))?;
    // Leading NAME=VALUE words set variables for the command.
    while let Some((name, value)) = words
        .first()
        .and_then(|w| w.split_once('='))
        .filter(|(n, _)| !n.is_empty() && !n.contains('/'))
    {
        found.env.push((name.to_owned(), value.to_owned()));
        words.remove(0);
    }
    if words.first().map(String::as_str) == Some("cd") {
        bail!("`{name} -c` with cd: run `gitstate run … -- terraform -chdir=DIR …`");
    }
    Ok(Some(words))
}

fn unset(name: &str) -> anyhow::Result<()> {
    if name.starts_with("TF_HTTP_") {
        bail!("`env -u {name}` would drop a variable that leads Terraform to this run's backend");
    }
    Ok(())
}

/// The index of the first argument after the options (`valued` take the next argument).
fn skip_options(args: &[String], valued: &[&str]) -> usize {
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        if arg == "--" {
            return i + 1;
        }
        if !arg.starts_with('-') || arg == "-" {
            break;
        }
        i += if valued.contains(&arg.as_str()) { 2 } else { 1 };
    }
    i
}

/// `-backend=false` and a `-backend-config` that sets a run-owned key are refused.
fn check_flags(flags: &[(String, String)], dir: &Path) -> anyhow::Result<()> {
    let mut i = 0;
    while let Some((source, flag)) = flags.get(i) {
        i += 1;
        let bare = flag.trim_start_matches('-');
        if !flag.starts_with('-') {
            continue;
        }
        if let Some(value) = bare.strip_prefix("backend=") {
            if matches!(value, "0" | "f" | "F" | "false" | "FALSE" | "False") {
                bail!(
                    "{source} carries {flag}: Terraform would skip the run's backend (remove it)"
                );
            }
            continue;
        }
        let value = if let Some(v) = bare.strip_prefix("backend-config=") {
            v.to_owned()
        } else if bare == "backend-config" {
            i += 1;
            match flags.get(i - 1) {
                Some((_, v)) => v.clone(),
                None => bail!("{source}: -backend-config without a value"),
            }
        } else {
            continue;
        };
        match value.split_once('=') {
            Some((key, _)) if RUN_KEYS.contains(&key.trim()) => bail!(
                "{source} carries -backend-config={}=…: gitstate run sets `{}` itself (through \
                 TF_HTTP_*); remove it, or run Terraform without gitstate run",
                key.trim(),
                key.trim()
            ),
            Some(_) => {}
            None => {
                let path = dir.join(&value);
                let text = std::fs::read_to_string(&path).with_context(|| {
                    format!("{source} names -backend-config={value}: cannot read it")
                })?;
                let body = hcl_edit::parser::parse_body(&text)
                    .map_err(|e| anyhow::anyhow!("{}: cannot parse ({e})", path.display()))?;
                for attribute in body.attributes() {
                    let key = attribute.key.as_str();
                    if RUN_KEYS.contains(&key) {
                        bail!(
                            "{}:{}: sets `{key}` for the backend ({source} passes it as \
                             -backend-config): gitstate run sets it itself; remove it",
                            path.display(),
                            line_of(&text, attribute.span().map_or(0, |s| s.start))
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// A `.terraform/` initialised for another backend, or with another address saved in it, is
/// refused unless this run re-initialises it.
fn check_data_dir(data_dir: &Path, reinit: bool) -> anyhow::Result<()> {
    let path = data_dir.join("terraform.tfstate");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let saved: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let backend = &saved["backend"];
    let kind = backend["type"].as_str().unwrap_or_default();
    let set: Vec<&str> = RUN_KEYS
        .iter()
        .copied()
        .filter(|k| {
            backend["config"][*k]
                .as_str()
                .is_some_and(|v| !v.is_empty())
        })
        .collect();
    let what = if backend.is_null() || (kind == "http" && set.is_empty()) {
        return Ok(());
    } else if kind != "http" {
        format!("backend {kind:?}")
    } else {
        format!("the http backend with {} saved", set.join(", "))
    };
    if reinit {
        return Ok(());
    }
    bail!(
        "{}: this directory was initialised for {what}, which Terraform would keep using instead \
         of this run's backend. Re-initialise it onto gitstate: gitstate run --state … -- \
         terraform init -reconfigure (or -migrate-state to copy the state it holds)",
        path.display()
    )
}

/// Whether the configuration of `dir` declares its own `backend "http"` (which the run then
/// uses); any other backend, a block that sets what the run sets, or a foreign file of the
/// generated name is refused.
fn declares_http(dir: &Path) -> anyhow::Result<bool> {
    let mut http = false;
    for file in backend_blocks::configuration_files(dir)? {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        if file.file_name().and_then(|n| n.to_str()) == Some(GENERATED_FILE) {
            if text == GENERATED {
                continue; // another run's, in this directory now
            }
            bail!(
                "{}:1: a file of the name gitstate run gives its backend block, but not one it \
                 wrote; Terraform would read it instead of the run's block. Rename or remove it",
                file.display()
            );
        }
        let blocks = backend_blocks::blocks(&file, &text).map_err(|e| {
            anyhow::anyhow!("{e}; gitstate run cannot tell which backend it declares")
        })?;
        for block in blocks {
            if block.kind != "http" {
                bail!(
                    "{}:{}: {} declares backend {:?}: Terraform would keep its state there, not \
                     in gitstate (gitstate run serves the http backend only). Remove that block, \
                     or run Terraform without gitstate run",
                    block.file.display(),
                    block.line,
                    block.file.display(),
                    block.kind
                );
            }
            if let Some(a) = block
                .attributes
                .iter()
                .find(|a| RUN_KEYS.contains(&a.key.as_str()))
            {
                bail!(
                    "{}:{}: the backend \"http\" block sets `{}`: Terraform would use it \
                     instead of this run's backend. Remove it (gitstate run sets the address \
                     and credentials through TF_HTTP_*)",
                    block.file.display(),
                    a.line,
                    a.key
                );
            }
            http = true;
        }
    }
    Ok(http)
}

#[cfg(test)]
mod tests;
