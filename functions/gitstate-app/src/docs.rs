//! The settings table operators read in `docs/operating.md`, generated from [`SETTINGS`] (name,
//! flag, secrecy, the default its help line states) and the descriptions here. A test compares
//! the file with [`settings_table`]; `UPDATE_DOCS=1 cargo test -p gitstate-app settings_table`
//! writes it.

use crate::layers::{self, SETTINGS};

/// What an operator reads about one setting of [`SETTINGS`]: the variable, the default when the
/// help line's `[…]` does not say it all (it differs by runtime, or there is none), and what it
/// does. Every setting has exactly one entry (a test checks both ways).
struct Described {
    var: &'static str,
    default: Option<&'static str>,
    meaning: &'static str,
}

const fn describe(var: &'static str, meaning: &'static str) -> Described {
    Described {
        var,
        default: None,
        meaning,
    }
}

const fn describe_default(
    var: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> Described {
    Described {
        var,
        default: Some(default),
        meaning,
    }
}

const DESCRIPTIONS: &[Described] = &[
    describe_default(
        "GITSTATE_REPOSITORY",
        "unset: embedded repository",
        "the state repository, `https://…` (required on Lambda); locally also SSH: `ssh://[user@]host[:port]/path` (or git's `git+ssh://`, `ssh+git://`, IPv6 hosts in brackets, `~user` paths) or `[user@]host:path`. `git://`, `file://` and local paths are refused at start-up (the local repository is `GITSTATE_LOCAL_REPOSITORY`). Credentials in the URL (`https://user:token@…`, `https://token@…`, an SSH password) are refused at start-up, and a request's `repository=` with them is 400: use `GITSTATE_GIT_USERNAME` / `GITSTATE_GIT_TOKEN` (locally also `git credential`), and keys for SSH",
    ),
    describe(
        "GITSTATE_REF",
        "the branch states live on (`master` where terraform-backend-git's interface is used: docs/migrating-from-terraform-backend-git.md). While it keeps no states (no `.gitstate/index.json`, no `.tfstate` file, no states' refs) and other branches do (or keep a file by the name read, or a near one), a read that finds no state and a write are 400 naming those branches, never \"no state\"; commit `{\"format\":1,\"states\":{}}` to `.gitstate/index.json` on it to start states there beside them ([Terraform](terraform.md))",
    ),
    describe(
        "GITSTATE_STATE",
        "locally: the state `run` serves and `serve` prints a block for when `--state` is not given (gitstate.toml `state`, terraform-backend-git's `git.state`; `run` takes a file's only where Terraform runs in that file's directory)",
    ),
    describe(
        "GITSTATE_GIT_USERNAME",
        "user name for the repository ([Git hosts](#git-hosts)), sent only to its origin (scheme, host, port)",
    ),
    describe(
        "GITSTATE_GIT_TOKEN",
        "token for the repository ([Git hosts](#git-hosts)), sent only to its origin (scheme, host, port)",
    ),
    describe(
        "GITSTATE_GIT_TOKEN_KMS",
        "the git token as base64 of a KMS ciphertext (context `{\"gitstate:purpose\":\"git-token\"}` plus the team), decrypted at Lambda cold start; exclusive with `GITSTATE_GIT_TOKEN`",
    ),
    describe(
        "GITSTATE_TEAM",
        "the deployment's team (the template sets it): the KMS-sealed settings must carry `\"gitstate:team\":\"<team>\"` in their context, so one team's ciphertext starts no other team's function",
    ),
    describe(
        "GITSTATE_ALLOWED_REPOSITORIES",
        "further repositories requests may name (comma-separated; no credentials in the URLs, as for `GITSTATE_REPOSITORY`); one on another origin is reached without credentials",
    ),
    describe(
        "GITSTATE_GIT_AUTH",
        "`bearer`: send the token as `Authorization: Bearer` (Bitbucket Data Center project/repository tokens)",
    ),
    describe(
        "GITSTATE_GIT_CA_FILE",
        "a private CA for the git host as a PEM file, trusted besides the system roots (may be set with `GITSTATE_GIT_CA_PEM`)",
    ),
    describe(
        "GITSTATE_GIT_CA_PEM",
        "a private CA for the git host as PEM text, trusted besides the system roots (may be set with `GITSTATE_GIT_CA_FILE`)",
    ),
    describe(
        "GITSTATE_REQUIRE_ATOMIC",
        "`true`: refuse hosts without atomic push (502 naming this setting) instead of [writing without it](#hosts-without-atomic-push)",
    ),
    describe(
        "GITSTATE_SINGLE_FRONT",
        "`true`: every request of a Terraform run reaches this one process (one `serve` in front of its clients; `gitstate run` sets it itself): the GETs after a LOCK rest on what the LOCK push proved for 5 s rather than 2 s (`GITSTATE_LOCK_PROOF_MS`)",
    ),
    describe_default(
        "GITSTATE_LOCK_PROOF_MS",
        "`2000`; `5000` with `GITSTATE_SINGLE_FRONT`",
        "how long, in milliseconds (0 to 5000), the GETs after this process's LOCK of a state are answered from what the LOCK push proved, without a git request (the protocol floor, see [state refs](#state-refs)); `0`: never. The lock commit records until when, and every other gitstate process waits until then (and a quarter second more) before it writes under that lock or releases it, so no such answer misses a write made through one (the processes' clocks agreeing to within that quarter second). Longer saves the create's second GET after slower applies; shorter keeps a write or UNLOCK that reaches another container from waiting",
    ),
    describe_default(
        "GITSTATE_FOLD_AFTER_WRITES",
        "`true` (local), `false` (Lambda)",
        "`true`: after a write to a state ref, the serving process folds the state refs onto the branch in the background ([state refs](#state-refs)); `false`: a scheduled `gitstate fold` does (the Lambda template's `FoldSchedule`, every minute), and the branch lags until it runs. On Lambda it cannot be `true`: a container is frozen once it has answered",
    ),
    describe_default(
        "GITSTATE_STATE_REFS",
        "`always` (Lambda), `auto` (local)",
        "where updates go: `always`, every update of an existing state to its own ref `refs/gitstate/states/<branch>/<sha1 of its path>` (created by its first update; on a host without atomic push as `never`), so writes of different states never share a compare-and-swap; `auto` and `never` (the same in this version), to the branch, except for a state that already has a ref. Creates and deletes go through the branch. Reads and folds look at state refs whatever this says ([state refs](#state-refs))",
    ),
    describe(
        "GITSTATE_ALLOW_UNLOCKED_WRITES",
        "`true`: accept writes and deletes that hold no lock (a backend block without `lock_address`, `terraform -lock=false`), each logged as a warning; by default they are refused with 428 ([Terraform](terraform.md#writes-need-the-lock))",
    ),
    describe(
        "GITSTATE_CREATE_REF",
        "`true`: the first write to a branch that does not exist (`GITSTATE_REF`, or an allowlisted `?ref=`) creates it, even where the repository has other branches; `GITSTATE_REF`'s only while no other branch holds states (the state index `.gitstate/index.json` or a `.tfstate` file: a typo never starts a branch beside them), else reads and writes are 400 naming those branches; while it is on, a read of `GITSTATE_REF` that finds no state also looks for a file by that name, or a near name of it, on the branches without the index (terraform-backend-git's states have any name) and is that 400 if one has it. By default only an empty repository's branch is created; elsewhere reads and writes of a missing branch are 400 naming the repository's default branch ([Terraform](terraform.md#a-branch-is-never-created-by-accident))",
    ),
    describe(
        "GITSTATE_ALLOWED_REFS",
        "further branches `?ref=` may name (comma-separated exact names or `prefix/*`); refs clashing with the lock refs or `GITSTATE_REF` are refused regardless",
    ),
    describe(
        "GITSTATE_KMS_PREVIOUS_KEY_IDS",
        "KMS keys (same forms as `GITSTATE_KMS_KEY_IDS`) that still open states sealed under them but seal nothing; with the current keys, the only keys ever asked to unwrap (template: `PreviousKeyArns`)",
    ),
    describe(
        "GITSTATE_AGE_RECIPIENTS",
        "age recipients (`age1…`, comma-separated) every write is sealed for, beside or instead of KMS; such files carry their location under the MAC, so a copy elsewhere is refused (seed: `TF_BACKEND_HTTP_SOPS_AGE_RECIPIENTS`)",
    ),
    describe(
        "GITSTATE_AGE_PREVIOUS_RECIPIENTS",
        "age recipients that still open states sealed for them but seal nothing; with the current ones, the only age entries ever tried",
    ),
    describe(
        "GITSTATE_AGE_IDENTITY",
        "age identities (`AGE-SECRET-KEY-1…` lines) that open states; else `SOPS_AGE_KEY`. Exclusive with `GITSTATE_AGE_IDENTITY_FILE` and `GITSTATE_AGE_IDENTITY_KMS`",
    ),
    describe(
        "GITSTATE_AGE_IDENTITY_FILE",
        "a file of age identities (as `age-keygen` writes it) that open states; else `SOPS_AGE_KEY_FILE`",
    ),
    describe(
        "GITSTATE_AGE_IDENTITY_KMS",
        "the age identities as base64 of a KMS ciphertext (context `{\"gitstate:purpose\":\"age-identity\"}` plus the team), decrypted once at start",
    ),
    describe(
        "GITSTATE_PGP_FINGERPRINTS",
        "OpenPGP primary-key fingerprints (40 hex digits, comma-separated) every write is sealed for, as sops's `pgp` entries; the location binding applies as for age (seed: `TF_BACKEND_HTTP_SOPS_PGP_FP`)",
    ),
    describe(
        "GITSTATE_PGP_PREVIOUS_FINGERPRINTS",
        "OpenPGP fingerprints that still open states sealed for them but seal nothing",
    ),
    describe(
        "GITSTATE_PGP_PUBLIC_KEYS",
        "armored public keys (`gpg --armor --export`) holding every key of `GITSTATE_PGP_FINGERPRINTS`, as text (on Lambda, where the function has no file of its own; template: `PgpPublicKeys`); exclusive with `GITSTATE_PGP_PUBLIC_KEYS_FILE`",
    ),
    describe(
        "GITSTATE_PGP_PUBLIC_KEYS_FILE",
        "a file of such public keys",
    ),
    describe(
        "GITSTATE_PGP_SECRET_KEYS",
        "armored secret keys (`gpg --armor --export-secret-keys`) that open states; exclusive with `GITSTATE_PGP_SECRET_KEYS_FILE` and `GITSTATE_PGP_SECRET_KEYS_KMS`",
    ),
    describe(
        "GITSTATE_PGP_SECRET_KEYS_FILE",
        "a file of such secret keys",
    ),
    describe(
        "GITSTATE_PGP_SECRET_KEYS_KMS",
        "the armored secret keys as base64 of a KMS ciphertext (context `{\"gitstate:purpose\":\"pgp-secret-keys\"}` plus the team), decrypted once at start; KMS encrypts at most 4096 bytes: enough for a Curve25519 key (gpg 2.2's `future-default`, the default from 2.3, 0.9 KB armored) or an RSA-3072 key's decryption subkey (`gpg --armor --export-secret-subkeys`, 3.7 KB), not for a whole RSA-3072 secret key (5 KB), which goes in `GITSTATE_PGP_SECRET_KEYS_FILE`",
    ),
    describe(
        "GITSTATE_PGP_PASSPHRASE",
        "unlocks the secret keys protected by a passphrase, once at start (a key it does not unlock, or a protected key without it, stops the start); exclusive with `GITSTATE_PGP_PASSPHRASE_FILE`",
    ),
    describe(
        "GITSTATE_PGP_PASSPHRASE_FILE",
        "a file whose first line is that passphrase (as `gpg --passphrase-file` reads it)",
    ),
    describe_default(
        "GITSTATE_SOPS_SHAMIR_THRESHOLD",
        "one group of every key",
        "one sops key group per source (KMS, age, OpenPGP), of which this many open a state (Shamir); 1 or unset: one group, any key opens (seed: `TF_BACKEND_HTTP_SOPS_SHAMIR_THRESHOLD`)",
    ),
    describe(
        "GITSTATE_HISTORY_MAX_DEPTH",
        "how many commits of the branch history paging and `?at=` may fetch at most",
    ),
    describe(
        "GITSTATE_GIT_MAX_RESPONSE_BYTES",
        "the most a git remote may send in one answer (advertisement, pack, push report); more is a 502",
    ),
    describe(
        "GITSTATE_GIT_WRITES_PER_PUSH",
        "how many writes waiting at once in one process may leave in one push ([group commit](../ARCHITECTURE.md#many-writers-on-one-branch)); 1 pushes each alone",
    ),
    describe(
        "GITSTATE_LOCK_REF_PREFIX",
        "where lock refs go; `refs/locks/` keeps them out of branch lists and CI triggers",
    ),
    describe_default(
        "GITSTATE_CACHE_DIR",
        "`/tmp/gitstate` (Lambda), `.gitstate/cache` (local)",
        "cache repositories",
    ),
    describe("GITSTATE_LOCAL_REPOSITORY", "the embedded repository"),
    describe(
        "GITSTATE_MAX_BODY_BYTES",
        "larger request bodies are 413 (6 MiB is the Function URL limit); an encrypted state expanding past it is refused (500)",
    ),
    describe(
        "GITSTATE_GIT_TIMEOUT_SECS",
        "timeout of one git HTTP request",
    ),
    describe(
        "GITSTATE_FOLD_LEASE_SECS",
        "a fold lease (`refs/gitstate/fold`) older than this is taken over: how long a fold whose process crashed holds up the next (see \"Unfolded writes\")",
    ),
    describe(
        "GITSTATE_REQUEST_DEADLINE_SECS",
        "a request not done by then is answered 504; on Lambda the invocation's deadline less 2 s applies too",
    ),
    describe(
        "GITSTATE_HEADER_TIMEOUT_SECS",
        "`gitstate serve`: how long a connection may take to send a whole request head, from when it opens (after the TLS handshake) or goes idle after an answer (so also the keep-alive timeout); then it is closed",
    ),
    describe(
        "GITSTATE_BODY_TIMEOUT_SECS",
        "`gitstate serve`: the longest wait for the next piece of a request body (then 400), or for a client to take more of its answer (then the connection is closed)",
    ),
    describe(
        "GITSTATE_MAX_CONNECTIONS",
        "`gitstate serve`: connections open at once (lowered to fit the open-file limit); more are answered 503 and closed",
    ),
    describe(
        "GITSTATE_MAX_CONNECTIONS_PER_ADDRESS",
        "`gitstate serve`: connections open at once from one client address (IPv6: its /64); more are answered 503 and closed",
    ),
    describe(
        "GITSTATE_TRUSTED_PROXIES",
        "`gitstate serve`: reverse proxies in front of it (addresses or CIDR blocks, comma-separated). A connection from one counts under `GITSTATE_MAX_CONNECTIONS` only, and each of its requests counts in the login throttle under the nearest `X-Forwarded-For` address that is not itself a trusted proxy; anyone else's `X-Forwarded-For` is ignored ([throttling](#throttling-failed-logins))",
    ),
    describe(
        "GITSTATE_COMMITTER_NAME",
        "commit committer name (the author is the authenticated user)",
    ),
    describe("GITSTATE_COMMITTER_EMAIL", "commit committer email"),
    describe_default(
        "GITSTATE_ACCESS",
        "unset: `.gitstate/access.toml` in the repository",
        "the access policy as TOML text (exclusive with `GITSTATE_ACCESS_FILE`)",
    ),
    describe_default(
        "GITSTATE_ACCESS_FILE",
        "unset: `.gitstate/access.toml` in the repository",
        "the access policy as a file path (exclusive with `GITSTATE_ACCESS`)",
    ),
    describe("GITSTATE_ADMIN_USER", "name of the bootstrap administrator"),
    describe(
        "GITSTATE_ADMIN_HASH",
        "bootstrap administrator (argon2id PHC hash)",
    ),
    describe(
        "GITSTATE_ADMIN_HASH_KMS",
        "that hash as base64 of a KMS ciphertext (context `{\"gitstate:purpose\":\"admin-hash\"}` plus the team), decrypted at start-up; exclusive with `GITSTATE_ADMIN_HASH` (template: `AdminHashCiphertext`)",
    ),
    describe(
        "GITSTATE_ACCESS_REFRESH_SECS",
        "how long a warm process trusts the branch tip it saw last when reading the access file",
    ),
    describe(
        "GITSTATE_KMS_KEY_IDS",
        "KMS keys (ARNs or aliases, comma-separated) every write is encrypted under; the first makes the data key",
    ),
    describe(
        "GITSTATE_ENCRYPTION",
        "`enforced`: refuse (409, \"run gitstate rekey\") any state not encrypted with the configured keys",
    ),
    describe(
        "GITSTATE_PASSPHRASE",
        "reads terraform-backend-git's `aes` passphrase mode (migration)",
    ),
    describe(
        "GITSTATE_RESPONSE_STREAMING",
        "the Function URL streams responses (`InvokeMode: RESPONSE_STREAM`): the Lambda runs the streaming runtime and serves states over 6 MB",
    ),
    describe("GITSTATE_LISTEN", "address of `gitstate serve`"),
    describe(
        "GITSTATE_TLS_CERT",
        "PEM certificate chain: `serve` speaks HTTPS (with `GITSTATE_TLS_KEY`)",
    ),
    describe("GITSTATE_TLS_KEY", "PEM private key of `GITSTATE_TLS_CERT`"),
    describe(
        "GITSTATE_TLS_CLIENT_CA",
        "PEM CA bundle: clients must present a certificate it issued",
    ),
    describe(
        "GITSTATE_INSECURE_LISTEN",
        "allow a non-loopback `GITSTATE_LISTEN` without TLS",
    ),
    describe(
        "GITSTATE_LOG_FORMAT",
        "`json`: one JSON object per log line",
    ),
    describe("GITSTATE_ACCESS_LOG", "one log line per request"),
    describe_default(
        "GITSTATE_URL",
        "`http://127.0.0.1:8080`, or `http://` + `listen` when that is set",
        "the backend the remote commands (`history`, `show`, `restore`, `list`, `locks`, `unlock`, `remove`) talk to",
    ),
];

/// Variables gitstate honours that are not settings ([`layers::OTHER_VARIABLES`], which must all
/// be here, and those of other tools): (name, default, meaning).
const OTHER_VARIABLES: &[(&str, &str, &str)] = &[
    (
        "HTTPS_PROXY",
        "none",
        "proxy for git requests (`HTTP_PROXY` and `ALL_PROXY` too), see [Proxies](#git-hosts)",
    ),
    ("NO_PROXY", "none", "hosts that bypass the proxy"),
    (
        "GITSTATE_SEED_SSH",
        "none",
        "set by gitstate itself, never by hand: on the process it runs with an ssh command made from terraform-backend-git's `SSH_PRIVATE_KEY` and `StrictHostKeyChecking`, which of them it came from (for `gitstate config`); not passed on to the program `gitstate run` starts",
    ),
    (
        "RUST_LOG",
        "`info`",
        "log level (`AWS_LAMBDA_LOG_LEVEL` on Lambda). On Lambda the runtime's own targets (`lambda_runtime`, `lambda_runtime_api_client`, `lambda_http`) stay at INFO whatever is set: `lambda_runtime` prints the raw event, Authorization header and state included, at TRACE. On Lambda and in the CLI the AWS SDK and HTTP crates (`aws_smithy_runtime*`, `aws_sigv4`, `aws_config`, `aws_sdk_kms`, `hyper*`, `h2`, `reqwest`, `rustls`) stay at INFO too: their TRACE holds whole requests (a KMS `Encrypt` carries a plaintext data key)",
    ),
];

/// Why the table cannot be made: a setting without a description, or one too many.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("{0} has no description in functions/gitstate-app/src/docs.rs (DESCRIPTIONS): add one")]
    Undescribed(&'static str),
    #[error(
        "DESCRIPTIONS in functions/gitstate-app/src/docs.rs describes {0}, which is no setting"
    )]
    Unknown(&'static str),
    #[error(
        "{var}: the described default {described:?} does not contain the help line's {stated:?}"
    )]
    Default {
        var: &'static str,
        described: &'static str,
        stated: &'static str,
    },
}

