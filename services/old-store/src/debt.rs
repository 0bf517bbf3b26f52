//! Compaction debt, kept in the store so that no restart forgets it.
//!
//! Every appended render leaves a *marker* in `archive_debt_by_hour`,
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
//!
//! # Shards and hours
//! Markers are spread over [`DEBT_SHARDS`] shards by title, and each shard's
//! over partitions of one hour, by the time of the append. A discharge is a
//! range deletion in the partitions of the block's markers; a sweep reads a
//! shard's hours from the first that may still hold debt (the shard's row in
//! `archive_debt_shards`) to now, and moves that start on past the hours it
//! found empty, once no late append (a replica whose clock is behind, a write
//! in flight) can land there any more. So no read steps over the deletions
//! of the hours behind it; had every shard been one partition, each sweep
//! would read every deletion of the last `gc_grace_seconds` (ten days of
//! compactions), and past 100,000 of them Cassandra aborts the read.
//!
//! Which hours hold a block's markers, this process knows for the appends it
//! made and the markers its sweeps read (the [`DebtBook`]); a discharge
//! covers those and the current and previous hour. A marker in another hour
//! (another replica's append) is left, and found by the next sweep, which
//! notes its hour and schedules the block again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use revstore_keys::time::{millis, rfc3339_millis};
use revstore_keys::{composite_key_bytes, murmur3_token};
use revstore_schema::tables::meta::SCHEMA_META;
use revstore_schema::tables::old_store::{ARCHIVE_DEBT, ARCHIVE_DEBT_SHARDS, col};
use revstore_storage::{Delete, DeleteTarget, ReadQuery, Slice, Store, StoreError, StoreResult, Upsert, Value};

use crate::block::BlockKey;
use crate::queue::CompactionQueue;

/// Shards of the debt table, each a partition per hour.
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
/// How far behind the sweeper's clock an append may still land: the clock
/// skew between replicas and a write in flight, with room to spare. A sweep
/// does not move a shard's start past now less this.
const LATE_APPEND_MARGIN: Duration = Duration::from_secs(600);

const HOUR_MILLIS: i64 = 3_600_000;

/// The hour (since the Unix epoch) whose partition holds a marker appended at `at_millis`.
pub fn hour_of(at_millis: i64) -> i64 {
    at_millis.div_euclid(HOUR_MILLIS)
}

/// The debt shard of a title.
pub fn debt_shard(domain: &str, title: &str) -> i64 {
    murmur3_token(&composite_key_bytes(&[domain.as_bytes(), title.as_bytes()])).rem_euclid(DEBT_SHARDS)
}

fn block_prefix(key: &BlockKey) -> [Value; 3] {
    [Value::from(key.domain.as_str()), Value::from(key.title.as_str()), Value::from(key.block)]
}

fn partition(key: &BlockKey, hour: i64) -> [Value; 2] {
    [Value::from(debt_shard(&key.domain, &key.title)), Value::from(hour)]
}

/// The marker a render appended at `slot` of `key` at `now` (the store's
/// clock) leaves until it is compacted.
pub fn marker(key: &BlockKey, slot: i64, now: SystemTime) -> Upsert {
    let [d, t, b] = block_prefix(key);
    Upsert::new(&ARCHIVE_DEBT, partition(key, hour_of(millis(now))).into_iter().chain([d, t, b, Value::from(slot)]))
        .set(col::APPENDED_AT, Value::Timestamp(millis(now)))
}

/// Which hours' partitions hold each owed block's markers, as far as this
/// process knows (its own appends, and what its sweeps read). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct DebtBook(Arc<Mutex<HashMap<BlockKey, BTreeSet<i64>>>>);

impl DebtBook {
    /// The marker of an append (see [`marker`]), its hour noted.
    pub fn owe(&self, key: &BlockKey, slot: i64, now: SystemTime) -> Upsert {
        self.note(key, hour_of(millis(now)));
        marker(key, slot, now)
    }

