//! What the git store is given: the adapter's own settings, filled by the application.

use std::path::PathBuf;
use std::time::Duration;

use gitstate_core::secret::Secret;

/// How the git token goes to the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GitAuth {
    /// `Authorization: Basic base64(user:token)`, what every host accepts for PATs.
    #[default]
    Basic,
    /// `Authorization: Bearer <token>` (Bitbucket Data Center project and repository tokens).
    Bearer,
}

/// Which writes go to a state's own ref (`GITSTATE_STATE_REFS`, issue 27): a state ref
/// `refs/gitstate/states/<sha1 of the path>` holds one state's newest writes, so writes of
/// different states never share a compare-and-swap point. Reads honour state refs whatever this
/// says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StateRefs {
    /// As [`Self::Never`] in this version (the default of `serve` and `run`): a state does not
    /// move to its own ref when its branch write loses a race, as that move cannot be made safe
    /// with unlocked writes or on hosts without atomic push.
    #[default]
    Auto,
    /// Every update of an existing state goes to its own ref, created by the first (the Lambda
    /// default). Creates and deletes go through the branch.
    Always,
    /// No state ref is created; a state that already has one is still written there (a write
    /// on the branch would be hidden by it), as a look under the writer's lock shows.
    Never,
}

impl StateRefs {
    /// `auto`, `always` or `never`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "auto" => Some(Self::Auto),
            "always" => Some(Self::Always),
            "never" => Some(Self::Never),
            _ => None,
        }
    }
}

/// The repository, its credentials and the bounds on git work.
#[derive(Debug, Clone)]
pub struct GitSettings {
    /// The hosted repository (smart HTTP(S) or SSH); `None` = the embedded one.
    pub repository: Option<String>,
    /// The embedded repository, used when `repository` is `None`.
    pub local_repository: PathBuf,
    /// Where bare cache repositories of hosted repositories go.
    pub cache_dir: PathBuf,
    /// Where lock refs go, e.g. `refs/heads/locks/`.
    pub lock_ref_prefix: String,
    pub username: Option<String>,
    /// Sent only to repositories of the same origin as `repository`.
    pub token: Option<Secret>,
    pub auth: GitAuth,
    /// PEM text of private certificate authorities trusted besides the system roots.
    pub ca_pem: Option<String>,
    /// Refuse remotes whose receive-pack does not advertise `atomic`.
    pub require_atomic: bool,
    /// Timeout of one git HTTP request.
    pub timeout: Duration,
    /// The most one git answer may hold.
    pub max_response_bytes: u64,
    /// How deep history paging and `?at=` may fetch.
    pub max_history_depth: u32,
    /// The most writes waiting at once that leave in one push (1: each alone).
    pub writes_per_push: usize,
    /// A fold lease older than this is taken over (its holder crashed or was frozen).
    pub fold_lease_age: Duration,
    /// Fold in the background after a write to a state ref (`serve` and `run`; the Lambda
    /// binary folds on its schedule instead, as a container must not work after it answered).
    pub fold_after_writes: bool,
    /// Which writes go to a state's own ref.
    pub state_refs: StateRefs,
    /// How long the GETs after this process's LOCK of a state are answered from what the LOCK
    /// push proved, without a git request (zero: never; at most [`MAX_PROOF_WINDOW`]). Every
    /// other process waits that long after the LOCK before it writes under that lock or
    /// releases it (see the store's `floor` module).
    pub proof_window: Duration,
}

/// The longest [`GitSettings::proof_window`]: what another process waits at most, after a LOCK,
/// before it writes under that lock or releases it.
pub const MAX_PROOF_WINDOW: Duration = Duration::from_secs(5);
