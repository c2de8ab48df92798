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

/// Sleep `wait` (a [`wait_for_reads`]), saying why.
pub(super) async fn wait_out(wait: Duration) {
    if wait.is_zero() {
        return;
    }
    tracing::debug!(
        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        "waiting out the reads the process that took the lock may answer from its LOCK"
    );
    tokio::time::sleep(wait).await;
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use rand::{Rng, SeedableRng};

    use super::{CLOCK_MARGIN, ReadsUntil, wait_for_reads};
    use crate::settings::MAX_PROOF_WINDOW;

    /// Lock commits whose recorded time lies anywhere from a minute before now to a year after
    /// (another process's clock, or a commit pushed by hand), and messages whose trailer is no
    /// time: the wait is the time left plus the margin, never more than the longest window and
    /// the margin, and nothing for a time past or a value that is no time.
    #[test]
    fn a_wait_is_what_the_lock_commit_records_and_never_more_than_the_longest_window() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(27);
        let most = MAX_PROOF_WINDOW + CLOCK_MARGIN;
        for _ in 0..2000 {
            let ahead_ms: i64 = match rng.random_range(0..4) {
                0 => rng.random_range(-60_000..0),
                1 => rng.random_range(0..6_000),
                _ => rng.random_range(6_000..31_536_000_000),
            };
            let now = SystemTime::now();
            let wall = match u64::try_from(ahead_ms) {
                Ok(ms) => now + Duration::from_millis(ms),
                Err(_) => now - Duration::from_millis(ahead_ms.unsigned_abs()),
            };
            let until = ReadsUntil {
                instant: std::time::Instant::now(),
                wall,
            };
            let message = until.recorded("lock env/app.tfstate\n\nLock-ID: x\nUser: ann\n");
            let wait = wait_for_reads(&message);
            let left = (wall + CLOCK_MARGIN)
                .duration_since(now)
                .unwrap_or_default()
                .min(most);
            assert!(wait <= most, "{ahead_ms} ms: {wait:?}");
            // (The clock moved on a little between the two readings.)
            let slack = Duration::from_millis(200);
            assert!(
                wait <= left && wait + slack >= left,
                "{ahead_ms} ms ahead: waits {wait:?}, {left:?} left"
            );
        }
        for value in [
            "",
            "soon",
            "2026-13-40T00:00:00Z",
            "1733600000",
            "9999-99-99",
        ] {
            let message = format!("lock a\n\nUser: ann\nReads-Proved-Until: {value}\n");
            assert_eq!(wait_for_reads(&message), Duration::ZERO, "{value:?}");
        }
        assert_eq!(wait_for_reads("lock a\n\nUser: ann\n"), Duration::ZERO);
    }
}
