//! The core's [`Sealer`] port over the sops envelope and KMS: what the backend stores.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use gitstate_core::StateName;
use gitstate_core::ports::{Location, Opened, Protection, SealError, Sealer};
use gitstate_core::secret::Secret;
use gitstate_core::service::Encryption;
use gitstate_sops::{
    AgeKeys, Context, Envelope, Error, Format, KeyError, KeyService, KeySource, Offline, PgpKeys,
};
use zeroize::Zeroizing;

use crate::Kms;

/// The context key naming the repository a state lives in.
pub const CONTEXT_REPOSITORY: &str = "gitstate:repository";
/// The context key naming the state's path in the repository.
pub const CONTEXT_STATE: &str = "gitstate:state";

/// The encryption context of a state: where it lives, so a copy elsewhere does not open.
pub fn context(repository: &str, name: &StateName) -> Context {
    let repository = repository.trim_end_matches('/');
    let repository = repository.strip_suffix(".git").unwrap_or(repository);
    [
        (CONTEXT_REPOSITORY.to_owned(), repository.to_owned()),
        (CONTEXT_STATE.to_owned(), name.as_str().to_owned()),
    ]
    .into_iter()
    .collect()
}

/// The most a sealed state may expand to unless [`SopsSealer::with_max_state_bytes`] says
/// otherwise: the default request body limit.
const DEFAULT_MAX_STATE_BYTES: usize = 6 * 1024 * 1024;

