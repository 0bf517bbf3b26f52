//! The archive: how a render is appended to its title's open block, how a
//! revision is found and decoded again, and how blocks are compacted.
//!
//! # Layout (seed 002, `docs/design/old-store-blocks.md`)
//! - `archive_meta` (one partition per title): a skinny row per render,
//!   `rev | tid → block, slot`, and static allocation state. A *slot* is the
//!   append position in the title's history; slots are taken one at a time by a
//!   lightweight transaction on the static `rev_count`, so replicas writing the
//!   same title never take the same one.
//! - `archive_blocks` (one partition per block): each appended render is a row
//!   at its slot, compressed against the slot before it (the `chain` codec);
//!   compaction rewrites the rows as one long-window zstd frame in the static
//!   `sealed` and drops them with a single range delete.
//!
//! # Write path
//! Read the title's state; apply the update policy; compress the render against
//! the previous slot; write the content row; then take the slot with a
//! conditional batch that also writes the metadata row. The content is written
//! first so that a committed slot always has its row; a writer that loses the
//! race leaves a row nobody points at, which readers ignore and the next
//! compaction removes. Beside the content row goes a compaction-debt marker
//! ([`crate::debt`]), so the block's compaction is owed in the store, not
//! only in this process's memory.
//!
//! # Bases
//! A compacted block may be compressed against a *base*: the first revision
//! of an earlier block that stands alone (an *anchor*). A page of 4 MB
//! revisions gets three or four to a 16 MiB block, and without a base each
//! block pays for its first revision whole; with one, a block of such a page
//! costs about what its edits do. A block's choice is made at its first
//! compaction after the block before it has chosen, and never changes: an
//! anchor stays an anchor, so decoding a block needs at most one other
//! revision, never a chain of them.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use futures_util::{Stream, TryStreamExt};
use revstore_codecs::{BlockBuilder, BlockReader, BlockSettings, CodecError, decode_chained, encode_chained};
use revstore_keys::{Domain, RevId, Tid, Title};
use revstore_schema::tables::old_store::{ARCHIVE_BLOCKS, ARCHIVE_META, ARCHIVE_SUPPRESSED, col};
use revstore_storage::{Cas, Condition, Delete, DeleteTarget, ReadQuery, Row, Slice, Store, Upsert, Value, Write};
use tokio_util::sync::CancellationToken;

use crate::compactor::Compactor;
use crate::debt;
use crate::error::ArchiveError;

/// zstd level of a render appended to an open block: fast, since every write pays it.
pub const APPEND_LEVEL: i32 = 3;
/// zstd level of the compactions that keep an open block's chain short.
pub const GROWTH_LEVEL: i32 = 12;
/// How often a writer retries after losing a slot to a concurrent writer.
const MAX_SLOT_ATTEMPTS: usize = 64;
/// The largest decoded block a reader accepts (corrupt or hostile lengths).
const MAX_DECODED: usize = 1 << 30;
/// A base and the block compressed against it must fit zstd's window together.
const MAX_BASE_SPAN: u64 = 1 << revstore_codecs::block::WINDOW_LOG_MAX;
/// `base_block` of a block that stands alone for good (an anchor).
const ANCHOR: i64 = -1;

/// What a block is compressed against (its `base_block` and `base_slot` statics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseChoice {
    /// Not chosen yet: the block's frame, if any, stands alone for now.
    Undecided,
    /// The block stands alone, for good; later blocks may use its first revision.
    Anchor,
    /// The revision at `slot`, the first of the anchor `block`.
    On { block: i64, slot: i64 },
}

impl BaseChoice {
    fn from_statics(statics: Option<&Row>) -> Self {
        match statics.and_then(|s| s.bigint(col::BASE_BLOCK)) {
            None => BaseChoice::Undecided,
            Some(ANCHOR) => BaseChoice::Anchor,
            Some(block) => match statics.and_then(|s| s.bigint(col::BASE_SLOT)) {
                Some(slot) => BaseChoice::On { block, slot },
                None => BaseChoice::Undecided,
            },
        }
    }
}

/// Which renders of a title are kept (seed 002's two update strategies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdatePolicy {
    /// The first render archived for each revision; later ones are skipped.
    FirstRenderPerRevision,
    /// At most one render per interval per title, by render time.
    OnePer(Duration),
}

impl FromStr for UpdatePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "first-render" {
            return Ok(UpdatePolicy::FirstRenderPerRevision);
        }
        let seconds = s.strip_prefix("one-per:").and_then(|n| n.parse::<u64>().ok()).filter(|&n| n > 0);
        match seconds {
            Some(n) => Ok(UpdatePolicy::OnePer(Duration::from_secs(n))),
            None => Err(format!("update policy {s:?}: expected \"first-render\" or \"one-per:<seconds>\"")),
        }
    }
}

/// When the open block of a title is sealed and a new one opened.
#[derive(Debug, Clone, Copy)]
pub struct BlockLimits {
    pub max_revisions: u64,
    /// Raw (decoded) bytes: pages whose revisions are megabytes each get few
    /// revisions per block, small pages many.
    pub max_bytes: u64,
}

/// What an archive write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveOutcome {
    Stored,
    /// This very render was already archived (the write is idempotent).
    AlreadyStored,
    Skipped(&'static str),
}

/// One partition of `archive_blocks`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub domain: String,
    pub title: String,
    pub block: i64,
}

