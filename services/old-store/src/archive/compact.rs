//! Compaction: rewriting a block's committed renders as one zstd frame, and
//! choosing what the frame is compressed against (its base).

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use revstore_codecs::{BlockBuilder, BlockSettings, CodecError, encode_chained};
use revstore_schema::tables::old_store::{ARCHIVE_BLOCKS, ARCHIVE_META, col};
use revstore_storage::{Cas, Condition, Delete, DeleteTarget, ReadQuery, Serialized, Slice, Upsert, Value, Write};
use tokio_util::sync::CancellationToken;

use super::{Archive, integrity};
use crate::block::{ANCHOR, APPEND_LEVEL, BaseChoice, BlockKey, CompactionOutcome, DecodedBlock, DecodedEntry, MAX_BASE_SPAN};
use crate::debt;
use crate::error::ArchiveError;

/// What a compaction reads of a block before deciding whether there is work.
#[derive(Debug)]
struct BlockState {
    /// The title's slot count: every slot below it is committed.
    committed: i64,
    /// The last slot in the block's frame, and the frame's level.
    through: Option<i64>,
    level: Option<i64>,
    base: BaseChoice,
    /// Whether a committed render is left outside the frame.
    pending_rows: bool,
}

impl Archive {
    /// Rewrites a block's committed renders as one zstd frame at `level` and
    /// drops the appended rows it now holds. Safe against concurrent appends
    /// and compactions: the rewrite is conditional on the block's previous
    /// compaction state, and only rows up to the new frame's last slot are
    /// deleted. At the seal level it also discharges the block's compaction
    /// debt. `stop` cancels the compression (the debt then stays owed).
    pub async fn compact(&self, key: &BlockKey, level: i32, stop: &CancellationToken) -> Result<CompactionOutcome, ArchiveError> {
        let state = self.block_state(key).await?;
        let discharges = level >= self.inner.seal_level;
        // A frame still waiting for its base choice is worth redoing once the block before has chosen.
        let undecided = state.base == BaseChoice::Undecided && state.through.is_some() && key.block > 0;
        let choosable = undecided && discharges && self.previous_has_chosen(key).await?;
        if !state.pending_rows && !choosable && state.level.is_some_and(|l| l >= i64::from(level)) {
            if undecided && discharges {
                return Ok(CompactionOutcome::BaseUndecided);
            }
            if discharges {
                if key.block == 0 && state.base == BaseChoice::Undecided && state.through.is_some() {
                    // A frame written before bases existed: block 0 always stands
                    // alone, so say so, and the blocks after it can choose.
                    let anchor =
                        Upsert::new(&ARCHIVE_BLOCKS, key.partition_values()).set(col::BASE_BLOCK, ANCHOR).set(col::FIRST_SLOT, 0i64);
                    self.inner.store.write(anchor).await?;
                }
                debt::discharge(&self.inner.store, &self.inner.debt, key, state.committed).await?;
            }
            return Ok(CompactionOutcome::NothingToDo);
        }
        let decoded = self.decode_block(key, None, state.committed).await?;
        let Some(first) = decoded.entries.first().cloned() else {
            if discharges {
                debt::discharge(&self.inner.store, &self.inner.debt, key, state.committed).await?;
            }
            return Ok(CompactionOutcome::NothingToDo);
        };
        let mut base = state.base;
        if base == BaseChoice::Undecided {
            base = self.choose_base(key, &first, decoded.raw_bytes()).await?;
        }
        let decoded = Arc::new(decoded);
        let Some(frame) = self.compress(key, &decoded, base, level, stop).await? else { return Ok(CompactionOutcome::Cancelled) };
        let stored_bytes = frame.len() as u64;
        if !self.store_frame(key, &decoded, frame, level, base, state.through).await? {
            return Ok(CompactionOutcome::LostRace);
        }
        if self.inner.cache.get(key).is_none_or(|c| c.entries.len() <= decoded.entries.len()) {
            self.inner.cache.insert(key.clone(), decoded.clone());
        }
        if discharges && base == BaseChoice::Undecided && key.block > 0 {
            return Ok(CompactionOutcome::BaseUndecided);
        }
        if discharges {
            debt::discharge(&self.inner.store, &self.inner.debt, key, state.committed).await?;
        }
        Ok(CompactionOutcome::Compacted { revisions: decoded.entries.len(), raw_bytes: decoded.raw_bytes(), stored_bytes, base })
    }