/// `GITSTATE_KMS_KEY_IDS`: KMS keys (ARNs, aliases; comma-separated) every write is sealed
/// under, the first making the data key; `GITSTATE_KMS_PREVIOUS_KEY_IDS`: keys that may still
/// unwrap states sealed before a key change, never used to seal (with the current ones, the only
/// keys ever asked to unwrap); `GITSTATE_AGE_RECIPIENTS` / `GITSTATE_AGE_PREVIOUS_RECIPIENTS`:
/// the same for age recipients, opened with the age identities held; `GITSTATE_SOPS_SHAMIR_THRESHOLD`:
/// one key group per source (KMS, age), any that many of which open a state (unset: one group of
/// every key, any one opens); `GITSTATE_ENCRYPTION`: `optional` (default: plaintext
/// states are still served and encrypted on their next write) or `enforced` (states not under
/// the configured keys are refused until `gitstate rekey`); `GITSTATE_PASSPHRASE`: reads
/// terraform-backend-git's aes passphrase mode.
#[derive(Debug, Clone, Default)]
pub struct EncryptionSettings {
    pub kms_key_ids: Vec<String>,
    pub previous_kms_key_ids: Vec<String>,
    pub age_recipients: Vec<String>,
    pub previous_age_recipients: Vec<String>,
    /// The age identities (`AGE-SECRET-KEY-1…` lines) as given, and the variable that gave
    /// them (`GITSTATE_AGE_IDENTITY`, `…_FILE`, sops's `SOPS_AGE_KEY`, `…_FILE`): parsed once at
    /// start (see [`open_age_identities`]).
    pub age_identity: Option<(&'static str, Secret)>,
    /// `GITSTATE_AGE_IDENTITY_KMS`: the identities as base64 of a KMS ciphertext (context
    /// `gitstate:purpose` = `age-identity`, plus `gitstate:team` when the deployment names its
    /// team), decrypted once at start.
    pub age_identity_kms: Option<Secret>,
    /// The identities, once opened.
    pub age_identities: Option<Arc<AgeKeys>>,
    /// `GITSTATE_PGP_FINGERPRINTS` / `…_PREVIOUS_FINGERPRINTS`: OpenPGP keys, as age recipients.
    pub pgp_fingerprints: Vec<String>,
    pub previous_pgp_fingerprints: Vec<String>,
    /// `GITSTATE_PGP_PUBLIC_KEYS`' (or `…_FILE`'s) armored public keys (to seal for the
    /// fingerprints).
    pub pgp_public_keys: Option<String>,
    /// Armored secret keys that open (`GITSTATE_PGP_SECRET_KEYS` or `…_FILE`), and the variable.
    pub pgp_secret_keys: Option<(&'static str, Secret)>,
    /// `GITSTATE_PGP_SECRET_KEYS_KMS`: the armored secret keys as base64 of a KMS ciphertext
    /// (context `gitstate:purpose` = `pgp-secret-keys`, plus the team), decrypted once at start.
    pub pgp_secret_keys_kms: Option<Secret>,
    /// `GITSTATE_PGP_PASSPHRASE` (or the first line of `…_FILE`): unlocks the secret keys that
    /// are protected by one, once at start.
    pub pgp_passphrase: Option<Secret>,
    /// The OpenPGP keys, once parsed.
    pub pgp_keys: Option<Arc<PgpKeys>>,
    pub shamir_threshold: Option<usize>,
    pub enforced: bool,
    pub passphrase: Option<Secret>,
    /// A fixed encryption context for states instead of their location's
    /// (terraform-backend-git's `TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT`, empty when it names
    /// none): states are sealed under it, and opened under it or under their location's. It
    /// binds a state to nothing but that context, as that tool's states were.
    pub fixed_context: Option<Context>,
}

impl EncryptionSettings {
    /// Whether states pass through encryption at all.
    pub fn is_configured(&self) -> bool {
        !self.kms_key_ids.is_empty()
            || self.passphrase.is_some()
            || !self.age_recipients.is_empty()
            || self.age_identity.is_some()
            || self.age_identity_kms.is_some()
            || self.age_identities.is_some()
            || !self.pgp_fingerprints.is_empty()
            || self.pgp_secret_keys.is_some()
            || self.pgp_secret_keys_kms.is_some()
            || self.pgp_keys.is_some()
    }

    /// Whether some key seals writes: a KMS key, an age recipient or an OpenPGP fingerprint.
    pub fn has_write_keys(&self) -> bool {
        !self.kms_key_ids.is_empty()
            || !self.age_recipients.is_empty()
            || !self.pgp_fingerprints.is_empty()
    }

    /// Why this deployment could not open what it seals, if it could not: every write is sealed
    /// for the current keys (one key group, or one per source with a threshold), and a source
    /// opens only holding the private side of one of its current keys (a KMS key always does).
    /// Such a deployment would take a new state's write, then refuse every read and write of it.
    pub fn unopenable(&self) -> Option<String> {
        let holds = |current: &[String], source: &dyn KeySource, held: Vec<String>| {
            current
                .iter()
                .any(|id| source.recipient(id).is_ok_and(|id| held.contains(&id)))
        };
        let age = (!self.age_recipients.is_empty()).then(|| {
            self.age_identities
                .as_ref()
                .is_some_and(|keys| holds(&self.age_recipients, &**keys, keys.recipients()))
        });
        let pgp = (!self.pgp_fingerprints.is_empty()).then(|| {
            self.pgp_keys
                .as_ref()
                .is_some_and(|keys| holds(&self.pgp_fingerprints, &**keys, keys.fingerprints()))
        });
        let kms = (!self.kms_key_ids.is_empty()).then_some(true);
        let sources = [kms, age, pgp];
        let sealing = sources.iter().flatten().count();
        let opening = sources.iter().flatten().filter(|opens| **opens).count();
        let needed = self.shamir_threshold.unwrap_or(1).max(1);
        if sealing == 0 || opening >= needed {
            return None;
        }
        let lacking = [
            (
                age,
                "GITSTATE_AGE_RECIPIENTS: no identity here (GITSTATE_AGE_IDENTITY, _FILE or _KMS, or SOPS_AGE_KEY(_FILE)) is one of them",
            ),
            (
                pgp,
                "GITSTATE_PGP_FINGERPRINTS: no secret key here (GITSTATE_PGP_SECRET_KEYS, _FILE or _KMS) is one of them",
            ),
        ];
        let lacking: Vec<&str> = lacking
            .iter()
            .filter_map(|(opens, why)| (*opens == Some(false)).then_some(*why))
            .collect();
        Some(format!(
            "this deployment could not open the states it writes ({opening} of its {sealing} key \
             sources open here, {needed} needed): {}",
            lacking.join("; ")
        ))
    }

    /// The sources other than KMS as configured (age, then OpenPGP): their recipients, and the
    /// private keys that open.
    pub fn offline(&self) -> Vec<Offline> {
        let mut out = Vec::new();
        if !self.age_recipients.is_empty()
            || !self.previous_age_recipients.is_empty()
            || self.age_identities.is_some()
        {
            let keys: Arc<dyn KeySource> = match &self.age_identities {
                Some(keys) => keys.clone(),
                None => Arc::new(AgeKeys::sealing_only()),
            };
            let mut previous = self.previous_age_recipients.clone();
            if self.age_recipients.is_empty()
                && let Some(held) = &self.age_identities
            {
                // identities with no recipient configured still open (a break-glass reader)
                previous.extend(held.recipients());
            }
            // every recipient was checked when the settings were read
            out.extend(Offline::new(keys, &self.age_recipients, &previous).ok());
        }
        if let Some(keys) = &self.pgp_keys {
            let mut previous = self.previous_pgp_fingerprints.clone();
            if self.pgp_fingerprints.is_empty() {
                previous.extend(keys.fingerprints());
            }
            let keys: Arc<dyn KeySource> = keys.clone();
            out.extend(Offline::new(keys, &self.pgp_fingerprints, &previous).ok());
        }
        out
    }
}

/// The context a KMS-encrypted age identity is bound to (plus the team, see
/// [`crate::TEAM_CONTEXT_KEY`]).
pub const AGE_IDENTITY_PURPOSE: (&str, &str) = ("gitstate:purpose", "age-identity");
/// The context KMS-encrypted OpenPGP secret keys are bound to (plus the team).
pub const PGP_SECRET_KEYS_PURPOSE: (&str, &str) = ("gitstate:purpose", "pgp-secret-keys");

#[derive(Debug, thiserror::Error)]
pub enum PrivateKeyError {
    #[error(transparent)]
    Sealed(#[from] crate::SealedSettingError),
    #[error("{var}: {source}")]
    Keys {
        var: &'static str,
        source: gitstate_sops::SourceError,
    },
    #[error("GITSTATE_PGP_FINGERPRINTS: {0} has no public key in GITSTATE_PGP_PUBLIC_KEYS(_FILE)")]
    NoPublicKey(String),
}

/// Parse the age identities and the OpenPGP secret keys given as text, or decrypt their `…_KMS`
/// settings with `kms` (under their purpose and `team`, as the git token) and parse them, once
/// per process; unlock the OpenPGP keys with the passphrase. Errors name the variable, never a
/// key.
pub async fn open_private_keys(
    kms: Option<&Kms>,
    team: Option<&str>,
    settings: &mut EncryptionSettings,
) -> Result<(), PrivateKeyError> {
    let parse = |var: &'static str, text: &str| {
        AgeKeys::parse(text)
            .map(Arc::new)
            .map_err(|source| PrivateKeyError::Keys { var, source })
    };
    if let Some((var, text)) = settings.age_identity.take() {
        settings.age_identities = Some(parse(var, text.expose())?);
    }
    if let (Some(kms), Some(ciphertext)) = (kms, settings.age_identity_kms.take()) {
        let var = "GITSTATE_AGE_IDENTITY_KMS";
        let text =
            crate::decrypt_setting(kms, var, AGE_IDENTITY_PURPOSE, team, ciphertext.expose())
                .await?;
        settings.age_identities = Some(parse(var, text.expose())?);
    }
    let mut secret = settings.pgp_secret_keys.take();
    if let (Some(kms), Some(ciphertext)) = (kms, settings.pgp_secret_keys_kms.take()) {
        let var = "GITSTATE_PGP_SECRET_KEYS_KMS";
        let text =
            crate::decrypt_setting(kms, var, PGP_SECRET_KEYS_PURPOSE, team, ciphertext.expose())
                .await?;
        secret = Some((var, text));
    }
    if secret.is_some() || settings.pgp_public_keys.is_some() {
        let (var, secret_text) = match &secret {
            Some((var, text)) => (*var, text.expose()),
            None => ("GITSTATE_PGP_PUBLIC_KEYS(_FILE)", ""),
        };
        let public = settings.pgp_public_keys.as_deref().unwrap_or_default();
        let passphrase = settings.pgp_passphrase.as_ref().map(|p| p.expose());
        let keys = PgpKeys::parse(public, secret_text, passphrase).map_err(|source| {
            let var = match source {
                gitstate_sops::SourceError::PgpPublic => "GITSTATE_PGP_PUBLIC_KEYS(_FILE)",
                gitstate_sops::SourceError::PgpPassphrase(_) => "GITSTATE_PGP_PASSPHRASE",
                _ => var,
            };
            PrivateKeyError::Keys { var, source }
        })?;
        for fp in &settings.pgp_fingerprints {
            if !keys.has_public(fp) {
                return Err(PrivateKeyError::NoPublicKey(fp.clone()));
            }
        }
        settings.pgp_keys = Some(Arc::new(keys));
    }
    Ok(())
}

/// States sealed as sops binary mode under KMS keys and age recipients.
pub struct SopsSealer<K> {
    envelope: Envelope<K>,
    /// The passphrase when it is the only protection configured: writes then stay in
    /// terraform-backend-git's aes mode (as that tool wrote them) instead of going out in clear.
    passphrase_writes: Option<Zeroizing<String>>,
    /// The largest state a sealed payload may expand to (`GITSTATE_MAX_BODY_BYTES`).
    max_state_bytes: usize,
    /// [`EncryptionSettings::fixed_context`].
    fixed_context: Option<Context>,
}

impl<K: KeyService> SopsSealer<K> {
    pub fn new(keys: K, settings: &EncryptionSettings) -> Self {
        let passphrase = settings
            .passphrase
            .as_ref()
            .map(|p| Zeroizing::new(p.expose().to_owned()));
        let passphrase_writes = passphrase.clone().filter(|_| !settings.has_write_keys());
        Self {
            envelope: Envelope::new(keys, settings.kms_key_ids.clone(), passphrase)
                .with_previous(settings.previous_kms_key_ids.clone())
                .with_offline(settings.offline())
                .with_threshold(settings.shamir_threshold),
            passphrase_writes,
            max_state_bytes: DEFAULT_MAX_STATE_BYTES,
            fixed_context: settings.fixed_context.clone(),
        }
    }

    /// The context states at `at` are sealed under: the fixed one, else the location's.
    fn sealing_context(&self, at: &Location, name: &StateName) -> Context {
        self.fixed_context
            .clone()
            .unwrap_or_else(|| context(&at.repository, name))
    }

    /// `stored` opened under the fixed context, else under the location's (a state gitstate
    /// wrote before the fixed context was set); the first failure is the one reported.
    async fn open_sealed(
        &self,
        stored: &[u8],
        at: &Location,
        name: &StateName,
    ) -> Result<gitstate_sops::Opened, Error> {
        let located = context(&at.repository, name);
        let Some(fixed) = self.fixed_context.as_ref().filter(|f| **f != located) else {
            return self.envelope.open(stored, Some(&located)).await;
        };
        match self.envelope.open(stored, Some(fixed)).await {
            Ok(opened) => Ok(opened),
            Err(first) => self
                .envelope
                .open(stored, Some(&located))
                .await
                .map_err(|_| first),
        }
    }

    /// Refuse sealed states that expand past `max` bytes (a decompression bomb).
    pub fn with_max_state_bytes(mut self, max: usize) -> Self {
        self.max_state_bytes = max;
        self
    }

    pub fn envelope(&self) -> &Envelope<K> {
        &self.envelope
    }
}

/// The backend's encryption as the settings ask for it, on the standard AWS configuration; none
/// when nothing is configured.
pub async fn encryption(
    settings: &EncryptionSettings,
    max_state_bytes: usize,
) -> Option<Encryption> {
    if !settings.is_configured() {
        return None;
    }
    let kms = Kms::from_env().await;
    Some(encryption_with(kms, settings, max_state_bytes))
}

/// The backend's encryption over a given KMS client.
pub fn encryption_with<K: KeyService + 'static>(
    keys: K,
    settings: &EncryptionSettings,
    max_state_bytes: usize,
) -> Encryption {
    Encryption {
        sealer: Arc::new(SopsSealer::new(keys, settings).with_max_state_bytes(max_state_bytes)),
        enforced: settings.enforced,
    }
}

pub fn seal_error(error: Error) -> SealError {
    let boxed = |e: Error| -> gitstate_core::ports::BoxError { Box::new(e) };
    match error {
        Error::Key(KeyError::Unavailable(_))
        | Error::NoKey {
            last: Some(KeyError::Unavailable(_)),
            ..
        }
        | Error::Threshold {
            last: Some(KeyError::Unavailable(_)),
            ..
        } => SealError::Unavailable(boxed(error)),
        Error::Key(_) | Error::NoKey { .. } | Error::Threshold { .. } => {
            SealError::Refused(boxed(error))
        }
        Error::NoConfiguredKey { .. } => SealError::ForeignKey(boxed(error)),
        Error::Tampered { .. }
        | Error::MacMismatch
        | Error::ContextMismatch { .. }
        | Error::Unbound => SealError::Integrity(boxed(error)),
        Error::Format(_)
        | Error::Unsupported(_)
        | Error::NoKmsEntry
        | Error::NoWriteKey
        | Error::Layout(_)
        | Error::Unrecognised(_)
        | Error::Crypto
        | Error::Compression(_)
        | Error::TooLarge { .. } => SealError::Unreadable(boxed(error)),
    }
}

/// The payload a state is sealed as: the state gzip-compressed (see
/// [`gitstate_sops::compression`]).
pub fn pack(state: &[u8]) -> Result<Vec<u8>, Error> {
    gitstate_sops::compression::compress(state)
}

/// The state an opened file holds: a binary-mode payload decompressed when it is compressed (files
/// sealed before compression are not), refused past `max_state_bytes`; plaintext as it is.
pub fn unpack(
    mut opened: gitstate_sops::Opened,
    max_state_bytes: usize,
) -> Result<gitstate_sops::Opened, Error> {
    if opened.format == Format::SopsBinary
        && let Some(state) =
            gitstate_sops::compression::decompress(&opened.plaintext, max_state_bytes)?
    {
        opened.plaintext = state;
    }
    Ok(opened)
}

#[async_trait]
impl<K: KeyService + 'static> Sealer for SopsSealer<K> {
    fn seals(&self) -> bool {
        self.envelope.seals() || self.passphrase_writes.is_some()
    }