impl BlockKey {
    /// The partition key of the block in `archive_blocks`.
    pub fn partition_values(&self) -> [Value; 3] {
        [Value::from(self.domain.as_str()), Value::from(self.title.as_str()), Value::from(self.block)]
    }
}

impl std::fmt::Display for BlockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} block {}", self.domain, self.title, self.block)
    }
}

/// One decoded render of a block.
#[derive(Debug)]
pub struct DecodedEntry {
    pub slot: i64,
    pub rev: u64,
    pub tid: Tid,
    pub content: Vec<u8>,
}

/// The decoded renders of a block, from its first slot, contiguous. Committed
/// slots never change, so a decoded prefix stays valid; it only grows.
#[derive(Debug, Default)]
pub struct DecodedBlock {
    pub entries: Vec<Arc<DecodedEntry>>,
    /// Whether the whole block (as far as it was committed) was decoded.
    pub complete: bool,
}

impl DecodedBlock {
    pub fn get(&self, slot: i64) -> Option<&Arc<DecodedEntry>> {
        let first = self.entries.first()?.slot;
        usize::try_from(slot - first).ok().and_then(|i| self.entries.get(i))
    }

    fn raw_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.content.len() as u64).sum()
    }
}

#[derive(Debug, Clone)]
struct BlockWeighter;

impl quick_cache::Weighter<BlockKey, Arc<DecodedBlock>> for BlockWeighter {
    fn weight(&self, _: &BlockKey, block: &Arc<DecodedBlock>) -> u64 {
        block.raw_bytes().max(1)
    }
}

type BlockCache = quick_cache::sync::Cache<BlockKey, Arc<DecodedBlock>, BlockWeighter>;

/// Where a render is: its metadata row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    pub rev: u64,
    pub tid: Tid,
    pub block: i64,
    pub slot: i64,
}

/// The per-title allocation state (the statics of `archive_meta`).
#[derive(Debug, Clone, Copy, Default)]
struct TitleState {
    /// Slots taken so far; `None` before the first write (the condition then is "unset").
    rev_count: Option<i64>,
    open_block: i64,
    open_block_revisions: i64,
    open_block_bytes: i64,
    last_tid: Option<Tid>,
}

impl TitleState {
    fn from_statics(statics: Option<&Row>) -> Self {
        let Some(s) = statics else { return TitleState::default() };
        TitleState {
            rev_count: s.bigint(col::REV_COUNT),
            open_block: s.bigint(col::OPEN_BLOCK).unwrap_or(0),
            open_block_revisions: s.bigint(col::OPEN_BLOCK_REVISIONS).unwrap_or(0),
            open_block_bytes: s.bigint(col::OPEN_BLOCK_BYTES).unwrap_or(0),
            last_tid: s.timeuuid(col::LAST_TID).and_then(|u| Tid::from_uuid(u).ok()),
        }
    }
}

/// The archive of one old-store process. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Archive {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    policy: UpdatePolicy,
    limits: BlockLimits,
    seal_level: i32,
    cache: BlockCache,
    compactor: Compactor,
    /// Block decodes in progress at once. Each holds its block's stored rows
    /// and decoded content (about twice the block's raw size) until done, so
    /// this bounds the working memory beside the cache; on N cores more than
    /// N decodes at once gain no throughput anyway.
    decode_slots: tokio::sync::Semaphore,
    table_log_max: Option<u32>,
}

/// How an archive is set up.
#[derive(Debug, Clone)]
pub struct ArchiveSettings {
    pub policy: UpdatePolicy,
    pub limits: BlockLimits,
    /// zstd level of a block's final compaction (sealed, or quiet for `settle`).
    pub seal_level: i32,
    /// Bytes of decoded blocks kept in memory.
    pub cache_bytes: u64,
    /// How long a title's open block must go without writes before it is
    /// compacted at the seal level.
    pub settle: Duration,
    /// Block decodes in progress at once (at least 1).
    pub max_concurrent_decodes: usize,
    /// zstd's table cap in seal-level compactions (see `BlockSettings`),
    /// from the memory budget.
    pub table_log_max: Option<u32>,
}

fn key_values(domain: &Domain, title: &Title) -> [Value; 2] {
    [Value::from(domain.as_str()), Value::from(title.as_str())]
}

fn integrity(key: &BlockKey, what: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::integrity(key, what)
}

fn tid_value(row: &Row, column: &str) -> Option<Tid> {
    row.timeuuid(column).and_then(|u| Tid::from_uuid(u).ok())
}

