//! What a process that pushed to a repository leaves in its cache for the next process on the
//! same cache (the wrapper's next run, in the same working directory): the receive-pack
//! capabilities, the branch tip it last saw, and that the repository's protocol record agreed
//! with its settings. A process that takes these up makes its first LOCK at the floor, without
//! a look first, exactly as a long-running process does with what it saw minutes before: each
//! push at the floor is conditional on what it assumes (see the `floor` module), so the server
//! decides, and a note out of date costs the look it saved. A note is for one repository,
//! branch, lock ref prefix and state refs mode; anything else in it, or a tip the cache lacks,
//! and it is not taken up.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gix::ObjectId;
use serde::{Deserialize, Serialize};

use gitstate_core::ports::Location;

use super::remote::Remote;
use super::{GitStore, RemoteError};
use crate::protocol::Advert;
use crate::sync::lock;

/// The file, in the cache repository's git directory.
const FILE: &str = "gitstate-session.json";

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Note {
    repository: String,
    branch: String,
    lock_ref_prefix: String,
    state_refs: String,
    tip: String,
    caps: Vec<String>,
    /// When the look was made that it rests on (this process's start-up look, or the one the
    /// note it took up rested on), in seconds since the Unix epoch: a note is taken up for a
    /// while after a look, not for ever by runs that each keep it again.
    looked: i64,
}

impl GitStore {
    fn note_path(remote: &Remote) -> PathBuf {
        remote.cache.git_dir().join(FILE)
    }

    fn note_for(&self, at: &Location, tip: ObjectId, caps: Vec<String>, looked: i64) -> Note {
        Note {
            repository: at.repository.clone(),
            branch: at.branch.full_ref(),
            lock_ref_prefix: self.options.lock_ref_prefix.clone(),
            state_refs: format!("{:?}", self.options.state_refs),
            tip: tip.to_string(),
            caps,
            looked,
        }
    }

    /// Keep what the next process on this cache needs to push to `at` without a look first
    /// (`keep`), or forget what was kept (a run that failed: the next one looks, and says what
    /// it finds). Nothing is kept unless this process made the start-up look
    /// ([`GitStore::ready_to_write`]) or took up a note, knows the push capabilities and the
    /// branch tip, and found the protocol record agreeing.
    pub(super) fn keep_session(&self, at: &Location, keep: bool) -> Result<(), RemoteError> {
        let remote = self.remote(at)?;
        let path = Self::note_path(&remote);
        let agreed = lock(&self.protocol_agreed).contains(&at.repository);
        let looked = *lock(&remote.session_look);
        let known = match (remote.floor_caps(), remote.cached_tip()?, looked) {
            (Some(caps), Some(tip), Some(looked)) if keep && agreed => Some((caps, tip, looked)),
            _ => None,
        };
        let Some((caps, tip, looked)) = known else {
            return match std::fs::remove_file(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(io(error)),
                _ => Ok(()),
            };
        };
        let note = self.note_for(at, tip, caps.caps, looked);
        let text = serde_json::to_vec(&note).map_err(|e| io(std::io::Error::other(e)))?;
        // Written aside (a name of this process's own) and renamed, so a reader never sees
        // half a note.
        let aside = path.with_extension(format!("json.{}.new", std::process::id()));
        std::fs::write(&aside, text).map_err(io)?;
        std::fs::rename(&aside, &path).map_err(io)?;
        Ok(())
    }

    /// Take up what the last process on this cache kept for `at`, if it is younger than
    /// `within` (counted from the look it rests on) and was kept under these settings: `true` when this process's first LOCK may go
    /// at the floor without a look. A note that cannot be read is ignored (the look is made).
    pub(super) fn resume_session(
        &self,
        at: &Location,
        within: Duration,
    ) -> Result<bool, RemoteError> {
        let remote = self.remote(at)?;
        let Ok(text) = std::fs::read(Self::note_path(&remote)) else {
            return Ok(false);
        };
        let Ok(note) = serde_json::from_slice::<Note>(&text) else {
            return Ok(false);
        };
        let Ok(tip) = ObjectId::from_hex(note.tip.as_bytes()) else {
            return Ok(false);
        };
        let age = jiff::Timestamp::now().as_second() - note.looked;
        let Some(age) = u64::try_from(age).ok().map(Duration::from_secs) else {
            return Ok(false);
        };
        let same = self.note_for(at, tip, note.caps.clone(), note.looked) == note;
        // Seen `age` ago (or at least a minute ago, on a machine up for less than `age`), so
        // that nothing takes it for a tip seen just now.
        let now = Instant::now();
        let seen = now
            .checked_sub(age)
            .or_else(|| now.checked_sub(age.min(Duration::from_secs(60))));
        let (Some(seen), true, true) = (seen, same && age < within, remote.cache.is_commit(tip)?)
        else {
            return Ok(false);
        };
        let caps = Advert {
            caps: note.caps,
            ..Advert::default()
        };
        if !remote.transport.take_caps(caps) {
            return Ok(false);
        }
        remote.saw_tip_at(tip, seen);
        *lock(&remote.session_look) = Some(note.looked);
        lock(&self.protocol_agreed).insert(at.repository.clone());
        Ok(true)
    }
}

fn io(error: std::io::Error) -> RemoteError {
    crate::repository::Error::from(error).into()
}
