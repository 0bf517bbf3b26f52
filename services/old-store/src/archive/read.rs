//! The read path: locating a render, and decoding its block (through the
//! block cache, a bounded number of decodes at once).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use futures_util::{Stream, TryStreamExt};
use revstore_keys::{Domain, RevId, Tid, Title};
use revstore_schema::tables::old_store::{ARCHIVE_BLOCKS, ARCHIVE_META, col};
use revstore_storage::{ReadQuery, Row, Slice, Value};

use super::{Archive, integrity, key_values};
use crate::block::{BaseChoice, BlockKey, DecodedBlock, DecodedEntry, Located, decode, located, tid_value};
use crate::error::ArchiveError;

/// Metadata rows read per request by a history walk.
const HISTORY_PAGE: u32 = 1000;

/// Where a history walk is: the metadata reads left, the rows read and not
/// yet sent, and the block decoded last.
struct Walk {
    archive: Archive,
    reads: std::collections::VecDeque<ReadQuery>,
    located: std::collections::VecDeque<Located>,
    block: Option<(i64, DecodedBlock)>,
    /// The title's slots taken when the walk began (read with its first block).
    committed: Option<i64>,
    base: BlockKey,
}

impl Walk {
    async fn next(&mut self) -> Result<Option<Arc<DecodedEntry>>, ArchiveError> {
        let at = loop {
            if let Some(at) = self.located.pop_front() {
                break at;
            }
            let Some(query) = self.reads.pop_front() else { return Ok(None) };
            let page = self.archive.inner.store.read(&query).await?;
            if let Some(token) = page.next {
                self.reads.push_front(query.page_token(Some(token)));
            }
            self.located.extend(page.rows.iter().filter_map(located));
        };
        let held = self.block.as_ref().filter(|(block, _)| *block == at.block).and_then(|(_, decoded)| decoded.get(at.slot)).cloned();
        let entry = match held {
            Some(entry) => entry,
            None => {
                let committed = match self.committed {
                    Some(committed) => committed,
                    None => {
                        let statics = self.archive.title_state_row(&self.base).await?;
                        *self.committed.insert(statics.and_then(|s| s.bigint(col::REV_COUNT)).unwrap_or(0))
                    }
                };
                // A render archived after the walk began is committed too: its metadata row says so.
                let key = BlockKey { block: at.block, ..self.base.clone() };
                let decoded = self.archive.decode_block(&key, None, committed.max(at.slot + 1)).await?;
                metrics::counter!("old_store_dump_blocks_decoded_total", "service" => crate::SERVICE).increment(1);
                let entry = decoded.get(at.slot).cloned().ok_or_else(|| integrity(&key, format!("slot {} is missing", at.slot)))?;
                self.block = Some((at.block, decoded));
                entry
            }
        };
        if entry.rev != at.rev || entry.tid != at.tid {
            let key = BlockKey { block: at.block, ..self.base.clone() };
            return Err(integrity(
                &key,
                format!("slot {} holds rev {} tid {}, metadata says rev {} tid {}", at.slot, entry.rev, entry.tid, at.rev, at.tid),
            ));
        }
        Ok(Some(entry))
    }
}

/// The rows of a block after its compacted frame, one per slot: (slot, rev, tid, chained content).
type Chain = Vec<(i64, u64, Tid, Vec<u8>)>;