impl Archive {
    pub fn new(store: Store, settings: ArchiveSettings) -> Self {
        // Exported from the start, at 0, for the integrity alert.
        metrics::counter!("old_store_integrity_errors_total", "service" => crate::SERVICE).increment(0);
        let cache = BlockCache::with_weighter(
            // quick_cache sizes its shards from an estimate of the item count.
            (settings.cache_bytes / (256 * 1024)).max(16) as usize,
            settings.cache_bytes.max(1),
            BlockWeighter,
        );
        let compactor = Compactor::new(settings.settle);
        Archive {
            inner: Arc::new(Inner {
                store,
                policy: settings.policy,
                limits: settings.limits,
                seal_level: settings.seal_level,
                cache,
                compactor,
                decode_slots: tokio::sync::Semaphore::new(settings.max_concurrent_decodes.max(1)),
                table_log_max: settings.table_log_max,
            }),
        }
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn compactor(&self) -> &Compactor {
        &self.inner.compactor
    }

    pub fn seal_level(&self) -> i32 {
        self.inner.seal_level
    }

    // ---- writes ----------------------------------------------------------

    /// Archives one render (its encoded entry). Idempotent; race-free against
    /// other replicas writing the same title.
    pub async fn archive(
        &self,
        domain: &Domain,
        title: &Title,
        rev: RevId,
        tid: Tid,
        entry: Vec<u8>,
    ) -> Result<ArchiveOutcome, ArchiveError> {
        if self.is_suppressed(domain, title, rev).await? {
            return Ok(ArchiveOutcome::Skipped("the revision is suppressed"));
        }
        let entry_len = entry.len() as i64;
        let entry = Arc::new(entry);
        for attempt in 0..MAX_SLOT_ATTEMPTS {
            // The state first, the revision's rows second, in two reads: a
            // partition read need not be one snapshot of statics and rows (on
            // Cassandra they are two queries). Read in this order, any render
            // committed under the state seen is among the rows seen; one
            // committed later moves `rev_count`, and the slot's LWT fails.
            let state = TitleState::from_statics(self.title_state(domain, title).await?.as_ref());
            let rows = self
                .inner
                .store
                .read(
                    &ReadQuery::new(&ARCHIVE_META, key_values(domain, title))
                        .slice(Slice::prefix([Value::from(rev.as_i64())]))
                        .limit(64)
                        .columns([col::BLOCK, col::SLOT]),
                )
                .await?
                .rows;
            if rows.iter().any(|r| tid_value(r, col::TID) == Some(tid)) {
                return Ok(ArchiveOutcome::AlreadyStored);
            }
            match self.inner.policy {
                UpdatePolicy::FirstRenderPerRevision if !rows.is_empty() => {
                    return Ok(ArchiveOutcome::Skipped("the revision already has an archived render"));
                }
                UpdatePolicy::OnePer(interval) => {
                    if let Some(last) = state.last_tid {
                        let apart = tid.time().duration_since(last.time()).or_else(|e| Ok::<_, ()>(e.duration())).unwrap_or_default();
                        if apart < interval {
                            return Ok(ArchiveOutcome::Skipped("a render of the title was archived within the policy's interval"));
                        }
                    }
                }
                UpdatePolicy::FirstRenderPerRevision => {}
            }

            // Where the render goes: the open block, or a new one when it is full.
            let slot = state.rev_count.unwrap_or(0);
            let limits = self.inner.limits;
            let full = state.open_block_revisions as u64 >= limits.max_revisions
                || (state.open_block_revisions > 0 && (state.open_block_bytes + entry_len) as u64 > limits.max_bytes);
            let (block, revisions, bytes) = match state.rev_count {
                None => (0, 1, entry_len),
                Some(_) if full => (state.open_block + 1, 1, entry_len),
                Some(_) => (state.open_block, state.open_block_revisions + 1, state.open_block_bytes + entry_len),
            };
            let key = BlockKey { domain: domain.as_str().to_owned(), title: title.as_str().to_owned(), block };
            let previous = if revisions > 1 { Some(self.entry_at(&key, slot - 1, slot).await?) } else { None };

            let link = {
                let entry = entry.clone();
                let previous = previous.clone();
                tokio::task::spawn_blocking(move || encode_chained(previous.as_ref().map(|p| &p.content[..]), &entry, APPEND_LEVEL))
                    .await
                    .map_err(ArchiveError::internal)?
                    .map_err(|e| ArchiveError::TooLarge(e.to_string()))?
            };
            let content = Upsert::new(&ARCHIVE_BLOCKS, key.partition_values().into_iter().chain([Value::from(slot), Value::from(tid)]))
                .set(col::REV, rev.as_i64())
                .set(col::CONTENT, link);
            tokio::try_join!(self.inner.store.write(content), self.inner.store.write(debt::marker(&key, slot)))?;
            let last_tid = match state.last_tid {
                Some(last) if last.time() > tid.time() => last,
                _ => tid,
            };
            let [d, t] = key_values(domain, title);
            let cas = Cas {
                table: &ARCHIVE_META,
                partition: vec![d.clone(), t.clone()],
                clustering: None,
                condition: Condition::Equals(vec![(col::REV_COUNT, state.rev_count.map_or(Value::Null, Value::from))]),
                writes: vec![
                    Write::Upsert(
                        Upsert::new(&ARCHIVE_META, [d.clone(), t.clone()])
                            .set(col::REV_COUNT, slot + 1)
                            .set(col::OPEN_BLOCK, block)
                            .set(col::OPEN_BLOCK_REVISIONS, revisions)
                            .set(col::OPEN_BLOCK_BYTES, bytes)
                            .set(col::LAST_TID, last_tid),
                    ),
                    Write::Upsert(
                        Upsert::new(&ARCHIVE_META, [d, t, Value::from(rev.as_i64()), Value::from(tid)])
                            .set(col::BLOCK, block)
                            .set(col::SLOT, slot),
                    ),
                ],
            };
            if !self.inner.store.cas(cas).await?.applied {
                metrics::counter!("old_store_slot_conflicts_total", "service" => crate::SERVICE).increment(1);
                // Another writer took the slot: back off a little (jittered) and start over.
                let pause = Duration::from_micros(200 * (attempt as u64 + 1) + u64::from(rand_jitter()));
                tokio::time::sleep(pause).await;
                continue;
            }
            let added = Arc::new(DecodedEntry { slot, rev: rev.get(), tid, content: Arc::unwrap_or_clone(entry) });
            self.remember_append(&key, previous, added);
            self.schedule_after_append(key, state, block, revisions);
            return Ok(ArchiveOutcome::Stored);
        }
        Err(ArchiveError::Contended)
    }

    /// The title's allocation state: the statics of `archive_meta`.
    async fn title_state(&self, domain: &Domain, title: &Title) -> Result<Option<Row>, ArchiveError> {
        let statics = [col::REV_COUNT, col::OPEN_BLOCK, col::OPEN_BLOCK_REVISIONS, col::OPEN_BLOCK_BYTES, col::LAST_TID];
        Ok(self.inner.store.read(&ReadQuery::new(&ARCHIVE_META, key_values(domain, title)).limit(1).columns(statics)).await?.statics)
    }

    /// Keeps the cache's copy of the open block in step with an append.
    fn remember_append(&self, key: &BlockKey, previous: Option<Arc<DecodedEntry>>, added: Arc<DecodedEntry>) {
        let cached = self.inner.cache.get(key);
        let mut entries = match (&cached, &previous) {
            (Some(block), Some(prev)) if block.entries.last().map(|e| e.slot) == Some(prev.slot) => block.entries.clone(),
            (_, None) => Vec::new(),
            _ => return,
        };
        entries.push(added);
        self.inner.cache.insert(key.clone(), Arc::new(DecodedBlock { entries, complete: true }));
    }

    fn schedule_after_append(&self, key: BlockKey, before: TitleState, block: i64, revisions: i64) {
        let compactor = &self.inner.compactor;
        // The block the title just left is full: compact it for good.
        if before.rev_count.is_some() && block != before.open_block {
            compactor.schedule_now(BlockKey { block: before.open_block, ..key.clone() }, self.inner.seal_level);
        }
        // Keep the chain of the open block at most as long as its compacted part:
        // each render is recompressed about twice over the block's life (linear).
        if revisions >= 4 && (revisions as u64).is_power_of_two() {
            compactor.schedule_now(key.clone(), GROWTH_LEVEL);
        }
        compactor.schedule_settle(key, self.inner.seal_level);
    }

    pub async fn suppress(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<(), ArchiveError> {
        let [d, t] = key_values(domain, title);
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        self.inner
            .store
            .write(Upsert::new(&ARCHIVE_SUPPRESSED, [d, t, Value::from(rev.as_i64())]).set(col::SUPPRESSED_AT, Value::Timestamp(now)))
            .await?;
        Ok(())
    }

    pub async fn is_suppressed(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<bool, ArchiveError> {
        let [d, t] = key_values(domain, title);
        Ok(self
            .inner
            .store
            .get(&ARCHIVE_SUPPRESSED, vec![d, t, Value::from(rev.as_i64())], Some(vec![col::SUPPRESSED_AT]))
            .await?
            .is_some())
    }

    // ---- reads -----------------------------------------------------------

    /// The metadata row of a render: the given tid, or the revision's first render.
    pub async fn locate(&self, domain: &Domain, title: &Title, rev: RevId, tid: Option<Tid>) -> Result<Option<Located>, ArchiveError> {
        let mut prefix = vec![Value::from(rev.as_i64())];
        prefix.extend(tid.map(Value::from));
        let page =
            self.inner.store.read(&ReadQuery::new(&ARCHIVE_META, key_values(domain, title)).slice(Slice::prefix(prefix)).limit(1)).await?;
        Ok(page.rows.first().and_then(located))
    }

    /// The decoded entry of a located render.
    pub async fn content(&self, domain: &Domain, title: &Title, at: &Located) -> Result<Arc<DecodedEntry>, ArchiveError> {
        let key = BlockKey { domain: domain.as_str().to_owned(), title: title.as_str().to_owned(), block: at.block };
        let entry = self.entry_at(&key, at.slot, at.slot + 1).await?;
        if entry.tid != at.tid || entry.rev != at.rev {
            return Err(integrity(
                &key,
                format!("slot {} holds rev {} tid {}, metadata says rev {} tid {}", at.slot, entry.rev, entry.tid, at.rev, at.tid),
            ));
        }
        Ok(entry)
    }

    /// The entry at `slot` of a block; `committed` is a bound below which every
    /// slot is known to be taken (the caller read it from a metadata row or the
    /// title's counter).
    async fn entry_at(&self, key: &BlockKey, slot: i64, committed: i64) -> Result<Arc<DecodedEntry>, ArchiveError> {
        self.entry_in(key, slot, committed, true).await
    }

    /// [`Archive::entry_at`]; `with_base` false for a base's own block, which
    /// must stand alone (so decoding never chains further).
    async fn entry_in(&self, key: &BlockKey, slot: i64, committed: i64, with_base: bool) -> Result<Arc<DecodedEntry>, ArchiveError> {
        let cached = self.inner.cache.get(key);
        if let Some(entry) = cached.as_ref().and_then(|b| b.get(slot)) {
            metrics::counter!("old_store_block_cache_total", "service" => crate::SERVICE, "result" => "hit").increment(1);
            return Ok(entry.clone());
        }
        metrics::counter!("old_store_block_cache_total", "service" => crate::SERVICE, "result" => "miss").increment(1);
        // A second miss on a block means its reader is walking it: decode it all.
        let upto = if cached.is_some() { None } else { Some(slot) };
        let decoded = Arc::new(self.decode_block_in(key, upto, committed, with_base).await?);
        let entry = decoded.get(slot).cloned().ok_or_else(|| integrity(key, format!("slot {slot} is missing")))?;
        let keep = cached.is_none_or(|c| c.entries.len() < decoded.entries.len());
        if keep {
            self.inner.cache.insert(key.clone(), decoded);
        }
        Ok(entry)
    }

    /// Reads a block partition and decodes it: the compacted frame (only as far
    /// as needed), then the chain of appended rows after it.
    pub async fn decode_block(&self, key: &BlockKey, upto: Option<i64>, committed: i64) -> Result<DecodedBlock, ArchiveError> {
        self.decode_block_in(key, upto, committed, true).await
    }

    async fn decode_block_in(
        &self,
        key: &BlockKey,
        upto: Option<i64>,
        committed: i64,
        with_base: bool,
    ) -> Result<DecodedBlock, ArchiveError> {
        let mut permit = self.inner.decode_slots.acquire().await.map_err(ArchiveError::internal)?;
        // Rows first, statics second, in two reads: a compaction between them
        // only moves rows already read into the frame read after them. (The
        // other order could miss rows compacted in between.)
        let mut query = ReadQuery::new(&ARCHIVE_BLOCKS, key.partition_values()).columns([col::REV, col::CONTENT]);
        if let Some(upto) = upto {
            query = query.slice(Slice::all().upper(Bound::Included(Value::from(upto))));
        }
        let page = self.inner.store.read(&query).await?;
        let statics = self
            .inner
            .store
            .read(&ReadQuery::new(&ARCHIVE_BLOCKS, key.partition_values()).limit(1).columns([
                col::SEALED,
                col::COMPACTED_THROUGH,
                col::BASE_BLOCK,
                col::BASE_SLOT,
            ]))
            .await?
            .statics;
        let through = statics.as_ref().and_then(|s| s.bigint(col::COMPACTED_THROUGH));
        let sealed = statics.as_ref().and_then(|s| s.blob(col::SEALED)).map(<[u8]>::to_vec);
        let base = match BaseChoice::from_statics(statics.as_ref()) {
            BaseChoice::On { block, slot } if sealed.is_some() => {
                if !with_base {
                    return Err(integrity(key, "a base block has a base itself"));
                }
                // The base's block takes a decode slot of its own: give this one
                // back meanwhile, or a single slot would wait on itself.
                drop(permit);
                let base_key = BlockKey { block, ..key.clone() };
                let entry = Box::pin(self.entry_in(&base_key, slot, slot + 1, false)).await?;
                permit = self.inner.decode_slots.acquire().await.map_err(ArchiveError::internal)?;
                Some(entry)
            }
            _ => None,
        };

        // The rows after the compacted part, one per slot below `committed`.
        let mut by_slot: BTreeMap<i64, Vec<&Row>> = BTreeMap::new();
        for row in &page.rows {
            let Some(slot) = row.bigint(col::SLOT) else { continue };
            if through.is_none_or(|t| slot > t) && slot < committed {
                by_slot.entry(slot).or_default().push(row);
            }
        }
        // A writer that lost a slot at a block boundary leaves its row in the
        // block the winner did not choose: the winner found the block full and
        // took the slot in the next one, or the other way round. So the first
        // and last slot of a block's rows are checked against the metadata,
        // and a row nobody points at there is not this block's: left out (the
        // compaction then discharges its marker). Inside a block, a slot's
        // winner is always in it.
        let (first_slot, last_slot) = (by_slot.keys().next().copied(), by_slot.keys().next_back().copied());
        let mut chain = Vec::with_capacity(by_slot.len());
        for (slot, rows) in by_slot {
            let edge = Some(slot) == first_slot || Some(slot) == last_slot;
            let row = if edge {
                let Some(row) = self.committed_row(key, slot, &rows).await? else {
                    tracing::debug!(
                        service = crate::SERVICE,
                        block = key.block,
                        slot,
                        "a lost writer's row at the block's edge is left out"
                    );
                    continue;
                };
                row
            } else if rows.len() == 1 {
                rows[0]
            } else {
                self.committed_row(key, slot, &rows).await?.ok_or_else(|| integrity(key, format!("no committed render at slot {slot}")))?
            };
            let (Some(rev), Some(tid), Some(content)) = (row.bigint(col::REV), tid_value(row, col::TID), row.blob(col::CONTENT)) else {
                return Err(integrity(key, format!("slot {slot} row is incomplete")));
            };
            chain.push((slot, rev as u64, tid, content.to_vec()));
        }
        let key_for_errors = key.clone();
        let decoded = tokio::task::spawn_blocking(move || decode(sealed, base, through, upto, chain))
            .await
            .map_err(ArchiveError::internal)?
            .map_err(|e| integrity(&key_for_errors, e));
        drop(permit);
        decoded
    }

    /// Of the rows at one slot (writers that lost the slot leave theirs), the
    /// one the metadata points at, if any.
    async fn committed_row<'a>(&self, key: &BlockKey, slot: i64, rows: &[&'a Row]) -> Result<Option<&'a Row>, ArchiveError> {
        for row in rows {
            let (Some(rev), Some(tid)) = (row.bigint(col::REV), row.timeuuid(col::TID)) else { continue };
            let meta = self
                .inner
                .store
                .get(
                    &ARCHIVE_META,
                    vec![Value::from(key.domain.as_str()), Value::from(key.title.as_str()), Value::from(rev), Value::TimeUuid(tid)],
                    Some(vec![col::BLOCK, col::SLOT]),
                )
                .await?;
            if meta.is_some_and(|m| m.bigint(col::BLOCK) == Some(key.block) && m.bigint(col::SLOT) == Some(slot)) {
                return Ok(Some(row));
            }
        }
        Ok(None)
    }

