//! What each setting of [`SETTINGS`](super::SETTINGS) is about. A command reads the concerns it
//! needs, and its `--help` offers the flags of those alone (`encrypt` has no `--listen`).

use super::Spec;

/// A group of settings one part of gitstate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Concern {
    /// Which repository holds the states.
    Repository,
    /// How that repository is reached, read and written.
    Git,
    /// The team KMS-sealed settings are bound to.
    Team,
    /// What requests may do: other repositories and branches, unlocked writes, history depth,
    /// request size and time, the encryption policy.
    Requests,
    /// Users and the bootstrap administrator.
    Access,
    /// The address served on, and TLS.
    Listener,
    /// Connection limits and timeouts of the local server.
    Connections,
    /// The keys states are encrypted for.
    Keys,
    /// The keys and passphrases that open states.
    Opening,
    /// The format of log lines.
    Logging,
    /// AWS Lambda alone.
    Lambda,
    /// The backend the remote commands (`history`, `show`, `list`…) talk to.
    Remote,
    /// The state `run` serves (a command's own `--state`).
    State,
}

impl Concern {
    /// The help heading of this concern's flags.
    pub fn heading(self) -> &'static str {
        match self {
            Self::Repository => "Repository",
            Self::Git => "Git access",
            Self::Team => "Team",
            Self::Requests => "Requests",
            Self::Access => "Users",
            Self::Listener => "Listener",
            Self::Connections => "Connections",
            Self::Keys => "Encryption keys",
            Self::Opening => "Decryption keys",
            Self::Logging => "Logging",
            Self::Lambda => "Lambda",
            Self::Remote => "Backend",
            Self::State => "State",
        }
    }

    /// Every concern, in help order.
    pub const ALL: [Self; 13] = [
        Self::Remote,
        Self::State,
        Self::Repository,
        Self::Git,
        Self::Team,
        Self::Requests,
        Self::Access,
        Self::Listener,
        Self::Connections,
        Self::Keys,
        Self::Opening,
        Self::Logging,
        Self::Lambda,
    ];
}

