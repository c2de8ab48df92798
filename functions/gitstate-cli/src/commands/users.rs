//! `gitstate user add`, `hash-password` and `access check`: access file entries and checks, all
//! offline.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, bail};
use gitstate_core::access::{Grant, Policy, User, check_user_name, entry_toml};
use gitstate_core::password::{generate_token, hash_secret};

pub fn user_add(name: &str, grants: &[String]) -> anyhow::Result<()> {
    check_user_name(name)?;
    let grants = grants
        .iter()
        .map(|g| Grant::parse(g))
        .collect::<Result<Vec<_>, _>>()?;
    let token = generate_token();
    let user = User {
        name: name.to_owned(),
        hash: hash_secret(token.as_bytes())?,
        grants,
    };
    let entry = entry_toml(&user)?;
    // The entry must be valid for the backend before anyone commits it.
    Policy::parse(&entry).context("the generated entry does not parse (a bug)")?;
    eprintln!(
        "Token for {name} (shown only this once; use it as TF_HTTP_PASSWORD):\n{}\n\n\
         Add this entry to .gitstate/access.toml on the state branch:",
        token
    );
    print!("{entry}");
    std::io::stdout().flush()?;
    Ok(())
}

pub fn hash_password() -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin()
        .take(64 * 1024)
        .read_to_string(&mut input)
        .context("reading the secret from standard input")?;
    let secret = input
        .strip_suffix('\n')
        .map(|s| s.strip_suffix('\r').unwrap_or(s))
        .unwrap_or(&input);
    if secret.is_empty() {
        bail!(
            "no secret on standard input (e.g. `printf %s \"$SECRET\" | gitstate hash-password`)"
        );
    }
    if secret.chars().count() < 16 {
        eprintln!("warning: a secret shorter than 16 characters is easy to guess");
    }
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