    /// Every render of the title in revision order, streamed `page` metadata
    /// rows at a time (constant memory whatever the history's length).
    pub fn locations(
        &self,
        domain: &Domain,
        title: &Title,
        page: u32,
    ) -> impl Stream<Item = Result<Located, ArchiveError>> + Send + 'static {
        let query = ReadQuery::new(&ARCHIVE_META, key_values(domain, title)).limit(page).columns([col::BLOCK, col::SLOT]);
        self.inner.store.rows(query).try_filter_map(|row| std::future::ready(Ok(located(&row)))).map_err(ArchiveError::from)
    }

    /// The title's metadata rows in revision order, a page at a time.
    pub async fn list(
        &self,
        domain: &Domain,
        title: &Title,
        from: Option<u64>,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<(Vec<Located>, Option<String>), ArchiveError> {
        let mut query =
            ReadQuery::new(&ARCHIVE_META, key_values(domain, title)).limit(limit).page_token(cursor).columns([col::BLOCK, col::SLOT]);
        if let Some(from) = from {
            let from = i64::try_from(from).map_err(|_| revstore_storage::StoreError::invalid(format!("from {from} is not a revision")))?;
            query = query.slice(Slice::all().lower(Bound::Included(Value::from(from))));
        }
        let page = self.inner.store.read(&query).await?;
        Ok((page.rows.iter().filter_map(located).collect(), page.next))
    }

    /// The revisions of a title that are suppressed.
    pub async fn suppressed_revisions(&self, domain: &Domain, title: &Title) -> Result<Vec<u64>, ArchiveError> {
        let rows =
            self.inner.store.rows(ReadQuery::new(&ARCHIVE_SUPPRESSED, key_values(domain, title)).columns([col::SUPPRESSED_AT]).limit(1000));
        Ok(rows.try_filter_map(|r| std::future::ready(Ok(r.bigint(col::REV).map(|rev| rev as u64)))).try_collect().await?)
    }

    // ---- compaction ------------------------------------------------------

    /// Rewrites a block's committed renders as one zstd frame at `level` and
    /// drops the appended rows it now holds. Safe against concurrent appends
    /// and compactions: the rewrite is conditional on the block's previous
    /// compaction state, and only rows up to the new frame's last slot are
    /// deleted. At the seal level it also discharges the block's compaction
    /// debt. `stop` cancels the compression (the debt then stays owed).
    pub async fn compact(&self, key: &BlockKey, level: i32, stop: &CancellationToken) -> Result<CompactionOutcome, ArchiveError> {
        let title_key = [Value::from(key.domain.as_str()), Value::from(key.title.as_str())];
        let statics = self.inner.store.read(&ReadQuery::new(&ARCHIVE_META, title_key).limit(1).columns([col::REV_COUNT])).await?.statics;
        let committed = statics.and_then(|s| s.bigint(col::REV_COUNT)).unwrap_or(0);
        let statics = self
            .inner
            .store
            .read(&ReadQuery::new(&ARCHIVE_BLOCKS, key.partition_values()).limit(1).columns([
                col::COMPACTED_THROUGH,
                col::COMPACTED_LEVEL,
                col::BASE_BLOCK,
                col::BASE_SLOT,
            ]))
            .await?
            .statics;
        let old_through = statics.as_ref().and_then(|s| s.bigint(col::COMPACTED_THROUGH));
        let old_level = statics.as_ref().and_then(|s| s.bigint(col::COMPACTED_LEVEL));
        let mut base = BaseChoice::from_statics(statics.as_ref());
        let discharges = level >= self.inner.seal_level;
        // Is any committed render left outside the frame? (Rows at or below
        // `compacted_through` are leftovers of writers that lost their slot.)
        let after_frame = old_through.map_or(Bound::Unbounded, |t| Bound::Excluded(Value::from(t)));
        let next_row = self
            .inner
            .store
            .read(
                &ReadQuery::new(&ARCHIVE_BLOCKS, key.partition_values())
                    .slice(Slice::all().lower(after_frame))
                    .limit(1)
                    .columns([col::REV]),
            )
            .await?
            .rows
            .first()
            .and_then(|r| r.bigint(col::SLOT));
        let pending_rows = next_row.is_some_and(|slot| slot < committed);
        // A frame still waiting for its base choice is worth redoing once the block before has chosen.
        let undecided = base == BaseChoice::Undecided && old_through.is_some() && key.block > 0;
        let choosable = undecided && discharges && self.previous_has_chosen(key).await?;
        if !pending_rows && !choosable && old_level.is_some_and(|l| l >= i64::from(level)) {
            if undecided && discharges {
                return Ok(CompactionOutcome::BaseUndecided);
            }
            if discharges {
                if key.block == 0 && base == BaseChoice::Undecided && old_through.is_some() {
                    // A frame written before bases existed: block 0 always stands
                    // alone, so say so, and the blocks after it can choose.
                    let anchor =
                        Upsert::new(&ARCHIVE_BLOCKS, key.partition_values()).set(col::BASE_BLOCK, ANCHOR).set(col::FIRST_SLOT, 0i64);
                    self.inner.store.write(anchor).await?;
                }
                debt::discharge(&self.inner.store, key, committed).await?;
            }
            return Ok(CompactionOutcome::NothingToDo);
        }
        let decoded = self.decode_block(key, None, committed).await?;
        let Some(first) = decoded.entries.first().cloned() else {
            if discharges {
                debt::discharge(&self.inner.store, key, committed).await?;
            }
            return Ok(CompactionOutcome::NothingToDo);
        };
        let last = decoded.entries.last().map_or(first.slot, |e| e.slot);
        let raw = decoded.raw_bytes();
        if base == BaseChoice::Undecided {
            base = self.choose_base(key, &first, raw).await?;
        }
        let base_content = match base {
            BaseChoice::On { block, slot } => Some(self.entry_in(&BlockKey { block, ..key.clone() }, slot, slot + 1, false).await?),
            _ => None,
        };
        let decoded = Arc::new(decoded);
        let cancel = Arc::new(AtomicBool::new(false));
        let table_log_max = self.inner.table_log_max;
        let compression = {
            let (decoded, cancel) = (decoded.clone(), cancel.clone());
            tokio::task::spawn_blocking(move || -> Result<Vec<u8>, CodecError> {
                let settings = BlockSettings { level, table_log_max, ..BlockSettings::default() };
                let mut builder = BlockBuilder::with_capacity(settings, decoded.entries.len(), raw as usize);
                for e in &decoded.entries {
                    builder.push(e.rev, *e.tid.uuid().as_bytes(), &e.content)?;
                }
                builder.finish_against(base_content.as_ref().map(|b| &b.content[..]), &cancel)
            })
        };
        // Cancelling sets the flag and still waits for the thread: it stops at
        // its next chunk, and no compression outlives the runtime.
        let frame = tokio::select! {
            done = compression => done,
            () = stop.cancelled() => {
                cancel.store(true, Ordering::Relaxed);
                return Ok(CompactionOutcome::Cancelled);
            }
        };
        let frame = match frame.map_err(ArchiveError::internal)? {
            Ok(frame) => frame,
            Err(CodecError::Cancelled) => return Ok(CompactionOutcome::Cancelled),
            Err(e) => return Err(integrity(key, e)),
        };
        let stored = frame.len() as u64;
        let mut statics = Upsert::new(&ARCHIVE_BLOCKS, key.partition_values())
            .set(col::SEALED, frame)
            .set(col::COMPACTED_THROUGH, last)
            .set(col::COMPACTED_LEVEL, i64::from(level))
            .set(col::FIRST_SLOT, first.slot);
        statics = match base {
            BaseChoice::Undecided => statics,
            BaseChoice::Anchor => statics.set(col::BASE_BLOCK, ANCHOR),
            BaseChoice::On { block, slot } => statics.set(col::BASE_BLOCK, block).set(col::BASE_SLOT, slot),
        };
        let cas = Cas {
            table: &ARCHIVE_BLOCKS,
            partition: key.partition_values().to_vec(),
            clustering: None,
            condition: Condition::Equals(vec![(col::COMPACTED_THROUGH, old_through.map_or(Value::Null, Value::from))]),
            writes: vec![
                Write::Upsert(statics),
                Write::Delete(Delete {
                    table: &ARCHIVE_BLOCKS,
                    partition: key.partition_values().to_vec(),
                    target: DeleteTarget::Range(Slice::all().upper(Bound::Included(Value::from(last)))),
                    timestamp: None,
                }),
            ],
        };
        if !self.inner.store.cas(cas).await?.applied {
            return Ok(CompactionOutcome::LostRace);
        }
        if self.inner.cache.get(key).is_none_or(|c| c.entries.len() <= decoded.entries.len()) {
            self.inner.cache.insert(key.clone(), decoded.clone());
        }
        if discharges && base == BaseChoice::Undecided && key.block > 0 {
            return Ok(CompactionOutcome::BaseUndecided);
        }
        if discharges {
            debt::discharge(&self.inner.store, key, committed).await?;
        }
        Ok(CompactionOutcome::Compacted { revisions: decoded.entries.len(), raw_bytes: raw, stored_bytes: stored, base })
    }

    /// The base choice of the block before `key`.
    async fn previous_choice(&self, key: &BlockKey) -> Result<(BaseChoice, Option<i64>), ArchiveError> {
        let previous = BlockKey { block: key.block - 1, ..key.clone() };
        let statics = self
            .inner
            .store
            .read(&ReadQuery::new(&ARCHIVE_BLOCKS, previous.partition_values()).limit(1).columns([
                col::BASE_BLOCK,
                col::BASE_SLOT,
                col::FIRST_SLOT,
            ]))
            .await?
            .statics;
        Ok((BaseChoice::from_statics(statics.as_ref()), statics.as_ref().and_then(|s| s.bigint(col::FIRST_SLOT))))
    }

    async fn previous_has_chosen(&self, key: &BlockKey) -> Result<bool, ArchiveError> {
        Ok(self.previous_choice(key).await?.0 != BaseChoice::Undecided)
    }

    /// Chooses what a block is compressed against, once the block before it has
    /// chosen: that block's base, or that block itself if it is an anchor. The
    /// candidate is kept if the block's first revision compressed against it
    /// (at the append level: a quick test) takes less than half of what it
    /// takes alone; otherwise the page has drifted from it, and this block
    /// becomes an anchor for the blocks after it.
    async fn choose_base(&self, key: &BlockKey, first: &Arc<DecodedEntry>, raw: u64) -> Result<BaseChoice, ArchiveError> {
        if key.block == 0 {
            return Ok(BaseChoice::Anchor);
        }
        let candidate = match self.previous_choice(key).await? {
            (BaseChoice::Undecided, _) | (BaseChoice::Anchor, None) => return Ok(BaseChoice::Undecided),
            (BaseChoice::Anchor, Some(slot)) => BaseChoice::On { block: key.block - 1, slot },
            (on, _) => on,
        };
        let BaseChoice::On { block, slot } = candidate else { return Ok(BaseChoice::Undecided) };
        let base = match self.entry_in(&BlockKey { block, ..key.clone() }, slot, slot + 1, false).await {
            Ok(base) => base,
            Err(e) => {
                // An unreadable candidate (already logged as an integrity error) is no base.
                tracing::warn!(service = "old-store", block = %key, base_block = block, error = %e, "base candidate unreadable; the block stands alone");
                return Ok(BaseChoice::Anchor);
            }
        };
        if base.content.len() as u64 + raw > MAX_BASE_SPAN {
            return Ok(BaseChoice::Anchor);
        }
        let first = first.clone();
        let sizes = tokio::task::spawn_blocking(move || -> Result<(usize, usize), CodecError> {
            let against = encode_chained(Some(&base.content), &first.content, APPEND_LEVEL)?.len();
            let alone = encode_chained(None, &first.content, APPEND_LEVEL)?.len();
            Ok((against, alone))
        })
        .await
        .map_err(ArchiveError::internal)?
        .map_err(|e| integrity(key, e))?;
        Ok(if sizes.0 * 2 < sizes.1 { candidate } else { BaseChoice::Anchor })
    }
}

