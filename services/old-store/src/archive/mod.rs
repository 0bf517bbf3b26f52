//! The archive: how a render is appended to its title's open block, how a
//! revision is found and decoded again, and how blocks are compacted.
//!
//! # Layout (`docs/design/old-store-blocks.md`)
//! - `archive_meta` (one partition per title): a skinny row per render,
//!   `rev | tid → block, slot`, and static allocation state. A *slot* is the
//!   append position in the title's history; slots are taken one at a time by a
//!   lightweight transaction on the static `rev_count`, so replicas writing the
//!   same title never take the same one.
//! - `archive_blocks` (one partition per block): each appended render is a row
//!   at its slot, compressed against the slot before it (the `chain` codec);
//!   compaction rewrites the rows as one long-window zstd frame in the static
//!   `sealed` and drops them with a single range delete.
//! - `archive_titles`: each domain's archived titles in the token order of
//!   their `archive_meta` partition ([`TITLE_INDEX`]), written with a title's
//!   first render, for history dumps.
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
//!
//! # Modules
//! The model is [`crate::block`]; this module holds the archive's state, and
//! its three sides are `impl Archive` blocks of their own: [`write`] (appends
//! and suppression), [`read`] (locating and decoding) and [`compact`].

mod compact;
mod read;
mod write;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use revstore_keys::{Domain, Tid, Title};
use revstore_schema::tables::old_store::{ARCHIVE_SUPPRESSED, ARCHIVE_TITLES, col};
use revstore_service::dump::TitleIndex;
use revstore_service::suppressions::Suppressions;
use revstore_storage::{Row, Store, Value};

use crate::block::{BlockKey, DecodedBlock};
use crate::debt::DebtBook;
use crate::error::ArchiveError;
use crate::queue::CompactionQueue;

/// `archive_titles`, the index of each domain's archived titles that
/// history dumps walk.
pub(crate) const TITLE_INDEX: TitleIndex = TitleIndex { table: &ARCHIVE_TITLES, identities: true };

/// old-store's suppressions (`archive_suppressed`), forwarded by current-store.
pub(crate) const SUPPRESSIONS: Suppressions = Suppressions { table: &ARCHIVE_SUPPRESSED };

/// Which renders of a title are kept.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct BlockLimits {
    /// A block is sealed when it holds this many revisions...
    /// (At most 10,000: a block's rows are read in one go, under the store's
    /// cap on reads without a limit.)
    #[arg(long = "block-max-revisions", env = "REVSTORE_BLOCK_MAX_REVISIONS", default_value = "1000", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_revisions: u64,
    /// ...or when the next revision would take it past this many raw bytes.
    /// (Raw, decoded bytes: pages whose revisions are megabytes each get few
    /// revisions per block, small pages many.)
    #[arg(long = "block-max-bytes", env = "REVSTORE_BLOCK_MAX_BYTES", default_value = "16777216", value_parser = clap::value_parser!(u64).range(4096..))]
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

#[derive(Debug, Clone)]
struct BlockWeighter;

impl quick_cache::Weighter<BlockKey, Arc<DecodedBlock>> for BlockWeighter {
    fn weight(&self, _: &BlockKey, block: &Arc<DecodedBlock>) -> u64 {
        block.raw_bytes().max(1)
    }
}

type BlockCache = quick_cache::sync::Cache<BlockKey, Arc<DecodedBlock>, BlockWeighter>;

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
    queue: CompactionQueue,
    /// Which hours hold the markers of the blocks this process owes a compaction.
    debt: DebtBook,
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
        Archive {
            inner: Arc::new(Inner {
                store,
                policy: settings.policy,
                limits: settings.limits,
                seal_level: settings.seal_level,
                cache,
                queue: CompactionQueue::new(settings.settle),
                debt: DebtBook::default(),
                decode_slots: tokio::sync::Semaphore::new(settings.max_concurrent_decodes.max(1)),
                table_log_max: settings.table_log_max,
            }),
        }
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Which hours hold the markers of the blocks this process owes a
    /// compaction (shared with the debt sweep).
    pub fn debt_book(&self) -> &DebtBook {
        &self.inner.debt
    }

    /// The queue of this archive's blocks waiting for a compaction.
    pub fn queue(&self) -> &CompactionQueue {
        &self.inner.queue
    }

    pub fn seal_level(&self) -> i32 {
        self.inner.seal_level
    }
}
