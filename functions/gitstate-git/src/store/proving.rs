//! What a LOCK push asserts after the lock's create, and how its verdicts are judged (see the
//! `floor` module).

use gix::ObjectId;

use super::null;
use super::proof::ReadsUntil;
use crate::protocol::Command;

/// What a LOCK push asserts after the lock's create: the ref that holds the state's newest
/// content (its state ref, or the branch) at the tip this process knows, and, for a state
/// believed to have no ref, that it has none ([`Probe`]).
pub(in crate::store) struct Proving {
    /// The ref that holds the state's newest content, at the tip this process knows; where that
    /// is the state's own ref, the branch at its known tip too, since the branch's file says
    /// whether the state exists (a tip this process last saw may predate the state's create,
    /// or a person's delete on the branch).
    pub(super) asserts: Vec<Command>,
    pub(super) branch: ObjectId,
    pub(super) state: Option<ObjectId>,
    /// The state's ref (whether `assert` names it or the branch).
    pub(super) state_ref: String,
    pub(super) probe: Option<Probe>,
    /// What the lock commit records (see [`ReadsUntil`]).
    pub(super) until: Option<ReadsUntil>,
}

/// How a LOCK push shows that a state has no ref, which no command asserts: it creates a ref
/// inside the state ref's name, `<state ref>/absent`, pointing at the lock commit, which git
/// refuses while the state ref exists (a directory/file conflict, in the files and reftable
/// backends alike) and which keeps anyone from creating the state ref while it stands. It
/// stands while the lock is held: this process deletes it with the lock's release (the two
/// deletes in one push), and a write that creates the state ref deletes one left behind (a
/// lock released elsewhere) first. Whether git applies a push's commands one by one or in
/// batches (git 2.51 and later), the create is judged with the lock's create, so "absent" holds
/// from the moment the lock is this process's.
pub(super) struct Probe {
    create: Command,
}

impl Probe {
    /// The probe of the lock commit `commit`: created, or moved from `left` where this process
    /// saw one left behind (at that tip it exists, so the state ref cannot; it then goes with
    /// this lock's release).
    fn new(state_ref: &str, commit: ObjectId, left: Option<ObjectId>) -> Self {
        Self {
            create: Command {
                old: left.unwrap_or_else(null),
                new: commit,
                name: probe_ref(state_ref),
            },
        }
    }
}

/// A command that asserts `name` at `tip` and changes nothing (never the zero id: `0 → 0`
/// would be a delete without a check).
fn unchanged(name: &str, tip: ObjectId) -> Command {
    Command {
        old: tip,
        new: tip,
        name: name.to_owned(),
    }
}

/// The ref a LOCK's probe creates for the state whose ref is `state_ref` (see [`Probe`]).
pub(in crate::store) fn probe_ref(state_ref: &str) -> String {
    format!("{state_ref}/absent")
}

/// What the verdicts on a LOCK push's assertion (and probe) say.
pub(super) struct Judged {
    pub(super) proved: bool,
    /// The probe stands (to delete with the lock, or at once when the lock did not land).
    pub(super) probe: Option<Command>,
}

impl Proving {
    /// The branch `branch_ref` at `branch`: a state that has no ref of its own (see
    /// [`Self::absent`]).
    pub(super) fn new(branch_ref: &str, branch: ObjectId) -> Self {
        Self {
            asserts: vec![unchanged(branch_ref, branch)],
            branch,
            state: None,
            state_ref: String::new(),
            probe: None,
            until: None,
        }
    }

    /// The state's own ref `state_ref` at `state`, and the branch `branch_ref` at `branch`.
    pub(super) fn own(
        state_ref: &str,
        state: ObjectId,
        branch_ref: &str,
        branch: ObjectId,
    ) -> Self {
        Self {
            asserts: vec![unchanged(state_ref, state), unchanged(branch_ref, branch)],
            state: Some(state),
            ..Self::new(branch_ref, branch)
        }
        .of(state_ref.to_owned())
    }

    /// A state without a ref of its own, on `branch_ref` at `branch`: the branch asserted, the
    /// ref's absence probed with the lock commit `lock`.
    pub(super) fn absent(
        branch_ref: &str,
        branch: ObjectId,
        state_ref: &str,
        (lock, left): (ObjectId, Option<ObjectId>),
    ) -> Self {
        let proving = Self::new(branch_ref, branch).of(state_ref.to_owned());
        Self {
            probe: Some(Probe::new(state_ref, lock, left)),
            ..proving
        }
    }