    fn note(&self, key: &BlockKey, hour: i64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).entry(key.clone()).or_default().insert(hour);
    }

    fn hours(&self, key: &BlockKey) -> BTreeSet<i64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned().unwrap_or_default()
    }

    /// Forgets `hours` of `key` (discharged), keeping any noted since.
    fn discharged(&self, key: &BlockKey, hours: &BTreeSet<i64>) {
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(noted) = book.get_mut(key) {
            noted.retain(|h| !hours.contains(h));
            if noted.is_empty() {
                book.remove(key);
            }
        }
    }
}

/// Deletes the markers of a block that a seal-level compaction discharged:
/// every slot below `committed`, the title's slot count the compaction read
/// (those are in the new frame, or were never this block's), in every hour
/// the book names and the current and previous one. Markers at higher slots
/// belong to appends still in flight and stay, unless they are older than
/// [`ABANDONED_AFTER`].
pub async fn discharge(store: &Store, book: &DebtBook, key: &BlockKey, committed: i64) -> StoreResult<()> {
    let now = millis(store.now());
    let mut hours = book.hours(key);
    hours.extend([hour_of(now) - 1, hour_of(now)]);
    let abandoned_before = now - ABANDONED_AFTER.as_millis() as i64;
    let mut still_owed = BTreeSet::new();
    for &hour in &hours {
        let at = partition(key, hour);
        store
            .write(Delete {
                table: &ARCHIVE_DEBT,
                partition: at.to_vec(),
                target: DeleteTarget::Range(Slice::prefix(block_prefix(key)).upper(Bound::Excluded(Value::from(committed)))),
                timestamp: None,
            })
            .await?;
        let left = store.read(&ReadQuery::new(&ARCHIVE_DEBT, at.clone()).slice(Slice::prefix(block_prefix(key))).limit(100)).await?;
        for row in left.rows {
            let (Some(slot), Some(appended_at)) = (row.bigint(col::SLOT), row.timestamp(col::APPENDED_AT)) else { continue };
            if appended_at < abandoned_before {
                let mut clustering = block_prefix(key).to_vec();
                clustering.push(Value::from(slot));
                store
                    .write(Delete { table: &ARCHIVE_DEBT, partition: at.to_vec(), target: DeleteTarget::Row(clustering), timestamp: None })
                    .await?;
            } else {
                still_owed.insert(hour);
            }
        }
    }
    hours.retain(|h| !still_owed.contains(h));
    book.discharged(key, &hours);
    for hour in still_owed {
        book.note(key, hour);
    }
    Ok(())
}

/// What a sweep found.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct SweepReport {
    /// Partitions read (a shard's hour each).
    pub partitions: u64,
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
    book: DebtBook,
    /// The level of the compaction that discharges a marker.
    seal_level: i32,
    last: Arc<Mutex<Option<SweepReport>>>,
}

impl DebtSweeper {
    pub fn new(store: Store, queue: CompactionQueue, book: DebtBook, seal_level: i32) -> Self {
        DebtSweeper { store, queue, book, seal_level, last: Arc::default() }
    }

    /// The queue the sweep fills.
    pub fn queue(&self) -> &CompactionQueue {
        &self.queue
    }

    /// Sweeps the debt table now, and records the report.
    pub async fn sweep(&self) -> StoreResult<SweepReport> {
        let report = sweep(&self.store, &self.queue, &self.book, self.seal_level, MAX_SWEEP_BLOCKS).await?;
        metrics::gauge!("old_store_compaction_debt_markers", "service" => crate::SERVICE).set(report.markers as f64);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
        Ok(report)
    }

