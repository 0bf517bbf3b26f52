//! Compaction debt, kept in the store so that no restart forgets it.
//!
//! Every appended render leaves a *marker* in `archive_compaction_debt`,
//! written before its slot is taken; the seal-level compaction that covers the
//! slot deletes it. So at any moment the markers name every block that holds
//! renders not yet in a seal-level frame — whatever happened to the process
//! that appended them (a deploy, `kill -9`, an autoscaler). The in-memory queue
//! ([`crate::queue`]) stays the fast path; a *sweep* reads the markers and
//! puts the blocks they name back into it: at start, every
//! `REVSTORE_DEBT_SWEEP_SECS`, and when asked (`POST /admin/compaction/sweep`).
//!
//! Why markers rather than a sweep over every block: the markers cost one small
//! write per append and a sweep reads only what is owed, while the blocks of a
//! wiki number in the tens of millions and are almost all sealed. Why one
//! marker per slot rather than one per block: a compaction deletes exactly the
//! slots it read as committed, so a render appended while it ran keeps its
//! marker, with no reliance on clocks or write timestamps.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use revstore_keys::time::{millis, rfc3339_millis};
use revstore_keys::{composite_key_bytes, murmur3_token};
use revstore_schema::tables::old_store::{ARCHIVE_DEBT, col};
use revstore_storage::{Delete, DeleteTarget, ReadQuery, Slice, Store, StoreResult, Upsert, Value};

use crate::block::BlockKey;
use crate::queue::CompactionQueue;

/// Partitions of the debt table; a sweep reads each in turn.
pub const DEBT_SHARDS: i64 = 64;
/// The most blocks one sweep puts in the queue; a sweep that stops there is
/// followed by another as soon as the queue has drained.
const MAX_SWEEP_BLOCKS: u64 = 10_000;
/// Markers read per step of a sweep.
const SWEEP_PAGE: u32 = 1000;
/// A marker at a slot the title never committed is left by a writer that
/// failed between writing it and taking the slot; after this long no such
/// write is still in flight, and the marker is dropped.
const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// The debt partition of a title.
pub fn debt_shard(domain: &str, title: &str) -> i64 {
    murmur3_token(&composite_key_bytes(&[domain.as_bytes(), title.as_bytes()])).rem_euclid(DEBT_SHARDS)
}

fn block_prefix(key: &BlockKey) -> [Value; 3] {
    [Value::from(key.domain.as_str()), Value::from(key.title.as_str()), Value::from(key.block)]
}

/// The marker a render appended at `slot` of `key` at `now` (the store's
/// clock) leaves until it is compacted.
pub fn marker(key: &BlockKey, slot: i64, now: SystemTime) -> Upsert {
    let [d, t, b] = block_prefix(key);
    Upsert::new(&ARCHIVE_DEBT, [Value::from(debt_shard(&key.domain, &key.title)), d, t, b, Value::from(slot)])
        .set(col::APPENDED_AT, Value::Timestamp(millis(now)))
}

/// Deletes the markers of a block that a seal-level compaction discharged:
/// every slot below `committed`, the title's slot count the compaction read
/// (those are in the new frame, or were never this block's). Markers at
/// higher slots belong to appends still in flight and stay, unless they are
/// older than [`ABANDONED_AFTER`].
pub async fn discharge(store: &Store, key: &BlockKey, committed: i64) -> StoreResult<()> {
    let shard = Value::from(debt_shard(&key.domain, &key.title));
    store
        .write(Delete {
            table: &ARCHIVE_DEBT,
            partition: vec![shard.clone()],
            target: DeleteTarget::Range(Slice::prefix(block_prefix(key)).upper(Bound::Excluded(Value::from(committed)))),
            timestamp: None,
        })
        .await?;
    let left = store.read(&ReadQuery::new(&ARCHIVE_DEBT, [shard.clone()]).slice(Slice::prefix(block_prefix(key))).limit(100)).await?;
    let abandoned_before = millis(store.now()) - ABANDONED_AFTER.as_millis() as i64;
    for row in left.rows {
        let (Some(slot), Some(at)) = (row.bigint(col::SLOT), row.timestamp(col::APPENDED_AT)) else { continue };
        if at < abandoned_before {
            let mut clustering = block_prefix(key).to_vec();
            clustering.push(Value::from(slot));
            store
                .write(Delete {
                    table: &ARCHIVE_DEBT,
                    partition: vec![shard.clone()],
                    target: DeleteTarget::Row(clustering),
                    timestamp: None,
                })
                .await?;
        }
    }
    Ok(())
}

