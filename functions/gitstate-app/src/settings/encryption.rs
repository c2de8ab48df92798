//! Encryption at rest: KMS keys, previous keys, the mode, the passphrase.

use gitstate_core::secret::Secret;
use gitstate_kms::kms_key::KeyName;

pub use gitstate_kms::EncryptionSettings;

use super::{ConfigError, Vars};

pub(crate) fn read(vars: &Vars<'_>) -> Result<EncryptionSettings, ConfigError> {
    let encryption = EncryptionSettings {
        kms_key_ids: key_list(vars, "GITSTATE_KMS_KEY_IDS")?,
        previous_kms_key_ids: key_list(vars, "GITSTATE_KMS_PREVIOUS_KEY_IDS")?,
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
    if encryption.enforced && encryption.kms_key_ids.is_empty() {
        return Err(ConfigError::EnforcedWithoutKeys);
    }
    if !encryption.previous_kms_key_ids.is_empty() && encryption.kms_key_ids.is_empty() {
        return Err(ConfigError::PreviousWithoutKeys);
    }
    Ok(encryption)
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
