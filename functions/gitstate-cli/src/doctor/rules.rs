//! The checks of `gitstate doctor` that need no request: the backend's address, lock
//! addresses, methods and credentials as configured.

use reqwest::Url;

use super::{Backend, Finding};

/// The lock address gitstate serves for the state at `address`.
pub fn lock_address_for(address: &Url) -> Option<Url> {
    let mut lock = address.clone();
    if let Some(name) = address.path().strip_prefix("/states/") {
        lock.set_path(&format!("/locks/{name}"));
        return Some(lock);
    }
    // The seed format locks at the state's own address with LOCK and UNLOCK.
    (address.path() == "/").then_some(lock)
}

/// A guess at the address meant by a mistyped one: its origin, `/states/`, and the name (the
/// path without a first word that is not part of it).
pub fn guessed_address(address: &Url) -> String {
    let origin = address.origin().ascii_serialization();
    if let Some((_, state)) = address.query_pairs().find(|(k, _)| k == "state") {
        return format!("{origin}/states/{state}");
    }
    let path = address.path().trim_start_matches('/');
    let name = match path.split_once('/') {
        Some((first, rest)) if !first.ends_with(".tfstate") && !rest.is_empty() => rest,
        _ => path,
    };
    let name = if name.is_empty() || !name.contains('.') && !name.contains('/') {
        "<name>.tfstate"
    } else {
        name
    };
    format!("{origin}/states/{name}")
}

/// The checks that need no request.
pub fn check(backend: &Backend) -> Vec<Finding> {
    let mut findings = Vec::new();
    let Some(address) = backend.get("address") else {
        findings.push(
            Finding::problem(
                "no-address",
                "the backend has no address".to_owned(),
                "set address = \"http://HOST:PORT/states/<name>.tfstate\" in the block, with \
                 -backend-config or TF_HTTP_ADDRESS"
                    .to_owned(),
            )
            .says("The argument \"address\" is required"),
        );
        return findings;
    };
    let address = match Url::parse(address) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => url,
        _ => {
            findings.push(
                Finding::problem(
                    "no-address",
                    format!(
                        "address {address:?} ({}) is not an http or https URL",
                        backend.from("address")
                    ),
                    "write it as http://HOST:PORT/states/<name>.tfstate".to_owned(),
                )
                .says("address must be HTTP or HTTPS"),
            );
            return findings;
        }
    };
    address_path(&address, backend, &mut findings);
    seed_repository(&address, backend, &mut findings);
    lock_addresses(&address, backend, &mut findings);
    methods(backend, &mut findings);
    credentials(backend, &mut findings);
    findings
}

/// The address names a state (not a lock, not nothing).
fn address_path(address: &Url, backend: &Backend, findings: &mut Vec<Finding>) {
    let path = address.path();
    let named = path
        .strip_prefix("/states/")
        .is_some_and(|name| !name.is_empty());
    if !named && path != "/" && !path.starts_with("/locks/") {
        findings.push(
            Finding::problem(
                "wrong-path",
                format!(
                    "address {address} ({}) names no state: gitstate serves states at \
                     /states/<name>",
                    backend.from("address")
                ),
                format!("address = \"{}\"", guessed_address(address)),
            )
            .says("Unexpected HTTP response code 400"),
        );
    }
    if path.starts_with("/locks/") {
        findings.push(
            Finding::problem(
                "wrong-path",
                format!(
                    "address ({}) is a lock's address: Terraform would read the lock as the state",
                    backend.from("address")
                ),
                format!(
                    "address = \"{}\"",
                    address.as_str().replacen("/locks/", "/states/", 1)
                ),
            )
            .says("nothing, or \"Unexpected HTTP response code 400\""),
        );
    }
}

/// The seed format's `repository=`: a URL gitstate serves, with a `+` escaped.
fn seed_repository(address: &Url, backend: &Backend, findings: &mut Vec<Finding>) {
    let Some((_, repository)) = address.query_pairs().find(|(k, _)| k == "repository") else {
        return;
    };
    let problem = if repository.contains(char::is_whitespace) {
        Some(
            "holds a space: a query reads `+` as a space, so `git+ssh://` arrives as `git ssh://`"
                .to_owned(),
        )
    } else {
        gitstate_app::settings::repository_url(&repository).err()
    };
    if let Some(why) = problem {
        findings.push(
            Finding::problem(
                "repository-url",
                format!(
                    "the repository= of address ({}) is not a repository URL gitstate serves: {why}",
                    backend.from("address")
                ),
                format!(
                    "name it as {}; in the address, write `+` as %2B (`git%2Bssh://…`)",
                    gitstate_app::settings::URL_FORMS
                ),
            )
            .says("Unexpected HTTP response code 400 (or 403)"),
        );
    }
}

