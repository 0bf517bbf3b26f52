//! The background workers of compaction: one runs the queue, one sweeps the debt.
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

use std::time::{Duration, Instant};

use revstore_service::BoxError;
use revstore_service::worker::{Worker, WorkerState};
use tokio_util::sync::CancellationToken;

use crate::archive::Archive;
use crate::block::{BlockKey, CompactionOutcome};
use crate::debt::DebtSweeper;

/// How often a truncated sweep checks whether the queue has drained.
const DRAIN_POLL: Duration = Duration::from_secs(1);

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
        let queue = self.archive.queue().clone();
        let (key, level, _running) = match queue.take_due() {
            Ok(job) => job,
            Err(next_due) => {
                self.next_due = next_due;
                return Ok(WorkerState::Idle);
            }
        };
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
        self.archive.queue().queued(sleep).await;
    }
}

/// Sweeps the debt table at start, then every `interval`, and again as soon
/// as the queue drains when a sweep stopped at its block limit.
#[derive(Debug)]
pub struct DebtSweep {
    sweeper: DebtSweeper,
    interval: Duration,
    /// Whether the last sweep stopped at its block limit.
    truncated: bool,
}

impl DebtSweep {
    pub fn new(sweeper: DebtSweeper, interval: Duration) -> Self {
        DebtSweep { sweeper, interval, truncated: false }
    }
}

impl Worker for DebtSweep {
    fn name(&self) -> &'static str {
        "compaction-debt-sweep"
    }

    async fn work(&mut self, _stop: &CancellationToken) -> Result<WorkerState, BoxError> {
        let report = self.sweeper.sweep().await.map_err(|e| format!("sweeping the compaction debt: {e}"))?;
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
                    if self.sweeper.queue().pending() == 0 { return }
                }
            }
        }
    }
}
