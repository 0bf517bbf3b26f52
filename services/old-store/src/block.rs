//! The block model every other module of old-store builds on: which block a
//! render is in ([`BlockKey`], [`Located`]), what a block decodes to
//! ([`DecodedBlock`]), what it is compressed against ([`BaseChoice`]) and
//! what a compaction did ([`CompactionOutcome`]). It imports nothing of the
//! service: the queue, the debt, the archive and the workers import it.

use std::sync::Arc;

use revstore_codecs::{BlockReader, BlockSettings, decode_chained};
use revstore_keys::Tid;
use revstore_schema::tables::old_store::col;
use revstore_storage::{Row, Value};

/// zstd level of a render appended to an open block: fast, since every write pays it.
pub const APPEND_LEVEL: i32 = 3;
/// zstd level of the compactions that keep an open block's chain short.
pub const GROWTH_LEVEL: i32 = 12;
/// The largest decoded block a reader accepts (corrupt or hostile lengths).
pub(crate) const MAX_DECODED: usize = 1 << 30;
/// A base and the block compressed against it must fit zstd's window together.
pub(crate) const MAX_BASE_SPAN: u64 = 1 << revstore_codecs::block::WINDOW_LOG_MAX;
/// `base_block` of a block that stands alone for good (an anchor).
pub(crate) const ANCHOR: i64 = -1;

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
    pub(crate) fn from_statics(statics: Option<&Row>) -> Self {
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

    pub(crate) fn raw_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.content.len() as u64).sum()
    }
}

/// Where a render is: its metadata row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    pub rev: u64,
    pub tid: Tid,
    pub block: i64,
    pub slot: i64,
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

/// The tid stored in `column`, if it is a valid one.
pub(crate) fn tid_value(row: &Row, column: &str) -> Option<Tid> {
    row.timeuuid(column).and_then(|u| Tid::from_uuid(u).ok())
}

pub(crate) fn located(row: &Row) -> Option<Located> {
    Some(Located {
        rev: row.bigint(col::REV)? as u64,
        tid: tid_value(row, col::TID)?,
        block: row.bigint(col::BLOCK)?,
        slot: row.bigint(col::SLOT)?,
    })
}

/// The CPU part of reading a block: the frame up to `upto` (or all of it),
/// then each chained row against the content before it.
pub(crate) fn decode(
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
