//! What `serve`, `run` and `gitstate config` check before the first request, so that a
//! misconfiguration is said at start rather than found by a failing Terraform run: the listener,
//! the TLS certificate's dates, the repository and its users, the store a process would use.

use std::path::Path;
use std::time::{Duration, SystemTime};

use gitstate_app::settings::ServerSettings;
use gitstate_core::ReadContext;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use x509_cert::der::Decode;

/// A certificate this close to its end is worth a warning.
const SOON: Duration = Duration::from_secs(14 * 24 * 3600);

/// One thing a check found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    Ok(String),
    /// Works, but a reader should know.
    Warning(String),
    /// Will not work as configured.
    Problem(String),
}

/// The rule every listener follows: a non-loopback address without TLS is refused unless
/// `--insecure-listen` accepts it. The message's fix is one a user can paste.
pub fn listener(server: &ServerSettings) -> Found {
    listener_rule(
        server.listen,
        server.tls.cert.is_some(),
        server.insecure_listen,
    )
}

fn listener_rule(address: std::net::SocketAddr, tls: bool, insecure: bool) -> Found {
    if tls || address.ip().is_loopback() {
        return Found::Ok(format!(
            "listener {address}{}",
            if tls { " with TLS" } else { " (loopback)" }
        ));
    }
    if insecure {
        return Found::Warning(format!(
            "listener {address} without TLS (--insecure-listen): Basic credentials and states \
             cross the network in clear"
        ));
    }
    Found::Problem(format!(
        "{address} is not a loopback address: without TLS, passwords would cross the network in \
         clear. Give --tls-cert and --tls-key, or accept it with --insecure-listen (or \
         GITSTATE_INSECURE_LISTEN=true)"
    ))
}