/// What a sweep found.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct SweepReport {
    /// Markers read: renders appended and not yet in a seal-level frame.
    pub markers: u64,
    /// Distinct blocks they name.
    pub blocks: u64,
    /// Of those, blocks put in the queue (the others were in it already).
    pub scheduled: u64,
    /// Whether the sweep stopped at its block limit before reading every marker.
    pub truncated: bool,
    /// When the oldest marker was written (RFC 3339), if there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_marker: Option<String>,
    /// When the sweep finished (RFC 3339).
    pub finished_at: String,
}

/// Sweeps the debt table into a compaction queue, and keeps the last report
/// (for `GET /admin/compaction`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct DebtSweeper {
    store: Store,
    queue: CompactionQueue,
    /// The level of the compaction that discharges a marker.
    seal_level: i32,
    last: Arc<Mutex<Option<SweepReport>>>,
}

impl DebtSweeper {
    pub fn new(store: Store, queue: CompactionQueue, seal_level: i32) -> Self {
        DebtSweeper { store, queue, seal_level, last: Arc::default() }
    }

    /// The queue the sweep fills.
    pub fn queue(&self) -> &CompactionQueue {
        &self.queue
    }

    /// Sweeps the debt table now, and records the report.
    pub async fn sweep(&self) -> StoreResult<SweepReport> {
        let report = sweep(&self.store, &self.queue, self.seal_level, MAX_SWEEP_BLOCKS).await?;
        metrics::gauge!("old_store_compaction_debt_markers", "service" => crate::SERVICE).set(report.markers as f64);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
        Ok(report)
    }

    /// The report of the last finished sweep.
    pub fn last_sweep(&self) -> Option<SweepReport> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Reads the markers of every shard and puts each block they name in the
/// queue at `level`, due a settle period after its latest append (at once
/// for debt older than that). Stops after `max_blocks` blocks.
async fn sweep(store: &Store, queue: &CompactionQueue, level: i32, max_blocks: u64) -> StoreResult<SweepReport> {
    let settle = queue.settle();
    let mut report = SweepReport::default();
    let mut oldest: Option<i64> = None;
    // Replicas sweep the same markers; starting each at its own shard spreads
    // who reaches a block first (the compactions are race-safe either way).
    let first = (rand::random::<u64>() % DEBT_SHARDS as u64) as i64;
    'shards: for i in 0..DEBT_SHARDS {
        let shard = (first + i) % DEBT_SHARDS;
        let mut cursor = None;
        loop {
            let page =
                store.read(&ReadQuery::new(&ARCHIVE_DEBT, [Value::from(shard)]).limit(SWEEP_PAGE).page_token(cursor.clone())).await?;
            // The latest append per block: a block still being written to waits.
            let mut latest: BTreeMap<(String, String, i64), i64> = BTreeMap::new();
            for row in &page.rows {
                let (Some(domain), Some(title), Some(block), Some(at)) =
                    (row.text(col::DOMAIN), row.text(col::TITLE), row.bigint(col::BLOCK), row.timestamp(col::APPENDED_AT))
                else {
                    continue;
                };
                report.markers += 1;
                oldest = Some(oldest.map_or(at, |o| o.min(at)));
                let entry = latest.entry((domain.to_owned(), title.to_owned(), block)).or_insert(at);
                *entry = (*entry).max(at);
            }
            let now = millis(store.now());
            for ((domain, title, block), at) in latest {
                report.blocks += 1;
                let wait = Duration::from_millis(u64::try_from(at + settle.as_millis() as i64 - now).unwrap_or(0));
                if queue.schedule_owed(BlockKey { domain, title, block }, level, Instant::now() + wait) {
                    report.scheduled += 1;
                }
                if report.blocks >= max_blocks {
                    report.truncated = true;
                    break 'shards;
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
    }
    report.oldest_marker = oldest.map(rfc3339_millis);
    report.finished_at = rfc3339_millis(millis(store.now()));
    Ok(report)
}
