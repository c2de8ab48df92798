//! Until when a LOCK's proof may answer reads, as the lock commit records it, and how long any
//! other process waits before it writes under that lock or releases it (see the `floor` module).

use std::time::{Duration, Instant, SystemTime};

/// What a process waits beyond the time a lock commit records before it writes under that lock
/// or releases it (see [`ReadsUntil`]): room for the clocks of two machines to differ.
pub(super) const CLOCK_MARGIN: Duration = Duration::from_millis(250);

/// Until when what a LOCK proved may answer the GETs that follow it (Terraform reads right
/// after it locks, and a create once more before its write): [`GitSettings::proof_window`]
/// after the lock commit was made, on this process's clock and on the wall clock. The lock
/// commit records the wall-clock time (`Reads-Proved-Until`), and every other process waits
/// until then (and [`CLOCK_MARGIN`] more) before it writes under that lock or releases it
/// ([`Remote::outwait_proof`]): the state cannot move on while such a GET may be answered.
/// What remains: a write without a lock (where the settings allow those) whose push raced the
/// LOCK's, a lock ref deleted or a state's file pushed outside gitstate meanwhile, clocks more
/// than [`CLOCK_MARGIN`] apart, and a gitstate too old to wait (fenced off, see
/// [`gitstate_core::protocol::PROOF_FENCE`]).
///
/// [`GitSettings::proof_window`]: crate::GitSettings::proof_window
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadsUntil {
    instant: Instant,
    wall: SystemTime,
}

impl ReadsUntil {
    /// `window` from now.
    pub(super) fn after(window: Duration) -> Self {
        Self {
            instant: Instant::now() + window,
            wall: SystemTime::now() + window,
        }
    }

    pub(super) fn stands(&self) -> bool {
        Instant::now() < self.instant && SystemTime::now() < self.wall
    }

    /// `message` recording it.
    pub(super) fn recorded(&self, message: &str) -> String {
        match jiff::Timestamp::try_from(self.wall) {
            Ok(until) => gitstate_core::trailers::with_reads_proved_until(message, until),
            // (Not before 1970 nor after 9999: never.)
            Err(_) => message.to_owned(),
        }
    }
}

/// How long a process that did not make the lock commit whose message is `message` waits
/// before it writes under that lock or releases it: until the time it records has passed by
/// [`CLOCK_MARGIN`], and never more than the longest window and that margin.
pub(super) fn wait_for_reads(message: &str) -> Duration {
    let Some(until) = gitstate_core::trailers::reads_proved_until(message) else {
        return Duration::ZERO;
    };
    let until = SystemTime::from(until) + CLOCK_MARGIN;
    until
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .min(crate::settings::MAX_PROOF_WINDOW + CLOCK_MARGIN)
}
