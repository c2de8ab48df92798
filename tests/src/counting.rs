//! Git requests of one Terraform apply (issue 27), for the request-counting tests of every shape
//! (`serve`, `serve` with KMS, `gitstate run`, the Lambda binary): an apply sends LOCK, GET (a
//! create a second one before its write), the write under the lock when it changes something,
//! and UNLOCK, and each step is counted with the git requests the server saw while it ran.
//!
//! Each shape asserts its numbers of today as upper bounds, next to [`FLOOR`]: when a change
//! takes a shape closer to the floor, lower its bounds to what it then measures.

use std::fmt;

use crate::{Client, GitServer, Seen, state_json};

/// What an apply does to its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apply {
    /// The first apply of a new state: GET answers 404 (twice, as Terraform reads), then the
    /// write.
    Create,
    /// An apply that changes the state.
    Update,
    /// An apply with nothing to change: LOCK, GET, UNLOCK.
    NoOp,
}

impl Apply {
    pub const ALL: [Self; 3] = [Self::Create, Self::Update, Self::NoOp];
}

/// Git requests per kind of apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requests {
    pub create: usize,
    pub update: usize,
    pub no_op: usize,
}

impl Requests {
    pub fn of(&self, kind: Apply) -> usize {
        match kind {
            Apply::Create => self.create,
            Apply::Update => self.update,
            Apply::NoOp => self.no_op,
        }
    }
}

/// The protocol floor issue 27 sets in every shape, plain and encrypted: an update is the LOCK
/// push, the write push and the UNLOCK push (the GET answered from what the LOCK proved), a
/// no-op the two lock pushes, a create the same three pushes as an update.
pub const FLOOR: Requests = Requests {
    create: 3,
    update: 3,
    no_op: 2,
};

/// One apply's steps, each with the labels of the git requests it made.
#[derive(Debug, Clone)]
pub struct Counted {
    pub kind: Apply,
    pub steps: Vec<(&'static str, Vec<String>)>,
}

impl Counted {
    pub fn total(&self) -> usize {
        self.steps.iter().map(|(_, labels)| labels.len()).sum()
    }

    /// Fails the test when the apply made more git requests than `bound` allows for its kind,
    /// naming the shape and every step's requests.
    #[track_caller]
    pub fn assert_within(&self, shape: &str, bound: &Requests) {
        let (total, allowed) = (self.total(), bound.of(self.kind));
        assert!(
            total <= allowed,
            "{shape}: a {:?} apply made {total} git requests, the bound is {allowed} (floor {}): {self}",
            self.kind,
            FLOOR.of(self.kind)
        );
    }
}

impl fmt::Display for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} = {}:", self.kind, self.total())?;
        for (step, labels) in &self.steps {
            write!(f, " {step} {labels:?}")?;
        }
        Ok(())
    }
}

/// The labels of the requests the server saw since the last look.
fn labels(server: &GitServer) -> Vec<String> {
    server.take_requests().iter().map(Seen::label).collect()
}

/// One apply of `kind` on `name` through `client`, as Terraform sends it (lock ID `id`; the
/// write carries `serial` of lineage `lineage`), each step's answer asserted and its git
/// requests counted. Requests the server saw before the apply are dropped.
pub async fn count_apply(
    server: &GitServer,
    client: &Client,
    name: &str,
    id: &str,
    kind: Apply,
    serial: u64,
) -> Counted {
    server.take_requests();
    let mut steps = Vec::new();
    client.lock(name, id).await.expect(200);
    steps.push(("LOCK", labels(server)));
    let read = client.get_state(name).await;
    let want = if kind == Apply::Create { 404 } else { 200 };
    read.expect(want);
    steps.push(("GET", labels(server)));
    if kind == Apply::Create {
        // Terraform reads a state it did not find once more before it writes the first one.
        client.get_state(name).await.expect(404);
        steps.push(("GET again", labels(server)));
    }
    if kind != Apply::NoOp {
        let lineage = format!("lineage-{}", name.replace('/', "-"));
        client
            .write_locked(name, id, &state_json(&lineage, serial))
            .await
            .expect(200);
        steps.push(("write", labels(server)));
    }
    client.unlock(name, id).await.expect(200);
    steps.push(("UNLOCK", labels(server)));
    Counted { kind, steps }
}

/// A warm apply of every kind on `name` (a new state), after one update apply on another state
/// that warms the process: the three counts, printed for the shape.
pub async fn count_warm_applies(
    server: &GitServer,
    client: &Client,
    shape: &str,
    name: &str,
) -> Vec<Counted> {
    let warm = format!("{name}.warm");
    count_apply(server, client, &warm, "warm-c", Apply::Create, 1).await;
    count_apply(server, client, &warm, "warm-u", Apply::Update, 2).await;
    let mut counted = Vec::new();
    for (i, kind) in Apply::ALL.into_iter().enumerate() {
        // A state's first update makes its own ref (`GITSTATE_STATE_REFS=always`), once in its
        // life, from a fresh advertisement: the update counted is a later one, as most are.
        if kind == Apply::Update {
            count_apply(server, client, name, "first-u", Apply::Update, 2).await;
        }
        let serial = if kind == Apply::Create { 1 } else { 3 };
        let id = format!("apply-{i}");
        let apply = count_apply(server, client, name, &id, kind, serial).await;
        eprintln!("{shape}: {apply}");
        counted.push(apply);
    }
    counted
}