/// The validity dates of the first certificate of a PEM chain, against `now`.
pub fn certificate_dates(chain: &[CertificateDer<'_>], path: &Path, now: SystemTime) -> Found {
    let Some(first) = chain.first() else {
        return Found::Problem(format!("{} holds no PEM certificate", path.display()));
    };
    let cert = match x509_cert::Certificate::from_der(first.as_ref()) {
        Ok(cert) => cert,
        Err(e) => {
            return Found::Problem(format!(
                "{}: not an X.509 certificate ({e})",
                path.display()
            ));
        }
    };
    let validity = &cert.tbs_certificate.validity;
    let (from, until) = (
        SystemTime::UNIX_EPOCH + validity.not_before.to_unix_duration(),
        SystemTime::UNIX_EPOCH + validity.not_after.to_unix_duration(),
    );
    let day = |t: SystemTime| {
        jiff::Timestamp::try_from(t).map_or_else(
            |_| "?".to_owned(),
            |t| t.strftime("%Y-%m-%d %H:%M:%SZ").to_string(),
        )
    };
    if now < from {
        Found::Warning(format!(
            "the TLS certificate {} is not valid before {}: clients refuse it until then (or \
             this machine's clock is wrong)",
            path.display(),
            day(from)
        ))
    } else if now > until {
        Found::Warning(format!(
            "the TLS certificate {} expired on {}: clients refuse it; renew it and restart",
            path.display(),
            day(until)
        ))
    } else if until.duration_since(now).unwrap_or_default() < SOON {
        Found::Warning(format!(
            "the TLS certificate {} expires on {}: renew it soon",
            path.display(),
            day(until)
        ))
    } else {
        Found::Ok(format!(
            "TLS certificate {} valid until {}",
            path.display(),
            day(until)
        ))
    }
}

/// [`certificate_dates`] of a PEM file.
pub fn certificate_file(path: &Path) -> Found {
    match CertificateDer::pem_file_iter(path).and_then(Iterator::collect::<Result<Vec<_>, _>>) {
        Ok(chain) => certificate_dates(&chain, path, SystemTime::now()),
        Err(e) => Found::Problem(format!("reading certificates from {}: {e}", path.display())),
    }
}

/// How to make the first administrator of a hosted repository that has no users.
pub const FIRST_ADMIN: &str = "No users: every request will be refused (401). Create the first \
     administrator:\n  \
     gitstate hash-password                      # type a password; prints its hash\n  \
     GITSTATE_ADMIN_USER=admin GITSTATE_ADMIN_HASH='<the hash>' gitstate serve …\n\
     then add users with `gitstate user add NAME --grant write:prefix/ --repository URL` (it \
     commits them to .gitstate/access.toml on the state branch), or keep them in \
     GITSTATE_ACCESS_FILE.";

/// The repository and its users, once the backend is assembled.
pub async fn users(app: &gitstate_app::App, storage: &str) -> Found {
    // Read from the remote now, whatever holds the users (a fixed access text reads nothing).
    let reached = match app.backend.locate(None, None) {
        Ok(at) => app
            .backend
            .store()
            .read_config(
                &at,
                gitstate_core::access::ACCESS_PATH,
                Duration::ZERO,
                &ReadContext::no_request(),
            )
            .await
            .map(drop)
            .map_err(|e| gitstate_core::report::chain(&e)),
        Err(e) => Err(gitstate_core::report::chain(&e)),
    };
    if let Err(why) = reached {
        return Found::Problem(format!(
            "{storage}: the repository cannot be read ({why}): check GITSTATE_REPOSITORY, the \
             git credentials and the network"
        ));
    }
    match app.access.user_count().await {
        // `run` brings its own credential: only a server needs users.
        Ok(0) => Found::Warning(format!("{storage}: {FIRST_ADMIN}")),
        Ok(n) => Found::Ok(format!(
            "{storage} reachable; {n} user{}",
            if n == 1 { "" } else { "s" }
        )),
        Err(e) => Found::Problem(format!(
            "{storage}: the repository cannot be read ({}): check GITSTATE_REPOSITORY, the git \
             credentials and the network",
            gitstate_core::report::chain(&e)
        )),
    }
}

/// The store the settings name: the hosted repository (reached, its users counted), or the
/// embedded one (which a process would create, new and empty, where there is none).
pub async fn store(settings: &mut gitstate_app::Settings) -> Vec<Found> {
    let embedded = settings.git.repository.is_none();
    let storage = settings
        .git
        .repository
        .clone()
        .unwrap_or_else(|| format!("{} (embedded)", settings.git.local_repository.display()));
    if embedded && !settings.git.local_repository.exists() {
        return vec![Found::Warning(format!(
            "no repository at {}: `serve` here would create a new, empty one (states kept \
             elsewhere are not seen from this directory)",
            settings.git.local_repository.display()
        ))];
    }
    crate::credential::fill(&mut settings.git).await;
    let branch = settings.git.branch.to_string();
    match gitstate_app::build(settings.clone()).await {
        Ok(app) => {
            let mut found = vec![users(&app, &storage).await];
            found.extend(ref_status(&app, &branch, false).await);
            found
        }
        Err(e) => vec![Found::Problem(format!(
            "{storage}: the backend cannot be assembled: {}",
            gitstate_core::report::chain(&e)
        ))],
    }
}

/// What the configured branch holds, and whether this backend speaks the repository's recorded
/// protocol: the branch exists; the repository is empty (the first write creates it); it is
/// missing beside others (refused, naming the remote's default branch, unless
/// GITSTATE_CREATE_REF allows it); the lock ref prefix differs from the recorded one.
/// `writes`: the process is about to write (the wrapper), so its one look is the one its first
/// push needs, and a look refused to pushes is a warning.
pub async fn ref_status(app: &gitstate_app::App, branch: &str, writes: bool) -> Vec<Found> {
    use gitstate_core::ports::BranchStatus;
    let at = match app.backend.locate(None, None) {
        Ok(at) => at,
        Err(e) => return vec![Found::Problem(gitstate_core::report::chain(&e))],
    };
    // The start-up's looks are one request: the later ones reuse the first's answer.
    let read = ReadContext::request(std::time::Instant::now(), None);
    let mut found = Vec::new();
    if writes {
        match app.backend.ready_to_write(&at, &read).await {
            Ok(None) => {}
            Ok(Some(reason)) => found.push(Found::Warning(format!(
                "the look that pushes begin with failed ({reason}): locks and writes may fail \
                 (a token or key that may only read is refused it)"
            ))),
            Err(e) => {
                found.push(Found::Problem(format!(
                    "the repository cannot take this backend's pushes ({})",
                    gitstate_core::report::chain(&e)
                )));
                return found;
            }
        }
    }
    found.push(match app.backend.branch_status(&at, &read).await {
        Ok(BranchStatus::Exists) => Found::Ok(format!("branch {branch} exists (GITSTATE_REF)")),
        Ok(BranchStatus::Missing { others, .. }) if others.is_empty() => Found::Ok(format!(
            "branch {branch}: the repository is empty, the first write creates it"
        )),
        Ok(BranchStatus::Missing { others, .. }) => {
            match app.backend.require_branch(&at, &read).await {
                Ok(()) => Found::Warning(format!(
                    "branch {branch} does not exist beside {}: the first write creates it \
                 (GITSTATE_CREATE_REF=true)",
                    others.join(", ")
                )),
                Err(e) => Found::Problem(format!(
                    "{e}; every read and write is refused (400) until GITSTATE_REF names the branch \
                 that holds the states"
                )),
            }
        }
        Err(e) => {
            found.push(Found::Problem(format!(
                "the repository cannot be read ({})",
                gitstate_core::report::chain(&e)
            )));
            return found;
        }
    });
    found.extend(instead(app, &at, &read, branch).await);
    found.extend(stranded(app, &at, &read).await);
    match app.backend.protocol_status(&at).await {
        Ok(gitstate_core::protocol::Protocol::Differs {
            setting,
            ours,
            recorded,
        }) => found.push(Found::Problem(format!(
            "{setting} is {ours:?} here but the repository records {recorded:?}: this backend \
             would not see the other deployments' locks, so its locks are refused (412); use \
             the recorded value"
        ))),
        Ok(_) => {}
        Err(e) => found.push(Found::Warning(format!(
            "the repository's protocol record cannot be read ({})",
            gitstate_core::report::chain(&e)
        ))),
    }
    found
}

/// Where a process would start a new, empty embedded store: `Some(message)` when the settings
/// name no hosted repository and the embedded one does not exist (nor any above the working
/// directory: [`gitstate_app::layers::find_root`] would have found it).
pub fn new_store(settings: &gitstate_app::Settings) -> Option<String> {
    if settings.git.repository.is_some() || settings.git.local_repository.exists() {
        return None;
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    Some(format!(
        "no gitstate store in {} or any directory above it (no gitstate.toml, no \
         .gitstate/repo.git): a new, empty store would start at {}, and Terraform would see no \
         state there. Run from the directory that holds your store (or below it), or name it \
         with --repository or GITSTATE_LOCAL_REPOSITORY",
        cwd.display(),
        settings.git.local_repository.display()
    ))
}

/// [`new_store`] for `serve` and `run`, which start one (with a warning, or `--new-store`), but
/// refused where `settings` carry a hosted repository's credentials and name no repository:
/// that repository was meant, and Terraform would plan against the new store's nothing and keep
/// its state where nobody looks.
pub fn new_store_checked(settings: &gitstate_app::Settings) -> anyhow::Result<Option<String>> {
    let git = &settings.git;
    let given: Vec<&str> = [
        ("GITSTATE_GIT_TOKEN", git.token.is_some()),
        ("GITSTATE_GIT_TOKEN_KMS", git.token_kms.is_some()),
        ("GITSTATE_GIT_USERNAME", git.username.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    match new_store(settings) {
        Some(warning) if !given.is_empty() => {
            let names = given.join(" and ");
            let verb = if given.len() > 1 { "are" } else { "is" };
            anyhow::bail!(
                "{names} {verb} set, but no repository (GITSTATE_REPOSITORY or --repository): \
                 {warning}. Name the repository, or unset {names} to start a new, empty store \
                 here"
            )
        }
        new => Ok(new),
    }
}

/// The configured branch holds no states while other branches do: reads that find no state
/// and writes are refused (a `GITSTATE_REF` naming a code branch, or a redeploy's default).
async fn instead(
    app: &gitstate_app::App,
    at: &gitstate_core::ports::Location,
    read: &ReadContext,
    branch: &str,
) -> Option<Found> {
    match app.backend.states_instead(at, read).await {
        Ok(holding) if holding.is_empty() => None,
        Ok(holding) => Some(Found::Warning(format!(
            "branch {branch} (GITSTATE_REF) holds no states, and {} hold them: a read that \
             finds no state there and every write are refused (400), never \"no state\"; set \
             GITSTATE_REF to the branch the states are on, or commit an empty state index \
             (.gitstate/index.json) to {branch} to keep states there too",
            holding.join(", ")
        ))),
        Err(e) => Some(Found::Warning(format!(
            "the other branches' states cannot be looked at ({})",
            gitstate_core::report::chain(&e)
        ))),
    }
}

/// States' refs whose branch is gone (renamed or deleted by hand), the configured one's aside:
/// a warning naming them, from the look `read` allows reusing.
async fn stranded(
    app: &gitstate_app::App,
    at: &gitstate_core::ports::Location,
    read: &ReadContext,
) -> Option<Found> {
    match app.backend.stranded_state_refs(at, read).await {
        Ok(gone) if gone.is_empty() => None,
        Ok(gone) => Some(Found::Warning(format!(
            "states' refs of {} remain, but no such branch: writes they hold that were never \
             folded are seen by no backend (a branch renamed or deleted by hand); see \
             docs/operating.md, \"Renaming the branch of states\"",
            gone.iter()
                .map(|b| format!("{b:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        Err(e) => Some(Found::Warning(format!(
            "the states' refs could not be listed ({})",
            gitstate_core::report::chain(&e)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_insecure_listen_fix_is_a_flag_that_parses() {
        let address = "192.0.2.1:8080".parse().expect("address");
        assert!(matches!(
            listener_rule(address, false, true),
            Found::Warning(_)
        ));
        assert!(matches!(listener_rule(address, true, false), Found::Ok(_)));
        let Found::Problem(message) = listener_rule(address, false, false) else {
            panic!("a non-loopback plain listener is a problem");
        };
        // The suggested spelling is the switch itself, which takes no separate value.
        assert!(message.contains("--insecure-listen (or"), "{message}");
        assert!(!message.contains("--insecure-listen true"), "{message}");
    }
}
