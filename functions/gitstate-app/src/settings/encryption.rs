//! Encryption at rest: KMS keys and age recipients (current and previous), the age identities,
//! key groups, the mode, the passphrase. terraform-backend-git's variables for the same things
//! are read too; gitstate's own win when both are set.

use gitstate_core::secret::Secret;
use gitstate_kms::kms_key::KeyName;
use gitstate_sops::{AgeKeys, KeySource};

pub use gitstate_kms::EncryptionSettings;

use super::{ConfigError, Vars};

pub(crate) fn read(vars: &Vars<'_>) -> Result<EncryptionSettings, ConfigError> {
    let pgp_fingerprints = if vars.get("GITSTATE_PGP_FINGERPRINTS").is_some() {
        fingerprints(vars, "GITSTATE_PGP_FINGERPRINTS")?
    } else {
        fingerprints(vars, "TF_BACKEND_HTTP_SOPS_PGP_FP")?
    };
    let age_recipients = if vars.get("GITSTATE_AGE_RECIPIENTS").is_some() {
        recipients(vars, "GITSTATE_AGE_RECIPIENTS")?
    } else {
        recipients(vars, "TF_BACKEND_HTTP_SOPS_AGE_RECIPIENTS")?
    };
    let shamir_threshold = match vars.get("GITSTATE_SOPS_SHAMIR_THRESHOLD") {
        Some(_) => Some(vars.number("GITSTATE_SOPS_SHAMIR_THRESHOLD", 1)?),
        None if vars.get("TF_BACKEND_HTTP_SOPS_SHAMIR_THRESHOLD").is_some() => {
            Some(vars.number("TF_BACKEND_HTTP_SOPS_SHAMIR_THRESHOLD", 1)?)
        }
        None => None,
    };
    let (kms_key_ids, fixed_context) = kms_keys(vars)?;
    let encryption = EncryptionSettings {
        kms_key_ids,
        fixed_context,
        previous_kms_key_ids: key_list(vars, "GITSTATE_KMS_PREVIOUS_KEY_IDS")?,
        age_recipients,
        previous_age_recipients: recipients(vars, "GITSTATE_AGE_PREVIOUS_RECIPIENTS")?,
        age_identity: identity(vars)?,
        age_identity_kms: vars.get("GITSTATE_AGE_IDENTITY_KMS").map(Secret::new),
        age_identities: None,
        previous_pgp_fingerprints: fingerprints(vars, "GITSTATE_PGP_PREVIOUS_FINGERPRINTS")?,
        pgp_public_keys: pgp_public_keys(vars)?,
        pgp_secret_keys: pgp_secret_keys(vars)?,
        pgp_secret_keys_kms: vars.get("GITSTATE_PGP_SECRET_KEYS_KMS").map(Secret::new),
        pgp_passphrase: pgp_passphrase(vars)?,
        pgp_fingerprints,
        pgp_keys: None,
        shamir_threshold: shamir_threshold.map(|t| usize::try_from(t).unwrap_or(usize::MAX)),
        enforced: match vars.get("GITSTATE_ENCRYPTION").as_deref() {
            None | Some("optional") => false,
            Some("enforced") => true,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: "GITSTATE_ENCRYPTION",
                    reason: format!("{other:?} is neither `optional` nor `enforced`"),
                });
            }
        },
        passphrase: vars.get("GITSTATE_PASSPHRASE").map(Secret::new),
    };
    let sources = usize::from(!encryption.kms_key_ids.is_empty())
        + usize::from(!encryption.age_recipients.is_empty())
        + usize::from(!encryption.pgp_fingerprints.is_empty());
    if !encryption.pgp_fingerprints.is_empty() && encryption.pgp_public_keys.is_none() {
        return Err(ConfigError::Invalid {
            var: "GITSTATE_PGP_PUBLIC_KEYS_FILE",
            reason: "needed (or GITSTATE_PGP_PUBLIC_KEYS) to seal for GITSTATE_PGP_FINGERPRINTS (armored public keys)".into(),
        });
    }
    seed_sops_sources(vars, sources)?;
    if encryption.enforced && sources == 0 {
        return Err(ConfigError::EnforcedWithoutKeys);
    }
    if !encryption.previous_kms_key_ids.is_empty() && encryption.kms_key_ids.is_empty() {
        return Err(ConfigError::PreviousWithoutKeys);
    }
    if let Some(threshold) = encryption.shamir_threshold
        && threshold > sources.max(1)
    {
        return Err(ConfigError::Invalid {
            var: "GITSTATE_SOPS_SHAMIR_THRESHOLD",
            reason: format!(
                "{threshold} key groups cannot open a state sealed for {sources} (one group per source: KMS, age, OpenPGP)"
            ),
        });
    }
    Ok(encryption)
}

