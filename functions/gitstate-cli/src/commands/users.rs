//! `gitstate user add`, `hash-password` and `access check`: users committed to the repository's
//! access file (or printed as entries), hashes and checks of access files.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, bail};
use gitstate_core::access::{Grant, Policy, User, check_user_name, entry_toml};
use gitstate_core::password::{generate_token, hash_secret};
use gitstate_core::ports::CommitMeta;

use crate::settings::SettingsArgs;

/// `gitstate user add`: how the new user's secret is made, and where the entry goes.
pub struct AddUser<'a> {
    pub name: &'a str,
    pub grants: &'a [String],
    /// Read the password from standard input instead of generating a token.
    pub password_stdin: bool,
    /// Print the entry instead of committing it.
    pub print: bool,
    pub settings: &'a SettingsArgs,
}

pub async fn user_add(add: &AddUser<'_>) -> anyhow::Result<()> {
    check_user_name(add.name)?;
    let grants = add
        .grants
        .iter()
        .map(|g| Grant::parse(g))
        .collect::<Result<Vec<_>, _>>()?;
    let (secret, generated) = if add.password_stdin {
        (
            read_secret("password", "user add NAME --grant … --password-stdin")?,
            false,
        )
    } else {
        (generate_token(), true)
    };
    let user = User {
        name: add.name.to_owned(),
        hash: hash_secret(secret.as_bytes())?,
        grants,
    };
    let told = |what: &str| {
        if generated {
            eprintln!(
                "Token for {} (shown only this once; use it as TF_HTTP_PASSWORD):\n{secret}\n\n{what}",
                add.name
            );
        } else {
            eprintln!("{what}");
        }
    };
    if add.print {
        let entry = entry_toml(&user)?;
        // The entry must be valid for the backend before anyone commits it.
        Policy::parse(&entry).context("the generated entry does not parse (a bug)")?;
        told("Add this entry to .gitstate/access.toml on the state branch:");
        print!("{entry}");
        std::io::stdout().flush()?;
        return Ok(());
    }
    let where_ = commit_user(&user, add.settings).await?;
    told(&format!(
        "User {} added to .gitstate/access.toml on {where_}; the backend reads it within \
         GITSTATE_ACCESS_REFRESH, without a restart.",
        add.name
    ));
    Ok(())
}

/// Commit `user` into the access file of the repository the settings name (hosted, or the
/// embedded one found here or above); says where.
async fn commit_user(user: &User, args: &SettingsArgs) -> anyhow::Result<String> {
    let (_, mut settings) = args.settings()?;
    if let Some(warning) = crate::startup::new_store(&settings) {
        bail!(
            "{warning}. To print an entry for an access file instead, pass --print; \
             `gitstate serve` starts a new store"
        );
    }
    crate::credential::fill(&mut settings.git).await;
    let place = format!(
        "branch {} of {}",
        settings.git.branch,
        settings
            .git
            .repository
            .clone()
            .unwrap_or_else(|| format!("{} (embedded)", settings.git.local_repository.display()))
    );
    let app = gitstate_app::build(settings)
        .await
        .context("assembling the backend")?;
    let committer = app.backend.committer();
    let meta = CommitMeta {
        author_name: committer.name.clone(),
        author_email: committer.email.clone(),
        committer_name: committer.name.clone(),
        committer_email: committer.email.clone(),
        message: String::new(),
    };
    app.access
        .add_user(user, meta)
        .await
        .with_context(|| format!("adding user {} on {place}", user.name))?;
    Ok(place)
}

/// A secret from standard input for `command`: up to 64 KiB, one final line break dropped; never
/// empty.
fn read_secret(what: &str, command: &str) -> anyhow::Result<String> {
    let mut input = String::new();
    std::io::stdin()
        .take(64 * 1024)
        .read_to_string(&mut input)
        .with_context(|| format!("reading {what} from standard input"))?;
    let secret = input
        .strip_suffix('\n')
        .map(|s| s.strip_suffix('\r').unwrap_or(s))
        .unwrap_or(&input);
    if secret.is_empty() {
        bail!("no {what} on standard input (e.g. `printf %s \"$SECRET\" | gitstate {command}`)");
    }
    if secret.chars().count() < 16 {
        eprintln!("warning: a secret shorter than 16 characters is easy to guess");
    }
    Ok(secret.to_owned())
}

pub fn hash_password() -> anyhow::Result<()> {
    let secret = read_secret("secret", "hash-password")?;
    println!("{}", hash_secret(secret.as_bytes())?);
    Ok(())
}

pub fn access_check(file: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let policy = Policy::parse(&text).with_context(|| format!("{} is invalid", file.display()))?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}: valid, {} user(s)",
        file.display(),
        policy.users().count()
    )?;
    for user in policy.users() {
        writeln!(out, "\n{}", user.name)?;
        if user.grants.is_empty() {
            writeln!(out, "  (no grants: can authenticate, can do nothing)")?;
        }
        if !user.grants.is_empty() {
            writeln!(out, "{}", crate::tables::grants(&user.grants))?;
        }
    }
    Ok(())
}