    /// The proof is of the state whose ref is `state_ref`.
    pub(super) fn of(self, state_ref: String) -> Self {
        Self { state_ref, ..self }
    }

    /// The commands after the lock's create.
    pub(super) fn commands(&self) -> Vec<Command> {
        let probe = self.probe.iter().map(|p| p.create.clone());
        self.asserts.iter().cloned().chain(probe).collect()
    }

    /// What undoes the probe this LOCK push made, given its `delete`: the delete, or, where
    /// the push moved a probe it saw standing, the move back.
    pub(super) fn undo_probe(&self, delete: Command) -> Command {
        let was = self.probe.as_ref().map_or_else(null, |p| p.create.old);
        Command { new: was, ..delete }
    }

    /// Judge the verdicts on [`Self::commands`], in their order.
    pub(super) fn judge(&self, verdicts: &[bool]) -> Judged {
        let ok = |i: usize| verdicts.get(i).copied().unwrap_or(false);
        let held = (0..self.asserts.len()).all(ok);
        let Some(probe) = &self.probe else {
            return Judged {
                proved: held,
                probe: None,
            };
        };
        let made = ok(self.asserts.len());
        Judged {
            proved: held && made,
            probe: made.then(|| Command {
                old: probe.create.new,
                new: null(),
                name: probe.create.name.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use gix::ObjectId;

    use super::{Proving, probe_ref};
    use crate::store::null;

    fn id(n: u8) -> ObjectId {
        ObjectId::from_bytes_or_panic(&[n; 20])
    }

    /// Every combination of verdicts on an absent state's assertion and probe: proved only when
    /// both were accepted; a probe that was made stands (to delete with the lock) whatever the
    /// branch did.
    #[test]
    fn a_probe_proves_absence_with_the_branch_held() {
        let state_ref = format!("refs/gitstate/states/main/{}", "ab".repeat(20));
        let proving = Proving::absent("refs/heads/main", id(1), &state_ref, (id(2), None));
        let commands = proving.commands();
        let names: Vec<&str> = commands.iter().map(|c| c.name.as_str()).collect();
        let probe = probe_ref(&state_ref);
        assert_eq!(names, ["refs/heads/main", probe.as_str()]);
        assert_eq!((commands[0].old, commands[0].new), (id(1), id(1)));
        assert_eq!((commands[1].old, commands[1].new), (null(), id(2)));
        for bits in 0..4u8 {
            let verdicts: Vec<bool> = (0..2).map(|i| bits & (1 << i) != 0).collect();
            let (held, made) = (verdicts[0], verdicts[1]);
            let judged = proving.judge(&verdicts);
            assert_eq!(judged.proved, held && made, "{verdicts:?}");
            let standing = judged.probe.map(|c| (c.name, c.old, c.new));
            let expected = made.then(|| (probe.clone(), id(2), null()));
            assert_eq!(standing, expected, "{verdicts:?}");
        }
        // A probe left behind at a tip this process saw is moved, not created.
        let left = Proving::absent("refs/heads/main", id(1), &state_ref, (id(2), Some(id(9))));
        let moved = &left.commands()[1];
        assert_eq!((moved.old, moved.new), (id(9), id(2)));
        // A state's own ref: it and the branch asserted, proved only when both held.
        let own = Proving::own(&state_ref, id(3), "refs/heads/main", id(1));
        let asserted: Vec<_> = own
            .commands()
            .into_iter()
            .map(|c| (c.name, c.old, c.new))
            .collect();
        assert_eq!(
            asserted,
            [
                (state_ref.clone(), id(3), id(3)),
                ("refs/heads/main".to_owned(), id(1), id(1)),
            ]
        );
        for bits in 0..4u8 {
            let verdicts: Vec<bool> = (0..2).map(|i| bits & (1 << i) != 0).collect();
            let judged = own.judge(&verdicts);
            assert_eq!(judged.proved, verdicts[0] && verdicts[1], "{verdicts:?}");
            assert!(judged.probe.is_none());
        }
    }
}