/// terraform-backend-git's key sources that gitstate does not seal with.
const SEED_UNSERVED: &[&str] = &[
    "TF_BACKEND_HTTP_SOPS_GCP_KMS_KEYS",
    "TF_BACKEND_HTTP_SOPS_HC_VAULT_URIS",
];

/// terraform-backend-git's sops mode with nothing gitstate can seal with, or with a key source
/// it does not serve, is refused: writing plaintext, or sealing for fewer keys than the seed
/// did, would be a silent change of who can read the states.
fn seed_sops_sources(vars: &Vars<'_>, sources: usize) -> Result<(), ConfigError> {
    if let Some(var) = SEED_UNSERVED.iter().find(|v| vars.get(v).is_some()) {
        return Err(ConfigError::Invalid {
            var,
            reason: "gitstate seals with AWS KMS, age and OpenPGP only: move these states to \
                     one of those (docs/migrating-from-terraform-backend-git.md) and unset it"
                .into(),
        });
    }
    if vars.get("TF_BACKEND_HTTP_ENCRYPTION_PROVIDER").as_deref() == Some("sops") && sources == 0 {
        return Err(ConfigError::Invalid {
            var: "TF_BACKEND_HTTP_ENCRYPTION_PROVIDER",
            reason: "`sops` names no key to seal with: set TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS, \
                     _AGE_RECIPIENTS or _PGP_FP (or GITSTATE_KMS_KEY_IDS, GITSTATE_AGE_RECIPIENTS, \
                     GITSTATE_PGP_FINGERPRINTS); states would otherwise be written in plaintext"
                .into(),
        });
    }
    Ok(())
}

/// terraform-backend-git's KMS keys for sops.
const SEED_KMS_ARNS: &str = "TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS";
/// terraform-backend-git's KMS encryption context: `key=value` pairs, comma-separated.
const SEED_KMS_CONTEXT: &str = "TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT";

/// The KMS keys states are sealed under, and the fixed context they are sealed under, if any:
/// gitstate's own keys keep the location-bound context; terraform-backend-git's come with the
/// context its variables name (none: empty), as it sealed its states.
type KmsKeys = (Vec<String>, Option<gitstate_sops::Context>);

fn kms_keys(vars: &Vars<'_>) -> Result<KmsKeys, ConfigError> {
    if vars.get("GITSTATE_KMS_KEY_IDS").is_some() {
        return Ok((key_list(vars, "GITSTATE_KMS_KEY_IDS")?, None));
    }
    let keys = key_list(vars, SEED_KMS_ARNS)?;
    let context = (!keys.is_empty()).then(|| seed_context(vars)).transpose()?;
    Ok((keys, context))
}

/// [`SEED_KMS_CONTEXT`] as a context (empty when unset); a pair without `=` or with an empty
/// key, or a key given twice, is refused.
fn seed_context(vars: &Vars<'_>) -> Result<gitstate_sops::Context, ConfigError> {
    let mut context = gitstate_sops::Context::new();
    for pair in vars.list(SEED_KMS_CONTEXT) {
        let bad = |reason: &str| ConfigError::Invalid {
            var: SEED_KMS_CONTEXT,
            reason: format!("{pair:?}: {reason}"),
        };
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| bad("write each pair as key=value"))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(bad("the key is empty"));
        }
        if context
            .insert(key.to_owned(), value.trim().to_owned())
            .is_some()
        {
            return Err(bad("the key is given twice"));
        }
    }
    Ok(context)
}