    /// The title's slot count, the block's compaction statics, and whether a
    /// committed render is outside its frame.
    async fn block_state(&self, key: &BlockKey) -> Result<BlockState, ArchiveError> {
        let title_key = [Value::from(key.domain.as_str()), Value::from(key.title.as_str())];
        let statics = self.inner.store.read(&ReadQuery::new(&ARCHIVE_META, title_key).first(1).columns([col::REV_COUNT])).await?.statics;
        let committed = statics.and_then(|s| s.bigint(col::REV_COUNT)).unwrap_or(0);
        let statics = self
            .inner
            .store
            .read(&ReadQuery::new(&ARCHIVE_BLOCKS, key.partition_values()).first(1).columns([
                col::COMPACTED_THROUGH,
                col::COMPACTED_LEVEL,
                col::BASE_BLOCK,
                col::BASE_SLOT,
            ]))
            .await?
            .statics;
        let through = statics.as_ref().and_then(|s| s.bigint(col::COMPACTED_THROUGH));
        // Rows at or below `compacted_through` are leftovers of writers that lost their slot.
        let after_frame = through.map_or(Bound::Unbounded, |t| Bound::Excluded(Value::from(t)));
        let next_row = self
            .inner
            .store
            .read(
                &ReadQuery::new(&ARCHIVE_BLOCKS, key.partition_values())
                    .slice(Slice::all().lower(after_frame))
                    .first(1)
                    .columns([col::REV]),
            )
            .await?
            .rows
            .first()
            .and_then(|r| r.bigint(col::SLOT));
        Ok(BlockState {
            committed,
            through,
            level: statics.as_ref().and_then(|s| s.bigint(col::COMPACTED_LEVEL)),
            base: BaseChoice::from_statics(statics.as_ref()),
            pending_rows: next_row.is_some_and(|slot| slot < committed),
        })
    }

    /// The block's renders as one frame at `level`, against `base`; `None`
    /// when `stop` cancelled it.
    async fn compress(
        &self,
        key: &BlockKey,
        decoded: &Arc<DecodedBlock>,
        base: BaseChoice,
        level: i32,
        stop: &CancellationToken,
    ) -> Result<Option<Vec<u8>>, ArchiveError> {
        let base_content = match base {
            BaseChoice::On { block, slot } => Some(self.entry_in(&BlockKey { block, ..key.clone() }, slot, slot + 1, false).await?),
            _ => None,
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let table_log_max = self.inner.table_log_max;
        let compression = {
            let (decoded, cancel) = (decoded.clone(), cancel.clone());
            tokio::task::spawn_blocking(move || -> Result<Vec<u8>, CodecError> {
                let settings = BlockSettings { level, table_log_max, ..BlockSettings::default() };
                let mut builder = BlockBuilder::with_capacity(settings, decoded.entries.len(), decoded.raw_bytes() as usize);
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
                return Ok(None);
            }
        };
        match frame.map_err(ArchiveError::internal)? {
            Ok(frame) => Ok(Some(frame)),
            Err(CodecError::Cancelled) => Ok(None),
            Err(e) => Err(integrity(key, e)),
        }
    }

    /// Stores the frame and drops the rows it holds, in one conditional batch
    /// on the block's previous `compacted_through`. Whether it was applied.
    async fn store_frame(
        &self,
        key: &BlockKey,
        decoded: &DecodedBlock,
        frame: Vec<u8>,
        level: i32,
        base: BaseChoice,
        old_through: Option<i64>,
    ) -> Result<bool, ArchiveError> {
        let (Some(first), Some(last)) = (decoded.entries.first(), decoded.entries.last()) else { return Ok(false) };
        let mut statics = Upsert::new(&ARCHIVE_BLOCKS, key.partition_values())
            .set(col::SEALED, frame)
            .set(col::COMPACTED_THROUGH, last.slot)
            .set(col::COMPACTED_LEVEL, i64::from(level))
            .set(col::FIRST_SLOT, first.slot);
        statics = match base {
            BaseChoice::Undecided => statics,
            BaseChoice::Anchor => statics.set(col::BASE_BLOCK, ANCHOR),
            BaseChoice::On { block, slot } => statics.set(col::BASE_BLOCK, block).set(col::BASE_SLOT, slot),
        };
        let cas = Cas {
            serialized: Serialized::AcrossSites,
            table: &ARCHIVE_BLOCKS,
            partition: key.partition_values().to_vec(),
            clustering: None,
            condition: Condition::Equals(vec![(col::COMPACTED_THROUGH, old_through.map_or(Value::Null, Value::from))]),
            writes: vec![
                Write::Upsert(statics),
                Write::Delete(Delete {
                    table: &ARCHIVE_BLOCKS,
                    partition: key.partition_values().to_vec(),
                    target: DeleteTarget::Range(Slice::all().upper(Bound::Included(Value::from(last.slot)))),
                    timestamp: None,
                }),
            ],
        };
        Ok(self.inner.store.cas(cas).await?.applied)
    }

    /// The base choice of the block before `key`.
    async fn previous_choice(&self, key: &BlockKey) -> Result<(BaseChoice, Option<i64>), ArchiveError> {
        let previous = BlockKey { block: key.block - 1, ..key.clone() };
        let statics = self
            .inner
            .store
            .read(&ReadQuery::new(&ARCHIVE_BLOCKS, previous.partition_values()).first(1).columns([
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
