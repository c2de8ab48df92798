//! The settings of the local commands, one [`Spec`] a setting: its variable, flag and file key
//! follow from it, and its help line is the flag's help and the documented default.

/// One setting: its variable, whether its value is a secret, and its help line.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub var: &'static str,
    /// Secrets are never flags (they would show in `ps`) and are redacted by `gitstate config`.
    pub secret: bool,
    /// A yes/no setting: its flag may stand alone (`--access-log` = `--access-log=true`).
    pub switch: bool,
    pub help: &'static str,
}

const fn setting(var: &'static str, help: &'static str) -> Spec {
    Spec {
        var,
        secret: false,
        switch: false,
        help,
    }
}

const fn secret(var: &'static str, help: &'static str) -> Spec {
    Spec {
        var,
        secret: true,
        switch: false,
        help,
    }
}

const fn switch(var: &'static str, help: &'static str) -> Spec {
    Spec {
        var,
        secret: false,
        switch: true,
        help,
    }
}

/// Every setting of the local commands. The settings table of
/// docs/operating.md, made by [`crate::docs`], says what each one means.
pub const SETTINGS: &[Spec] = &[
    setting(
        "GITSTATE_REPOSITORY",
        "the state repository (unset: the embedded one)",
    ),
    setting("GITSTATE_REF", "the branch states live on [main]"),
    setting(
        "GITSTATE_STATE",
        "the state `run` serves and `serve` prints a block for",
    ),
    setting("GITSTATE_GIT_USERNAME", "user name for the repository"),
    secret("GITSTATE_GIT_TOKEN", "token for the repository"),
    secret(
        "GITSTATE_GIT_TOKEN_KMS",
        "the git token as a KMS ciphertext",
    ),
    setting("GITSTATE_TEAM", "the team KMS-sealed settings are bound to"),
    setting(
        "GITSTATE_ALLOWED_REPOSITORIES",
        "further repositories requests may name",
    ),
    setting(
        "GITSTATE_GIT_AUTH",
        "how the token is sent: basic or bearer [basic]",
    ),
    setting(
        "GITSTATE_GIT_CA_FILE",
        "PEM bundle of a private CA for the git host",
    ),
    setting(
        "GITSTATE_GIT_CA_PEM",
        "PEM text of a private CA for the git host",
    ),
    switch(
        "GITSTATE_REQUIRE_ATOMIC",
        "refuse git hosts without atomic push [false]",
    ),
    switch(
        "GITSTATE_SINGLE_FRONT",
        "every request of a Terraform run reaches this one process [false]",
    ),
    setting(
        "GITSTATE_LOCK_PROOF_MS",
        "how long GETs after a LOCK rest on what it proved, 0-5000 ms (5000 single front) [2000]",
    ),
    setting(
        "GITSTATE_FOLD_AFTER_WRITES",
        "fold state refs in the background after a write: true or false [true]",
    ),
    setting(
        "GITSTATE_STATE_REFS",
        "where updates go: always (own refs), auto or never (the branch) [auto]",
    ),
    switch(
        "GITSTATE_ALLOW_UNLOCKED_WRITES",
        "accept writes that hold no lock, each with a warning [false]",
    ),
    switch(
        "GITSTATE_CREATE_REF",
        "let the first write create a missing branch beside others [false]",
    ),
    setting(
        "GITSTATE_ALLOWED_REFS",
        "further branches ?ref= may name (names or prefix/*)",
    ),
    setting(
        "GITSTATE_KMS_PREVIOUS_KEY_IDS",
        "KMS keys that may still open older states",
    ),
    setting(
        "GITSTATE_AGE_RECIPIENTS",
        "age recipients states are encrypted for",
    ),
    setting(
        "GITSTATE_AGE_PREVIOUS_RECIPIENTS",
        "age recipients that may still open older states",
    ),
    secret(
        "GITSTATE_AGE_IDENTITY",
        "age identities (private keys) that open states",
    ),
    setting(
        "GITSTATE_AGE_IDENTITY_FILE",
        "a file of age identities that open states",
    ),
    secret(
        "GITSTATE_AGE_IDENTITY_KMS",
        "age identities as a base64 KMS ciphertext",
    ),
    setting(
        "GITSTATE_PGP_FINGERPRINTS",
        "OpenPGP keys states are encrypted for",
    ),
    setting(
        "GITSTATE_PGP_PREVIOUS_FINGERPRINTS",
        "OpenPGP keys that may still open older states",
    ),
    setting(
        "GITSTATE_PGP_PUBLIC_KEYS",
        "armored OpenPGP public keys to encrypt for, as text",
    ),
    setting(
        "GITSTATE_PGP_PUBLIC_KEYS_FILE",
        "armored OpenPGP public keys to encrypt for",
    ),
    secret(
        "GITSTATE_PGP_SECRET_KEYS",
        "armored OpenPGP secret keys that open states",
    ),
    setting(
        "GITSTATE_PGP_SECRET_KEYS_FILE",
        "a file of armored OpenPGP secret keys",
    ),
    secret(
        "GITSTATE_PGP_SECRET_KEYS_KMS",
        "armored OpenPGP secret keys as a base64 KMS ciphertext",
    ),
    secret(
        "GITSTATE_PGP_PASSPHRASE",
        "the passphrase of passphrase-protected OpenPGP secret keys",
    ),
    setting(
        "GITSTATE_PGP_PASSPHRASE_FILE",
        "a file whose first line is that passphrase",
    ),
    setting(
        "GITSTATE_SOPS_SHAMIR_THRESHOLD",
        "key groups (one per source) needed to open [one group of every key]",
    ),
    setting(
        "GITSTATE_HISTORY_MAX_DEPTH",
        "deepest history fetched for a page or ?at= [10000]",
    ),
    setting(
        "GITSTATE_GIT_MAX_RESPONSE_BYTES",
        "largest answer taken from the git remote [134217728]",
    ),
    setting(
        "GITSTATE_GIT_WRITES_PER_PUSH",
        "most waiting writes pushed together [32]",
    ),
    setting(
        "GITSTATE_LOCK_REF_PREFIX",
        "where lock refs go [refs/heads/locks/]",
    ),
    setting("GITSTATE_CACHE_DIR", "cache repositories [.gitstate/cache]"),
    setting(
        "GITSTATE_LOCAL_REPOSITORY",
        "the embedded repository [.gitstate/repo.git]",
    ),
    setting("GITSTATE_MAX_BODY_BYTES", "largest request body [6291456]"),
    setting(
        "GITSTATE_GIT_TIMEOUT_SECS",
        "timeout of one git request [20]",
    ),
    setting(
        "GITSTATE_FOLD_LEASE_SECS",
        "a fold lease older than this is taken over [60]",
    ),
    setting(
        "GITSTATE_REQUEST_DEADLINE_SECS",
        "a request not done by then is a 504 [50]",
    ),
    setting(
        "GITSTATE_HEADER_TIMEOUT_SECS",
        "serve: time for a whole request head, also when idle [10]",
    ),
    setting(
        "GITSTATE_BODY_TIMEOUT_SECS",
        "serve: longest wait for the next piece of a body, or for a client to read its answer [20]",
    ),
    setting(
        "GITSTATE_MAX_CONNECTIONS",
        "serve: connections open at once [1024]",
    ),
    setting(
        "GITSTATE_MAX_CONNECTIONS_PER_ADDRESS",
        "serve: connections open at once from one address [64]",
    ),
    setting(
        "GITSTATE_TRUSTED_PROXIES",
        "serve: reverse proxies (addresses, CIDR blocks) whose X-Forwarded-For names the client",
    ),
    setting(
        "GITSTATE_COMMITTER_NAME",
        "commit committer name [gitstate]",
    ),
    setting(
        "GITSTATE_COMMITTER_EMAIL",
        "commit committer email [gitstate@localhost]",
    ),
    secret("GITSTATE_ACCESS", "the access policy as TOML text"),
    setting("GITSTATE_ACCESS_FILE", "the access policy's file"),
    setting(
        "GITSTATE_ADMIN_USER",
        "bootstrap administrator's name [admin]",
    ),
    secret(
        "GITSTATE_ADMIN_HASH",
        "bootstrap administrator's argon2id hash",
    ),
    secret("GITSTATE_ADMIN_HASH_KMS", "that hash as a KMS ciphertext"),
    setting(
        "GITSTATE_ACCESS_REFRESH_SECS",
        "how long the last seen tip is trusted [10]",
    ),
    setting(
        "GITSTATE_KMS_KEY_IDS",
        "KMS keys states are encrypted under",
    ),
    setting("GITSTATE_ENCRYPTION", "optional or enforced [optional]"),
    secret(
        "GITSTATE_PASSPHRASE",
        "reads terraform-backend-git's aes mode",
    ),
    switch(
        "GITSTATE_RESPONSE_STREAMING",
        "Lambda response streaming [false]",
    ),
    setting("GITSTATE_LISTEN", "address to listen on [127.0.0.1:8080]"),
    setting("GITSTATE_TLS_CERT", "PEM certificate chain: serve HTTPS"),
    setting("GITSTATE_TLS_KEY", "PEM private key of --tls-cert"),
    setting(
        "GITSTATE_TLS_CLIENT_CA",
        "PEM CA bundle: require client certificates",
    ),
    switch(
        "GITSTATE_INSECURE_LISTEN",
        "allow a non-loopback address without TLS [false]",
    ),
    setting("GITSTATE_LOG_FORMAT", "text or json [text]"),
    switch("GITSTATE_ACCESS_LOG", "one log line per request [false]"),
    setting(
        "GITSTATE_URL",
        "the backend the remote commands talk to [http://127.0.0.1:8080]",
    ),
];

impl Spec {
    /// The default as the help line states it (`[…]` at its end), if any.
    pub fn default_value(&self) -> Option<&'static str> {
        let help = self.help.trim_end();
        let start = help.rfind('[')?;
        help.ends_with(']')
            .then(|| &help[start + 1..help.len() - 1])
    }

    /// The key in the TOML file: the variable without `GITSTATE_`, in lower case.
    pub fn key(&self) -> String {
        self.var
            .trim_start_matches("GITSTATE_")
            .to_ascii_lowercase()
    }

    /// The long flag: the key with dashes.
    pub fn flag(&self) -> String {
        self.key().replace('_', "-")
    }
}