/// A comma-separated list of KMS keys, each a strictly parsed ARN or a bare alias or key ID.
fn key_list(vars: &Vars<'_>, var: &'static str) -> Result<Vec<String>, ConfigError> {
    let mut keys: Vec<String> = Vec::new();
    for key in vars.list(var) {
        KeyName::parse(&key).map_err(|e| ConfigError::Invalid {
            var,
            reason: e.to_string(),
        })?;
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    Ok(keys)
}

/// A comma-separated list of age recipients (`age1…`).
fn recipients(vars: &Vars<'_>, var: &'static str) -> Result<Vec<String>, ConfigError> {
    let age = AgeKeys::sealing_only();
    let mut out: Vec<String> = Vec::new();
    for recipient in vars.list(var) {
        let recipient = age
            .recipient(&recipient)
            .map_err(|e| ConfigError::Invalid {
                var,
                reason: e.to_string(),
            })?;
        if !out.contains(&recipient) {
            out.push(recipient);
        }
    }
    Ok(out)
}

/// The age identities' text: `GITSTATE_AGE_IDENTITY` or the file `GITSTATE_AGE_IDENTITY_FILE`
/// names, else sops's own `SOPS_AGE_KEY` / `SOPS_AGE_KEY_FILE`; at most one of gitstate's three
/// (with `GITSTATE_AGE_IDENTITY_KMS`). Parsed when the application is built.
fn identity(vars: &Vars<'_>) -> Result<Option<(&'static str, Secret)>, ConfigError> {
    let set = at_most_one(
        vars,
        &[
            "GITSTATE_AGE_IDENTITY",
            "GITSTATE_AGE_IDENTITY_FILE",
            "GITSTATE_AGE_IDENTITY_KMS",
        ],
    )?;
    let (text_var, file_var) = match set {
        Some("GITSTATE_AGE_IDENTITY_KMS") => return Ok(None),
        Some(_) => ("GITSTATE_AGE_IDENTITY", "GITSTATE_AGE_IDENTITY_FILE"),
        None => ("SOPS_AGE_KEY", "SOPS_AGE_KEY_FILE"),
    };
    Ok(match (vars.get(text_var), vars.get(file_var)) {
        (Some(text), _) => Some((text_var, Secret::new(text))),
        (None, Some(path)) => Some((
            file_var,
            Secret::new(
                std::fs::read_to_string(&path).map_err(|e| ConfigError::Invalid {
                    var: file_var,
                    reason: format!("cannot read {path:?}: {e}"),
                })?,
            ),
        )),
        (None, None) => None,
    })
}

/// The armored OpenPGP secret keys' text: `GITSTATE_PGP_SECRET_KEYS` or the file
/// `GITSTATE_PGP_SECRET_KEYS_FILE` names; at most one of these two and
/// `GITSTATE_PGP_SECRET_KEYS_KMS` (opened when the application is built).
fn pgp_secret_keys(vars: &Vars<'_>) -> Result<Option<(&'static str, Secret)>, ConfigError> {
    at_most_one(
        vars,
        &[
            "GITSTATE_PGP_SECRET_KEYS",
            "GITSTATE_PGP_SECRET_KEYS_FILE",
            "GITSTATE_PGP_SECRET_KEYS_KMS",
        ],
    )?;
    Ok(
        match (
            vars.get("GITSTATE_PGP_SECRET_KEYS"),
            vars.get("GITSTATE_PGP_SECRET_KEYS_FILE"),
        ) {
            (Some(text), _) => Some(("GITSTATE_PGP_SECRET_KEYS", Secret::new(text))),
            (None, Some(path)) => Some((
                "GITSTATE_PGP_SECRET_KEYS_FILE",
                Secret::new(read_file("GITSTATE_PGP_SECRET_KEYS_FILE", &path)?),
            )),
            (None, None) => None,
        },
    )
}

/// The armored OpenPGP public keys: `GITSTATE_PGP_PUBLIC_KEYS` as text (a Lambda function has
/// no file of its own) or the file `GITSTATE_PGP_PUBLIC_KEYS_FILE` names, never both.
fn pgp_public_keys(vars: &Vars<'_>) -> Result<Option<String>, ConfigError> {
    Ok(
        match at_most_one(
            vars,
            &["GITSTATE_PGP_PUBLIC_KEYS", "GITSTATE_PGP_PUBLIC_KEYS_FILE"],
        )? {
            Some("GITSTATE_PGP_PUBLIC_KEYS") => vars
                .get("GITSTATE_PGP_PUBLIC_KEYS")
                .map(|t| unflatten_armor(&t)),
            Some(var) => match vars.get(var) {
                Some(path) => Some(read_file(var, &path)?),
                None => None,
            },
            None => None,
        },
    )
}

/// Armored OpenPGP text whose newlines became spaces (a CloudFormation parameter given on one
/// line) with its lines back: each `-----BEGIN …-----` line, the empty line the armor needs, the
/// base64 lines and the checksum, the `-----END …-----` line. Text with newlines is unchanged.
/// (A flattened armor header such as `Comment: …` cannot be told from the body: export without.)
pub(crate) fn unflatten_armor(text: &str) -> String {
    if text.trim().contains('\n') {
        return text.to_owned();
    }
    let mut out = String::new();
    for part in text.split("-----").map(str::trim).filter(|p| !p.is_empty()) {
        if part.starts_with("BEGIN ") {
            out.push_str(&format!("-----{part}-----\n\n"));
        } else if part.starts_with("END ") {
            out.push_str(&format!("-----{part}-----\n"));
        } else {
            for chunk in part.split_whitespace() {
                out.push_str(chunk);
                out.push('\n');
            }
        }
    }
    out
}

/// A comma-separated list of OpenPGP fingerprints (spaces allowed, any case).
fn fingerprints(vars: &Vars<'_>, var: &'static str) -> Result<Vec<String>, ConfigError> {
    let pgp = gitstate_sops::PgpKeys::parse("", "", None).map_err(|e| ConfigError::Invalid {
        var,
        reason: e.to_string(),
    })?;
    let mut out: Vec<String> = Vec::new();
    for fp in vars.list(var) {
        let fp = pgp.recipient(&fp).map_err(|e| ConfigError::Invalid {
            var,
            reason: e.to_string(),
        })?;
        if !out.contains(&fp) {
            out.push(fp);
        }
    }
    Ok(out)
}

/// `GITSTATE_PGP_PASSPHRASE`, or the first line of the file `GITSTATE_PGP_PASSPHRASE_FILE`
/// names (as `gpg --passphrase-file` reads it); not both.
fn pgp_passphrase(vars: &Vars<'_>) -> Result<Option<Secret>, ConfigError> {
    const FILE: &str = "GITSTATE_PGP_PASSPHRASE_FILE";
    Ok(
        match at_most_one(vars, &["GITSTATE_PGP_PASSPHRASE", FILE])? {
            Some(FILE) => {
                let text = read_file(FILE, &vars.get(FILE).unwrap_or_default())?;
                Some(Secret::new(
                    text.lines().next().unwrap_or_default().to_owned(),
                ))
            }
            Some(var) => vars.get(var).map(Secret::new),
            None => None,
        },
    )
}

/// Which one of `choices` (ways to give the same secret) is set; an error naming the second
/// when more than one is.
fn at_most_one(
    vars: &Vars<'_>,
    choices: &[&'static str],
) -> Result<Option<&'static str>, ConfigError> {
    let set: Vec<&'static str> = choices
        .iter()
        .copied()
        .filter(|v| vars.get(v).is_some())
        .collect();
    if let [first, second, ..] = set[..] {
        return Err(ConfigError::Invalid {
            var: second,
            reason: format!("{first} is set too: choose one"),
        });
    }
    Ok(set.first().copied())
}

fn read_file(var: &'static str, path: &str) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
        var,
        reason: format!("cannot read {path:?}: {e}"),
    })
}