/// The Markdown table of every setting, in [`SETTINGS`] order, then the other variables.
pub fn settings_table() -> Result<String, TableError> {
    if let Some(other) = layers::OTHER_VARIABLES
        .iter()
        .find(|v| !OTHER_VARIABLES.iter().any(|(name, _, _)| name == *v))
    {
        return Err(TableError::Undescribed(other));
    }
    if let Some(extra) = DESCRIPTIONS
        .iter()
        .find(|d| !SETTINGS.iter().any(|s| s.var == d.var))
    {
        return Err(TableError::Unknown(extra.var));
    }
    let mut out = String::from("| variable | flag | default | meaning |\n|---|---|---|---|\n");
    for spec in SETTINGS {
        let described = DESCRIPTIONS
            .iter()
            .find(|d| d.var == spec.var)
            .ok_or(TableError::Undescribed(spec.var))?;
        let default = match (described.default, spec.default_value()) {
            (Some(described), Some(stated)) if !described.contains(stated) => {
                return Err(TableError::Default {
                    var: spec.var,
                    described,
                    stated,
                });
            }
            (Some(described), _) => described.to_owned(),
            (None, Some(stated)) => format!("`{stated}`"),
            (None, None) => "none".to_owned(),
        };
        let flag = if spec.secret {
            "none (secret)".to_owned()
        } else {
            format!("`--{}`", spec.flag())
        };
        out.push_str(&format!(
            "| `{}` | {flag} | {default} | {} |\n",
            spec.var, described.meaning
        ));
    }
    for (var, default, meaning) in OTHER_VARIABLES {
        out.push_str(&format!("| `{var}` | none | {default} | {meaning} |\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operating.md");
    const BEGIN: &str = "<!-- settings table: generated from functions/gitstate-app/src/docs.rs; \
        UPDATE_DOCS=1 cargo test -p gitstate-app settings_table -->\n";
    const END: &str = "<!-- end of the settings table -->";

    /// Every cell stays on its line and in its column.
    #[test]
    fn settings_table_cells_are_one_line_without_pipes() {
        let rows = DESCRIPTIONS
            .iter()
            .map(|d| (d.var, d.meaning))
            .chain(OTHER_VARIABLES.iter().map(|(v, _, m)| (*v, *m)));
        for (var, text) in rows {
            assert!(!text.contains(['|', '\n']), "{var}: {text}");
        }
        let table = settings_table().expect("every setting described");
        let columns = |line: &str| line.matches('|').count();
        assert!(table.lines().all(|line| columns(line) == 5), "{table}");
        assert_eq!(
            table.lines().count(),
            2 + SETTINGS.len() + OTHER_VARIABLES.len()
        );
    }

    const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

    /// The documents, by reader, and the two beside them.
    const DOCUMENTS: [&str; 7] = [
        "README.md",
        "docs/terraform.md",
        "docs/operating.md",
        "docs/migrating-from-terraform-backend-git.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "BENCHMARKS.md",
    ];

    fn read(path: &std::path::Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// GitHub's anchors of a Markdown file's headings (code blocks aside): lower case, spaces as
    /// `-`, other punctuation than `-` and `_` dropped; a repeated one also with `-1`, `-2`, ….
    fn anchors(text: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut fenced = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            let Some(heading) = line.strip_prefix('#').filter(|_| !fenced) else {
                continue;
            };
            let anchor: String = heading
                .trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect();
            let seen = out.iter().filter(|a| **a == anchor).count();
            if seen > 0 {
                out.push(format!("{anchor}-{seen}"));
            }
            out.push(anchor);
        }
        out
    }

    /// Issue 26's docs by reader, kept: a README of at most 200 lines that links each reader's
    /// document, ARCHITECTURE.md in rust-analyzer's three parts, CONTRIBUTING.md's commit style;
    /// and every relative link among the documents names a file that exists and, after `#`, a
    /// heading in it.
    #[test]
    fn the_documents_by_reader_are_there_and_their_links_hold() {
        let root = std::path::Path::new(ROOT);
        let readme = read(&root.join("README.md"));
        let lines = readme.lines().count();
        assert!(lines <= 200, "README.md is {lines} lines: at most 200");
        for doc in [
            "docs/terraform.md",
            "docs/operating.md",
            "ARCHITECTURE.md",
            "CONTRIBUTING.md",
        ] {
            assert!(
                readme.contains(&format!("]({doc}")),
                "README.md links no {doc}"
            );
        }
        let architecture = read(&root.join("ARCHITECTURE.md"));
        for part in ["## Bird's-eye view", "## Code map", "## Invariants"] {
            assert!(
                architecture.lines().any(|l| l == part),
                "ARCHITECTURE.md lacks {part}"
            );
        }
        let contributing = read(&root.join("CONTRIBUTING.md"));
        for said in ["## Commits", "says **what**", "says **why**"] {
            assert!(
                contributing.contains(said),
                "CONTRIBUTING.md lacks {said:?}"
            );
        }
        let mut links = 0;
        for doc in DOCUMENTS {
            let at = root.join(doc);
            let text = read(&at);
            for link in text.split("](").skip(1) {
                let Some(target) = link.split(')').next().filter(|t| !t.contains("://")) else {
                    continue;
                };
                let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
                let path = if file.is_empty() {
                    at.clone()
                } else {
                    at.parent().map(|dir| dir.join(file)).unwrap_or_default()
                };
                assert!(path.exists(), "{doc}: the link ({target}) names no file");
                if !fragment.is_empty() {
                    let headings = anchors(&read(&path));
                    assert!(
                        headings.iter().any(|a| a == fragment),
                        "{doc}: the link ({target}) names no heading of {file}"
                    );
                }
                links += 1;
            }
        }
        assert!(links > 20, "{links} links?");
    }

    /// docs/operating.md holds the table as generated now; with `UPDATE_DOCS=1` it is rewritten.
    #[test]
    fn settings_table_in_docs_is_current() {
        let table = settings_table().unwrap_or_else(|e| panic!("{e}"));
        let text = std::fs::read_to_string(DOC).expect("docs/operating.md");
        let (before, rest) = text
            .split_once(BEGIN)
            .unwrap_or_else(|| panic!("docs/operating.md lacks the line {BEGIN:?}"));
        let (current, after) = rest
            .split_once(END)
            .unwrap_or_else(|| panic!("docs/operating.md lacks the line {END:?}"));
        if current == table {
            return;
        }
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(DOC, format!("{before}{BEGIN}{table}{END}{after}"))
                .expect("writing docs/operating.md");
            return;
        }
        panic!(
            "docs/operating.md's settings table differs from the settings (layers::SETTINGS and \
             docs.rs): regenerate it with `UPDATE_DOCS=1 cargo test -p gitstate-app settings_table`"
        );
    }
}
