//! Model-based test (issue 12): seeded, reproducible random sequences of LOCK, UNLOCK, write,
//! DELETE, restore and GET, by users with random grants, on names and refs drawn from small
//! alphabets built to collide, sent through the real router (two backends with their own caches)
//! to the machine's `git http-backend`; one step in eight sends two requests at once. Every
//! answer is compared with a small in-memory model of the rules (two at once: the answers and the
//! remote must be those of one of the two orders), and after every step the remote itself (read
//! with `git` on the bare repository) is checked: no ref outside the allowed set, nothing changed
//! outside the actors' grants, no write landed on a state someone else holds locked, every state,
//! lock ID and lock owner equal to the model's; `git fsck --strict` every [`FSCK_EVERY`] steps
//! and at the end. A failure that involves two requests at once may need a few replays to recur.
//!
//! One seed, e.g. to replay a failure (the failure prints this line):
//! `GITSTATE_MODEL_SEED=7 GITSTATE_MODEL_STEPS=900 cargo test -p gitstate-tests --test it model:: -- --nocapture`
//! A longer hunt: `GITSTATE_MODEL_SEEDS=100..200 GITSTATE_MODEL_STEPS=3000` (every seed runs, the
//! failures are listed at the end). `GITSTATE_MODEL_SHRINK_SECS` bounds how long a failing
//! sequence is shrunk (default 60; 0 prints the whole sequence).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use gitstate_tests::{GitServer, TestBackend, access_file, git_output, lock_info};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha1::Digest;

/// What CI runs: these seeds, [`CI_STEPS`] steps each.
const CI_SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 6];
const CI_STEPS: usize = 1000;
const FSCK_EVERY: usize = 100;
const REPO: &str = "model";

// ---------------------------------------------------------------------------------------------
// The alphabets. Names collide as files and folders (`a`, `a/b`, `a/b/c.tfstate`) and by letter
// case (`A.tfstate`, `a.tfstate`), refs include
// the configured branch, allowlisted ones, lock-like names, parents and children of each, and
// garbage.

const NAMES: [&str; 12] = [
    "A.tfstate",
    "B/a.tfstate",
    "a",
    "a/b",
    "a/b/c.tfstate",
    "a.tfstate",
    "a/b.tfstate",
    "b",
    "b/a.tfstate",
    "a/c",
    "ab",
    "locks",
];
/// Names the router must refuse (400) before anything else.
const BAD_NAMES: [&str; 4] = ["x.lock", "a//b", ".gitstate/access.toml", "a/b."];

/// The configured branch: `main`, or for every third seed one with a parent folder (`env`).
const BRANCHES: [&str; 2] = ["main", "env/main"];
const ALLOWED_REFS: &str = "env/prod,team/*";
const REFS: [&str; 23] = [
    "main",
    "refs/heads/main",
    "env/main",
    "env/main/x",
    "env/prod",
    "team/x",
    "team/x/y",
    "team/locks",
    "team",
    "env",
    "env/prod/x",
    "main/x",
    "locks",
    "locks/a",
    "locks/a/b.tfstate",
    "refs/heads/locks/a",
    "refs/locks/a",
    "other",
    "a..b",
    "-x",
    "x.lock",
    "team/x.",
    "ma in",
];

const IDS: [&str; 4] = ["id-1", "id-2", "id-3", "id-4"];
/// Names of which none is a folder of another (for `GITSTATE_MODEL_OFF=tree`).
const APART: [&str; 5] = ["a.tfstate", "b/a.tfstate", "ab", "a/c", "locks"];
const LINEAGES: [&str; 2] = ["L1", "L2"];
const GRANT_PREFIXES: [&str; 8] = [
    "*",
    "a",
    "a/",
    "a/b",
    "b",
    "a.tfstate",
    "a/b/c.tfstate",
    "l",
];

// ---------------------------------------------------------------------------------------------
// Users and the configuration of one run.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Read,
    Write,
    Admin,
}

#[derive(Debug, Clone)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) password: String,
    /// (role, prefix); the prefix `*` is every state.
    grants: Vec<(Role, &'static str)>,
}

impl User {
    fn may(&self, role: Role, name: &str) -> bool {
        self.grants
            .iter()
            .any(|(r, p)| *r >= role && (*p == "*" || name.starts_with(p)))
    }

