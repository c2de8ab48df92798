//! Writes: a commit on the advertised tip, pushed with compare-and-swap and retried on a moved
//! branch.

use super::*;

impl GitStore {
    pub(super) async fn create_file(
        &self,
        at: &Location,
        path: &str,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        let meta = meta.clone();
        let plan: WritePlan = Arc::new(move |_, stored| match stored {
            Some(_) => Err(Refusal::Exists),
            None => Ok(meta.clone()),
        });
        Ok(matches!(
            self.write_loop(at, path, None, Change::Put(content), plan)
                .await?,
            Written::Committed { .. }
        ))
    }

    /// Write `path`, guarded by the lock of `lock` when given; retried on a moved branch.
    pub(super) async fn write_loop(
        &self,
        at: &Location,
        path: &str,
        lock: Option<&StateName>,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, StoreError> {
        let remote = self.remote(at)?;
        let started = std::time::Instant::now();
        let mut last_error = None;
        let mut last_attempt = Duration::ZERO;
        let mut missed_floor = false;
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            // A first attempt at the floor that missed (the tip moved on since this process saw
            // it) is not contention: the second one looks at the remote at once.
            if attempt > 1 && !missed_floor {
                tokio::time::sleep(backoff(attempt, last_attempt)).await;
            }
            missed_floor = false;
            if attempt > 1 && started.elapsed() > WRITE_DEADLINE {
                break;
            }
            let attempt_started = std::time::Instant::now();
            let job = Job {
                path,
                lock,
                change: &change,
                plan: &plan,
            };
            let outcome = self.write_attempt(&remote, at, job, attempt == 1).await;
            last_attempt = attempt_started.elapsed();
            match outcome {
                Ok(Attempt::Done(written)) => return Ok(written),
                Ok(Attempt::MissedFloor(report)) => {
                    tracing::debug!(?report, "write at the floor refused, looking at the remote");
                    missed_floor = true;
                }
                Ok(Attempt::Lost(report)) => {
                    tracing::debug!(
                        attempt,
                        ?report,
                        "write lost a race, rebuilding on the new tip"
                    );
                }
                // A tip that moved between advertisement and fetch ("not our ref"), a remote that
                // hiccuped: every attempt starts from what the remote says now, and a push that
                // did land shows up as "unchanged", so trying again is safe.
                Err(error) if error.is_transient() => {
                    tracing::debug!(attempt, error = %gitstate_core::report::chain(&error), "write attempt failed, retrying");
                    last_error = Some(error);
                }
                Err(error) => return Err(error.into()),
            }
        }
        match last_error {
            Some(error) => Err(error.into()),
            None => Err(StoreError::Contention {
                attempts: MAX_WRITE_ATTEMPTS,
            }),
        }
    }

    /// Where an attempt starts: at the floor on a first attempt when it can, else from a fresh
    /// receive-pack advertisement.
    async fn start(
        &self,
        remote: &Remote,
        at: &Location,
        lock_ref: Option<&String>,
        floor: bool,
    ) -> Result<Start, Error> {
        if floor && let Some(start) = floor_start(remote, lock_ref)? {
            return Ok(start);
        }
        let branch = at.branch.full_ref();
        let advert = remote
            .refs(
                Service::ReceivePack,
                std::iter::once(branch.clone())
                    .chain(lock_ref.cloned())
                    .collect(),
            )
            .await?;
        Ok(Start {
            tip: advert.tip(&branch),
            lock_tip: lock_ref.and_then(|r| advert.tip(r)),
            mode: WriteMode::of(&advert),
            advert: Some(advert),
        })
    }

    async fn write_attempt(
        &self,
        remote: &Remote,
        at: &Location,
        job: Job<'_>,
        floor: bool,
    ) -> Result<Attempt, Error> {
        let Job {
            path,
            lock,
            change,
            plan,
        } = job;
        let lock_ref = lock.map(|name| self.lock_ref(name));
        let start = self.start(remote, at, lock_ref.as_ref(), floor).await?;
        let tip = start.tip;
        // At the floor only a push rests on what this process remembers: a refusal or an
        // "unchanged" is decided again from the remote.
        let decided = |written| {
            if start.advert.is_none() {
                Attempt::MissedFloor(PushReport::default())
            } else {
                Attempt::Done(written)
            }
        };
        remote
            .ensure(tip.into_iter().chain(start.lock_tip).collect())
            .await?;
        // The tree rule, against the very tree the commit is built on: a concurrent writer that
        // slips a clashing path in makes the push below lose the compare-and-swap, and the next
        // attempt sees it here.
        if let Some(tip) = tip {
            let (cache, owned) = (remote.cache.clone(), path.to_owned());
            if let Some(clash) = blocking(move || cache.path_clash(tip, &owned)).await? {
                return Ok(decided(Written::Refused(Refusal::Clash(clash))));
            }
        }
        let held = match (start.lock_tip, lock) {
            (Some(lock_tip), Some(name)) => Some(self.held(remote, lock_tip, name).await?),
            _ => None,
        };
        let stored = match tip {
            Some(tip) => {
                // The state and the index the commit updates, in one fetch if missing.
                let index = gitstate_core::index::INDEX_PATH.to_owned();
                remote.want_blobs(tip, vec![path.to_owned(), index]).await?;
                remote.read(tip, path.to_owned()).await?
            }
            None => None,
        };
        let meta = match plan(held.as_ref(), stored.as_deref()) {
            Ok(meta) => meta,
            Err(refusal) => return Ok(decided(Written::Refused(refusal))),
        };
        let content = match change {
            Change::Put(bytes) if stored.as_deref() == Some(bytes.as_ref()) => {
                return Ok(decided(Written::Unchanged));
            }
            Change::Put(bytes) => Some(bytes.clone()),
            Change::Delete => None,
        };
        // A new branch git cannot create next to an existing one (`env/a/b` while `env/a`
        // exists): refuse it now rather than push. A clashing branch created by someone else
        // after this look makes the push fail, and the next attempt refuses it here.
        if tip.is_none()
            && let Some(advert) = &start.advert
            && let Some(clash) = self.branch_clash(remote, advert, &at.branch).await?
        {
            return Ok(Attempt::Done(Written::Refused(Refusal::Clash(clash))));
        }
        let commit = remote.commit(tip, path.to_owned(), content, meta).await?;
        push_write(remote, at, &start, lock_ref, commit).await
    }
}

