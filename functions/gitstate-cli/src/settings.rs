//! The settings flags of the commands that read settings: one `--<key>` per non-secret entry of
//! [`gitstate_app::layers::SETTINGS`] whose concern the command reads ([`uses`]), under that
//! concern's heading, plus `--config PATH`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Arg, ArgMatches, Args, FromArgMatches};
use gitstate_app::layers::seed::{Seed, find_hcl};
use gitstate_app::layers::{Concern, Layered, Origin, SETTINGS, Spec, find_file, find_root};
use gitstate_app::{Runtime, Settings};

use crate::startup::Found;

const CONFIG: &str = "config";

/// Settings a command names with a flag of its own (`--state`), not through this group.
const OWN_FLAGS: &[&str] = &["GITSTATE_STATE"];

fn has_flag(spec: &Spec) -> bool {
    !spec.secret && !OWN_FLAGS.contains(&spec.var)
}

#[derive(Debug, Clone, Default)]
pub struct SettingsArgs {
    config: Option<PathBuf>,
    flags: Vec<(&'static str, String)>,
    /// terraform-backend-git's command-line form was used: its defaults apply.
    seed_interface: bool,
}

impl SettingsArgs {
    /// Settings given by terraform-backend-git's command-line form: its flags (as gitstate
    /// variables) and `--config` (its HCL file, or a gitstate.toml).
    pub fn seed(config: Option<PathBuf>, flags: Vec<(&'static str, String)>) -> Self {
        Self {
            config,
            flags,
            seed_interface: true,
        }
    }

    /// The file `--config` names, if any.
    pub fn named_file(&self) -> Option<&std::path::Path> {
        self.config.as_deref()
    }

    /// `--config PATH`: a `.hcl` file is terraform-backend-git's, anything else a gitstate.toml.
    fn config_files(&self) -> (Option<&std::path::Path>, Option<&std::path::Path>) {
        match self.config.as_deref() {
            Some(path) if path.extension().is_some_and(|e| e == "hcl") => (None, Some(path)),
            other => (other, None),
        }
    }

    /// Flags, then `GITSTATE_*` variables, then gitstate.toml; then terraform-backend-git's
    /// variables, its `terraform-backend-git.hcl` and its defaults for what is still unset.
    pub fn layered(&self) -> anyhow::Result<Layered> {
        let (toml, hcl) = self.config_files();
        let file = find_file(toml)?;
        let root = std::env::current_dir().ok().and_then(|cwd| find_root(&cwd));
        let hcl = find_hcl(hcl)?;
        let layered = Layered::build(
            |var| {
                self.flags
                    .iter()
                    .find(|(v, _)| *v == var)
                    .map(|(_, value)| value.clone())
            },
            |var| std::env::var(var).ok(),
            file.as_ref()
                .map(|(path, text)| (path.as_path(), text.as_str())),
        )?
        .with_seed(&Seed {
            env: &|var| std::env::var(var).ok(),
            hcl: hcl
                .as_ref()
                .map(|(path, text)| (path.as_path(), text.as_str())),
            interface: self.seed_interface,
        })?
        .with_root(root.as_deref());
        Ok(layered)
    }

    pub fn settings(&self) -> anyhow::Result<(Layered, Settings)> {
        let layered = self.layered()?;
        let settings = layered
            .settings(Runtime::Local)
            .context("reading the settings (flags, GITSTATE_* variables, gitstate.toml)")?;
        Ok((layered, settings))
    }
}

/// Which concerns' flags a command offers: a mask of [`Concern`] bits, the type parameter of
/// [`SettingsFor`].
pub mod uses {
    use gitstate_app::layers::Concern::{
        self, Access, Connections, Git, Keys, Listener, Logging, Opening, Remote, Repository,
        Requests, Team,
    };

    pub const fn mask(concerns: &[Concern]) -> u16 {
        let (mut mask, mut i) = (0, 0);
        while i < concerns.len() {
            mask |= 1 << concerns[i] as u16;
            i += 1;
        }
        mask
    }

    pub const fn has(mask: u16, concern: Concern) -> bool {
        mask & (1 << concern as u16) != 0
    }

    pub const SERVE: u16 = mask(&[
        Repository,
        Git,
        Team,
        Requests,
        Access,
        Listener,
        Connections,
        Keys,
        Opening,
        Logging,
    ]);
    /// `run` serves on a loopback port of its own, for its own user.
    pub const RUN: u16 = mask(&[
        Repository,
        Git,
        Team,
        Requests,
        Connections,
        Keys,
        Opening,
        Logging,
    ]);
    pub const CONFIG: u16 = mask(&Concern::ALL);
    pub const REKEY: u16 = mask(&[Repository, Git, Team, Keys, Opening, Logging]);
    /// The repository binds the encrypted state to its place.
    pub const ENCRYPT: u16 = mask(&[Repository, Team, Keys, Opening, Logging]);
    pub const DECRYPT: u16 = mask(&[Team, Opening, Logging]);
    pub const REMOTE: u16 = mask(&[Remote]);
    /// Replays the states' own refs onto the branch: git alone.
    pub const FOLD: u16 = mask(&[Repository, Git, Team, Logging]);
    /// A commit to the repository's access file.
    pub const USER_ADD: u16 = mask(&[Repository, Git, Team, Logging]);

