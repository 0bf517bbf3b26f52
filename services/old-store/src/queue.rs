//! The in-memory queue of blocks to compact: the fast path of compaction.
//!
//! Appends put their block here (at once when it grew or was sealed, after a
//! quiet period otherwise); the compaction worker ([`crate::workers`]) takes
//! the due ones in key order. What the queue holds is also owed in the store
//! ([`crate::debt`]), whose sweep refills it after a restart. The queue only
//! knows the block model: it neither reads the store nor compacts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::block::BlockKey;

#[derive(Debug, Default, Clone, Copy)]
struct Job {
    /// A compaction to run as soon as possible, at this level.
    now: Option<i32>,
    /// A compaction at this level once the block has been quiet until the instant.
    settle: Option<(i32, Instant)>,
}

/// The queue of blocks to compact. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CompactionQueue {
    /// In key order, so a title's blocks are compacted oldest first: a block
    /// chooses its base only after the block before it has chosen.
    jobs: Arc<Mutex<BTreeMap<BlockKey, Job>>>,
    wake: Arc<Notify>,
    settle: Duration,
    /// Whether a compaction is running (set as its job leaves the queue).
    compacting: Arc<AtomicBool>,
}

impl CompactionQueue {
    pub fn new(settle: Duration) -> Self {
        CompactionQueue { jobs: Arc::default(), wake: Arc::new(Notify::new()), settle, compacting: Arc::default() }
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

    /// How long a block must be quiet before its seal-level compaction.
    pub fn settle(&self) -> Duration {
        self.settle
    }

    /// Blocks waiting for a compaction, quiet periods included.
    pub fn pending(&self) -> usize {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The next job that is due, removed from the queue; or when to look again.
    ///
    /// The job taken counts as running until the returned guard is dropped.
    pub(crate) fn take_due(&self) -> Result<(BlockKey, i32, Running<'_>), Option<Instant>> {
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
        Ok((key, level, Running(&self.compacting)))
    }

    /// Waits until a job is queued (or `timeout` passes).
    pub(crate) async fn queued(&self, timeout: Duration) {
        tokio::select! {
            () = self.wake.notified() => {}
            () = tokio::time::sleep(timeout) => {}
        }
    }
}

/// A compaction taken from the queue and still running: [`CompactionQueue::compacting`]
/// says so until it is dropped (at the end of the step that ran it).
#[derive(Debug)]
pub(crate) struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