impl Archive {
    /// The metadata row of a render: the given tid, or the revision's first render.
    pub async fn locate(&self, domain: &Domain, title: &Title, rev: RevId, tid: Option<Tid>) -> Result<Option<Located>, ArchiveError> {
        let mut prefix = vec![Value::from(rev.as_i64())];
        prefix.extend(tid.map(Value::from));
        let page =
            self.inner.store.read(&ReadQuery::new(&ARCHIVE_META, key_values(domain, title)).slice(Slice::prefix(prefix)).first(1)).await?;
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
    pub(super) async fn entry_at(&self, key: &BlockKey, slot: i64, committed: i64) -> Result<Arc<DecodedEntry>, ArchiveError> {
        self.entry_in(key, slot, committed, true).await
    }

    /// [`Archive::entry_at`]; `with_base` false for a base's own block, which
    /// must stand alone (so decoding never chains further).
    pub(super) async fn entry_in(
        &self,
        key: &BlockKey,
        slot: i64,
        committed: i64,
        with_base: bool,
    ) -> Result<Arc<DecodedEntry>, ArchiveError> {
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
            .read(&ReadQuery::new(&ARCHIVE_BLOCKS, key.partition_values()).first(1).columns([
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
        let chain = self.chain_of(key, &page.rows, through, committed).await?;
        let key_for_errors = key.clone();
        let decoded = tokio::task::spawn_blocking(move || decode(sealed, base, through, upto, chain))
            .await
            .map_err(ArchiveError::internal)?
            .map_err(|e| integrity(&key_for_errors, e));
        drop(permit);
        decoded
    }

    /// The committed rows after the compacted part (`through`), one per slot below `committed`.
    async fn chain_of(&self, key: &BlockKey, rows: &[Row], through: Option<i64>, committed: i64) -> Result<Chain, ArchiveError> {
        let mut by_slot: BTreeMap<i64, Vec<&Row>> = BTreeMap::new();
        for row in rows {
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
        Ok(chain)
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

    /// Every render of a title after `after` (revision, tid), in (revision,
    /// tid) order, decoded. A dump walks a history front to back, so each
    /// block is decoded whole, once, and kept while its renders are sent —
    /// not through the block cache, which a dump would only flush. (A render
    /// archived late, into a later block than the revisions after it, costs
    /// one more decode of the block it interrupts.)
    pub fn history(
        &self,
        domain: &Domain,
        title: &Title,
        after: Option<(u64, Tid)>,
    ) -> impl Stream<Item = Result<Arc<DecodedEntry>, ArchiveError>> + Send + use<> {
        let meta = |slice: Slice| {
            ReadQuery::new(&ARCHIVE_META, key_values(domain, title)).slice(slice).limit(HISTORY_PAGE).columns([col::BLOCK, col::SLOT])
        };
        let reads: std::collections::VecDeque<ReadQuery> = match after {
            None => [meta(Slice::all())].into(),
            Some((rev, tid)) => {
                let rev = Value::from(rev as i64);
                [
                    meta(Slice::prefix([rev.clone()]).lower(Bound::Excluded(Value::from(tid)))),
                    meta(Slice::all().lower(Bound::Excluded(rev))),
                ]
                .into()
            }
        };
        let base = BlockKey { domain: domain.as_str().to_owned(), title: title.as_str().to_owned(), block: 0 };
        let walk = Walk { archive: self.clone(), reads, located: std::collections::VecDeque::new(), block: None, committed: None, base };
        futures_util::stream::try_unfold(walk, |mut walk| async move {
            match walk.next().await? {
                Some(entry) => Ok(Some((entry, walk))),
                None => Ok(None),
            }
        })
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

    /// The revisions of a title that must not be served: the suppressed
    /// ones, and those deleted with the page.
    pub async fn hidden_revisions(&self, domain: &Domain, title: &Title) -> Result<Hidden, ArchiveError> {
        let (suppressed, deleted_through) = tokio::try_join!(
            async { Ok::<_, ArchiveError>(super::SUPPRESSIONS.revisions(&self.inner.store, domain, title).await?) },
            self.deleted_through(domain, title)
        )?;
        Ok(Hidden { suppressed: suppressed.into_iter().map(RevId::get).collect(), deleted_through })
    }

    /// The revision the page was deleted through, if it was.
    pub async fn deleted_through(&self, domain: &Domain, title: &Title) -> Result<Option<u64>, ArchiveError> {
        let query = ReadQuery::new(&ARCHIVE_META, key_values(domain, title)).first(1).columns([col::DELETED_THROUGH_REV]);
        let statics = self.inner.store.read(&query).await?.statics;
        Ok(statics.and_then(|s| s.bigint(col::DELETED_THROUGH_REV)).map(|r| r as u64))
    }

    // ---- compaction ------------------------------------------------------
}

/// The revisions of a title that are not served.
#[derive(Debug, Clone, Default)]
pub struct Hidden {
    suppressed: std::collections::BTreeSet<u64>,
    deleted_through: Option<u64>,
}

impl Hidden {
    pub fn contains(&self, rev: &u64) -> bool {
        self.suppressed.contains(rev) || self.deleted_through.is_some_and(|through| *rev <= through)
    }
}
