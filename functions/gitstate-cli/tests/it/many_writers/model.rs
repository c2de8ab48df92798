//! The model: what the backend must have done so far, the requests, and the judge of each
//! answer (alone, or two requests on one name at once, which must agree with one of the two
//! orders).

use std::collections::BTreeMap;

use gitstate_tests::Client;

/// States several actors share (so they contend): folders of one another (`a`, `a/b`,
/// `a/b/c.tfstate`), case variants (only one of which can be a state), and plain names; then one state per actor that only that
/// actor touches.
pub const NAMES: [&str; 14] = [
    "a",
    "a/b",
    "a/b/c.tfstate",
    "env/App.tfstate",
    "env/app.tfstate",
    "env/APP.tfstate",
    "net/prod.tfstate",
    "net/stage.tfstate",
    "own/0.tfstate",
    "own/1.tfstate",
    "own/2.tfstate",
    "own/3.tfstate",
    "own/4.tfstate",
    "own/5.tfstate",
];
/// How many of [`NAMES`] are shared; the rest are the actors' own, in actor order.
pub const SHARED: usize = 8;

/// The state only actor `who` touches.
pub fn own_name(who: usize) -> &'static str {
    NAMES[SHARED + who]
}

/// One version of a state: its serial (strictly increasing per state) and the marker of the
/// write that first carried its content (a restore carries the marker of what it restores).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub serial: u64,
    pub marker: String,
}

impl Version {
    pub fn body(&self, name: &str) -> String {
        format!(
            r#"{{"version":4,"terraform_version":"1.11.4","serial":{},"lineage":"{}","outputs":{{"write":{{"value":"{}","type":"string"}}}},"resources":[]}}"#,
            self.serial,
            lineage(name),
            self.marker
        )
    }

    /// The version a state body holds, if it is one of this test's.
    pub fn of(body: &str) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_str(body).ok()?;
        Some(Self {
            serial: value["serial"].as_u64()?,
            marker: value["outputs"]["write"]["value"].as_str()?.to_owned(),
        })
    }
}

fn lineage(name: &str) -> String {
    format!("lineage-{}", name.replace('/', "-"))
}

/// Names that are a folder of one another (the namespace rules make them exclude each other).
fn related(a: &str, b: &str) -> bool {
    a != b && (a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/")))
}

/// The family of a name: the first name in [`NAMES`] it is equal, related or a near name to
/// (requests of one round never touch one family twice: their answers would depend on an
/// order the round does not fix).
pub fn family(name: &str) -> usize {
    NAMES
        .iter()
        .position(|n| *n == name || related(n, name) || gitstate_core::refs::near_name(n, name))
        .expect("a known name")
}

/// One request of a round.
#[derive(Debug, Clone)]
pub enum Op {
    Lock {
        name: &'static str,
        id: String,
    },
    /// A holder's read, or anyone's.
    Get {
        name: &'static str,
    },
    Write {
        name: &'static str,
        id: String,
        version: Version,
    },
    /// `POST` without `?ID=` (`terraform apply -lock=false`, allowed by
    /// `GITSTATE_ALLOW_UNLOCKED_WRITES`): refused while someone holds the lock.
    WriteUnlocked {
        name: &'static str,
        version: Version,
    },
    /// `terraform workspace delete`: the holder deletes the state (the lock stays).
    Delete {
        name: &'static str,
        id: String,
    },
    Unlock {
        name: &'static str,
        id: String,
    },
    ForceUnlock {
        name: &'static str,
    },
    Restore {
        name: &'static str,
        serial: u64,
    },
    History {
        name: &'static str,
    },
}

impl Op {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Lock { .. } => "LOCK",
            Self::Get { .. } => "GET",
            Self::Write { .. } => "write",
            Self::WriteUnlocked { .. } => "unlocked write",
            Self::Delete { .. } => "DELETE",
            Self::Unlock { .. } => "UNLOCK",
            Self::ForceUnlock { .. } => "force-unlock",
            Self::Restore { .. } => "restore",
            Self::History { .. } => "history",
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Lock { name, .. }
            | Self::Get { name }
            | Self::Write { name, .. }
            | Self::WriteUnlocked { name, .. }
            | Self::Delete { name, .. }
            | Self::Unlock { name, .. }
            | Self::ForceUnlock { name }
            | Self::Restore { name, .. }
            | Self::History { name } => name,
        }
    }

    /// A write that holds no lock of the caller's: the backend takes the lock for it (restore
    /// always, an unlocked write in the redesign), so a request racing it may find that lock.
    fn locks_implicitly(&self) -> bool {
        matches!(self, Self::WriteUnlocked { .. } | Self::Restore { .. })
    }

    pub async fn send(&self, client: &Client) -> (u16, String) {
        let answer = match self {
            Self::Lock { name, id } => client.lock(name, id).await,
            Self::Get { name } => client.get_state(name).await,
            Self::Write { name, id, version } => {
                client.write_locked(name, id, &version.body(name)).await
            }
            Self::WriteUnlocked { name, version } => client.write(name, &version.body(name)).await,
            Self::Delete { name, id } => client.delete_state(name, Some(id)).await,
            Self::Unlock { name, id } => client.unlock(name, id).await,
            Self::ForceUnlock { name } => client.force_unlock(name).await,
            Self::Restore { name, serial } => client.restore(name, &serial.to_string()).await,
            Self::History { name } => client.history(name, "per_page=100").await,
        };
        (answer.status, answer.body)
    }
}