/// What a write attempt writes.
struct Job<'a> {
    path: &'a str,
    /// The lock the write is made under, if any.
    lock: Option<&'a StateName>,
    change: &'a Change,
    plan: &'a WritePlan,
}

/// Where a write attempt starts.
struct Start {
    tip: Option<ObjectId>,
    /// The lock commit the attempt rests on, when it writes under a lock that exists.
    lock_tip: Option<ObjectId>,
    mode: WriteMode,
    /// The advertisement it came from; `None` at the floor.
    advert: Option<Advert>,
}

/// A first attempt at the floor: on the tip this process last saw and, under a lock, the lock
/// commit it made, when the remote pushes atomically (without `atomic` the lock is only checked
/// as of an advertisement, so a write under a lock takes a fresh one). `None`: advertise.
fn floor_start(remote: &Remote, lock_ref: Option<&String>) -> Result<Option<Start>, Error> {
    let Some(caps) = remote.floor_caps() else {
        return Ok(None);
    };
    let Some(tip) = remote.cached_tip()? else {
        return Ok(None);
    };
    let mode = WriteMode::of(&caps);
    let lock_tip = match lock_ref {
        None => None,
        Some(_) if mode != WriteMode::Atomic => return Ok(None),
        Some(lock_ref) => match remote.made_lock(lock_ref) {
            Some(commit) => Some(commit),
            None => return Ok(None),
        },
    };
    Ok(Some(Start {
        tip: Some(tip),
        lock_tip,
        mode,
        advert: None,
    }))
}

/// Push `commit` with compare-and-swap on the attempt's tip, atomically with the unchanged lock
/// ref when the remote allows; at the floor, a remote that wants an advertisement first makes
/// the attempt lost (the next one advertises).
async fn push_write(
    remote: &Remote,
    at: &Location,
    start: &Start,
    lock_ref: Option<String>,
    commit: NewCommit,
) -> Result<Attempt, Error> {
    let mut commands = vec![Command {
        old: start.tip.unwrap_or_else(null),
        new: commit.id,
        name: at.branch.full_ref(),
    }];
    if let (Some(lock_tip), Some(lock_ref), WriteMode::Atomic) =
        (start.lock_tip, lock_ref, start.mode)
    {
        // The plan accepted the lock as it is: the write lands only if it still is.
        commands.push(Command {
            old: lock_tip,
            new: lock_tip,
            name: lock_ref,
        });
    }
    let report = if start.advert.is_none() {
        match remote
            .push_at_floor(commands.clone(), commit.objects)
            .await?
        {
            Some(report) if report.all_ok(&commands) => report,
            Some(report) => return Ok(Attempt::MissedFloor(report)),
            None => return Ok(Attempt::MissedFloor(PushReport::default())),
        }
    } else {
        remote.push(commands.clone(), commit.objects).await?
    };
    if report.all_ok(&commands) {
        remote.saw_tip(commit.id);
        return Ok(Attempt::Done(Written::Committed {
            version: commit.id.to_string(),
        }));
    }
    Ok(Attempt::Lost(report))
}

/// How long to wait before write attempt `attempt` (2, 3, …) after one that took `last`: full
/// jitter over a window that starts at half an attempt's duration and doubles with each loss.
/// Scaling with the attempt (rather than a fixed 10 ms base) spreads contenders by about the time
/// a winner needs from advertisement to push, whatever the remote's round trip (BENCHMARKS.md
/// compares it with the fixed 10 ms base it replaced).
pub(super) fn backoff(attempt: u32, last: Duration) -> Duration {
    let base = (last / 2).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let window = base.saturating_mul(1 << attempt.saturating_sub(2).min(5));
    let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(rand::random_range(0..millis))
}

/// How one write attempt ended.
enum Attempt {
    Done(Written),
    /// The remote refused the push: another writer moved the branch or the lock changed.
    Lost(PushReport),
    /// The remote refused a push at the floor: the tip or lock this process knew had changed
    /// (or the remote wants an advertisement first).
    MissedFloor(PushReport),
}