    /// Every command with settings, by its words after `gitstate`: what its flags must be (a
    /// test checks the help), and what it reaches.
    pub const BY_COMMAND: &[(&str, u16)] = &[
        ("serve", SERVE),
        ("run", RUN),
        ("config", CONFIG),
        ("rekey", REKEY),
        ("fold", FOLD),
        ("encrypt", ENCRYPT),
        ("decrypt", DECRYPT),
        ("history", REMOTE),
        ("show", REMOTE),
        ("restore", REMOTE),
        ("list", REMOTE),
        ("locks", REMOTE),
        ("unlock", REMOTE),
        ("remove", REMOTE),
        ("user add", USER_ADD),
    ];

    /// Whether the parsed command reads or writes the repository through git: its settings
    /// include the git ones. The others talk to a running backend, or to files and KMS alone.
    pub fn reaches_repository(matches: &clap::ArgMatches) -> bool {
        let mut words = Vec::new();
        let mut at = matches;
        while let Some((name, sub)) = at.subcommand() {
            words.push(name);
            at = sub;
        }
        let path = words.join(" ");
        BY_COMMAND
            .iter()
            .any(|(command, mask)| *command == path && has(*mask, Concern::Git))
    }
}

/// The settings flags of a command whose concerns are `USES` ([`uses`]), and `--config`.
#[derive(Debug, Clone, Default)]
pub struct SettingsFor<const USES: u16>(pub SettingsArgs);

impl<const USES: u16> std::ops::Deref for SettingsFor<USES> {
    type Target = SettingsArgs;

    fn deref(&self) -> &SettingsArgs {
        &self.0
    }
}

fn offered(uses: u16) -> impl Iterator<Item = &'static Spec> {
    SETTINGS
        .iter()
        .filter(move |s| has_flag(s) && uses::has(uses, s.concern()))
}

impl<const USES: u16> FromArgMatches for SettingsFor<USES> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = Self::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        if let Some(path) = matches.get_one::<PathBuf>(CONFIG) {
            self.0.config = Some(path.clone());
        }
        for spec in offered(USES) {
            if let Some(value) = matches.get_one::<String>(spec.var) {
                self.0.flags.retain(|(var, _)| *var != spec.var);
                self.0.flags.push((spec.var, value.clone()));
            }
        }
        Ok(())
    }
}

impl<const USES: u16> Args for SettingsFor<USES> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let cmd = cmd.next_help_heading("Settings").arg(
            Arg::new(CONFIG)
                .long("config")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .help(
                    "TOML settings file [default: ./gitstate.toml if present]; a .hcl file is \
                     read as terraform-backend-git.hcl. A flag wins over its GITSTATE_* \
                     variable, which wins over the file",
                ),
        );
        // One heading per concern, in a fixed order; what follows the group is back under
        // the command's own heading.
        let cmd = Concern::ALL.iter().fold(cmd, |cmd, concern| {
            let cmd = cmd.next_help_heading(concern.heading());
            offered(USES)
                .filter(|spec| spec.concern() == *concern)
                .fold(cmd, |cmd, spec| {
                    let arg = Arg::new(spec.var)
                        .long(spec.flag())
                        .help(format!("{} (env {})", spec.help, spec.var));
                    cmd.arg(if spec.switch {
                        arg.value_name("BOOL")
                            .num_args(0..=1)
                            .require_equals(true)
                            .default_missing_value("true")
                    } else {
                        arg.value_name("VALUE")
                    })
                })
        });
        cmd.next_help_heading(None::<&str>)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// `gitstate config`: every setting, its effective value (secrets redacted) and its origin; then
/// whether the whole is valid.
pub async fn print(args: &SettingsArgs) -> anyhow::Result<()> {
    let layered = args.layered()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{:<24} {:<44} FROM", "SETTING", "VALUE")?;
    for (spec, shown, origin) in layered.report() {
        let from = origin.map_or_else(
            || "default".to_owned(),
            |o| match o {
                Origin::Flag => format!("flag --{}", spec.flag()),
                Origin::Env => format!("env {}", spec.var),
                other => other.to_string(),
            },
        );
        let shown = shown
            .or_else(|| spec.default_value().map(str::to_owned))
            .unwrap_or_else(|| "(unset)".to_owned());
        writeln!(out, "{:<24} {:<44} {from}", spec.key(), shown)?;
    }
    if let Some((shown, from)) = crate::seed_ssh::report() {
        writeln!(out, "{:<24} {:<44} {from}", "GIT_SSH_COMMAND", shown)?;
    }
    out.flush()?;
    drop(out);
    let mut settings = layered
        .settings(Runtime::Local)
        .context("the settings are invalid")?;
    // What `serve` would find at start, said now.
    let mut found = vec![crate::startup::listener(&settings.server)];
    if let Some(cert) = &settings.server.tls.cert {
        found.push(crate::startup::certificate_file(cert));
    }
    found.extend(crate::startup::store(&mut settings).await);
    println!();
    let mut problems = 0;
    for finding in &found {
        let (label, what) = match finding {
            Found::Ok(what) => ("ok", what),
            Found::Warning(what) => ("WARNING", what),
            Found::Problem(what) => {
                problems += 1;
                ("PROBLEM", what)
            }
        };
        println!("{label:<8} {}", what.replace('\n', "\n         "));
    }
    if problems > 0 {
        anyhow::bail!(
            "{problems} problem{} found",
            if problems == 1 { "" } else { "s" }
        );
    }
    println!("ok");
    Ok(())
}