    fn grant_strings(&self) -> Vec<String> {
        self.grants
            .iter()
            .map(|(r, p)| {
                let role = match r {
                    Role::Read => "read",
                    Role::Write => "write",
                    Role::Admin => "admin",
                };
                format!("{role}:{p}")
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    seed: u64,
    branch: &'static str,
    lock_prefix: &'static str,
    pub(crate) users: Vec<User>,
}

impl Config {
    /// Everything but the steps follows from the seed: the lock prefix and the users' grants.
    pub(crate) fn for_seed(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_c0f1_9000_0000);
        let lock_prefix = if seed % 4 == 3 {
            "refs/locks/"
        } else {
            "refs/heads/locks/"
        };
        let mut users = vec![User {
            name: "root".into(),
            password: "root-model-Pa55word".into(),
            grants: vec![(Role::Admin, "*")],
        }];
        for i in 1..4 {
            let count = rng.random_range(1..=3);
            let grants = (0..count)
                .map(|_| {
                    let role = [Role::Read, Role::Write, Role::Admin][rng.random_range(0..3)];
                    (
                        role,
                        GRANT_PREFIXES[rng.random_range(0..GRANT_PREFIXES.len())],
                    )
                })
                .collect();
            users.push(User {
                name: format!("u{i}"),
                password: format!("u{i}-model-Pa55word"),
                grants,
            });
        }
        Self {
            seed,
            branch: BRANCHES[usize::from(seed % 3 == 2)],
            lock_prefix,
            users,
        }
    }

    /// The settings of every backend of a run: the users' access file, the branch, the
    /// allowed refs and the lock prefix.
    pub(crate) fn backend_vars(&self) -> Vec<(&'static str, String)> {
        let users: Vec<(&str, &str, Vec<String>)> = self
            .users
            .iter()
            .map(|u| (u.name.as_str(), u.password.as_str(), u.grant_strings()))
            .collect();
        let grants: Vec<Vec<&str>> = users
            .iter()
            .map(|(_, _, g)| g.iter().map(String::as_str).collect())
            .collect();
        let entries: Vec<(&str, &str, &[&str])> = users
            .iter()
            .zip(&grants)
            .map(|((n, p, _), g)| (*n, *p, g.as_slice()))
            .collect();
        vec![
            ("GITSTATE_ACCESS", access_file(&entries)),
            ("GITSTATE_REF", self.branch.to_owned()),
            ("GITSTATE_ALLOWED_REFS", ALLOWED_REFS.to_owned()),
            // The model lets a write create its allowlisted branch (misconfigured.rs tests the
            // default, which refuses that beside other branches).
            ("GITSTATE_CREATE_REF", "true".to_owned()),
            ("GITSTATE_LOCK_REF_PREFIX", self.lock_prefix.to_owned()),
            // Each backend answers the GETs after its LOCK from what the LOCK proved for this
            // long, and the other waits that out before it writes under the lock or releases it:
            // short, so those waits keep a thousand steps quick.
            ("GITSTATE_LOCK_PROOF_MS", "300".to_owned()),
        ]
    }

    pub(crate) fn describe(&self) -> String {
        let users: Vec<String> = self
            .users
            .iter()
            .map(|u| format!("{}=[{}]", u.name, u.grant_strings().join(" ")))
            .collect();
        format!(
            "seed {}: GITSTATE_REF={} GITSTATE_ALLOWED_REFS={ALLOWED_REFS} GITSTATE_LOCK_REF_PREFIX={} users {}",
            self.seed,
            self.branch,
            self.lock_prefix,
            users.join(" ")
        )
    }

    /// The branch `?ref=` addresses, or the status and reason it is refused with.
    fn branch(&self, reference: Option<&str>) -> Result<String, (u16, String)> {
        let Some(reference) = reference else {
            return Ok(self.branch.to_owned());
        };
        let branch = reference.strip_prefix("refs/heads/").unwrap_or(reference);
        if !valid_path(branch) || branch.split('/').any(|s| s.starts_with('-')) {
            return Err((400, format!("ref {reference:?} is not a valid branch name")));
        }
        if self.allowed_branch(branch) {
            Ok(branch.to_owned())
        } else {
            Err((403, format!("ref {reference:?} is not allowed")))
        }
    }

    /// The allowlist rule: the configured branch, an allowlisted one, and never one that clashes
    /// with the lock refs or the configured branch.
    fn allowed_branch(&self, branch: &str) -> bool {
        let listed = branch == self.branch
            || ALLOWED_REFS
                .split(',')
                .any(|entry| match entry.strip_suffix("/*") {
                    Some(prefix) => branch.starts_with(&format!("{prefix}/")),
                    None => branch == entry,
                });
        let full = format!("refs/heads/{branch}");
        let locks = self.lock_prefix.trim_end_matches('/');
        let clashes_with_locks = full.starts_with(self.lock_prefix) || path_clash(&full, locks);
        let clashes_with_branch = branch != self.branch && path_clash(branch, self.branch);
        listed && !clashes_with_locks && !clashes_with_branch
    }
}

/// The rules of a state name (and of a branch name, which has one more).
fn valid_path(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.contains("..")
        && name.split('/').all(|segment| {
            !segment.is_empty()
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
                && !segment.starts_with('.')
                && !segment.ends_with(".lock")
                && !segment.ends_with('.')
        })
}

/// Whether one path is a proper parent folder of the other (or they are equal): in git, two
/// such refs, or a file and a folder of one tree, cannot exist together.
fn path_clash(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"))
}

// ---------------------------------------------------------------------------------------------
// Steps.

#[derive(Debug, Clone, Copy)]
pub(crate) enum Md5Header {
    Absent,
    Correct,
    Wrong,
    Malformed,
}

#[derive(Debug, Clone)]
pub(crate) struct StateBody {
    lineage: &'static str,
    serial: u64,
    nonce: u8,
}

impl StateBody {
    fn bytes(&self) -> Vec<u8> {
        format!(
            r#"{{"version":4,"terraform_version":"1.11.4","serial":{},"lineage":"{}","outputs":{{"nonce":{{"value":{},"type":"number"}}}},"resources":[]}}"#,
            self.serial, self.lineage, self.nonce
        )
        .into_bytes()
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    GetState,
    GetLock,
    Lock {
        id: &'static str,
    },
    /// `None`: force-unlock (empty body).
    Unlock {
        id: Option<&'static str>,
    },
    /// `body: None`: not JSON.
    Write {
        id: Option<&'static str>,
        body: Option<StateBody>,
        md5: Md5Header,
    },
    Delete {
        id: Option<&'static str>,
    },
    Restore {
        serial: u64,
    },
    /// `GET /history/<name>?per_page=100`.
    History,
    /// `GET /history/<name>?at=<serial>`.
    At {
        serial: u64,
    },
    /// `GET /locks` (the name is not used).
    ListLocks,
}

#[derive(Debug, Clone)]
pub(crate) struct Step {
    /// Which of the two backends (each with its own cache) serves it.
    pub(crate) backend: usize,
    pub(crate) user: usize,
    pub(crate) name: &'static str,
    pub(crate) reference: Option<&'static str>,
    pub(crate) op: Op,
    /// A second request sent at the same moment: the answers and the remote must then be those
    /// of one of the two orders.
    pub(crate) with: Option<Box<Step>>,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(with) = &self.with {
            let alone = Step {
                with: None,
                ..self.clone()
            };
            return write!(f, "{alone} || {with}");
        }
        write!(f, "b{} u{} ", self.backend, self.user)?;
        let id = |id: &Option<&str>| id.map(|i| format!(" ID={i}")).unwrap_or_default();
        match &self.op {
            Op::GetState => write!(f, "GET state {}", self.name)?,
            Op::GetLock => write!(f, "GET lock {}", self.name)?,
            Op::Lock { id } => write!(f, "LOCK {} {id}", self.name)?,
            Op::Unlock { id: Some(i) } => write!(f, "UNLOCK {} {i}", self.name)?,
            Op::Unlock { id: None } => write!(f, "UNLOCK {} force", self.name)?,
            Op::Write {
                id: lock,
                body,
                md5,
            } => {
                let body = body.as_ref().map_or("not-json".to_owned(), |b| {
                    format!("{}/{}/n{}", b.lineage, b.serial, b.nonce)
                });
                write!(f, "WRITE {}{} {body} md5={md5:?}", self.name, id(lock))?;
            }
            Op::Delete { id: lock } => write!(f, "DELETE {}{}", self.name, id(lock))?,
            Op::Restore { serial } => write!(f, "RESTORE {} serial {serial}", self.name)?,
            Op::History => write!(f, "HISTORY {}", self.name)?,
            Op::At { serial } => write!(f, "GET {} at serial {serial}", self.name)?,
            Op::ListLocks => write!(f, "GET /locks")?,
        }
        if let Some(reference) = self.reference {
            write!(f, " ?ref={reference}")?;
        }
        Ok(())
    }
}

/// Draw the next step. It may look at the model (to pick a holder's ID or user more often than
/// chance would), but the step itself is a plain value, so a recorded sequence replays and
/// shrinks without the generator.
pub(crate) fn generate(rng: &mut StdRng, model: &Model, users: usize, off: &Off) -> Step {
    let name = if rng.random_ratio(1, 40) {
        BAD_NAMES[rng.random_range(0..BAD_NAMES.len())]
    } else if off.tree {
        APART[rng.random_range(0..APART.len())]
    } else {
        NAMES[rng.random_range(0..NAMES.len())]
    };
    let reference = if rng.random_ratio(3, 5) {
        None
    } else {
        Some(REFS[rng.random_range(0..REFS.len())])
    };
    let reference = reference
        .filter(|r| !off.refs || ["env/prod", "team/x", "team/x/y", "team/locks"].contains(r));
    let held = model.locks.get(name);
    let mut user = rng.random_range(0..users);
    if let Some(holder) = held
        && rng.random_bool(0.5)
    {
        user = holder.user;
    }
    let any_id = |rng: &mut StdRng| match off.owner {
        true => IDS[user % IDS.len()],
        false => IDS[rng.random_range(0..IDS.len())],
    };
    let lock_id = |rng: &mut StdRng| match held {
        Some(holder) if !off.owner && rng.random_bool(0.6) => holder.id,
        _ => any_id(rng),
    };
    let op = match rng.random_range(0..100) {
        0..14 => Op::GetState,
        14..20 => Op::GetLock,
        20..38 => Op::Lock { id: any_id(rng) },
        38..52 => Op::Unlock {
            id: if rng.random_ratio(1, 4) {
                None
            } else {
                Some(lock_id(rng))
            },
        },
        52..86 => Op::Write {
            id: if rng.random_ratio(2, 5) {
                None
            } else {
                Some(lock_id(rng))
            },
            body: if rng.random_ratio(1, 30) {
                None
            } else {
                Some(StateBody {
                    lineage: LINEAGES[rng.random_range(0..LINEAGES.len())],
                    serial: rng.random_range(0..6),
                    nonce: rng.random_range(0..3),
                })
            },
            md5: match rng.random_range(0..20) {
                0..8 => Md5Header::Absent,
                8..18 => Md5Header::Correct,
                _ if off.md5 => Md5Header::Correct,
                18 => Md5Header::Wrong,
                _ => Md5Header::Malformed,
            },
        },
        86..88 => Op::History,
        88..90 => Op::At {
            serial: rng.random_range(0..7),
        },
        90..91 => Op::ListLocks,
        91..95 => Op::Delete {
            id: if rng.random_bool(0.5) {
                None
            } else {
                Some(lock_id(rng))
            },
        },
        _ => Op::Restore {
            serial: rng.random_range(0..7),
        },
    };
    let mut step = Step {
        backend: rng.random_range(0..2),
        user,
        name,
        reference,
        op,
        with: None,
    };
    // One step in eight sends a second request at the same time (never a restore: its result
    // is read back from the remote).
    if rng.random_ratio(1, 8) && !matches!(step.op, Op::Restore { .. }) {
        let mut with = generate(rng, model, users, off);
        if with.with.is_none() && !matches!(with.op, Op::Restore { .. }) {
            with.backend = rng.random_range(0..2);
            step.with = Some(Box::new(with));
        }
    }
    step
}

/// Inputs a long hunt can leave out (`GITSTATE_MODEL_OFF=md5,refs,tree,owner`), to look past a
/// class of bug already found: `md5` sends no wrong Content-MD5, `refs` only allowed refs, `tree`
/// only names that are not folders of each other, `owner` only each user's own lock ID.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Off {
    md5: bool,
    refs: bool,
    tree: bool,
    owner: bool,
}

impl Off {
    fn from_env() -> Self {
        let off = std::env::var("GITSTATE_MODEL_OFF").unwrap_or_default();
        let has = |word: &str| off.split(',').any(|w| w.trim() == word);
        Self {
            md5: has("md5"),
            refs: has("refs"),
            tree: has("tree"),
            owner: has("owner"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model.

#[derive(Debug, Clone)]
struct Revision {
    serial: Option<u64>,
    /// `None`: the state was deleted by this revision.
    bytes: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Default)]
struct Branch {
    states: BTreeMap<String, Vec<u8>>,
    /// Every revision of each state on this branch, oldest first.
    history: BTreeMap<String, Vec<Revision>>,
}

impl Branch {
    /// The revisions of `name` holding `serial` that are not deletions, newest first: `?at=` and
    /// restore read the one, and refuse several (409) as they refuse none (400).
    fn revisions(&self, name: &str, serial: u64) -> Vec<&Vec<u8>> {
        self.history
            .get(name)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .rev()
            .filter(|r| r.serial == Some(serial))
            .filter_map(|r| r.bytes.as_ref())
            .collect()
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder {
    id: &'static str,
    user: usize,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Model {
    /// Branches that have at least one commit.
    branches: BTreeMap<String, Branch>,
    /// Lock refs are per repository, not per branch.
    locks: BTreeMap<String, Holder>,
    /// What a backend's LOCK may have proved (issue 27's floor), by (backend, branch, name): the
    /// state as it was then (`None`: absent), while that lock is held and unwritten. The
    /// backend's next GET of the state may answer it instead of the newest (see [`Proof`]).
    proofs: BTreeMap<(usize, String, String), Proof>,
}

/// A backend's LOCK push asserts the branch at the tip it knows, after creating the lock; when
/// the remote accepts that, the backend's next GET of the state is answered as of the LOCK,
/// without asking the remote (Terraform reads right after it locks). The model cannot know
/// whether the assertion was accepted (that depends on the backend's cache), so that GET may
/// answer the newest state or the state as of the LOCK. The proof is gone once any backend wrote
/// the state under the lock or released it (the other backends wait until the LOCK's proof can
/// no longer answer before they do: `GITSTATE_LOCK_PROOF_MS`), so a proof that stands is of
/// the newest state, unless a write without a lock raced the LOCK (or after a few seconds; a
/// model that keeps it longer only tolerates more).
#[derive(Debug, Clone)]
pub(crate) struct Proof {
    state: Option<Vec<u8>>,
}

#[derive(Debug, Clone)]
pub(crate) enum Effect {
    None,
    Put {
        branch: String,
        name: String,
        bytes: Vec<u8>,
        serial: Option<u64>,
    },
    Delete {
        branch: String,
        name: String,
    },
    Lock {
        name: String,
        holder: Holder,
    },
    Unlock {
        name: String,
    },
    /// The restored state is the old one with its serial replaced; its bytes are read back from
    /// the remote (the serialisation is gitstate's).
    Restore {
        branch: String,
        name: String,
        expected: serde_json::Value,
        serial: u64,
    },
}

/// What the rules say of one step: the refusals that apply (any of their statuses is right, and
/// nothing may change), refusals an implementation may or may not give where the rules leave the
/// order open (`tolerated`), and otherwise 200 with `effect`.
#[derive(Debug)]
pub(crate) struct Prediction {
    pub(crate) refusals: Vec<(u16, String)>,
    tolerated: Vec<(u16, String)>,
    pub(crate) effect: Effect,
    /// What a successful GET answers.
    answer: Option<Expected>,
    /// What a GET may answer instead, from what the backend's LOCK proved (see [`Proof`]).
    proved: Option<Option<Vec<u8>>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    /// The body, and for a lock the user header.
    Bytes(Vec<u8>, Option<String>),
    /// (serial, deleted) of each revision, newest first.
    History(Vec<(Option<u64>, bool)>),
    /// (state, ID, user) of each lock.
    Locks(BTreeSet<(String, String, String)>),
}

impl Prediction {
    fn new() -> Self {
        Self {
            refusals: Vec::new(),
            tolerated: Vec::new(),
            effect: Effect::None,
            answer: None,
            proved: None,
        }
    }

    fn refuse(&mut self, status: u16, why: impl Into<String>) {
        self.refusals.push((status, why.into()));
    }

    fn tolerate(&mut self, status: u16, why: impl Into<String>) {
        self.tolerated.push((status, why.into()));
    }

    fn accepts(&self, status: u16) -> bool {
        let refused = self
            .refusals
            .iter()
            .chain(&self.tolerated)
            .any(|(s, _)| *s == status);
        refused || (self.refusals.is_empty() && status == 200)
    }

    fn describe(&self) -> String {
        let list = |v: &[(u16, String)]| {
            v.iter()
                .map(|(s, w)| format!("{s} ({w})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = if self.refusals.is_empty() {
            "200".to_owned()
        } else {
            list(&self.refusals)
        };
        if !self.tolerated.is_empty() {
            out.push_str(&format!(" or tolerated {}", list(&self.tolerated)));
        }
        out
    }
}

fn version_of(bytes: &[u8]) -> (Option<String>, Option<u64>) {
    let value: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    (
        value
            .get("lineage")
            .and_then(|l| l.as_str())
            .map(str::to_owned),
        value.get("serial").and_then(serde_json::Value::as_u64),
    )
}

impl Model {
    pub(crate) fn predict(&self, cfg: &Config, step: &Step) -> Prediction {
        let mut p = Prediction::new();
        let name = step.name;
        if !valid_path(name) && !matches!(step.op, Op::ListLocks) {
            p.refuse(400, "invalid state name");
            return p;
        }
        let branch = match cfg.branch(step.reference) {
            Ok(branch) => branch,
            Err((status, why)) => {
                p.refuse(status, why);
                return p;
            }
        };
        let user = &cfg.users[step.user];
        let role = match step.op {
            Op::GetState | Op::GetLock | Op::History | Op::At { .. } | Op::ListLocks => Role::Read,
            Op::Lock { .. } | Op::Unlock { .. } | Op::Write { .. } => Role::Write,
            Op::Delete { .. } | Op::Restore { .. } => Role::Admin,
        };
        if !matches!(step.op, Op::ListLocks) && !user.may(role, name) {
            p.refuse(403, format!("{} lacks {role:?} on {name}", user.name));
        }
        if let Op::Write { body, md5, .. } = &step.op {
            if body.is_none() {
                p.refuse(400, "body is not a state");
            }
            if matches!(md5, Md5Header::Wrong | Md5Header::Malformed) {
                p.refuse(400, "Content-MD5 does not match");
            }
        }
        if !p.refusals.is_empty() {
            return p;
        }

        let empty = Branch::default();
        let tree = self.branches.get(&branch).unwrap_or(&empty);
        // A folder or file in the way; else, for a name that is no state, a near name of it.
        let tree_clash = tree
            .states
            .keys()
            .find(|s| s.as_str() != name && path_clash(s, name))
            .or_else(|| {
                let variant = |s: &&String| gitstate_core::refs::near_name(name, s);
                let absent = !tree.states.contains_key(name);
                absent.then(|| tree.states.keys().find(variant)).flatten()
            })
            .cloned();
        let lock_clash = self
            .locks
            .keys()
            .find(|m| m.as_str() != name && path_clash(m, name))
            .cloned();
        let held = self.locks.get(name).copied();
        let stored = tree.states.get(name);
        let admin = user.may(Role::Admin, name);

        if matches!(step.op, Op::GetState) {
            let key = (step.backend, branch.clone(), name.to_owned());
            p.proved = self.proofs.get(&key).map(|proof| proof.state.clone());
        }
        match &step.op {
            Op::GetState => match stored {
                Some(bytes) => p.answer = Some(Expected::Bytes(bytes.clone(), None)),
                None => {
                    p.refuse(404, "no such state");
                    if let Some(c) = tree_clash {
                        p.tolerate(409, format!("{c} is in the way"));
                    }
                }
            },
            Op::GetLock => match held {
                Some(h) => {
                    p.answer = Some(Expected::Bytes(
                        lock_info(h.id).into_bytes(),
                        Some(cfg.users[h.user].name.clone()),
                    ));
                }
                None => p.refuse(409, "not locked"),
            },
            Op::Lock { id } => match held {
                Some(h) if h.id == *id && h.user == step.user => {
                    if let Some(c) = tree_clash {
                        p.tolerate(409, format!("{c} is in the way"));
                    }
                }
                Some(h) => {
                    p.refuse(423, format!("held by {} of u{}", h.id, h.user));
                    if let Some(c) = tree_clash {
                        p.tolerate(409, format!("{c} is in the way"));
                    }
                }
                None => {
                    if let Some(c) = tree_clash {
                        p.refuse(409, format!("state {c} is in the way"));
                    }
                    if let Some(m) = lock_clash {
                        p.refuse(409, format!("lock ref of {m} clashes"));
                    }
                    p.effect = Effect::Lock {
                        name: name.to_owned(),
                        holder: Holder {
                            id,
                            user: step.user,
                        },
                    };
                }
            },
            Op::Unlock { id } => match held {
                None => {
                    if let Some(c) = tree_clash {
                        p.refuse(409, format!("state {c} is in the way"));
                    }
                    if let Some(m) = lock_clash {
                        p.tolerate(409, format!("lock ref of {m} clashes"));
                    }
                }
                Some(h) => {
                    match id {
                        Some(id) if *id != h.id => p.refuse(409, format!("holder is {}", h.id)),
                        None if !admin => p.refuse(403, "force-unlock needs admin"),
                        Some(_) if h.user != step.user && !admin => {
                            p.refuse(403, "another user's lock needs admin")
                        }
                        _ => {}
                    }
                    p.effect = Effect::Unlock {
                        name: name.to_owned(),
                    };
                }
            },
            Op::Write { id, body, .. } => {
                let body = body.as_ref().map(StateBody::bytes).unwrap_or_default();
                admit(&mut p, held, *id, step.user);
                if let Some(c) = tree_clash {
                    p.refuse(409, format!("state {c} is in the way"));
                }
                // The first write to a branch creates it: not beside a branch it clashes with
                // (`team/x` and `team/x/y` are both allowlisted by `team/*`).
                if let Some(other) = self
                    .branches
                    .keys()
                    .find(|other| **other != branch && path_clash(other, &branch))
                {
                    p.refuse(409, format!("branch {other} clashes with {branch}"));
                }
                let (lineage, serial) = version_of(&body);
                if let (Some(stored), Some(sent)) = (stored, serial) {
                    let (stored_lineage, stored_serial) = version_of(stored);
                    if stored_lineage == lineage && stored_serial.is_some_and(|s| s > sent) {
                        p.refuse(409, "stale serial");
                    }
                }
                if stored != Some(&body) {
                    p.effect = Effect::Put {
                        branch,
                        name: name.to_owned(),
                        bytes: body,
                        serial,
                    };
                }
            }
            Op::Delete { id } => {
                admit(&mut p, held, *id, step.user);
                if stored.is_none() {
                    match tree_clash {
                        Some(c) => {
                            p.refuse(409, format!("state {c} is in the way"));
                            p.tolerate(404, "no such state");
                        }
                        None => p.refuse(404, "no such state"),
                    }
                }
                p.effect = Effect::Delete {
                    branch,
                    name: name.to_owned(),
                };
            }
            Op::History => {
                let revisions = tree
                    .history
                    .get(name)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                p.answer = Some(Expected::History(
                    revisions
                        .iter()
                        .rev()
                        .take(100)
                        .map(|r| (r.serial, r.bytes.is_none()))
                        .collect(),
                ));
            }
            Op::At { serial } => match tree.revisions(name, *serial).as_slice() {
                [bytes] => p.answer = Some(Expected::Bytes((*bytes).clone(), None)),
                [] => p.refuse(400, format!("no revision with serial {serial}")),
                many => p.refuse(
                    409,
                    format!("{} revisions hold serial {serial}", many.len()),
                ),
            },
            Op::ListLocks => {
                p.answer = Some(Expected::Locks(
                    self.locks
                        .iter()
                        .filter(|(state, _)| user.may(Role::Read, state))
                        .map(|(state, h)| {
                            (
                                state.clone(),
                                h.id.to_owned(),
                                cfg.users[h.user].name.clone(),
                            )
                        })
                        .collect(),
                ));
            }
            Op::Restore { serial } => {
                let revisions = tree.revisions(name, *serial);
                if revisions.len() > 1 {
                    p.refuse(
                        409,
                        format!("{} revisions hold serial {serial}", revisions.len()),
                    );
                    return p;
                }
                let Some(old) = revisions.first().copied() else {
                    p.refuse(400, format!("no revision with serial {serial}"));
                    if let Some(c) = tree_clash {
                        p.tolerate(409, format!("state {c} is in the way"));
                    }
                    return p;
                };
                if let Some(h) = held {
                    p.refuse(423, format!("held by {} of u{}", h.id, h.user));
                }
                if let Some(c) = tree_clash {
                    p.refuse(409, format!("state {c} is in the way"));
                }
                if let Some(m) = lock_clash {
                    p.refuse(409, format!("lock ref of {m} clashes"));
                }
                let current = stored.and_then(|s| version_of(s).1);
                let new_serial = current.max(version_of(old).1).unwrap_or(0) + 1;
                let mut expected: serde_json::Value =
                    serde_json::from_slice(old).unwrap_or_default();
                expected["serial"] = new_serial.into();
                p.effect = Effect::Restore {
                    branch,
                    name: name.to_owned(),
                    expected,
                    serial: new_serial,
                };
            }
        }
        p
    }

    /// What a step that answered `status` did to the backends' proofs (see [`Proof`]).
    pub(crate) fn observe(&mut self, cfg: &Config, step: &Step, status: u16) {
        let Ok(branch) = cfg.branch(step.reference) else {
            return;
        };
        let key = (step.backend, branch, step.name.to_owned());
        match &step.op {
            // A write without a lock asserts none: it may have raced another backend's LOCK
            // (two requests at once), whose proof then stands on the state before it.
            Op::Write { id: None, .. } | Op::Delete { id: None } if status == 200 => {
                self.proofs.remove(&key);
            }
            // A write under the lock, or a restore (under a lock of its own): through another
            // backend, it waited until the LOCK's proof could no longer answer.
            Op::Write { .. } | Op::Delete { .. } | Op::Restore { .. } if status == 200 => {
                let (_, branch, name) = key;
                self.proofs
                    .retain(|(_, b, n), _| *b != branch || *n != name);
            }
            // Lock refs are the repository's: every backend's and every branch's proof of the
            // name (a release through another backend waited until they could no longer answer).
            Op::Unlock { .. } if status == 200 => {
                let name = step.name;
                self.proofs.retain(|(_, _, n), _| n != name);
            }
            _ => {}
        }
    }

    /// After a step answered `status` (and its effect, if any, was applied): the proofs.
    pub(crate) fn settle(
        &mut self,
        cfg: &Config,
        step: &Step,
        prediction: &Prediction,
        status: u16,
    ) {
        self.observe(cfg, step, status);
        if status == 200
            && prediction.refusals.is_empty()
            && matches!(prediction.effect, Effect::Lock { .. })
            && let Ok(branch) = cfg.branch(step.reference)
        {
            self.locked(step, &branch);
        }
    }

    /// A LOCK that created a lock (not one already held by the same ID): what it may prove.
    fn locked(&mut self, step: &Step, branch: &str) {
        let state = self
            .branches
            .get(branch)
            .and_then(|tree| tree.states.get(step.name))
            .cloned();
        let key = (step.backend, branch.to_owned(), step.name.to_owned());
        self.proofs.insert(key, Proof { state });
    }

    pub(crate) fn apply(&mut self, effect: &Effect) {
        match effect {
            Effect::None | Effect::Restore { .. } => {}
            Effect::Put {
                branch,
                name,
                bytes,
                serial,
            } => {
                let branch = self.branches.entry(branch.clone()).or_default();
                branch.states.insert(name.clone(), bytes.clone());
                branch
                    .history
                    .entry(name.clone())
                    .or_default()
                    .push(Revision {
                        serial: *serial,
                        bytes: Some(bytes.clone()),
                    });
            }
            Effect::Delete { branch, name } => {
                if let Some(branch) = self.branches.get_mut(branch) {
                    branch.states.remove(name);
                    branch
                        .history
                        .entry(name.clone())
                        .or_default()
                        .push(Revision {
                            serial: None,
                            bytes: None,
                        });
                }
            }
            Effect::Lock { name, holder } => {
                self.locks.insert(name.clone(), *holder);
            }
            Effect::Unlock { name } => {
                self.locks.remove(name);
            }
        }
    }
}

/// The lock rule of writes and deletes: with an ID, the holder's, taken by the same user
/// (administrators included: they force-unlock first); without one, nobody may hold the lock.
fn admit(p: &mut Prediction, held: Option<Holder>, id: Option<&str>, user: usize) {
    match (held, id) {
        (Some(h), None) => p.refuse(423, format!("held by {} of u{}", h.id, h.user)),
        (Some(h), Some(id)) if id != h.id => p.refuse(409, format!("holder is {}", h.id)),
        (Some(h), Some(_)) if h.user != user => {
            p.refuse(423, format!("{} was taken by u{}", h.id, h.user));
        }
        (None, Some(id)) => p.refuse(409, format!("{id} is not held")),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// The remote, read with git on the bare repository.

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Snapshot {
    /// Every ref and its object id.
    refs: BTreeMap<String, String>,
    /// For every branch ref: path → blob id of its tree.
    trees: BTreeMap<String, BTreeMap<String, String>>,
    /// For every lock ref: the state's name → (lock ID, `User:` trailer) of its lock commit.
    locks: BTreeMap<String, (String, String)>,
}

fn run_git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["--git-dir", dir.to_str().unwrap_or_default()];
    all.extend_from_slice(args);
    let out = git_output(&all, None);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Snapshot {
    /// Read the remote; trees of refs that did not move since `before` are taken from it.
    fn take(dir: &Path, before: &Snapshot, lock_prefix: &str) -> Result<Self, String> {
        let listing = run_git(dir, &["for-each-ref", "--format=%(objectname) %(refname)"])?;
        let mut snapshot = Snapshot::default();
        for line in listing.lines() {
            let (id, name) = line.split_once(' ').ok_or("for-each-ref output")?;
            snapshot.refs.insert(name.to_owned(), id.to_owned());
        }
        for (name, id) in &snapshot.refs {
            if let Some(state) = name.strip_prefix(lock_prefix) {
                let lock = match before.locks.get(state) {
                    Some(lock) if before.refs.get(name) == Some(id) => lock.clone(),
                    _ => read_lock(dir, id, state),
                };
                snapshot.locks.insert(state.to_owned(), lock);
                continue;
            }
            if !name.starts_with("refs/heads/") {
                continue;
            }
            if before.refs.get(name) == Some(id)
                && let Some(tree) = before.trees.get(name)
            {
                snapshot.trees.insert(name.clone(), tree.clone());
                continue;
            }
            let listing = run_git(dir, &["ls-tree", "-r", "--full-tree", id])?;
            let mut tree = BTreeMap::new();
            for line in listing.lines() {
                // <mode> SP <type> SP <id> TAB <path>
                let (meta, path) = line.split_once('\t').ok_or("ls-tree output")?;
                let blob = meta.split(' ').nth(2).ok_or("ls-tree output")?;
                // The state index is gitstate's own bookkeeping, derived from the states; the
                // model describes the states themselves.
                if path == ".gitstate/index.json" {
                    continue;
                }
                tree.insert(path.to_owned(), blob.to_owned());
            }
            snapshot.trees.insert(name.clone(), tree);
        }
        Ok(snapshot)
    }

    /// States (branch, path) and lock names whose content differs between the two snapshots.
    fn changes(&self, after: &Snapshot, lock_prefix: &str) -> (Vec<(String, String)>, Vec<String>) {
        let mut states = Vec::new();
        let branches: BTreeSet<&String> = self.trees.keys().chain(after.trees.keys()).collect();
        let none = BTreeMap::new();
        for branch in branches {
            if branch.starts_with(lock_prefix) {
                continue;
            }
            let (old, new) = (
                self.trees.get(branch).unwrap_or(&none),
                after.trees.get(branch).unwrap_or(&none),
            );
            let paths: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            for path in paths {
                if old.get(path) != new.get(path) {
                    states.push((branch.clone(), path.clone()));
                }
            }
        }
        let refs: BTreeSet<&String> = self.refs.keys().chain(after.refs.keys()).collect();
        let locks = refs
            .into_iter()
            .filter(|r| self.refs.get(*r) != after.refs.get(*r))
            .filter_map(|r| r.strip_prefix(lock_prefix).map(str::to_owned))
            .collect();
        (states, locks)
    }
}

/// (lock ID, user) of a lock commit; empty strings for what it lacks.
fn read_lock(dir: &Path, commit: &str, state: &str) -> (String, String) {
    let info = run_git(
        dir,
        &["cat-file", "blob", &format!("{commit}:{state}.lock")],
    )
    .ok()
    .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
    .and_then(|v| v["ID"].as_str().map(str::to_owned))
    .unwrap_or_default();
    let user = run_git(dir, &["log", "-1", "--format=%B", commit])
        .ok()
        .and_then(|message| {
            message
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("User: ").map(str::to_owned))
        })
        .unwrap_or_default();
    (info, user)
}

fn blob_id(bytes: &[u8]) -> String {
    let mut hasher = sha1::Sha1::new();
    hasher.update(format!("blob {}\0", bytes.len()).as_bytes());
    hasher.update(bytes);
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The driver.

struct World {
    server: GitServer,
    backends: Vec<TestBackend>,
    http: reqwest::Client,
}

impl World {
    async fn start(cfg: &Config) -> Self {
        let server = GitServer::start().await;
        let url = server.create_repo(REPO);
        // receive-pack's automatic gc runs in the foreground, inside the push that triggers it,
        // so that an fsck never races a detached repack.
        gitstate_tests::git(
            &["config", "gc.autoDetach", "false"],
            Some(&server.repo_dir(REPO)),
        );
        let vars = cfg.backend_vars();
        let extra: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut backends = Vec::new();
        for _ in 0..2 {
            backends.push(TestBackend::start(&url, &extra).await);
        }
        Self {
            server,
            backends,
            http: reqwest::Client::new(),
        }
    }

    async fn send(&self, cfg: &Config, step: &Step) -> (u16, Vec<u8>, Option<String>) {
        send(&self.http, &self.backends[step.backend].url, cfg, step).await
    }
}

/// Send one step (not its `with`) to the backend at `base`: the status, the body and the
/// `Gitstate-Lock-User` header.
pub(crate) async fn send(
    http: &reqwest::Client,
    base: &str,
    cfg: &Config,
    step: &Step,
) -> (u16, Vec<u8>, Option<String>) {
    let user = &cfg.users[step.user];
    let mut query: Vec<String> = Vec::new();
    let (method, path, body, md5) = match &step.op {
        Op::GetState => ("GET", "states", None, Md5Header::Absent),
        Op::GetLock => ("GET", "locks", None, Md5Header::Absent),
        Op::Lock { id } => ("POST", "locks", Some(lock_info(id)), Md5Header::Absent),
        Op::Unlock { id } => (
            "DELETE",
            "locks",
            Some(id.map(lock_info).unwrap_or_default()),
            Md5Header::Absent,
        ),
        Op::Write { id, body, md5 } => {
            query.extend(id.map(|i| format!("ID={i}")));
            let body = body.as_ref().map_or_else(
                || "{\"serial\": ".to_owned(),
                |b| String::from_utf8_lossy(&b.bytes()).into_owned(),
            );
            ("POST", "states", Some(body), *md5)
        }
        Op::Delete { id } => {
            query.extend(id.map(|i| format!("ID={i}")));
            ("DELETE", "states", None, Md5Header::Absent)
        }
        Op::Restore { serial } => {
            query.push(format!("restore={serial}"));
            ("POST", "history", None, Md5Header::Absent)
        }
        Op::History => {
            query.push("per_page=100".into());
            ("GET", "history", None, Md5Header::Absent)
        }
        Op::At { serial } => {
            query.push(format!("at={serial}"));
            ("GET", "history", None, Md5Header::Absent)
        }
        Op::ListLocks => ("GET", "locks", None, Md5Header::Absent),
    };
    query.extend(
        step.reference
            .map(|r| format!("ref={}", r.replace(' ', "%20"))),
    );
    let mut url = match step.op {
        Op::ListLocks => format!("{base}/locks"),
        _ => format!("{base}/{path}/{}", step.name),
    };
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = http
        .request(method, url)
        .basic_auth(&user.name, Some(&user.password));
    if let Some(body) = body {
        let digest = md5::Md5::digest(body.as_bytes());
        let header = match md5 {
            Md5Header::Absent => None,
            Md5Header::Correct => Some(base64::engine::general_purpose::STANDARD.encode(digest)),
            Md5Header::Wrong => Some(
                base64::engine::general_purpose::STANDARD
                    .encode(md5::Md5::digest(b"something else")),
            ),
            Md5Header::Malformed => Some("not base64 at all!".to_owned()),
        };
        if let Some(header) = header {
            request = request.header("content-md5", header);
        }
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    let response = request.send().await.expect("the backend answers");
    let status = response.status().as_u16();
    let lock_user = response
        .headers()
        .get("gitstate-lock-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.bytes().await.unwrap_or_default().to_vec();
    (status, body, lock_user)
}

#[derive(Debug, Clone)]
struct Failure {
    /// Index of the failing step.
    step: usize,
    messages: Vec<String>,
}

impl Failure {
    /// The class of the first message (its text up to the first ':'), used to keep shrinking on
    /// the same bug.
    fn class(&self) -> String {
        self.messages
            .first()
            .and_then(|m| m.split(':').next())
            .unwrap_or_default()
            .to_owned()
    }
}

/// Run steps from `next` (which sees the model) until it returns `None`; stop at the first
/// divergence. Returns the steps run.
async fn run(
    cfg: &Config,
    mut next: impl FnMut(usize, &Model) -> Option<Step>,
) -> (Vec<Step>, Result<(), Failure>) {
    let world = World::start(cfg).await;
    let dir = world.server.repo_dir(REPO);
    let mut model = Model::default();
    let mut before = Snapshot::default();
    let mut steps = Vec::new();
    while let Some(step) = next(steps.len(), &model) {
        steps.push(step.clone());
        let index = steps.len() - 1;
        let outcome = check_step(cfg, &world, &dir, &mut model, &mut before, &step).await;
        let fsck_due = (index + 1) % FSCK_EVERY == 0;
        let outcome = outcome.and_then(|()| if fsck_due { fsck(&dir) } else { Ok(()) });
        if let Err(messages) = outcome {
            return (
                steps,
                Err(Failure {
                    step: index,
                    messages,
                }),
            );
        }
    }
    if let Err(messages) = fsck(&dir) {
        let step = steps.len().saturating_sub(1);
        return (steps, Err(Failure { step, messages }));
    }
    (steps, Ok(()))
}

fn fsck(dir: &Path) -> Result<(), Vec<String>> {
    run_git(dir, &["fsck", "--strict", "--no-progress"])
        .map(|_| ())
        .map_err(|e| vec![format!("fsck: {e}")])
}

async fn check_step(
    cfg: &Config,
    world: &World,
    dir: &Path,
    model: &mut Model,
    before: &mut Snapshot,
    step: &Step,
) -> Result<(), Vec<String>> {
    if let Some(with) = &step.with {
        return check_pair(cfg, world, dir, model, before, step, with).await;
    }
    let prediction = model.predict(cfg, step);
    let answer = world.send(cfg, step).await;
    let status = answer.0;
    let mut problems = Vec::new();
    judge(&prediction, &answer, &mut problems);
    let held_before = model.locks.clone();
    let succeeded = status == 200 && prediction.refusals.is_empty();
    if succeeded {
        model.apply(&prediction.effect);
    }
    model.settle(cfg, step, &prediction, status);
    let after =
        Snapshot::take(dir, before, cfg.lock_prefix).map_err(|e| vec![format!("git: {e}")])?;
    if succeeded
        && let Effect::Restore {
            branch,
            name,
            expected,
            serial,
        } = &prediction.effect
    {
        restored(
            dir,
            model,
            &after,
            branch,
            name,
            expected,
            *serial,
            &mut problems,
        );
    }
    invariants(cfg, &[step], before, &after, &held_before, &mut problems);
    model_matches(cfg, &after, model, &mut problems);
    *before = after;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

fn shown(answer: &Expected) -> String {
    match answer {
        Expected::Bytes(bytes, user) => format!("{:?} {user:?}", String::from_utf8_lossy(bytes)),
        other => format!("{other:?}"),
    }
}

/// (serial, deleted) of each revision a history answer lists.
fn history_of(body: &[u8]) -> Vec<(Option<u64>, bool)> {
    let answer: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    answer["versions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|v| {
            (
                v["serial"].as_u64(),
                v["deleted"].as_bool().unwrap_or_default(),
            )
        })
        .collect()
}

/// (state, ID, user) of each lock `GET /locks` lists.
fn locks_of(body: &[u8]) -> BTreeSet<(String, String, String)> {
    let answer: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    answer
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|l| (text(&l["state"]), text(&l["id"]), text(&l["user"])))
        .collect()
}

/// Compare one answer with the prediction.
fn judge(
    prediction: &Prediction,
    (status, body, lock_user): &(u16, Vec<u8>, Option<String>),
    problems: &mut Vec<String>,
) {
    // The state as of the backend's LOCK, answered from what that LOCK proved.
    if let Some(proved) = &prediction.proved {
        let as_proved = match proved {
            Some(bytes) => *status == 200 && body == bytes,
            None => *status == 404,
        };
        if as_proved {
            return;
        }
    }
    if !prediction.accepts(*status) {
        problems.push(format!(
            "status: {status} ({}), the rules say {}",
            String::from_utf8_lossy(body).trim(),
            prediction.describe()
        ));
    }
    if *status == 200
        && let Some(expected) = &prediction.answer
    {
        let got = match expected {
            Expected::Bytes(_, user) => {
                Expected::Bytes(body.clone(), user.as_ref().and(lock_user.clone()))
            }
            Expected::History(_) => Expected::History(history_of(body)),
            Expected::Locks(_) => Expected::Locks(locks_of(body)),
        };
        if got != *expected {
            problems.push(format!(
                "answer: got {}, the model has {}",
                shown(&got),
                shown(expected)
            ));
        }
    }
}

/// Two requests at once: the answers and the remote must be those of one order of the two.
async fn check_pair(
    cfg: &Config,
    world: &World,
    dir: &Path,
    model: &mut Model,
    before: &mut Snapshot,
    first: &Step,
    second: &Step,
) -> Result<(), Vec<String>> {
    let alone = Step {
        with: None,
        ..first.clone()
    };
    let (a, b) = tokio::join!(world.send(cfg, &alone), world.send(cfg, second));
    let held_before = model.locks.clone();
    let after =
        Snapshot::take(dir, before, cfg.lock_prefix).map_err(|e| vec![format!("git: {e}")])?;
    let mut explained = None;
    let mut why = Vec::new();
    for (x, ax, y, ay) in [(&alone, &a, second, &b), (second, &b, &alone, &a)] {
        let mut candidate = model.clone();
        let mut problems = Vec::new();
        for (step, answer) in [(x, ax), (y, ay)] {
            let prediction = candidate.predict(cfg, step);
            judge(&prediction, answer, &mut problems);
            if answer.0 == 200 && prediction.refusals.is_empty() {
                candidate.apply(&prediction.effect);
            }
            candidate.settle(cfg, step, &prediction, answer.0);
        }
        model_matches(cfg, &after, &candidate, &mut problems);
        if problems.is_empty() {
            explained = Some(candidate);
            break;
        }
        why.push(format!("[{x}] then [{y}]: {}", problems.join("; ")));
    }
    let mut problems = Vec::new();
    match explained {
        Some(candidate) => *model = candidate,
        None => problems.push(format!(
            "linearizable: answers {} and {} and the remote fit neither order: {}",
            a.0,
            b.0,
            why.join(" | ")
        )),
    }
    invariants(
        cfg,
        &[&alone, second],
        before,
        &after,
        &held_before,
        &mut problems,
    );
    *before = after;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Take the restored state's bytes from the remote into the model, after checking they are the
/// old revision with the new serial.
#[allow(clippy::too_many_arguments)]
fn restored(
    dir: &Path,
    model: &mut Model,
    after: &Snapshot,
    branch: &str,
    name: &str,
    expected: &serde_json::Value,
    serial: u64,
    problems: &mut Vec<String>,
) {
    let blob = after
        .trees
        .get(&format!("refs/heads/{branch}"))
        .and_then(|t| t.get(name));
    let bytes = blob.and_then(|b| {
        let mut all = vec!["--git-dir", dir.to_str().unwrap_or_default()];
        all.extend(["cat-file", "blob", b.as_str()]);
        let out = git_output(&all, None);
        out.status.success().then_some(out.stdout)
    });
    let Some(bytes) = bytes else {
        problems.push(format!("restore: {name} is not on {branch} after a 200"));
        return;
    };
    let actual: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if actual != *expected {
        problems.push(format!(
            "restore: {name} holds {actual}, expected {expected}"
        ));
    }
    model.apply(&Effect::Put {
        branch: branch.to_owned(),
        name: name.to_owned(),
        bytes,
        serial: Some(serial),
    });
}

/// The invariants, each with its own class in the message.
fn invariants(
    cfg: &Config,
    steps: &[&Step],
    before: &Snapshot,
    after: &Snapshot,
    held_before: &BTreeMap<String, Holder>,
    problems: &mut Vec<String>,
) {
    let prefix = cfg.lock_prefix;
    // 1. No ref outside the allowed set.
    for name in after.refs.keys() {
        let allowed = match name.strip_prefix(prefix) {
            Some(state) => valid_path(state),
            // The record of the lock ref prefix, and only this backend's (and the fence of a
            // backend that writes states to their own refs).
            None if name.starts_with(gitstate_core::protocol::PROTOCOL_PREFIX) => {
                *name == gitstate_core::protocol::lock_prefix_record(prefix)
                    || *name == gitstate_core::protocol::STATE_REFS_FENCE
                    || *name == gitstate_core::protocol::PROOF_FENCE
            }
            // A LOCK's probe (a state has no ref of its own), while that lock is held: it
            // points at the lock commit, and goes with the lock.
            None if name.starts_with("refs/gitstate/states/") && name.ends_with("/absent") => {
                let probe = &after.refs[name];
                after
                    .refs
                    .iter()
                    .any(|(lock, tip)| lock.starts_with(prefix) && tip == probe)
            }
            None => name
                .strip_prefix("refs/heads/")
                .is_some_and(|b| cfg.allowed_branch(b)),
        };
        if !allowed {
            problems.push(format!("refs: {name} exists, outside the allowed set"));
        }
    }
    // 2. Nothing outside the actors' grants changed; 3. a held lock is honoured.
    let actors: Vec<String> = steps
        .iter()
        .map(|s| cfg.users[s.user].name.clone())
        .collect();
    let actors = actors.join(" or ");
    let (states, locks) = before.changes(after, prefix);
    for (branch, path) in &states {
        let granted = steps.iter().any(|step| {
            let role = match step.op {
                Op::Delete { .. } | Op::Restore { .. } => Role::Admin,
                _ => Role::Write,
            };
            cfg.users[step.user].may(role, path)
        });
        if !granted {
            problems.push(format!(
                "grant: {path} on {branch} changed by {actors}, without the grant for it"
            ));
        }
        if let Some(holder) = held_before.get(path.as_str()) {
            let by_holder = steps.iter().any(|step| match &step.op {
                Op::Write { id, .. } | Op::Delete { id } => {
                    *id == Some(holder.id) && holder.user == step.user
                }
                _ => false,
            });
            if !by_holder {
                problems.push(format!(
                    "lock: {path} on {branch} changed while {} of u{} held it",
                    holder.id, holder.user
                ));
            }
        }
    }
    for name in &locks {
        if !steps
            .iter()
            .any(|step| cfg.users[step.user].may(Role::Write, name))
        {
            problems.push(format!(
                "grant: lock of {name} changed by {actors}, who lack Write on it"
            ));
        }
    }
}

/// The remote equals the model: branches, every state's bytes, lock refs.
fn model_matches(cfg: &Config, after: &Snapshot, model: &Model, problems: &mut Vec<String>) {
    let prefix = cfg.lock_prefix;
    // 4. The remote equals the model.
    let branch_refs: BTreeSet<String> = after
        .refs
        .keys()
        .filter(|r| !r.starts_with(prefix))
        .filter_map(|r| r.strip_prefix("refs/heads/").map(str::to_owned))
        .collect();
    let model_branches: BTreeSet<String> = model.branches.keys().cloned().collect();
    if branch_refs != model_branches {
        problems.push(format!(
            "model: branches {branch_refs:?} on the remote, {model_branches:?} in the model"
        ));
    }
    for (branch, expected) in &model.branches {
        let none = BTreeMap::new();
        let tree = after
            .trees
            .get(&format!("refs/heads/{branch}"))
            .unwrap_or(&none);
        let paths: BTreeSet<&String> = tree.keys().chain(expected.states.keys()).collect();
        for path in paths {
            let remote = tree.get(path);
            let model = expected.states.get(path).map(|b| blob_id(b));
            if remote != model.as_ref() {
                problems.push(format!(
                    "model: {path} on {branch} is {} on the remote, {} in the model",
                    remote.map_or("absent", String::as_str),
                    model.as_deref().unwrap_or("absent")
                ));
            }
        }
    }
    let lock_refs: BTreeSet<String> = after
        .refs
        .keys()
        .filter_map(|r| r.strip_prefix(prefix).map(str::to_owned))
        .collect();
    let model_locks: BTreeSet<String> = model.locks.keys().cloned().collect();
    if lock_refs != model_locks {
        problems.push(format!(
            "model: locks {lock_refs:?} on the remote, {model_locks:?} in the model"
        ));
    }
    for (name, holder) in &model.locks {
        let expected = (holder.id.to_owned(), cfg.users[holder.user].name.clone());
        if let Some(remote) = after.locks.get(name)
            && *remote != expected
        {
            problems.push(format!(
                "model: the lock of {name} is {remote:?} on the remote, {expected:?} in the model"
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Seeds, shrinking and the report.

/// Run `steps` generated steps of `seed`; on a failure, shrink and describe it.
async fn run_seed(seed: u64, steps: usize, shrink_for: Duration) -> Result<(), String> {
    let cfg = Config::for_seed(seed);
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let users = cfg.users.len();
    let off = Off::from_env();
    let (sequence, outcome) = run(&cfg, |i, model| {
        (i < steps).then(|| generate(&mut rng, model, users, &off))
    })
    .await;
    let elapsed = started.elapsed();
    let Err(failure) = outcome else {
        println!(
            "model: seed {seed}: {} steps passed in {:.1} s",
            sequence.len(),
            elapsed.as_secs_f64()
        );
        return Ok(());
    };
    let failing = sequence[..=failure.step].to_vec();
    let (shrunk, shrunk_failure) = shrink(&cfg, failing.clone(), failure.clone(), shrink_for).await;
    let mut report = format!(
        "model: {}\nfailed at step {} of seed {seed} ({:.1} s):\n  {}\nreplay: {}GITSTATE_MODEL_SEED={seed} GITSTATE_MODEL_STEPS={} cargo test -p gitstate-tests --test it model:: -- --nocapture\n",
        cfg.describe(),
        failure.step,
        elapsed.as_secs_f64(),
        failure.messages.join("\n  "),
        std::env::var("GITSTATE_MODEL_OFF")
            .map(|off| format!("GITSTATE_MODEL_OFF={off} "))
            .unwrap_or_default(),
        failure.step + 1
    );
    if shrunk.len() < failing.len() {
        report.push_str(&format!(
            "shrunk to {} steps (failing with: {}):\n",
            shrunk.len(),
            shrunk_failure.messages.join(" | ")
        ));
        for step in &shrunk {
            report.push_str(&format!("  {step}\n"));
        }
    } else {
        report.push_str("the sequence:\n");
        for (i, step) in failing.iter().enumerate() {
            report.push_str(&format!("  {i:4} {step}\n"));
        }
    }
    Err(report)
}

/// Remove chunks of the sequence while it still fails the same way, halving the chunk size, for
/// at most `budget`.
async fn shrink(
    cfg: &Config,
    mut steps: Vec<Step>,
    mut failure: Failure,
    budget: Duration,
) -> (Vec<Step>, Failure) {
    let started = Instant::now();
    let class = failure.class();
    let mut chunk = steps.len() / 2;
    while chunk >= 1 && started.elapsed() < budget {
        let mut start = 0;
        while start < steps.len() && started.elapsed() < budget {
            let mut candidate = steps.clone();
            let end = (start + chunk).min(candidate.len());
            candidate.drain(start..end);
            if candidate.is_empty() {
                start += chunk;
                continue;
            }
            let replay = candidate.clone();
            let (_, outcome) = run(cfg, |i, _| replay.get(i).cloned()).await;
            match outcome {
                Err(found) if found.class() == class => {
                    candidate.truncate(found.step + 1);
                    steps = candidate;
                    failure = found;
                }
                _ => start += chunk,
            }
        }
        chunk /= 2;
    }
    (steps, failure)
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sequences_match_the_model() {
    let seeds: Vec<u64> = match (
        env_number("GITSTATE_MODEL_SEED"),
        std::env::var("GITSTATE_MODEL_SEEDS").ok(),
    ) {
        (Some(seed), _) => vec![seed],
        (None, Some(range)) => {
            let (from, to) = range
                .split_once("..")
                .expect("GITSTATE_MODEL_SEEDS=<from>..<to>");
            let from: u64 = from.trim().parse().expect("a seed");
            let to: u64 = to.trim().parse().expect("a seed");
            (from..to).collect()
        }
        (None, None) => CI_SEEDS.to_vec(),
    };
    let steps = env_number("GITSTATE_MODEL_STEPS").map_or(CI_STEPS, |n| n as usize);
    let shrink_for = Duration::from_secs(env_number("GITSTATE_MODEL_SHRINK_SECS").unwrap_or(60));
    let started = Instant::now();
    let mut failures = Vec::new();
    for seed in &seeds {
        if let Err(report) = run_seed(*seed, steps, shrink_for).await {
            println!("{report}");
            failures.push(report.lines().skip(1).take(2).collect::<Vec<_>>().join(" "));
        }
    }
    println!(
        "model: {} seeds × {steps} steps in {:.1} s, {} failed",
        seeds.len(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "the model and gitstate disagree (the report of each seed is above):\n{}",
        failures.join("\n")
    );
}
