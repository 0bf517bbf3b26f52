//! The write path: appending a render to its title's open block (race-free
//! slot allocation), and suppressing revisions.

use std::sync::Arc;
use std::time::Duration;

use revstore_api::PageIdentity;
use revstore_codecs::encode_chained;
use revstore_keys::{Domain, RevId, Tid, Title};
use revstore_schema::tables::old_store::{ARCHIVE_BLOCKS, ARCHIVE_META, col};
use revstore_service::suppressions::{Change, Hidden, Hiding, Suppressions, deletion_timestamp};
use revstore_storage::{Cas, Condition, ReadQuery, Row, Serialized, Slice, Upsert, Value, Write};

use super::{Archive, ArchiveOutcome, TitleState, UpdatePolicy, key_values};
use crate::block::{APPEND_LEVEL, BlockKey, DecodedBlock, DecodedEntry, GROWTH_LEVEL, tid_value};
use crate::error::ArchiveError;

/// How often a writer retries after losing a slot to a concurrent writer.
const MAX_SLOT_ATTEMPTS: usize = 64;

/// Where an append goes: the slot it takes and the block's counters after it.
#[derive(Debug)]
struct Placement {
    key: BlockKey,
    slot: i64,
    /// Revisions and raw bytes of the block once the render is in it.
    revisions: i64,
    bytes: i64,
}

