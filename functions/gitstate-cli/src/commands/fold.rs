//! `gitstate fold`: the writes kept on the states' own refs replayed onto the branch now, with
//! the deployment's repository settings (hosted, or the embedded repository).

use anyhow::{Context, bail};

use crate::settings::SettingsArgs;

pub async fn fold(args: &SettingsArgs) -> anyhow::Result<()> {
    let (_, settings) = args.settings()?;
    let backend = gitstate_app::build(settings)
        .await
        .context("assembling the backend")?
        .backend;
    let at = backend.locate(None, None)?;
    let report = backend
        .store()
        .fold(&at)
        .await
        .context("folding the state refs onto the branch")?;
    // Busy is a failure: a script that runs `gitstate fold && git pull` must not go on to read
    // a branch this command did not bring up to date.
    if report.busy {
        bail!(
            "another fold holds the lease (refs/gitstate/fold), so nothing was folded; it folds what waits, and a lease older than GITSTATE_FOLD_LEASE_SECS is taken over: run this again"
        );
    }
    println!(
        "folded {} write(s) of {} state(s) onto branch {}",
        report.writes, report.states, at.branch
    );
    if !report.refused.is_empty() {
        for name in &report.refused {
            eprintln!(
                "not folded: {name}: its file on the branch is not what the last fold left (written on the branch outside gitstate)"
            );
        }
        bail!(
            "{} state(s) not folded; see docs/operating.md, \"Unfolded writes\"",
            report.refused.len()
        );
    }
    Ok(())
}
