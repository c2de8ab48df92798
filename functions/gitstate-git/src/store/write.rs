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
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            if attempt > 1 {
                tokio::time::sleep(backoff(attempt, last_attempt)).await;
                if started.elapsed() > WRITE_DEADLINE {
                    break;
                }
            }
            let attempt_started = std::time::Instant::now();
            let outcome = self
                .write_attempt(&remote, at, path, lock, &change, &plan)
                .await;
            last_attempt = attempt_started.elapsed();
            match outcome {
                Ok(Attempt::Done(written)) => return Ok(written),
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
                    tracing::debug!(attempt, error = %gitstate_core::http::chain(&error), "write attempt failed, retrying");
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

    async fn write_attempt(
        &self,
        remote: &Remote,
        at: &Location,
        path: &str,
        lock: Option<&StateName>,
        change: &Change,
        plan: &WritePlan,
    ) -> Result<Attempt, Error> {
        let branch = at.branch.full_ref();
        let lock_ref = lock.map(|name| self.lock_ref(name));
        let advert = remote
            .refs(
                Service::ReceivePack,
                std::iter::once(branch.clone())
                    .chain(lock_ref.clone())
                    .collect(),
            )
            .await?;
        let tip = advert.tip(&branch);
        let lock_tip = match (&lock_ref, lock) {
            (Some(lock_ref), Some(name)) => advert.tip(lock_ref).map(|t| (t, lock_ref, name)),
            _ => None,
        };
        remote
            .ensure(tip.into_iter().chain(lock_tip.map(|l| l.0)).collect())
            .await?;
        // The tree rule, against the very tree the commit is built on: a concurrent writer that
        // slips a clashing path in makes the push below lose the compare-and-swap, and the next
        // attempt sees it here.
        if let Some(tip) = tip {
            let (cache, owned) = (remote.cache.clone(), path.to_owned());
            if let Some(clash) = blocking(move || cache.path_clash(tip, &owned)).await? {
                return Ok(Attempt::Done(Written::Refused(Refusal::Clash(clash))));
            }
        }
        let held = match lock_tip {
            Some((lock_tip, _, name)) => Some(self.held(remote, lock_tip, name).await?),
            None => None,
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
            Err(refusal) => return Ok(Attempt::Done(Written::Refused(refusal))),
        };
        let content = match change {
            Change::Put(bytes) if stored.as_deref() == Some(bytes.as_ref()) => {
                return Ok(Attempt::Done(Written::Unchanged));
            }
            Change::Put(bytes) => Some(bytes.clone()),
            Change::Delete => None,
        };
        // A new branch git cannot create next to an existing one (`env/a/b` while `env/a`
        // exists): refuse it now rather than push. A clashing branch created by someone else
        // after this look makes the push fail, and the next attempt refuses it here.
        if tip.is_none()
            && let Some(clash) = self.branch_clash(remote, &advert, &at.branch).await?
        {
            return Ok(Attempt::Done(Written::Refused(Refusal::Clash(clash))));
        }
        let commit = remote.commit(tip, path.to_owned(), content, meta).await?;
        let mut commands = vec![Command {
            old: tip.unwrap_or_else(null),
            new: commit.id,
            name: branch,
        }];
        if let (Some((lock_tip, lock_ref, _)), WriteMode::Atomic) =
            (lock_tip, WriteMode::of(&advert))
        {
            // The plan accepted the lock as it is: the write lands only if it still is.
            commands.push(Command {
                old: lock_tip,
                new: lock_tip,
                name: lock_ref.clone(),
            });
        }
        let report = remote.push(commands.clone(), commit.objects).await?;
        if report.all_ok(&commands) {
            remote.saw_tip(commit.id);
            return Ok(Attempt::Done(Written::Committed {
                version: commit.id.to_string(),
            }));
        }
        Ok(Attempt::Lost(report))
    }
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
}