/// What a compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionOutcome {
    Compacted {
        revisions: usize,
        raw_bytes: u64,
        stored_bytes: u64,
        base: BaseChoice,
    },
    NothingToDo,
    /// Stopped by shutdown before it was stored.
    Cancelled,
    /// At the seal level, the block could not choose its base because the
    /// block before it has not chosen yet; its debt is kept (whatever was
    /// compacted meanwhile is stored).
    BaseUndecided,
    /// Another replica compacted the block first.
    LostRace,
}

fn located(row: &Row) -> Option<Located> {
    Some(Located {
        rev: row.bigint(col::REV)? as u64,
        tid: tid_value(row, col::TID)?,
        block: row.bigint(col::BLOCK)?,
        slot: row.bigint(col::SLOT)?,
    })
}

/// The CPU part of reading a block: the frame up to `upto` (or all of it),
/// then each chained row against the content before it.
fn decode(
    sealed: Option<Vec<u8>>,
    base: Option<Arc<DecodedEntry>>,
    through: Option<i64>,
    upto: Option<i64>,
    chain: Vec<(i64, u64, Tid, Vec<u8>)>,
) -> Result<DecodedBlock, String> {
    let settings = BlockSettings { max_decoded: MAX_DECODED, ..BlockSettings::default() };
    let mut entries: Vec<Arc<DecodedEntry>> = Vec::new();
    if let (Some(frame), Some(through)) = (sealed.as_deref(), through) {
        let mut reader = BlockReader::parse(frame, &settings).map_err(|e| e.to_string())?;
        if let Some(base) = &base {
            reader = reader.with_base(&base.content).map_err(|e| format!("base at slot {}: {e}", base.slot))?;
        }
        let count = reader.entries().len();
        let first = through + 1 - count as i64;
        let wanted = match upto {
            Some(upto) if upto < through => usize::try_from(upto - first + 1).map_err(|_| format!("slot {upto} precedes the block"))?,
            _ => count,
        };
        for (i, (e, content)) in reader.read_first(wanted).map_err(|e| e.to_string())?.into_iter().enumerate() {
            let tid = Tid::from_uuid(uuid_from(e.tid)).map_err(|e| e.to_string())?;
            entries.push(Arc::new(DecodedEntry { slot: first + i as i64, rev: e.rev, tid, content }));
        }
    }
    for (slot, rev, tid, link) in chain {
        if let Some(last) = entries.last()
            && slot != last.slot + 1
        {
            return Err(format!("slot {} is missing", last.slot + 1));
        }
        let content = decode_chained(entries.last().map(|e| &e.content[..]), &link, MAX_DECODED).map_err(|e| e.to_string())?;
        entries.push(Arc::new(DecodedEntry { slot, rev, tid, content }));
    }
    Ok(DecodedBlock { entries, complete: upto.is_none() })
}

fn uuid_from(bytes: [u8; 16]) -> uuid::Uuid {
    uuid::Uuid::from_bytes(bytes)
}

fn rand_jitter() -> u16 {
    rand::random::<u16>() % 2000
}
