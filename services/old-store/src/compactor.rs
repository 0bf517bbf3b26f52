//! Background compaction of blocks.
//!
//! Appends are cheap (each render compressed against the one before it); the
//! few-percent ratio comes from rewriting a block as one long-window frame. The
//! compactor does that off the request path, for three reasons:
//! - *growth*: the open block's chain reached its compacted size (at 4, 8,
//!   16… revisions), rewritten at a fast level so reads stay short;
//! - *seal*: a block is full and will never change again, rewritten at the seal level;
//! - *settle*: a title has had no archive writes for the settle period, so its
//!   open block is rewritten at the seal level too.
//!
//! The queue lives in memory and is the fast path. What must still be
//! compacted is also kept in the store ([`crate::debt`]): a sweep of it refills
//! the queue at start, periodically and on request, so a restart (clean or
//! `kill -9`) loses no compaction. On shutdown a running compaction is
//! cancelled within about a second; its debt stays in the store.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::archive::{Archive, BlockKey, CompactionOutcome};
use crate::debt::{self, SweepReport};

/// The longest pause after failed compactions.
const MAX_FAILURE_PAUSE: Duration = Duration::from_secs(60);
/// The most blocks one sweep puts in the queue; a sweep that stops there is
/// followed by another as soon as the queue has drained.
const MAX_SWEEP_BLOCKS: u64 = 10_000;
/// How often a truncated sweep checks whether the queue has drained.
const DRAIN_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Default, Clone, Copy)]
struct Job {
    /// A compaction to run as soon as possible, at this level.
    now: Option<i32>,
    /// A compaction at this level once the block has been quiet until the instant.
    settle: Option<(i32, Instant)>,
}

/// The queue of blocks to compact. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Compactor {
    /// In key order, so a title's blocks are compacted oldest first: a block
    /// chooses its base only after the block before it has chosen.
    jobs: Arc<Mutex<BTreeMap<BlockKey, Job>>>,
    wake: Arc<Notify>,
    settle: Duration,
    last_sweep: Arc<Mutex<Option<SweepReport>>>,
    /// Whether a compaction is running (set as its job leaves the queue).
    compacting: Arc<AtomicBool>,
}

impl Compactor {
    pub fn new(settle: Duration) -> Self {
        Compactor { jobs: Arc::default(), wake: Arc::new(Notify::new()), settle, last_sweep: Arc::default(), compacting: Arc::default() }
    }