/// What the backend must have done so far.
#[derive(Default, Clone)]
pub struct Model {
    /// Acknowledged versions per name, oldest first (plus unacknowledged ones found landed);
    /// `None` is a delete.
    pub history: BTreeMap<&'static str, Vec<Option<Version>>>,
    /// Lock ID per locked name.
    pub locks: BTreeMap<&'static str, String>,
    /// The highest serial handed to a write of each name (two writes of a round never share
    /// one).
    pub issued: BTreeMap<&'static str, u64>,
    /// Writes answered with a 5xx that had not landed when the round ended: never to appear.
    pub unsure: Vec<(&'static str, Version)>,
    /// Every lock ID an actor ever sent (a lock held under another ID is one the backend took
    /// for a restore or an unlocked write).
    pub ids: std::collections::BTreeSet<String>,
    /// Writes and restores acknowledged, and requests sent.
    pub acknowledged: usize,
    pub sent: usize,
    pub writes: u64,
    /// Answers per request kind and status, and the races run, for the report.
    pub seen: BTreeMap<String, usize>,
    /// The LOCK proof (see `as_of_lock` in mod.rs): per process and name, the version (`None`:
    /// no state) its last 200 LOCK of the name proved and when, until that process serves
    /// another request on the name.
    pub proofs: BTreeMap<(usize, &'static str), (Option<Version>, std::time::Instant)>,
    /// How long a LOCK's proof answers the GETs after it through that process; `None`:
    /// never (a host without atomic push, or `GITSTATE_LOCK_PROOF_MS=0`).
    pub proof_window: Option<std::time::Duration>,
    /// Every process waits out the reads another may answer from its LOCK's proof before it
    /// writes under that lock or releases it (`GITSTATE_LOCK_PROOF_MS`): a GET answered from a
    /// proof must be the newest version, unless an unlocked write of the name was sent since
    /// the round of the LOCK (see `as_of_lock` in mod.rs).
    pub strict_proofs: bool,
    /// Rounds judged so far, and the last round that sent an unlocked write of each name.
    pub rounds: usize,
    pub unlocked_sent: BTreeMap<&'static str, usize>,
    /// The round of each entry of [`Self::proofs`].
    pub proof_rounds: BTreeMap<(usize, &'static str), usize>,
}

impl Model {
    pub fn newest(&self, name: &str) -> Option<&Version> {
        self.history
            .get(name)
            .and_then(|h| h.last())
            .and_then(Option::as_ref)
    }

    pub fn count(&mut self, what: impl Into<String>) {
        *self.seen.entry(what.into()).or_default() += 1;
    }

    /// The serial of a new write: above every serial the name ever had or was handed (a write
    /// after a delete starts no lower), so that serials name versions.
    pub fn next_serial(&mut self, name: &'static str) -> u64 {
        let versions = self.history.get(name).into_iter().flatten().flatten();
        let stored = versions.map(|v| v.serial).max().unwrap_or(0);
        let issued = self.issued.entry(name).or_default();
        *issued = (*issued).max(stored) + 1;
        *issued
    }

    /// The one version with `serial`, when exactly one has it (a restore after a delete can
    /// repeat a serial).
    pub fn only_version(&self, name: &str, serial: u64) -> Option<&Version> {
        let versions = self.history.get(name).into_iter().flatten().flatten();
        let mut found = versions.filter(|v| v.serial == serial);
        let first = found.next()?;
        found.next().is_none().then_some(first)
    }

    /// Whether a stored state is in the name's folder or has the name as a folder, or, when the
    /// name is no state, is a near name of it (the tree's rule, checked first by
    /// every request).
    pub fn tree_clash(&self, name: &str) -> bool {
        let variant = |other: &str| gitstate_core::refs::near_name(name, other);
        let absent = self.newest(name).is_none();
        NAMES.iter().any(|other| {
            (related(name, other) || (absent && variant(other))) && self.newest(other).is_some()
        })
    }

    /// Whether a held lock's ref is in the name's folder or has it as a folder (found when the
    /// lock ref is taken).
    fn lock_clash(&self, name: &str) -> bool {
        NAMES
            .iter()
            .any(|other| related(name, other) && self.locks.contains_key(other))
    }

    /// The answer a read of `name` must have: 200 with the newest version, or 404.
    pub fn check_read(&self, name: &str, status: u16, body: &str) -> Result<(), String> {
        match self.newest(name) {
            Some(want) => {
                let got = Version::of(body);
                if status == 200 && got.as_ref() == Some(want) {
                    Ok(())
                } else {
                    Err(format!(
                        "stale or wrong read of {name}: {status} {got:?}, newest acknowledged {want:?}"
                    ))
                }
            }
            // A name in another's folder, or a folder of states, is not a state: 404 or 409.
            None if status == 404 || (status == 409 && self.tree_clash(name)) => Ok(()),
            None => Err(format!("{name} was never written, read {status} {body}")),
        }
    }

    /// The serials of `name`'s history, oldest first (a delete is `None`).
    pub fn serials(&self, name: &str) -> Vec<Option<u64>> {
        self.history
            .get(name)
            .into_iter()
            .flatten()
            .map(|v| v.as_ref().map(|v| v.serial))
            .collect()
    }

    /// Apply what a judged request did.
    pub fn apply(&mut self, effect: &Effect) {
        match effect {
            Effect::None | Effect::Unsure(..) => {}
            Effect::Locked(name, id) => {
                self.locks.insert(name, id.clone());
            }
            Effect::Unlocked(name) => {
                self.locks.remove(name);
            }
            Effect::Wrote(name, version) => {
                self.acknowledged += 1;
                self.history
                    .entry(name)
                    .or_default()
                    .push(Some(version.clone()));
            }
            Effect::Deleted(name) => {
                self.acknowledged += 1;
                self.history.entry(name).or_default().push(None);
            }
        }
    }
}

/// What a request changed, once judged.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    None,
    Locked(&'static str, String),
    Unlocked(&'static str),
    Wrote(&'static str, Version),
    Deleted(&'static str),
    /// A 5xx: settled against the repository once the round is over. What the request may
    /// have written (`Some(None)`: a delete) landed once or never; its lock, or the lock the
    /// backend took for it, is read again.
    Unsure(&'static str, Option<Option<Version>>),
}

fn expect(want: &[u16], status: u16, body: &str, op: &Op) -> Result<(), String> {
    if want.contains(&status) {
        Ok(())
    } else {
        Err(format!("{op:?}: expected {want:?}, got {status} {body}"))
    }
}

/// One answer of a round: the request, its status and body.
pub type Answered<'a> = (&'a Op, u16, &'a str);

/// Judge one request as if nothing else happened at the same time.
pub fn judge(model: &Model, (op, status, body): Answered<'_>) -> Result<Effect, String> {
    let name = op.name();
    let holder = model.locks.get(name);
    if status >= 500 {
        return Ok(failed(model, op));
    }
    match op {
        Op::Lock { id, .. } => {
            // A LOCK at the protocol floor checks the tree as of the last tip its process saw
            // (LOCK_ON_A_FOLDER_AT_THE_FLOOR): a folder relative stored since may go unseen, and
            // the write under that lock is refused instead. A held lock may answer first.
            let want: &[u16] = match (model.tree_clash(name), holder, model.lock_clash(name)) {
                (true, Some(_), _) => &[409, 423],
                (true, None, false) => &[409, 200],
                (true, None, true) | (false, None, true) => &[409],
                (false, Some(_), _) => &[423],
                (false, None, false) => &[200],
            };
            expect(want, status, body, op)?;
            if status == 423 && !body.contains(holder.map_or("", String::as_str)) {
                return Err(format!("{op:?}: the 423 does not name the holder: {body}"));
            }
            Ok(if status == 200 {
                Effect::Locked(name, id.clone())
            } else {
                Effect::None
            })
        }
        Op::Get { .. } => model.check_read(name, status, body).map(|()| Effect::None),
        Op::Write { id, version, .. } => {
            if holder == Some(id) && model.tree_clash(name) {
                // A relative was created without a lock while the holder held its own.
                expect(&[409], status, body, op).map(|()| Effect::None)
            } else if holder == Some(id) {
                expect(&[200], status, body, op)?;
                Ok(Effect::Wrote(name, version.clone()))
            } else {
                // Deposed by a force-unlock: refused, nothing written.
                expect(&[409, 423], status, body, op).map(|()| Effect::None)
            }
        }
        Op::WriteUnlocked { version, .. } => judge_unlocked_write(model, op, version, status, body),
        Op::Delete { id, .. } => {
            if holder != Some(id) {
                return expect(&[409, 423], status, body, op).map(|()| Effect::None);
            }
            let want: &[u16] = if model.newest(name).is_some() {
                &[200]
            } else if model.tree_clash(name) {
                &[404, 409]
            } else {
                &[404]
            };
            expect(want, status, body, op)?;
            Ok(if status == 200 {
                Effect::Deleted(name)
            } else {
                Effect::None
            })
        }
        Op::Unlock { id, .. } => match holder {
            Some(held) if held == id => {
                expect(&[200], status, body, op).map(|()| Effect::Unlocked(name))
            }
            Some(_) => expect(&[409, 423], status, body, op).map(|()| Effect::None),
            // Releasing nothing is 200, except under a name that cannot hold a lock.
            None if model.tree_clash(name) => {
                expect(&[409], status, body, op).map(|()| Effect::None)
            }
            None => expect(&[200], status, body, op).map(|()| Effect::None),
        },
        Op::ForceUnlock { .. } => {
            let want = if holder.is_none() && model.tree_clash(name) {
                409
            } else {
                200
            };
            expect(&[want], status, body, op)?;
            Ok(if holder.is_some() {
                Effect::Unlocked(name)
            } else {
                Effect::None
            })
        }
        Op::Restore { serial, .. } => judge_restore(model, op, *serial, status, body),
        Op::History { .. } => judge_history(model, op, status, body),
    }
}

fn judge_unlocked_write(
    model: &Model,
    op: &Op,
    version: &Version,
    status: u16,
    body: &str,
) -> Result<Effect, String> {
    let name = op.name();
    let stale = model
        .newest(name)
        .is_some_and(|v| v.serial > version.serial);
    let want: &[u16] = if model.tree_clash(name) {
        &[409]
    } else if model.locks.contains_key(name) {
        &[423]
    } else if stale {
        &[409]
    } else if model.lock_clash(name) {
        // Today an unlocked write takes no lock ref; the redesign takes one, which clashes.
        &[200, 409]
    } else {
        &[200]
    };
    expect(want, status, body, op)?;
    Ok(if status == 200 {
        Effect::Wrote(name, version.clone())
    } else {
        Effect::None
    })
}

fn judge_restore(
    model: &Model,
    op: &Op,
    serial: u64,
    status: u16,
    body: &str,
) -> Result<Effect, String> {
    let name = op.name();
    let from = model.only_version(name, serial);
    let want = if model.tree_clash(name) {
        409
    } else if from.is_none() {
        // No such revision: the request names what is not there.
        400
    } else if model.locks.contains_key(name) {
        423
    } else if model.lock_clash(name) {
        409
    } else {
        200
    };
    let (Some(from), 200) = (from, want) else {
        return expect(&[want], status, body, op).map(|()| Effect::None);
    };
    let restored = restored(model, name, from);
    expect(&[200], status, body, op)?;
    let answered: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("{op:?}: {e}: {body}"))?;
    if answered["serial"].as_u64() != Some(restored.serial) {
        return Err(format!("{op:?}: restored as {body}, want {restored:?}"));
    }
    Ok(Effect::Wrote(name, restored))
}

/// What a restore of `from` writes: its content, numbered above the newest version.
fn restored(model: &Model, name: &str, from: &Version) -> Version {
    Version {
        serial: model.newest(name).map_or(0, |v| v.serial).max(from.serial) + 1,
        marker: from.marker.clone(),
    }
}

/// A request answered with a 5xx (the git server failed, or a bug): what it may have done, to
/// settle against the repository. Reads did nothing.
fn failed(model: &Model, op: &Op) -> Effect {
    let name = op.name();
    let wrote = match op {
        Op::Get { .. } | Op::History { .. } => return Effect::None,
        Op::Lock { .. } | Op::Unlock { .. } | Op::ForceUnlock { .. } => None,
        Op::Write { version, .. } | Op::WriteUnlocked { version, .. } => {
            Some(Some(version.clone()))
        }
        Op::Delete { .. } => Some(None),
        Op::Restore { serial, .. } => model
            .only_version(name, *serial)
            .map(|from| Some(restored(model, name, from))),
    };
    Effect::Unsure(name, wrote)
}

fn judge_history(model: &Model, op: &Op, status: u16, body: &str) -> Result<Effect, String> {
    let name = op.name();
    let mut want = model.serials(name);
    want.reverse();
    want.truncate(100);
    if want.is_empty() && status == 409 && model.tree_clash(name) {
        return Ok(Effect::None);
    }
    // A name never written has an empty history.
    expect(&[200], status, body, op)?;
    let page: gitstate_tests::History =
        serde_json::from_str(body).map_err(|e| format!("{op:?}: {e}: {body}"))?;
    let got = page_serials(&page);
    if got == want {
        Ok(Effect::None)
    } else {
        Err(format!("history of {name}: {got:?}, model {want:?}"))
    }
}

/// A history page's serials, a delete as `None`.
pub fn page_serials(page: &gitstate_tests::History) -> Vec<Option<u64>> {
    page.versions
        .iter()
        .map(|v| (!v.deleted).then(|| v.serial.unwrap_or_default()))
        .collect()
}

/// `first` then `second`; with `took`, the first (answered with a 5xx) is judged as having
/// done what a 200 would have before the second ran (what it did is still settled later).
fn judge_in_order(
    model: &Model,
    first: Answered<'_>,
    second: Answered<'_>,
    took: bool,
) -> Result<Vec<Effect>, String> {
    let mut m = model.clone();
    let effect = judge(&m, first)?;
    if took {
        m.apply(&judge(&m, (first.0, 200, ""))?);
    } else {
        m.apply(&effect);
    }
    Ok(vec![effect, judge(&m, second)?])
}

/// Two requests on one name at once. Sound answers are those of one of the two orders, one
/// request after the other; or, when one of them is a write the backend locks for (restore, an
/// unlocked write), the other may have met that lock (a 423 naming a holder the model does not
/// know) while the write went on. A request answered with a 5xx may have taken effect before
/// the other one ran. When several orders fit the answers, they must leave the same model (the
/// pairs are planned so; what a 5xx did is settled from the repository afterwards), else the
/// round is ambiguous and fails.
pub fn judge_pair(model: &Model, pair: [Answered<'_>; 2]) -> Result<Vec<Effect>, String> {
    let mut fits: Vec<(Model, Vec<Effect>)> = Vec::new();
    let mut problems = Vec::new();
    // A first request answered with a 5xx may have taken effect before the second or not.
    for (order, took) in [
        ([0, 1], false),
        ([1, 0], false),
        ([0, 1], true),
        ([1, 0], true),
    ] {
        let (first, second) = (pair[order[0]], pair[order[1]]);
        if took && (first.1 < 500 || matches!(first.0, Op::Get { .. } | Op::History { .. })) {
            continue;
        }
        match judge_in_order(model, first, second, took) {
            Ok(effects) => {
                let mut m = model.clone();
                effects.iter().for_each(|e| m.apply(e));
                fits.push((m, effects));
            }
            Err(e) => problems.push(e),
        }
    }
    for (met, writer) in [(0, 1), (1, 0)] {
        let (op, status, _) = pair[met];
        let free = !model.locks.contains_key(op.name());
        if status == 423 && free && pair[writer].0.locks_implicitly() {
            let mut m = model.clone();
            if let Ok(effect) = judge(&m, pair[writer]) {
                m.apply(&effect);
                fits.push((m, vec![effect]));
            }
        }
    }
    let name = pair[0].0.name();
    match fits.as_slice() {
        [] => Err(format!(
            "no order of the two fits (nor a 5xx that took effect first): {}",
            problems.join("; or: ")
        )),
        [(first, effects), rest @ ..] => {
            for (other, _) in rest {
                if other.history.get(name) != first.history.get(name)
                    || other.locks.get(name) != first.locks.get(name)
                {
                    return Err(format!(
                        "two orders fit and disagree on {name}: {:?} / {:?} and {:?} / {:?}",
                        first.serials(name),
                        first.locks.get(name),
                        other.serials(name),
                        other.locks.get(name)
                    ));
                }
            }
            Ok(effects.clone())
        }
    }
}