/// The lock and unlock addresses: set, equal, and the lock of this very state.
fn lock_addresses(address: &Url, backend: &Backend, findings: &mut Vec<Finding>) {
    let expected_lock = lock_address_for(address);
    let suggestion = expected_lock
        .as_ref()
        .map_or_else(|| "/locks/<name>".to_owned(), |l| l.as_str().to_owned());
    match (backend.get("lock_address"), backend.get("unlock_address")) {
        (None, _) => findings.push(
            Finding::problem(
                "no-lock-address",
                "lock_address is not set: Terraform writes the state without a lock. gitstate \
                 refuses such writes (428 Precondition Required) unless the backend allows them \
                 (GITSTATE_ALLOW_UNLOCKED_WRITES=true); then two runs can overwrite each other"
                    .to_owned(),
                format!(
                    "lock_address = \"{suggestion}\", unlock_address = \"{suggestion}\", \
                     lock_method = \"POST\", unlock_method = \"DELETE\" (in the block, or \
                     TF_HTTP_LOCK_ADDRESS, TF_HTTP_UNLOCK_ADDRESS, TF_HTTP_LOCK_METHOD, \
                     TF_HTTP_UNLOCK_METHOD)"
                ),
            )
            .says("HTTP error: 428 (on apply)"),
        ),
        (Some(_), None) => findings.push(
            Finding::problem(
                "no-unlock-address",
                "lock_address is set but unlock_address is not: Terraform takes the lock and \
                 never releases it, and the next run finds the state locked (423)"
                    .to_owned(),
                format!("unlock_address = \"{suggestion}\", unlock_method = \"DELETE\""),
            )
            .says("Error acquiring the state lock (on the next run)"),
        ),
        (Some(lock), Some(unlock)) => {
            let expected = expected_lock.as_ref();
            let both = LockPair {
                lock,
                unlock,
                expected,
                suggestion: &suggestion,
            };
            lock_pair(address, backend, &both, findings);
        }
    }
}

/// The lock and unlock addresses as set, and what they should be.
struct LockPair<'a> {
    lock: &'a str,
    unlock: &'a str,
    expected: Option<&'a Url>,
    suggestion: &'a str,
}

/// Both lock addresses set: the same, not the state's own with POST/DELETE, and this state's.
fn lock_pair(address: &Url, backend: &Backend, pair: &LockPair<'_>, findings: &mut Vec<Finding>) {
    let LockPair {
        lock,
        unlock,
        expected: expected_lock,
        suggestion,
    } = *pair;
    let (lock_method, unlock_method) = (
        backend.get("lock_method").unwrap_or("LOCK"),
        backend.get("unlock_method").unwrap_or("UNLOCK"),
    );
    let parsed = Url::parse(lock).ok();
    if lock != unlock {
        findings.push(Finding::problem(
            "lock-mismatch",
            format!(
                "unlock_address ({}) differs from lock_address ({}): the lock taken is \
                 not the one released",
                backend.from("unlock_address"),
                backend.from("lock_address")
            ),
            format!("set both to \"{suggestion}\""),
        ));
    }
    if parsed.as_ref() == Some(address) && (lock_method == "POST" || unlock_method == "DELETE") {
        findings.push(
            Finding::problem(
                "lock-at-state",
                format!(
                    "lock_address is the state's address with lock_method {lock_method} \
                     and unlock_method {unlock_method}: gitstate takes them for a state \
                     write and a state delete, and refuses them (400)"
                ),
                format!(
                    "lock_address = unlock_address = \"{}\" with POST and DELETE",
                    address.as_str().replacen("/states/", "/locks/", 1)
                ),
            )
            .says("Unexpected HTTP response code 400 (Error acquiring the state lock)"),
        );
    } else if let (Some(parsed), Some(expected)) = (&parsed, expected_lock)
        && parsed != expected
        && parsed != address
    {
        findings.push(Finding::problem(
            "lock-other-state",
            format!(
                "lock_address {lock} ({}) is not the lock of the state at {address}: \
                     the lock would guard another state, or no route (400)",
                backend.from("lock_address")
            ),
            format!("lock_address = unlock_address = \"{expected}\""),
        ));
    }
}

/// The lock, unlock and update methods gitstate answers.
fn methods(backend: &Backend, findings: &mut Vec<Finding>) {
    let (lock_method, unlock_method) = (
        backend.get("lock_method").unwrap_or("LOCK"),
        backend.get("unlock_method").unwrap_or("UNLOCK"),
    );
    if backend.get("lock_address").is_some() {
        if !matches!(lock_method, "POST" | "LOCK") {
            findings.push(
                Finding::problem(
                    "bad-method",
                    format!(
                        "lock_method {lock_method} ({})",
                        backend.from("lock_method")
                    ),
                    "lock_method = \"POST\" (or LOCK)".to_owned(),
                )
                .says("Unexpected HTTP response code 405"),
            );
        }
        if !matches!(unlock_method, "DELETE" | "UNLOCK") {
            findings.push(
                Finding::problem(
                    "bad-method",
                    format!(
                        "unlock_method {unlock_method} ({})",
                        backend.from("unlock_method")
                    ),
                    "unlock_method = \"DELETE\" (or UNLOCK)".to_owned(),
                )
                .says("Unexpected HTTP response code 405"),
            );
        }
    }
    if let Some(update) = backend.get("update_method")
        && !matches!(update, "POST" | "PUT")
    {
        findings.push(
            Finding::problem(
                "bad-method",
                format!("update_method {update} ({})", backend.from("update_method")),
                "update_method = \"POST\" (or PUT), or leave it unset".to_owned(),
            )
            .says("HTTP error: 405"),
        );
    }
}

/// The password kept out of saved files, client certificate and key together.
fn credentials(backend: &Backend, findings: &mut Vec<Finding>) {
    if backend.get("password").is_some() && !backend.from("password").starts_with("env ") {
        findings.push(Finding::note(
            "password-in-config",
            format!(
                "the password comes from {}: Terraform saves it in .terraform/ and in plan files; \
                 TF_HTTP_PASSWORD keeps it out of them",
                backend.from("password")
            ),
        ));
    }
    if backend.get("client_certificate_pem").is_some()
        != backend.get("client_private_key_pem").is_some()
    {
        findings.push(Finding::problem(
            "tls",
            "client_certificate_pem and client_private_key_pem go together".to_owned(),
            "set both (TF_HTTP_CLIENT_CERTIFICATE_PEM, TF_HTTP_CLIENT_PRIVATE_KEY_PEM) or neither"
                .to_owned(),
        ));
    }
}