    /// The report of the last finished sweep.
    pub fn last_sweep(&self) -> Option<SweepReport> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Reads the markers of every shard, each from the first hour that may still
/// hold debt, and puts each block they name in the queue at `level`, due a
/// settle period after its latest append (at once for debt older than that).
/// Stops after `max_blocks` blocks.
async fn sweep(store: &Store, queue: &CompactionQueue, book: &DebtBook, level: i32, max_blocks: u64) -> StoreResult<SweepReport> {
    let settle = queue.settle();
    let mut report = SweepReport::default();
    let mut oldest: Option<i64> = None;
    // Replicas sweep the same markers; starting each at its own shard spreads
    // who reaches a block first (the compactions are race-safe either way).
    let first = (rand::random::<u64>() % DEBT_SHARDS as u64) as i64;
    'shards: for i in 0..DEBT_SHARDS {
        let shard = (first + i) % DEBT_SHARDS;
        let swept_from = swept_from(store, shard).await?;
        let now = millis(store.now());
        // Hours before this one are empty once a sweep found them so.
        let settled = hour_of(now - LATE_APPEND_MARGIN.as_millis() as i64);
        let mut first_owing: Option<i64> = None;
        for hour in swept_from..=hour_of(now) {
            report.partitions += 1;
            let mut cursor = None;
            loop {
                let page = store
                    .read(
                        &ReadQuery::new(&ARCHIVE_DEBT, [Value::from(shard), Value::from(hour)])
                            .limit(SWEEP_PAGE)
                            .page_token(cursor.clone()),
                    )
                    .await?;
                // The latest append per block: a block still being written to waits.
                let mut latest: BTreeMap<(String, String, i64), i64> = BTreeMap::new();
                for row in &page.rows {
                    let (Some(domain), Some(title), Some(block), Some(at)) =
                        (row.text(col::DOMAIN), row.text(col::TITLE), row.bigint(col::BLOCK), row.timestamp(col::APPENDED_AT))
                    else {
                        continue;
                    };
                    report.markers += 1;
                    first_owing.get_or_insert(hour);
                    oldest = Some(oldest.map_or(at, |o| o.min(at)));
                    let entry = latest.entry((domain.to_owned(), title.to_owned(), block)).or_insert(at);
                    *entry = (*entry).max(at);
                }
                for ((domain, title, block), at) in latest {
                    report.blocks += 1;
                    let key = BlockKey { domain, title, block };
                    book.note(&key, hour);
                    let wait = Duration::from_millis(u64::try_from(at + settle.as_millis() as i64 - now).unwrap_or(0));
                    if queue.schedule_owed(key, level, Instant::now() + wait) {
                        report.scheduled += 1;
                    }
                    if report.blocks >= max_blocks {
                        report.truncated = true;
                        // This shard's later hours were not read: its start stays.
                        break 'shards;
                    }
                }
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        let next_from = first_owing.unwrap_or(i64::MAX).min(settled);
        if next_from > swept_from {
            store.write(Upsert::new(&ARCHIVE_DEBT_SHARDS, [Value::from(shard)]).set(col::SWEPT_FROM, next_from)).await?;
        }
    }
    report.oldest_marker = oldest.map(rfc3339_millis);
    report.finished_at = rfc3339_millis(millis(store.now()));
    Ok(report)
}

/// The first hour of `shard` that may still hold debt: where the last sweep
/// left it, or, before any sweep, the hour old-store's tables were last
/// migrated (no marker is older than its table) less the margin.
async fn swept_from(store: &Store, shard: i64) -> StoreResult<i64> {
    let stored = store.get(&ARCHIVE_DEBT_SHARDS, vec![Value::from(shard)], None).await?;
    if let Some(hour) = stored.and_then(|row| row.bigint(col::SWEPT_FROM)) {
        return Ok(hour);
    }
    let schema = store.get(&SCHEMA_META, vec![Value::from(crate::SERVICE)], None).await?;
    let applied_at = schema
        .and_then(|row| row.timestamp("applied_at"))
        .ok_or_else(|| StoreError::Internal("no schema recorded for old-store: run revstore-migrate".into()))?;
    Ok(hour_of(applied_at - LATE_APPEND_MARGIN.as_millis() as i64))
}
