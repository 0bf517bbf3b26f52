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

use revstore_service::BoxError;
use revstore_service::worker::{Worker, WorkerState};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::archive::{Archive, BlockKey, CompactionOutcome};
use crate::debt::{self, SweepReport};

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
        metrics::gauge!("old_store_compactions_pending", "service" => crate::SERVICE).set(jobs.len() as f64);
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
        metrics::gauge!("old_store_compaction_debt_markers", "service" => crate::SERVICE).set(report.markers as f64);
        *self.last_sweep.lock().unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
        Ok(report)
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
        metrics::gauge!("old_store_compactions_pending", "service" => crate::SERVICE).set(jobs.len() as f64);
        // Under the queue's lock, so that no observer sees the job in neither place.
        self.compacting.store(true, Ordering::SeqCst);
        Ok((key, level))
    }
}

/// Runs the compactor's queue, one compaction per step, as a background worker.
///
/// A failed compaction is retried after its settle period, and the runner
/// pauses before the next step, longer after each failure in a row: when the
/// storage itself fails (a full disk), every block would fail alike.
#[derive(Debug)]
pub struct Compaction {
    archive: Archive,
    /// When the earliest settling job is due (when the last step found none due).
    next_due: Option<Instant>,
}

impl Compaction {
    pub fn new(archive: Archive) -> Self {
        Compaction { archive, next_due: None }
    }
}

impl Worker for Compaction {
    fn name(&self) -> &'static str {
        "compactor"
    }

    async fn work(&mut self, stop: &CancellationToken) -> Result<WorkerState, BoxError> {
        let queue = self.archive.compactor().clone();
        let (key, level) = match queue.take_due() {
            Ok(job) => job,
            Err(next_due) => {
                self.next_due = next_due;
                return Ok(WorkerState::Idle);
            }
        };
        let _running = CompactingFlag(&queue.compacting);
        let started = Instant::now();
        let outcome = self.archive.compact(&key, level, stop).await;
        if stop.is_cancelled() {
            // Cancelled mid-way, or finished as the stop came: the block's
            // debt markers stay until a compaction completes, so nothing is lost.
            return Ok(WorkerState::Done);
        }
        let seconds = started.elapsed().as_secs_f64();
        metrics::histogram!("old_store_compaction_seconds", "service" => crate::SERVICE).record(seconds);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                metrics::counter!("old_store_compactions_total", "service" => crate::SERVICE, "outcome" => "failed").increment(1);
                queue.schedule_settle(key.clone(), level);
                return Err(format!("compacting block {key} at level {level}: {e}").into());
            }
        };
        match outcome {
            CompactionOutcome::Compacted { revisions, raw_bytes, stored_bytes, base } => {
                metrics::counter!("old_store_compactions_total", "service" => crate::SERVICE, "outcome" => "compacted").increment(1);
                tracing::debug!(service = "old-store", block = %key, level, revisions, raw_bytes, stored_bytes, ?base, seconds, "compacted");
            }
            CompactionOutcome::Cancelled => return Ok(WorkerState::Done),
            CompactionOutcome::BaseUndecided => {
                // The block before has not chosen its base yet: compact it
                // first, then this one again (its debt is kept meanwhile).
                metrics::counter!("old_store_compactions_total", "service" => crate::SERVICE, "outcome" => "base_undecided").increment(1);
                if key.block > 0 {
                    queue.schedule_now(BlockKey { block: key.block - 1, ..key.clone() }, level);
                }
                queue.schedule_settle(key, level);
            }
            CompactionOutcome::NothingToDo => {
                metrics::counter!("old_store_compactions_total", "service" => crate::SERVICE, "outcome" => "nothing_to_do").increment(1);
            }
            CompactionOutcome::LostRace => {
                metrics::counter!("old_store_compactions_total", "service" => crate::SERVICE, "outcome" => "lost_race").increment(1);
                queue.schedule_settle(key, level);
            }
        }
        Ok(WorkerState::Busy)
    }

    async fn wait_for_work(&mut self) {
        let sleep = self.next_due.map_or(Duration::from_secs(3600), |n| n.saturating_duration_since(Instant::now()));
        let wake = self.archive.compactor().wake.clone();
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Sweeps the debt table at start, then every `interval`, and again as soon
/// as the queue drains when a sweep stopped at its block limit.
#[derive(Debug)]
pub struct DebtSweep {
    archive: Archive,
    interval: Duration,
    /// Whether the last sweep stopped at its block limit.
    truncated: bool,
}

impl DebtSweep {
    pub fn new(archive: Archive, interval: Duration) -> Self {
        DebtSweep { archive, interval, truncated: false }
    }
}

impl Worker for DebtSweep {
    fn name(&self) -> &'static str {
        "compaction-debt-sweep"
    }

    async fn work(&mut self, _stop: &CancellationToken) -> Result<WorkerState, BoxError> {
        let report = self.archive.compactor().sweep(&self.archive).await.map_err(|e| format!("sweeping the compaction debt: {e}"))?;
        if report.blocks > 0 {
            tracing::info!(
                service = "old-store",
                markers = report.markers,
                blocks = report.blocks,
                scheduled = report.scheduled,
                truncated = report.truncated,
                "compaction debt swept"
            );
        }
        self.truncated = report.truncated;
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) {
        let next_sweep = tokio::time::sleep(self.interval);
        tokio::pin!(next_sweep);
        loop {
            tokio::select! {
                () = &mut next_sweep => return,
                () = tokio::time::sleep(DRAIN_POLL), if self.truncated => {
                    if self.archive.compactor().pending() == 0 { return }
                }
            }
        }
    }
}

/// Clears the compacting flag once a compaction's outcome is recorded (at the
/// end of the step that ran it).
struct CompactingFlag<'a>(&'a AtomicBool);

impl Drop for CompactingFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
