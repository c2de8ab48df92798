//! Every command's `--help`: an Examples section, and the flags of exactly the settings its
//! concerns name ([`crate::settings::uses`]), checked for every command × every setting.

use clap::{CommandFactory, Parser};
use gitstate_app::layers::SETTINGS;

use crate::Cli;
use crate::settings::uses;

/// Every command path: `[]` (gitstate itself), `["serve"]`, `["user", "add"]`, …
fn paths(cmd: &clap::Command, path: &[String], out: &mut Vec<Vec<String>>) {
    out.push(path.to_vec());
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let mut next = path.to_vec();
        next.push(sub.get_name().to_owned());
        paths(sub, &next, out);
    }
}

fn help_of(path: &[String]) -> String {
    let args = std::iter::once("gitstate")
        .chain(path.iter().map(String::as_str))
        .chain(["--help"]);
    match Cli::try_parse_from(args) {
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.to_string(),
        Err(e) => panic!("{path:?} --help: {e}"),
        Ok(_) => panic!("{path:?} --help parsed as a command"),
    }
}

fn command_at<'a>(root: &'a clap::Command, path: &[String]) -> &'a clap::Command {
    path.iter().fold(root, |cmd, name| {
        cmd.find_subcommand(name)
            .unwrap_or_else(|| panic!("no subcommand {name}"))
    })
}

#[test]
fn every_help_has_examples_and_the_flags_of_its_settings_alone() {
    let root = Cli::command();
    let mut all = Vec::new();
    paths(&root, &[], &mut all);
    assert!(all.len() > 20, "{all:?}");
    let mut cases = 0;
    for path in &all {
        let help = help_of(path);
        let examples = help
            .split_once("\nExamples:\n")
            .unwrap_or_else(|| panic!("gitstate {path:?} --help has no Examples section:\n{help}"))
            .1;
        assert!(
            examples
                .lines()
                .any(|l| l.trim_start().contains("gitstate")),
            "{path:?}: the examples show no gitstate command: {examples}"
        );
        let cmd = command_at(&root, path);
        let name = path.join(" ");
        let mask = uses::BY_COMMAND
            .iter()
            .find(|(command, _)| *command == name)
            .map_or(0, |(_, mask)| *mask);
        for spec in SETTINGS {
            let used =
                !spec.secret && spec.var != "GITSTATE_STATE" && uses::has(mask, spec.concern());
            let arg = cmd.get_arguments().find(|a| a.get_id() == spec.var);
            let shown = help.contains(&format!("(env {})", spec.var));
            assert_eq!(
                (arg.is_some(), shown),
                (used, used),
                "gitstate {} --help: {} ({:?}) offered {:?}, shown {shown}, should be {used}",
                path.join(" "),
                spec.var,
                spec.concern(),
                arg.is_some(),
            );
            if !used {
                // A flag of the same name is the command's own (`--ref` of history: a branch).
                assert!(
                    cmd.get_arguments()
                        .filter(|a| a.get_long() == Some(spec.flag().as_str()))
                        .all(|a| a.get_id() != spec.var),
                    "{path:?}: --{}",
                    spec.flag()
                );
            }
            cases += 1;
        }
    }
    // What the issue saw, said once more by hand.
    let encrypt = help_of(&["encrypt".to_owned()]);
    for flag in [
        "--listen",
        "--tls-cert",
        "--access-file",
        "--max-connections",
    ] {
        assert!(!encrypt.contains(flag), "encrypt offers {flag}");
    }
    assert!(help_of(&["serve".to_owned()]).contains("--tls-cert"));
    assert!(help_of(&["history".to_owned()]).contains("--url"));
    println!(
        "{cases} command × setting cases over {} commands",
        all.len()
    );
}

#[test]
fn every_command_with_settings_flags_has_its_mask() {
    let root = Cli::command();
    let mut all = Vec::new();
    paths(&root, &[], &mut all);
    for path in &all {
        let cmd = command_at(&root, path);
        let has_config = cmd.get_arguments().any(|a| a.get_id() == "config");
        let name = path.join(" ");
        let listed = uses::BY_COMMAND.iter().any(|(c, _)| *c == name);
        // The seed's `git` grammar has a --config of its own and no settings flags.
        if has_config && !listed {
            assert!(
                !cmd.get_arguments()
                    .any(|a| SETTINGS.iter().any(|s| s.var == a.get_id())),
                "{path:?} has settings flags but no entry in uses::BY_COMMAND"
            );
        }
    }
    for (command, _) in uses::BY_COMMAND {
        assert!(
            command
                .split(' ')
                .try_fold(&root, |cmd, word| cmd.find_subcommand(word))
                .is_some(),
            "uses::BY_COMMAND names {command}, not a command"
        );
    }
}