    fn update(&self, key: BlockKey, f: impl FnOnce(&mut Job)) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        f(jobs.entry(key).or_default());
        metrics::gauge!("old_store_compactions_pending").set(jobs.len() as f64);
        drop(jobs);
        self.wake.notify_one();
    }

    pub fn schedule_now(&self, key: BlockKey, level: i32) {
        self.update(key, |job| job.now = Some(job.now.map_or(level, |l| l.max(level))));
    }

    /// (Re)starts the block's quiet period.
    pub fn schedule_settle(&self, key: BlockKey, level: i32) {
        let due = Instant::now() + self.settle;
        self.update(key, |job| job.settle = Some((level, due)));
    }

    /// Puts a block the debt table names in the queue, due at `due`, unless
    /// it is there already (then its own schedule is the fresher one).
    /// Whether it was added.
    pub fn schedule_owed(&self, key: BlockKey, level: i32, due: Instant) -> bool {
        let mut added = false;
        self.update(key, |job| {
            if job.now.is_none() && job.settle.is_none() {
                job.settle = Some((level, due));
                added = true;
            }
        });
        added
    }

    /// Whether a compaction is running now.
    pub fn compacting(&self) -> bool {
        self.compacting.load(Ordering::SeqCst)
    }

    /// The report of the last finished sweep.
    pub fn last_sweep(&self) -> Option<SweepReport> {
        self.last_sweep.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sweeps the debt table now, and records the report.
    pub async fn sweep(&self, archive: &Archive) -> Result<SweepReport, revstore_storage::StoreError> {
        let report = debt::sweep(archive.store(), self, archive.seal_level(), self.settle, MAX_SWEEP_BLOCKS).await?;
        metrics::gauge!("old_store_compaction_debt_markers").set(report.markers as f64);
        *self.last_sweep.lock().unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
        Ok(report)
    }

    /// Sweeps the debt table at start, then every `interval`, and again as
    /// soon as the queue drains when a sweep stopped at its block limit.
    pub async fn sweep_forever(self, archive: Archive, interval: Duration, stop: CancellationToken) {
        let mut failed_before = false;
        loop {
            let truncated = match self.sweep(&archive).await {
                Ok(report) => {
                    if report.blocks > 0 || failed_before {
                        tracing::info!(
                            markers = report.markers,
                            blocks = report.blocks,
                            scheduled = report.scheduled,
                            truncated = report.truncated,
                            "compaction debt swept"
                        );
                    }
                    failed_before = false;
                    report.truncated
                }
                Err(e) => {
                    if !failed_before {
                        tracing::warn!(
                            error = %e,
                            "sweeping the compaction debt failed; retrying at the next interval"
                        );
                    }
                    failed_before = true;
                    false
                }
            };
            let next_sweep = tokio::time::sleep(interval);
            tokio::pin!(next_sweep);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = &mut next_sweep => break,
                    _ = tokio::time::sleep(DRAIN_POLL), if truncated => {
                        if self.pending() == 0 { break }
                    }
                }
            }
        }
    }

    /// Blocks waiting for a compaction, quiet periods included.
    pub fn pending(&self) -> usize {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The next job that is due, removed from the queue; or when to look again.
    fn take_due(&self) -> Result<(BlockKey, i32), Option<Instant>> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let mut next_due: Option<Instant> = None;
        // The first urgent job in key order, else the first settled one.
        let mut chosen = None;
        for (key, job) in jobs.iter() {
            if let Some(level) = job.now {
                chosen = Some((key.clone(), level, true));
                break;
            }
            if let Some((level, due)) = job.settle {
                if due > now {
                    next_due = Some(next_due.map_or(due, |n| n.min(due)));
                } else if chosen.is_none() {
                    chosen = Some((key.clone(), level, false));
                }
            }
        }
        let Some((key, level, urgent)) = chosen else { return Err(next_due) };
        if let Some(job) = jobs.get_mut(&key) {
            if urgent {
                job.now = None;
            } else {
                job.settle = None;
            }
            if job.now.is_none() && job.settle.is_none() {
                jobs.remove(&key);
            }
        }
        metrics::gauge!("old_store_compactions_pending").set(jobs.len() as f64);
        // Under the queue's lock, so that no observer sees the job in neither place.
        self.compacting.store(true, Ordering::SeqCst);
        Ok((key, level))
    }

    /// Runs compactions until `stop` is cancelled.
    ///
    /// A failed compaction is retried after its settle period, and the
    /// compactor pauses before the next one, longer after each failure in a
    /// row (up to a minute): when the storage itself fails (a full disk),
    /// every block would fail alike. Such an episode is logged once when it
    /// starts and once when compactions succeed again, not once per block.
    pub async fn run(self, archive: Archive, stop: CancellationToken) {
        let mut failures_in_a_row: u32 = 0;
        loop {
            if failures_in_a_row > 0 {
                let pause = Duration::from_millis(500).saturating_mul(1 << failures_in_a_row.min(7)).min(MAX_FAILURE_PAUSE);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            let (key, level) = match self.take_due() {
                Ok(job) => job,
                Err(next) => {
                    let sleep = next.map_or(Duration::from_secs(3600), |n| n.saturating_duration_since(Instant::now()));
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = self.wake.notified() => continue,
                        _ = tokio::time::sleep(sleep) => continue,
                    }
                }
            };
            let _running = CompactingFlag(&self.compacting);
            if stop.is_cancelled() {
                return;
            }
            let started = Instant::now();
            let outcome = archive.compact(&key, level, &stop).await;
            if stop.is_cancelled() {
                // Cancelled mid-way, or finished as the stop came: the block's
                // debt markers stay until a compaction completes, so nothing is lost.
                return;
            }
            if outcome.is_ok() && failures_in_a_row > 0 {
                tracing::info!(failures = failures_in_a_row, "compactions succeed again");
                failures_in_a_row = 0;
            }
            let seconds = started.elapsed().as_secs_f64();
            metrics::histogram!("old_store_compaction_seconds").record(seconds);
            match outcome {
                Ok(CompactionOutcome::Compacted { revisions, raw_bytes, stored_bytes, base }) => {
                    metrics::counter!("old_store_compactions_total", "outcome" => "compacted").increment(1);
                    tracing::debug!(block = %key, level, revisions, raw_bytes, stored_bytes, ?base, seconds, "compacted");
                }
                Ok(CompactionOutcome::Cancelled) => return,
                Ok(CompactionOutcome::BaseUndecided) => {
                    // The block before has not chosen its base yet: compact it
                    // first, then this one again (its debt is kept meanwhile).
                    metrics::counter!("old_store_compactions_total", "outcome" => "base_undecided").increment(1);
                    if key.block > 0 {
                        self.schedule_now(BlockKey { block: key.block - 1, ..key.clone() }, level);
                    }
                    self.schedule_settle(key, level);
                }
                Ok(CompactionOutcome::NothingToDo) => {
                    metrics::counter!("old_store_compactions_total", "outcome" => "nothing_to_do").increment(1);
                }
                Ok(CompactionOutcome::LostRace) => {
                    metrics::counter!("old_store_compactions_total", "outcome" => "lost_race").increment(1);
                    self.schedule_settle(key, level);
                }
                Err(e) => {
                    metrics::counter!("old_store_compactions_total", "outcome" => "failed").increment(1);
                    let error = e.to_string();
                    if failures_in_a_row == 0 {
                        tracing::warn!(block = %key, level, error, "compaction failed; retrying with a growing pause, logged again once they succeed");
                    } else {
                        tracing::debug!(block = %key, level, error, "compaction failed again");
                    }
                    failures_in_a_row = failures_in_a_row.saturating_add(1);
                    self.schedule_settle(key, level);
                }
            }
        }
    }
}

/// Clears the compacting flag once a compaction's outcome is recorded (at the
/// end of the loop iteration that ran it).
struct CompactingFlag<'a>(&'a AtomicBool);

impl Drop for CompactingFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