/// The settings of each concern, by variable. Every setting is in exactly one (a test checks).
const CONCERNS: &[(Concern, &[&str])] = &[
    (Concern::Repository, &["GITSTATE_REPOSITORY"]),
    (
        Concern::Git,
        &[
            "GITSTATE_REF",
            "GITSTATE_GIT_USERNAME",
            "GITSTATE_GIT_TOKEN",
            "GITSTATE_GIT_TOKEN_KMS",
            "GITSTATE_GIT_AUTH",
            "GITSTATE_GIT_CA_FILE",
            "GITSTATE_GIT_CA_PEM",
            "GITSTATE_REQUIRE_ATOMIC",
            "GITSTATE_SINGLE_FRONT",
            "GITSTATE_LOCK_PROOF_MS",
            "GITSTATE_STATE_REFS",
            "GITSTATE_FOLD_AFTER_WRITES",
            "GITSTATE_GIT_MAX_RESPONSE_BYTES",
            "GITSTATE_GIT_WRITES_PER_PUSH",
            "GITSTATE_LOCK_REF_PREFIX",
            "GITSTATE_CACHE_DIR",
            "GITSTATE_LOCAL_REPOSITORY",
            "GITSTATE_GIT_TIMEOUT_SECS",
            "GITSTATE_FOLD_LEASE_SECS",
            "GITSTATE_COMMITTER_NAME",
            "GITSTATE_COMMITTER_EMAIL",
        ],
    ),
    (Concern::Team, &["GITSTATE_TEAM"]),
    (
        Concern::Requests,
        &[
            "GITSTATE_ALLOWED_REPOSITORIES",
            "GITSTATE_ALLOW_UNLOCKED_WRITES",
            "GITSTATE_CREATE_REF",
            "GITSTATE_ALLOWED_REFS",
            "GITSTATE_HISTORY_MAX_DEPTH",
            "GITSTATE_MAX_BODY_BYTES",
            "GITSTATE_REQUEST_DEADLINE_SECS",
            "GITSTATE_ENCRYPTION",
            "GITSTATE_ACCESS_LOG",
        ],
    ),
    (
        Concern::Access,
        &[
            "GITSTATE_ACCESS",
            "GITSTATE_ACCESS_FILE",
            "GITSTATE_ADMIN_USER",
            "GITSTATE_ADMIN_HASH",
            "GITSTATE_ADMIN_HASH_KMS",
            "GITSTATE_ACCESS_REFRESH_SECS",
        ],
    ),
    (
        Concern::Listener,
        &[
            "GITSTATE_LISTEN",
            "GITSTATE_TLS_CERT",
            "GITSTATE_TLS_KEY",
            "GITSTATE_TLS_CLIENT_CA",
            "GITSTATE_INSECURE_LISTEN",
        ],
    ),
    (
        Concern::Connections,
        &[
            "GITSTATE_HEADER_TIMEOUT_SECS",
            "GITSTATE_BODY_TIMEOUT_SECS",
            "GITSTATE_MAX_CONNECTIONS",
            "GITSTATE_MAX_CONNECTIONS_PER_ADDRESS",
            "GITSTATE_TRUSTED_PROXIES",
        ],
    ),
    (
        Concern::Keys,
        &[
            "GITSTATE_KMS_KEY_IDS",
            "GITSTATE_AGE_RECIPIENTS",
            "GITSTATE_PGP_FINGERPRINTS",
            "GITSTATE_PGP_PUBLIC_KEYS",
            "GITSTATE_PGP_PUBLIC_KEYS_FILE",
            "GITSTATE_SOPS_SHAMIR_THRESHOLD",
        ],
    ),
    (
        Concern::Opening,
        &[
            "GITSTATE_KMS_PREVIOUS_KEY_IDS",
            "GITSTATE_AGE_PREVIOUS_RECIPIENTS",
            "GITSTATE_AGE_IDENTITY",
            "GITSTATE_AGE_IDENTITY_FILE",
            "GITSTATE_AGE_IDENTITY_KMS",
            "GITSTATE_PGP_PREVIOUS_FINGERPRINTS",
            "GITSTATE_PGP_SECRET_KEYS",
            "GITSTATE_PGP_SECRET_KEYS_FILE",
            "GITSTATE_PGP_SECRET_KEYS_KMS",
            "GITSTATE_PGP_PASSPHRASE",
            "GITSTATE_PGP_PASSPHRASE_FILE",
            "GITSTATE_PASSPHRASE",
        ],
    ),
    (Concern::Logging, &["GITSTATE_LOG_FORMAT"]),
    (Concern::Lambda, &["GITSTATE_RESPONSE_STREAMING"]),
    (Concern::Remote, &["GITSTATE_URL"]),
    (Concern::State, &["GITSTATE_STATE"]),
];

impl Spec {
    /// What this setting is about. A setting missing from the table reads as a Lambda one:
    /// offered by `config` alone (and a test fails).
    pub fn concern(&self) -> Concern {
        CONCERNS
            .iter()
            .find(|(_, vars)| vars.contains(&self.var))
            .map_or(Concern::Lambda, |(concern, _)| *concern)
    }
}

#[cfg(test)]
mod tests {
    use super::super::SETTINGS;
    use super::*;

    #[test]
    fn every_setting_has_exactly_one_concern_and_every_listed_one_exists() {
        for spec in SETTINGS {
            let found = CONCERNS
                .iter()
                .filter(|(_, vars)| vars.contains(&spec.var))
                .count();
            assert_eq!(
                found, 1,
                "{} is in {found} concerns of layers/concerns.rs: put it in one",
                spec.var
            );
        }
        for (concern, vars) in CONCERNS {
            assert!(Concern::ALL.contains(concern), "{concern:?} not in ALL");
            for var in *vars {
                assert!(
                    SETTINGS.iter().any(|s| s.var == *var),
                    "{var} ({concern:?}) is not a setting"
                );
            }
        }
    }
}