    fn is_sealed(&self, stored: &[u8]) -> bool {
        Envelope::<K>::is_encrypted(stored)
    }

    async fn seal(
        &self,
        plaintext: &[u8],
        at: &Location,
        name: &StateName,
    ) -> Result<Bytes, SealError> {
        if let Some(passphrase) = &self.passphrase_writes {
            let sealed = gitstate_sops::seal_passphrase(passphrase, rand::random(), plaintext)
                .map_err(seal_error)?;
            return Ok(Bytes::from(sealed));
        }
        let payload = pack(plaintext).map_err(seal_error)?;
        let sealed = self
            .envelope
            .seal(&payload, &self.sealing_context(at, name))
            .await
            .map_err(seal_error)?;
        Ok(Bytes::from(sealed))
    }

    async fn open(
        &self,
        stored: Bytes,
        at: &Location,
        name: &StateName,
    ) -> Result<Opened, SealError> {
        let opened = self
            .open_sealed(&stored, at, name)
            .await
            .and_then(|opened| unpack(opened, self.max_state_bytes))
            .map_err(seal_error)?;
        let protection = match self
            .envelope
            .protection(&opened)
            .await
            .map_err(seal_error)?
        {
            gitstate_sops::Protection::Unprotected => Protection::Unprotected,
            gitstate_sops::Protection::Partly => Protection::Partly,
            gitstate_sops::Protection::Current => Protection::Current,
        };
        let plaintext = match opened.format {
            // plain bytes need no copy
            Format::Plain => stored,
            _ => Bytes::copy_from_slice(&opened.plaintext),
        };
        Ok(Opened {
            plaintext,
            protection,
            format: opened.format.describe(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository in the context is the configured URL without trailing slashes and one
    /// `.git`: respelling the setting so keeps every state readable; anything else (scheme, host,
    /// case, path) is another repository.
    #[test]
    fn context_repository_spellings() {
        let name = StateName::parse("a/b.tfstate").expect("name");
        let want = context("https://git.example/o/r", &name);
        for same in [
            "https://git.example/o/r.git",
            "https://git.example/o/r/",
            "https://git.example/o/r.git/",
            "https://git.example/o/r//",
        ] {
            assert_eq!(context(same, &name), want, "{same}");
        }
        for other in [
            "http://git.example/o/r",
            "https://GIT.example/o/r",
            "https://git.example/o/R",
            "https://git.example/o/r.git.git",
            "https://git.example/o",
        ] {
            assert_ne!(context(other, &name), want, "{other}");
        }
        assert_eq!(want[CONTEXT_STATE], "a/b.tfstate");
    }
}