impl Archive {
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
        if self.hides(domain, title, rev).await? {
            return Ok(ArchiveOutcome::Skipped("the revision is suppressed or deleted with its page"));
        }
        let entry = Arc::new(entry);
        for attempt in 0..MAX_SLOT_ATTEMPTS {
            // The state first, the revision's rows second, in two reads: a
            // partition read need not be one snapshot of statics and rows (on
            // Cassandra they are two queries). Read in this order, any render
            // committed under the state seen is among the rows seen; one
            // committed later moves `rev_count`, and the slot's LWT fails.
            let state = TitleState::from_statics(self.title_state(domain, title).await?.as_ref());
            let renders = self.renders_of(domain, title, rev).await?;
            if renders.iter().any(|r| tid_value(r, col::TID) == Some(tid)) {
                return Ok(ArchiveOutcome::AlreadyStored);
            }
            if let Some(reason) = self.policy_skips(&state, !renders.is_empty(), tid) {
                return Ok(ArchiveOutcome::Skipped(reason));
            }
            let place = self.place(&state, domain, title, entry.len() as i64);
            let previous = if place.revisions > 1 { Some(self.entry_at(&place.key, place.slot - 1, place.slot).await?) } else { None };
            let link = {
                let (entry, previous) = (entry.clone(), previous.clone());
                tokio::task::spawn_blocking(move || encode_chained(previous.as_ref().map(|p| &p.content[..]), &entry, APPEND_LEVEL))
                    .await
                    .map_err(ArchiveError::internal)?
                    .map_err(|e| ArchiveError::TooLarge(e.to_string()))?
            };
            let content =
                Upsert::new(&ARCHIVE_BLOCKS, place.key.partition_values().into_iter().chain([Value::from(place.slot), Value::from(tid)]))
                    .set(col::REV, rev.as_i64())
                    .set(col::CONTENT, link);
            tokio::try_join!(
                self.inner.store.write(content),
                self.inner.store.write(self.inner.debt.owe(&place.key, place.slot, self.inner.store.now()))
            )?;
            // A title's first render enters the dump index before it is committed.
            if state.rev_count.is_none() {
                self.inner.store.write(super::TITLE_INDEX.row(domain, title, tid)).await?;
            }
            if !self.take_slot(domain, title, rev, tid, &state, &place).await? {
                metrics::counter!("old_store_slot_conflicts_total", "service" => crate::SERVICE).increment(1);
                // Another writer took the slot: back off a little (jittered) and start over.
                let pause = Duration::from_micros(200 * (attempt as u64 + 1) + u64::from(rand::random::<u16>() % 2000));
                tokio::time::sleep(pause).await;
                continue;
            }
            let added = Arc::new(DecodedEntry { slot: place.slot, rev: rev.get(), tid, content: Arc::unwrap_or_clone(entry) });
            self.remember_append(&place.key, previous, added);
            self.schedule_after_append(state, place);
            return Ok(ArchiveOutcome::Stored);
        }
        Err(ArchiveError::Contended)
    }

    /// Keeps what an archive write says of the title's page (its page id and
    /// namespace) on the title's index row, timestamped like the render: the
    /// word of the newest render stands (a page deleted and created again
    /// under its title has a new id).
    pub async fn note_page(&self, domain: &Domain, title: &Title, page: PageIdentity, tid: Tid) -> Result<(), ArchiveError> {
        if let Some(row) = super::TITLE_INDEX.identity(domain, title, page, tid) {
            self.inner.store.write(row).await?;
        }
        Ok(())
    }

    /// The statics of a title's `archive_meta` partition, by a block key of the title.
    pub(super) async fn title_state_row(&self, key: &BlockKey) -> Result<Option<Row>, ArchiveError> {
        let (domain, title) = (Value::from(key.domain.as_str()), Value::from(key.title.as_str()));
        Ok(self.inner.store.read(&ReadQuery::new(&ARCHIVE_META, [domain, title]).first(1).columns([col::REV_COUNT])).await?.statics)
    }

    /// The title's allocation state: the statics of `archive_meta`.
    async fn title_state(&self, domain: &Domain, title: &Title) -> Result<Option<Row>, ArchiveError> {
        let statics = [col::REV_COUNT, col::OPEN_BLOCK, col::OPEN_BLOCK_REVISIONS, col::OPEN_BLOCK_BYTES, col::LAST_TID];
        Ok(self.inner.store.read(&ReadQuery::new(&ARCHIVE_META, key_values(domain, title)).first(1).columns(statics)).await?.statics)
    }

    /// The metadata rows of the revision's archived renders.
    async fn renders_of(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<Vec<Row>, ArchiveError> {
        let query = ReadQuery::new(&ARCHIVE_META, key_values(domain, title))
            .slice(Slice::prefix([Value::from(rev.as_i64())]))
            .limit(64)
            .columns([col::BLOCK, col::SLOT]);
        Ok(self.inner.store.read(&query).await?.rows)
    }

    /// Why the update policy skips a render, if it does.
    fn policy_skips(&self, state: &TitleState, revision_archived: bool, tid: Tid) -> Option<&'static str> {
        match self.inner.policy {
            UpdatePolicy::FirstRenderPerRevision if revision_archived => Some("the revision already has an archived render"),
            UpdatePolicy::FirstRenderPerRevision => None,
            UpdatePolicy::OnePer(interval) => {
                let last = state.last_tid?;
                let apart = tid.time().duration_since(last.time()).unwrap_or_else(|e| e.duration());
                (apart < interval).then_some("a render of the title was archived within the policy's interval")
            }
        }
    }

    /// Where a render of `entry_len` bytes goes: the open block, or a new one when it is full.
    fn place(&self, state: &TitleState, domain: &Domain, title: &Title, entry_len: i64) -> Placement {
        let limits = self.inner.limits;
        let full = state.open_block_revisions as u64 >= limits.max_revisions
            || (state.open_block_revisions > 0 && (state.open_block_bytes + entry_len) as u64 > limits.max_bytes);
        let (block, revisions, bytes) = match state.rev_count {
            None => (0, 1, entry_len),
            Some(_) if full => (state.open_block + 1, 1, entry_len),
            Some(_) => (state.open_block, state.open_block_revisions + 1, state.open_block_bytes + entry_len),
        };
        let key = BlockKey { domain: domain.as_str().to_owned(), title: title.as_str().to_owned(), block };
        Placement { key, slot: state.rev_count.unwrap_or(0), revisions, bytes }
    }

    /// Takes the slot with a conditional batch on the title's counter that
    /// also writes the render's metadata row. Whether it was taken.
    async fn take_slot(
        &self,
        domain: &Domain,
        title: &Title,
        rev: RevId,
        tid: Tid,
        state: &TitleState,
        place: &Placement,
    ) -> Result<bool, ArchiveError> {
        let last_tid = match state.last_tid {
            Some(last) if last.time() > tid.time() => last,
            _ => tid,
        };
        let [d, t] = key_values(domain, title);
        let cas = Cas {
            serialized: Serialized::AcrossSites,
            table: &ARCHIVE_META,
            partition: vec![d.clone(), t.clone()],
            clustering: None,
            condition: Condition::Equals(vec![(col::REV_COUNT, state.rev_count.map_or(Value::Null, Value::from))]),
            writes: vec![
                Write::Upsert(
                    Upsert::new(&ARCHIVE_META, [d.clone(), t.clone()])
                        .set(col::REV_COUNT, place.slot + 1)
                        .set(col::OPEN_BLOCK, place.key.block)
                        .set(col::OPEN_BLOCK_REVISIONS, place.revisions)
                        .set(col::OPEN_BLOCK_BYTES, place.bytes)
                        .set(col::LAST_TID, last_tid),
                ),
                Write::Upsert(
                    Upsert::new(&ARCHIVE_META, [d, t, Value::from(rev.as_i64()), Value::from(tid)])
                        .set(col::BLOCK, place.key.block)
                        .set(col::SLOT, place.slot),
                ),
            ],
        };
        Ok(self.inner.store.cas(cas).await?.applied)
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

    fn schedule_after_append(&self, before: TitleState, place: Placement) {
        let queue = &self.inner.queue;
        // The block the title just left is full: compact it for good.
        if before.rev_count.is_some() && place.key.block != before.open_block {
            queue.schedule_now(BlockKey { block: before.open_block, ..place.key.clone() }, self.inner.seal_level);
        }
        // Keep the chain of the open block at most as long as its compacted part:
        // each render is recompressed about twice over the block's life (linear).
        if place.revisions >= 4 && (place.revisions as u64).is_power_of_two() {
            queue.schedule_now(place.key.clone(), GROWTH_LEVEL);
        }
        queue.schedule_settle(place.key, self.inner.seal_level);
    }

    /// Hides a revision from every read (current-store's suppression,
    /// forwarded), or lifts its suppression (`Change::Lift`): at `at`
    /// (milliseconds), the time current-store recorded the change, when
    /// given, so that both stores hold the same times whatever order the
    /// changes arrive in; by this store's clock otherwise.
    pub async fn change_suppression(
        &self,
        domain: &Domain,
        title: &Title,
        rev: RevId,
        change: Change,
        at: Option<i64>,
    ) -> Result<(), ArchiveError> {
        let store = &self.inner.store;
        match at {
            Some(at) => super::SUPPRESSIONS.record(store, domain, title, rev, change, at).await?,
            None => {
                super::SUPPRESSIONS.change(store, domain, title, rev, change).await?;
            }
        }
        Ok(())
    }

    /// Hides every revision of the page up to `through` (the page deleted):
    /// a static cell written at the deletion's timestamp, so a deletion
    /// through a later revision wins and none through an earlier one does.
    /// The blocks stay (a revision written after a re-creation shares them).
    /// The deletion is also recorded in the suppression table, where the
    /// janitor's `hidden` task finds it.
    pub async fn delete_page(&self, domain: &Domain, title: &Title, through: RevId) -> Result<(), ArchiveError> {
        let writes = vec![deletion_fence(domain, title, through), super::SUPPRESSIONS.deletion_record(domain, title, through)];
        self.inner.store.apply(writes).await?;
        Ok(())
    }

    /// Whether `rev` of the page must not be served: suppressed, or deleted with the page.
    pub async fn hides(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<bool, ArchiveError> {
        let (suppressed, deleted_through) = tokio::try_join!(
            async { Ok::<_, ArchiveError>(super::SUPPRESSIONS.is_suppressed(&self.inner.store, domain, title, rev).await?) },
            self.deleted_through(domain, title)
        )?;
        Ok(suppressed || deleted_through.is_some_and(|through| rev.get() <= through))
    }
}

/// A page's deletion through `through` in old-store's own tables: its
/// fence, a static cell of its `archive_meta` partition at the deletion's
/// timestamp.
fn deletion_fence(domain: &Domain, title: &Title, through: RevId) -> Write {
    Upsert::new(&ARCHIVE_META, key_values(domain, title))
        .set(col::DELETED_THROUGH_REV, through.as_i64())
        .timestamp(deletion_timestamp(through))
        .into()
}

/// The janitor's `hidden` task in old-store: a page's deletion fence,
/// written again from what every site's suppression rows say
/// (`revstore_service::suppressions`, "Across sites"); reads check the
/// suppression rows themselves.
impl Hiding for Archive {
    fn suppressions(&self) -> Suppressions {
        super::SUPPRESSIONS
    }

    fn hiding_writes(&self, domain: &Domain, title: &Title, hidden: &Hidden) -> Vec<Write> {
        hidden.deleted_through.map(|through| deletion_fence(domain, title, through)).into_iter().collect()
    }
}
