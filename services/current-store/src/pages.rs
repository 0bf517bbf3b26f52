//! current-store's model of a page, over the `Store`: where renders live,
//! which one wins, and what a write must do so that precedence and the grace
//! period hold whatever order writes arrive in.
//!
//! Tables (docs/design/current-store-writes.md):
//! - `page_renders` (domain, title) → rev DESC, tid DESC: every render of the
//!   page, with the time it was stored. The first row is the latest render
//!   (precedence is the clustering order, whatever order writes arrive in); a
//!   superseded render stays a row, so a reader who saw it can fetch it by
//!   (rev, tid), until it has been superseded for the grace period — then the
//!   janitor's retention sweep range-deletes it. Nothing is copied when a
//!   render is superseded, and a write reads nothing before it writes.
//! - `suppressed`: revisions never to be served again.
//! - `outbox`: hand-offs to old-store (and change notices to the dependency
//!   graph), written before the render becomes visible.
//! - `domain_pages`: the dump index, a row per page, written with every
//!   render (the same row again, timestamped with the render).

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use revstore_keys::{Domain, RevId, Tid, Title};
use revstore_schema::tables::current_store::{DOMAIN_PAGES, PAGE_RENDERS, SUPPRESSED, col};
use revstore_service::dump::TitleIndex;
use revstore_service::janitor_admin::Journal;
use revstore_service::suppressions::{Change, Hidden, Hiding, Suppressions, deletion_timestamp};
use revstore_storage::{Delete, ReadQuery, Row, Slice, Store, Upsert, Value, Write, row_bytes};

use crate::error::{PagesError, Refusal};

/// Render keys read per page of a listing.
const GRACE_PAGE: u32 = 1000;

/// A suppression's row deletes sent at once.
const SUPPRESSION_WRITES: usize = 100;

use crate::render::{RenderBody, RenderId, StoredParts};

/// `domain_pages`, the index of each domain's pages that dumps walk: a row
/// is written with each render, timestamped by its revision
/// ([`fence_timestamp`]), and removed by the page's deletion at the fence's
/// timestamp, so the render of a revision newer than the deletion (the
/// page re-created) brings it back, whatever the clocks, and none older does.
pub(crate) const PAGE_INDEX: TitleIndex = TitleIndex { table: &DOMAIN_PAGES, identities: false };

/// current-store's suppressions (`suppressed`).
pub(crate) const SUPPRESSIONS: Suppressions = Suppressions { table: &SUPPRESSED };

/// The write timestamp of a page's deletion through revision `rev`, and of
/// a render's index row of revision `rev` ([`deletion_timestamp`]): a
/// deletion's fence, range delete and index removal are newer than any
/// write of the revisions it deletes, whatever the writer's clock, and
/// older than a later deletion's and than the index row of a newer revision.
fn fence_timestamp(rev: RevId) -> i64 {
    deletion_timestamp(rev)
}

/// The write time of a page's suppression flag (`has_suppressed_revs`):
/// later than any write will ever carry, so that no delete of the page (a
/// partition tombstone at its newest render's write) removes it, and a
/// render of a suppressed revision written after the page was deleted and
/// written again is still caught by the latest read.
const SUPPRESSION_FLAG_WRITTEN_AT: i64 = 1 << 62;

/// A page's deletion through `through` in current-store's own tables: its
/// fence (`deleted_through_rev`, a static cell), a range delete of its
/// renders and the removal of its dump index row, all at [`fence_timestamp`].
fn deletion_writes(domain: &Domain, title: &Title, through: RevId) -> Vec<Write> {
    let at = fence_timestamp(through);
    let fence = Upsert::new(&PAGE_RENDERS, key(domain, title)).set(col::DELETED_THROUGH_REV, through.as_i64()).timestamp(at);
    let renders = Slice::all().upper(Bound::Included(Value::from(through.as_i64())));
    vec![
        fence.into(),
        Delete::range(&PAGE_RENDERS, key(domain, title), renders).timestamp(at).into(),
        PAGE_INDEX.delete(domain, title, at).into(),
    ]
}

/// The janitor's `hidden` task in current-store: a page's deletion and its
/// suppression flag, written again from what every site's suppression rows
/// say (`revstore_service::suppressions`, "Across sites"). The renders of a
/// suppressed revision that a site still holds stay; every read there checks
/// the suppression.
impl Hiding for Pages {
    fn suppressions(&self) -> Suppressions {
        SUPPRESSIONS
    }

    fn hiding_writes(&self, domain: &Domain, title: &Title, hidden: &Hidden) -> Vec<Write> {
        let mut writes = hidden.deleted_through.map(|through| deletion_writes(domain, title, through)).unwrap_or_default();
        if !hidden.revisions.is_empty() {
            writes.push(suppression_flag(key(domain, title)).into());
        }
        writes
    }
}

/// The static cell saying that the page `page` (domain, title) has a suppressed revision.
fn suppression_flag(page: [Value; 2]) -> Upsert {
    Upsert::new(&PAGE_RENDERS, page).set(col::HAS_SUPPRESSED_REVS, true).timestamp(SUPPRESSION_FLAG_WRITTEN_AT)
}

/// Flags every page with a suppressed revision (the flag is set by each
/// suppression; suppressions made by code that predates it, before or
/// during an upgrade, are flagged here). Idempotent; returns the pages.
pub async fn flag_suppressed_pages(store: &Store) -> Result<u64, PagesError> {
    let mut partitions = std::pin::pin!(store.partitions(revstore_storage::ScanQuery::new(&SUPPRESSED, 1000)));
    let mut flagged = 0;
    while let Some(partition) = partitions.try_next().await? {
        let [domain @ Value::Text(_), title @ Value::Text(_)] = partition.key.as_slice() else { continue };
        store.write(suppression_flag([domain.clone(), title.clone()])).await?;
        flagged += 1;
    }
    Ok(flagged)
}

/// current-store's journal of changed pages: every render write records its
/// page, so that the janitor's routine run visits only the pages written
/// since the last.
pub(crate) fn journal(store: &Store) -> Journal {
    Journal::new(store.clone(), "current-store")
}

/// A render found in storage, with the stored parts that were asked for.
#[derive(Debug, Clone)]
pub struct Found {
    pub id: RenderId,
    pub row: Row,
}

/// Conditions a write must meet.
#[derive(Debug, Clone, Default)]
pub struct Preconditions {
    /// `If-Match`: the ETag of the latest render the writer based its render on.
    pub if_match: Option<String>,
    /// `If-Unmodified-Since`: no render of the page is newer than this.
    pub if_unmodified_since: Option<SystemTime>,
}

impl Preconditions {
    /// Whether any condition was sent: only then does a write read the page.
    pub fn is_set(&self) -> bool {
        self.if_match.is_some() || self.if_unmodified_since.is_some()
    }
}

/// What this instance's writes have made durable, so that a later write need
/// not again:
/// - the revisions whose hand-off it queued, each with the oldest render tid
///   it queued one for. A render of a revision here with a tid no older
///   queues none: a hand-off queued no later than its own render is durable.
///   Anything else queues one again — a revision whose first render another
///   instance wrote, a restart, an eviction, a render older than any queued —
///   and the outbox drops the repeat when an older render of the revision is
///   held (`outbox::repeats_an_earlier_row`); old-store takes any that gets
///   through as a no-op;
/// - per page, the slot of its last journal entry and the revision of its
///   last dump index row: both rows are the same for every write of that
///   slot or revision (the journal's entry is the slot's, the index row is
///   timestamped by revision), so a re-render of a hot page writes
///   neither again. A deletion cannot make a remembered index row stale for
///   a write that is kept: it deletes through the revision, and a render of
///   that revision is refused from then on.
#[derive(Debug, Clone)]
pub struct WriterMemory {
    handed_off: Arc<quick_cache::sync::Cache<(Domain, Title, RevId), Tid>>,
    pages: Arc<quick_cache::sync::Cache<(Domain, Title), PageWritten>>,
}

/// What this instance last wrote of a page beside its renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PageWritten {
    journal_slot: i64,
    indexed_rev: RevId,
}

/// Revisions (and pages) remembered per instance, at about 100 bytes each.
const REMEMBERED: usize = 100_000;

impl Default for WriterMemory {
    fn default() -> Self {
        WriterMemory {
            handed_off: Arc::new(quick_cache::sync::Cache::new(REMEMBERED)),
            pages: Arc::new(quick_cache::sync::Cache::new(REMEMBERED)),
        }
    }
}

impl WriterMemory {
    /// Whether a render of this revision with this tid must queue a hand-off.
    fn needs(&self, revision: &(Domain, Title, RevId), tid: Tid) -> bool {
        self.handed_off.get(revision).is_none_or(|queued| queued > tid)
    }

    /// A hand-off of this revision for a render with this tid is durable.
    fn queued(&self, revision: (Domain, Title, RevId), tid: Tid) {
        let oldest = self.handed_off.get(&revision).map_or(tid, |queued| queued.min(tid));
        self.handed_off.insert(revision, oldest);
    }

    /// What this instance last wrote of the page beside its renders.
    fn page(&self, page: &(Domain, Title)) -> Option<PageWritten> {
        self.pages.get(page)
    }

    /// The page's journal entry of `journal_slot` and its index row of `indexed_rev` are durable.
    fn page_written(&self, page: (Domain, Title), written: PageWritten) {
        self.pages.insert(page, written);
    }
}

/// Where a listed render is held.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct HeldRender {
    pub rev: u64,
    pub tid: String,
    pub rendered_at: String,
    /// `current` for the latest render of a revision, `grace` for renders kept for the grace period.
    pub held_in: &'static str,
}

#[derive(Debug, Clone)]
pub struct Pages {
    pub store: Store,
    /// How long a superseded render stays retrievable.
    pub grace: Duration,
    /// The largest difference between the clocks of the instances that write
    /// (`REVSTORE_CLOCK_SKEW`): a render is removed only once it has been
    /// superseded for the grace period on every clock within it, since the
    /// instance that removes it is not the one that stored its successor.
    pub clock_skew: Duration,
    /// Queue the first render of each revision for old-store.
    pub hand_off: bool,
    /// Queue a change notice for the dependency graph on each new revision.
    pub notify_graph: bool,
    /// The revisions this instance has queued a hand-off for.
    pub remembered: WriterMemory,
}

pub(crate) fn key(domain: &Domain, title: &Title) -> [Value; 2] {
    [Value::from(domain.as_str()), Value::from(title.as_str())]
}

pub(crate) fn render_id(row: &Row) -> Result<RenderId, PagesError> {
    let rev = row.bigint(col::REV).and_then(|r| RevId::new(r as u64).ok());
    let tid = row.timeuuid(col::TID).and_then(|t| Tid::from_uuid(t).ok());
    match (rev, tid) {
        (Some(rev), Some(tid)) => Ok(RenderId { rev, tid }),
        _ => Err(PagesError::Corrupt(format!("stored render without a valid rev or tid: {row:?}"))),
    }
}

pub fn rendered_at(tid: Tid) -> String {
    revstore_keys::rfc3339(tid.time())
}

impl Pages {
    pub async fn is_suppressed(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<bool, PagesError> {
        Ok(SUPPRESSIONS.is_suppressed(&self.store, domain, title, rev).await?)
    }

    /// Whether `rev` of the page must not be served from anywhere, old-store
    /// included: suppressed, or deleted with the page.
    pub async fn hides(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<bool, PagesError> {
        let (suppressed, statics) = tokio::try_join!(self.is_suppressed(domain, title, rev), self.statics(domain, title))?;
        Ok(suppressed || statics.deleted(rev))
    }

    /// The page's static cells alone.
    async fn statics(&self, domain: &Domain, title: &Title) -> Result<PageStatics, PagesError> {
        let query = ReadQuery::new(&PAGE_RENDERS, key(domain, title)).first(1).columns(PageStatics::COLUMNS);
        Ok(PageStatics::of(self.store.read(&query).await?.statics.as_ref()))
    }

    /// The latest render of the latest revision: the page's first row, read
    /// with the page's static cells — nothing when the page was deleted
    /// through its revision, and on a flagged page (one with a suppressed
    /// revision) the first render whose revision is not suppressed.
    pub async fn latest(&self, domain: &Domain, title: &Title, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let mut wanted = content_columns(columns);
        wanted.extend(PageStatics::COLUMNS);
        let page = self.store.read(&ReadQuery::new(&PAGE_RENDERS, key(domain, title)).first(1).columns(wanted)).await?;
        let statics = PageStatics::of(page.statics.as_ref());
        let latest = match found(page.rows.into_iter().next())? {
            Some(first) if statics.has_suppressed_revs => self.first_not_suppressed(domain, title, first, columns).await?,
            first => first,
        };
        // Every row after the first is of an older revision: a deleted first is a deleted page.
        Ok(latest.filter(|f| !statics.deleted(f.id.rev)))
    }

    /// From `first` (a render of a flagged page) down, the first render whose
    /// revision is not suppressed: one read per suppressed revision passed.
    async fn first_not_suppressed(
        &self,
        domain: &Domain,
        title: &Title,
        first: Found,
        columns: &[&'static str],
    ) -> Result<Option<Found>, PagesError> {
        let suppressed = self.suppressed_revisions(domain, title).await?;
        let mut candidate = first;
        while suppressed.contains(&candidate.id.rev) {
            let older = Slice::all().upper(Bound::Excluded(Value::from(candidate.id.rev.as_i64())));
            let query = ReadQuery::new(&PAGE_RENDERS, key(domain, title)).slice(older).first(1).columns(content_columns(columns));
            match found(self.store.read(&query).await?.rows.into_iter().next())? {
                Some(next) => candidate = next,
                None => return Ok(None),
            }
        }
        Ok(Some(candidate))
    }

    /// Every suppressed revision of a page.
    pub(crate) async fn suppressed_revisions(&self, domain: &Domain, title: &Title) -> Result<BTreeSet<RevId>, PagesError> {
        Ok(SUPPRESSIONS.revisions(&self.store, domain, title).await?)
    }

    /// The latest render of a revision: the revision's first row, unless the
    /// revision is suppressed or deleted with the page.
    pub async fn of_rev(&self, domain: &Domain, title: &Title, rev: RevId, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let prefix = [Value::from(rev.as_i64())];
        let (suppressed, found) = tokio::try_join!(self.is_suppressed(domain, title, rev), self.find(domain, title, &prefix, columns))?;
        Ok(found.filter(|_| !suppressed))
    }

    /// The first render under a clustering prefix (a revision, or a
    /// revision and tid), read with the page's deletion fence: nothing when
    /// the page was deleted through its revision.
    async fn find(&self, domain: &Domain, title: &Title, prefix: &[Value], columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let mut wanted = content_columns(columns);
        wanted.push(col::DELETED_THROUGH_REV);
        let query = ReadQuery::new(&PAGE_RENDERS, key(domain, title)).slice(Slice::prefix(prefix.to_vec())).first(1).columns(wanted);
        let page = self.store.read(&query).await?;
        let statics = PageStatics::of(page.statics.as_ref());
        Ok(found(page.rows.into_iter().next())?.filter(|f| !statics.deleted(f.id.rev)))
    }

    /// One render, by revision and tid.
    pub async fn of_tid(
        &self,
        domain: &Domain,
        title: &Title,
        rev: RevId,
        tid: Tid,
        columns: &[&'static str],
    ) -> Result<Option<Found>, PagesError> {
        let prefix = [Value::from(rev.as_i64()), Value::from(tid)];
        let (suppressed, found) = tokio::try_join!(self.is_suppressed(domain, title, rev), self.find(domain, title, &prefix, columns))?;
        Ok(found.filter(|_| !suppressed))
    }

    /// Stores a render. See the module documentation and
    /// docs/design/current-store-writes.md.
    ///
    /// Two stages. First, durable before the render can be seen, each
    /// unless this instance already made it durable ([`WriterMemory`]): the
    /// page's journal entry of the slot (the janitor's retention sweep
    /// visits the page once the grace period has passed), its row in the
    /// dump index for the revision, and the revision's hand-off to old-store
    /// and its change notice. At the same time, one read of the page's first row and
    /// static cells ([`Pages::write_check`]) says whether the render can be
    /// kept: a render of a revision deleted with the page or suppressed, or
    /// another body under a stored (rev, tid), is refused (409) and never
    /// written. Then the render's row, one INSERT (none when the same render
    /// is already stored). Nothing is deleted here: what the render
    /// supersedes stays for the grace period and is removed by the retention
    /// sweep. Every write is idempotent (explicit keys), so a retry after a
    /// failure anywhere completes the write, and a repeated write answers as
    /// the first did.
    pub async fn put(
        &self,
        domain: &Domain,
        title: &Title,
        id: RenderId,
        body: &RenderBody,
        pre: &Preconditions,
    ) -> Result<(), PagesError> {
        body.validate()?;
        id.tid.check_render_time(self.store.now())?;
        if pre.is_set() {
            let latest = self.latest(domain, title, &[]).await?.map(|found| found.id);
            check_preconditions(pre, latest)?;
        }
        let [d, t] = key(domain, title);
        let parts = StoredParts::encode(body);
        // Timestamped when stored, not with the render's time: no sweep made
        // before this write shadows it, whatever its tid (see `behind`).
        let now = self.store.now_micros();
        let journal = journal(&self.store);
        let page = (domain.clone(), title.clone());
        let written = PageWritten { journal_slot: journal.slot_now(), indexed_rev: id.rev };
        let before = self.remembered.page(&page);
        let mut durable_first: Vec<Write> = Vec::new();
        if before.is_none_or(|b| b.journal_slot != written.journal_slot) {
            durable_first.push(journal.entry_in(written.journal_slot, &[d.clone(), t.clone()]));
        }
        if before.is_none_or(|b| b.indexed_rev != written.indexed_rev) {
            durable_first.push(PAGE_INDEX.row_written_at(domain, title, id.tid, fence_timestamp(id.rev)).into());
        }
        let revision = (domain.clone(), title.clone(), id.rev);
        let queue_hand_off = self.remembered.needs(&revision, id.tid);
        if queue_hand_off && self.hand_off {
            durable_first.push(self.outbox("archive", domain, title, id, parts.handoff_payload()).into());
        }
        if queue_hand_off && self.notify_graph {
            let notice = revstore_api::ChangeNotice {
                page: title.as_str().to_owned(),
                kind: revstore_api::ChangeKind::Modification,
                at: rendered_at(id.tid),
                selector: None,
            };
            let notice = revstore_codecs::Envelope::default()
                .encode(&serde_json::to_vec(&notice).unwrap_or_default(), revstore_codecs::Compression::None);
            durable_first.push(self.outbox("change", domain, title, id, notice).into());
        }
        // A refused render leaves the first stage behind: a journal entry, an
        // index row and a hand-off of a revision that is deleted or
        // suppressed, which the sweep, the dump and the delivery pass over
        // (each checks the page as a reader does).
        let first_stage = async {
            if !durable_first.is_empty() {
                self.store.apply_in_stages(vec![durable_first]).await?;
            }
            Ok::<_, PagesError>(())
        };
        let (stored, ()) = tokio::try_join!(self.write_check(domain, title, id, parts.body_hash), first_stage)?;
        if queue_hand_off {
            self.remembered.queued(revision, id.tid);
        }
        self.remembered.page_written(page, written);
        if stored {
            return Ok(());
        }
        let render = Upsert::new(&PAGE_RENDERS, [d, t, Value::from(id.rev.as_i64()), Value::from(id.tid)])
            .set(col::STORED_AT, Value::Timestamp(now / 1000))
            .set(col::BODY_HASH, parts.body_hash)
            .set(col::HTML, parts.html)
            .set(col::DATA_PARSOID, parts.data_parsoid)
            .set(col::SECTION_OFFSETS, parts.section_offsets)
            .timestamp(now);
        self.store.write(with_stored_bytes(render)).await?;
        Ok(())
    }

    /// Whether a render can be kept, from the page's first row and static
    /// cells (one read; a second only for a render that sorts behind the
    /// first row, which may be stored already, and one more on a page with a
    /// suppressed revision): `Ok(true)` when the same render is stored,
    /// `Ok(false)` when it is not, refused when its revision was deleted with
    /// the page or is suppressed, or another body is stored under its
    /// (rev, tid). A deletion or suppression made after this read and before
    /// the render's INSERT still hides it: it is later than the 201.
    async fn write_check(&self, domain: &Domain, title: &Title, id: RenderId, body_hash: i64) -> Result<bool, PagesError> {
        let mut wanted = vec![col::BODY_HASH];
        wanted.extend(PageStatics::COLUMNS);
        let page = self.store.read(&ReadQuery::new(&PAGE_RENDERS, key(domain, title)).first(1).columns(wanted)).await?;
        let statics = PageStatics::of(page.statics.as_ref());
        if statics.deleted(id.rev) {
            let through = statics.deleted_through_rev.map_or(0, RevId::get);
            return Err(PagesError::Refused {
                kind: Refusal::PageDeleted,
                detail: format!(
                    "{title} was deleted through revision {through}: a render of revision {} is not stored (a new revision re-creates the page)",
                    id.rev
                ),
            });
        }
        if statics.has_suppressed_revs && self.is_suppressed(domain, title, id.rev).await? {
            return Err(PagesError::Refused {
                kind: Refusal::RevisionSuppressed,
                detail: format!("revision {} of {title} is suppressed: its renders are not stored", id.rev),
            });
        }
        let first = page.rows.first().map(|row| Ok::<_, PagesError>((render_id(row)?, row.bigint(col::BODY_HASH)))).transpose()?;
        let stored_hash = match first {
            Some((first, hash)) if first == id => Some(hash),
            // Behind the first row: it may be stored (a retry after a newer render).
            Some((first, _)) if first.is_newer_than(&id) => {
                let [d, t] = key(domain, title);
                let at = vec![d, t, Value::from(id.rev.as_i64()), Value::from(id.tid)];
                self.store.get(&PAGE_RENDERS, at, Some(vec![col::BODY_HASH])).await?.map(|row| row.bigint(col::BODY_HASH))
            }
            _ => None,
        };
        match stored_hash {
            None => Ok(false),
            // A row without a hash (none is written so) is taken as this render.
            Some(None) => Ok(true),
            Some(Some(hash)) if hash == body_hash => Ok(true),
            Some(Some(_)) => Err(PagesError::Refused {
                kind: Refusal::OtherBody,
                detail: format!(
                    "another body is stored as render {} of {title}: a render's (rev, tid) names one body; render again with a new tid",
                    id.etag()
                ),
            }),
        }
    }

    /// Renders stored at or before this time (microseconds) superseded
    /// whatever sorts behind them long enough ago to remove it.
    pub(crate) fn retention_cutoff(&self, now_micros: i64) -> i64 {
        now_micros - (self.grace + self.clock_skew).as_micros() as i64
    }

    /// The range deletes of every render older than `boundary` in `rows` (a
    /// page's keys, newest first, every one behind the boundary stored before
    /// the retention cutoff): `rev < boundary.rev`, and the renders of
    /// `boundary.rev` older than it — only where there is something there, so
    /// that a quiet page gathers no tombstones. Each is timestamped just after
    /// the newest write of the rows it removes, not now: a render stored
    /// after this sweep (a late write sorting behind the boundary, whatever
    /// its tid) carries a later timestamp and stays readable for its own
    /// grace period.
    pub(crate) fn behind(&self, domain: &Domain, title: &Title, boundary: RenderId, rows: &[Held]) -> Vec<Write> {
        let [d, t] = key(domain, title);
        let r = Value::from(boundary.rev.as_i64());
        let after_newest = |removed: &mut dyn Iterator<Item = &Held>| removed.map(|h| h.written_at() + 1).max();
        let mut deletes = Vec::new();
        if let Some(at) = after_newest(&mut rows.iter().filter(|h| h.id.rev < boundary.rev)) {
            let older = Slice::all().upper(Bound::Excluded(r.clone()));
            deletes.push(Delete::range(&PAGE_RENDERS, [d.clone(), t.clone()], older).timestamp(at).into());
        }
        if let Some(at) = after_newest(&mut rows.iter().filter(|h| h.id.rev == boundary.rev && boundary.is_newer_than(&h.id))) {
            let older = Slice::prefix([r]).upper(Bound::Excluded(Value::from(boundary.tid)));
            deletes.push(Delete::range(&PAGE_RENDERS, [d, t], older).timestamp(at).into());
        }
        deletes
    }

    /// The boundary render retention keeps, written again to go with the
    /// deletes behind it where the keyspaces span several sites: the same
    /// cells, at the earliest timestamp its own write can have carried (the
    /// start of its storing millisecond), so that a site which never
    /// received it (its hints lost in a long cut) receives it with the
    /// deletes, in one mutation of the partition, and is not left with no
    /// render of the page. Where the original is held it wins (its timestamp
    /// is the same or later); a suppression's or deletion's tombstone is
    /// later than both. `None` when the row is no longer there to carry.
    pub(crate) async fn carried(&self, domain: &Domain, title: &Title, boundary: Held) -> Result<Option<Write>, PagesError> {
        let [d, t] = key(domain, title);
        let at = vec![d, t, Value::from(boundary.id.rev.as_i64()), Value::from(boundary.id.tid)];
        let Some(row) = self.store.get(&PAGE_RENDERS, at.clone(), Some(RENDER_CELLS.to_vec())).await? else { return Ok(None) };
        let render = RENDER_CELLS
            .iter()
            .filter_map(|column| row.get(column).filter(|v| !matches!(v, Value::Null)).map(|v| (*column, v.clone())))
            .fold(Upsert::new(&PAGE_RENDERS, at), |upsert, (column, value)| upsert.set(column, value));
        Ok(Some(render.timestamp(boundary.stored_at).into()))
    }

    fn outbox(&self, kind: &'static str, domain: &Domain, title: &Title, id: RenderId, payload: Vec<u8>) -> Upsert {
        let row = crate::outbox::queued(&self.store, crate::outbox::outbox_shard(self.store.site(), domain, title))
            .set(col::KIND, kind)
            .set(col::DOMAIN, domain.as_str())
            .set(col::TITLE, title.as_str())
            .set(col::REV, id.rev.as_i64())
            .set(col::TID, id.tid)
            .set(col::PAYLOAD, payload)
            .set(col::ATTEMPTS, 0i64);
        // The delivery, maybe minutes later, continues the writer's trace.
        match revstore_telemetry::current_traceparent() {
            Some(traceparent) => row.set(col::TRACE, traceparent),
            None => row,
        }
    }

    /// Every render key of a page, newest first, a page of rows at a time (a
    /// page re-rendered all day can hold thousands).
    pub(crate) async fn all_held(&self, domain: &Domain, title: &Title, slice: Slice) -> Result<Vec<Held>, PagesError> {
        let query = ReadQuery::new(&PAGE_RENDERS, key(domain, title)).slice(slice).columns([col::STORED_AT]).limit(GRACE_PAGE);
        let rows: Vec<Row> = self.store.rows(query).try_collect().await?;
        rows.iter().map(held).collect()
    }

    /// The renders held for a title, newest first: the latest, then the
    /// superseded ones still held (their grace period, and until retention
    /// removes them).
    pub async fn held(&self, domain: &Domain, title: &Title) -> Result<Vec<HeldRender>, PagesError> {
        let (all, statics, suppressed) = tokio::try_join!(
            self.all_held(domain, title, Slice::all()),
            self.statics(domain, title),
            self.suppressed_revisions(domain, title)
        )?;
        let visible = all.into_iter().map(|h| h.id).filter(|id| !statics.deleted(id.rev) && !suppressed.contains(&id.rev));
        Ok(visible
            .into_iter()
            .enumerate()
            .map(|(i, id)| HeldRender {
                rev: id.rev.get(),
                tid: id.tid.to_string(),
                rendered_at: rendered_at(id.tid),
                held_in: if i == 0 { "current" } else { "grace" },
            })
            .collect())
    }

    /// Deletes the page through revision `through` (the page's newest
    /// revision as the wiki knows it) or, without it, through the newest
    /// revision held here: the page's fence (`deleted_through_rev`, a static
    /// cell), a range delete of its renders and the removal of its dump index
    /// row, all at [`fence_timestamp`] — later than any write of those
    /// revisions will carry, so that no retried, late or replayed write of
    /// them comes back, and earlier than the fence of a later deletion (a
    /// deletion through an older revision than the fence changes nothing).
    /// Writes of those revisions are refused from then on and reads pass
    /// them, old-store's fallback included; the render of a newer revision
    /// (the page re-created) is served. Answers the revision the page is
    /// deleted through (`None`: nothing was known of it, and only the index
    /// row was removed).
    ///
    /// A deletion that names its revision is one write, read nothing first,
    /// and reaches no further: a render of a newer revision — the page
    /// re-created while the deletion was in flight, or before a retried
    /// deletion job arrived — stays served. Through "the newest held", a
    /// deletion would read the page and then write its fence, and a render
    /// stored between the two would be neither deleted nor after the
    /// deletion.
    pub async fn delete(&self, domain: &Domain, title: &Title, through: Option<RevId>) -> Result<Option<RevId>, PagesError> {
        let through = match through {
            Some(named) => named,
            None => {
                let (newest_held, deleted_through) = self.newest_held_rev(domain, title).await?;
                let Some(through) = newest_held.max(deleted_through) else {
                    self.store.write(PAGE_INDEX.delete(domain, title, self.store.now_micros())).await?;
                    return Ok(None);
                };
                through
            }
        };
        let mut writes = deletion_writes(domain, title, through);
        writes.push(SUPPRESSIONS.deletion_record(domain, title, through));
        self.store.apply(writes).await?;
        if self.hand_off {
            // old-store's own routes stop serving the page's revisions too.
            let id = RenderId { rev: through, tid: Tid::now() };
            self.store.write(self.outbox("delete", domain, title, id, Vec::new())).await?;
        }
        Ok(Some(through))
    }

    /// The newest revision the page holds a row of, suppressed or not, and
    /// the revision it was deleted through before.
    async fn newest_held_rev(&self, domain: &Domain, title: &Title) -> Result<(Option<RevId>, Option<RevId>), PagesError> {
        let query = ReadQuery::new(&PAGE_RENDERS, key(domain, title)).first(1).columns([col::DELETED_THROUGH_REV]);
        let page = self.store.read(&query).await?;
        let deleted_through = PageStatics::of(page.statics.as_ref()).deleted_through_rev;
        Ok((found(page.rows.into_iter().next())?.map(|f| f.id.rev), deleted_through))
    }

    /// Hides a revision: the page flagged first (so that its latest read
    /// checks), then recorded as suppressed (checked on every read, so it is
    /// never served again, also not through the old-store fallback, and its
    /// renders are refused), its renders held here removed, and the
    /// suppression queued for old-store. Suppressing a hidden revision
    /// changes nothing.
    ///
    /// The renders are removed row by row, each just after its own write,
    /// not by a range: a render of the revision written after the
    /// suppression is lifted, by a clock behind this one, must not fall under
    /// a tombstone that covers every tid.
    pub async fn suppress(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<(), PagesError> {
        self.store.write(suppression_flag(key(domain, title))).await?;
        let at = SUPPRESSIONS.change(&self.store, domain, title, rev, Change::Suppress).await?;
        let of_rev = self.all_held(domain, title, Slice::prefix([Value::from(rev.as_i64())])).await?;
        let mut writes: Vec<Write> = of_rev
            .iter()
            .map(|h| {
                let clustering = [Value::from(h.id.rev.as_i64()), Value::from(h.id.tid)];
                Delete::row(&PAGE_RENDERS, key(domain, title), clustering).timestamp(h.written_at() + 1).into()
            })
            .collect();
        if self.hand_off {
            let id = RenderId { rev, tid: Tid::now() };
            writes.push(self.outbox("suppress", domain, title, id, crate::outbox::change_payload(at)).into());
        }
        for chunk in writes.chunks(SUPPRESSION_WRITES) {
            self.store.apply_in_stages(vec![chunk.to_vec()]).await?;
        }
        Ok(())
    }

    /// Lifts a revision's suppression (here and, through the outbox, in
    /// old-store): its renders written from now on are stored and served,
    /// and reads of it fall back to old-store again. The renders the
    /// suppression removed are gone from current-store. Lifting a visible
    /// revision changes nothing.
    pub async fn lift_suppression(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<(), PagesError> {
        let at = SUPPRESSIONS.change(&self.store, domain, title, rev, Change::Lift).await?;
        if self.hand_off {
            let id = RenderId { rev, tid: Tid::now() };
            self.store.write(self.outbox("lift", domain, title, id, crate::outbox::change_payload(at))).await?;
        }
        Ok(())
    }
}

/// What a page's static cells say to a reader.
#[derive(Debug, Clone, Copy, Default)]
struct PageStatics {
    /// A revision of the page is (or was) suppressed: readers check `suppressed`.
    has_suppressed_revs: bool,
    /// The page was deleted through this revision: none up to it is served.
    deleted_through_rev: Option<RevId>,
}

impl PageStatics {
    const COLUMNS: [&'static str; 2] = [col::HAS_SUPPRESSED_REVS, col::DELETED_THROUGH_REV];

    fn of(statics: Option<&Row>) -> PageStatics {
        PageStatics {
            has_suppressed_revs: statics.and_then(|s| s.boolean(col::HAS_SUPPRESSED_REVS)).unwrap_or(false),
            deleted_through_rev: statics.and_then(|s| s.bigint(col::DELETED_THROUGH_REV)).and_then(|r| RevId::new(r as u64).ok()),
        }
    }

    /// Whether `rev` was deleted with the page.
    fn deleted(&self, rev: RevId) -> bool {
        self.deleted_through_rev.is_some_and(|through| rev <= through)
    }
}

/// The cells a render's write sets (its key aside).
const RENDER_CELLS: [&str; 6] = [col::STORED_AT, col::BODY_HASH, col::HTML, col::DATA_PARSOID, col::SECTION_OFFSETS, col::STORED_BYTES];

/// A render's row with `stored_bytes`: its size as the storage audit counts
/// it ([`row_bytes`], that cell included), so that retention and the audit's
/// ideal read it instead of the row's parts.
fn with_stored_bytes(render: Upsert) -> Upsert {
    let mut cells: Vec<(&'static str, Value)> = vec![(col::REV, render.key[2].clone()), (col::TID, render.key[3].clone())];
    cells.extend(render.cells.iter().cloned());
    cells.push((col::STORED_BYTES, Value::from(0i64)));
    let bytes = row_bytes(&PAGE_RENDERS, &Row::new(cells)) as i64;
    render.set(col::STORED_BYTES, bytes)
}

/// A render's key as a page's listing holds it, with when it was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub id: RenderId,
    /// Microseconds since the epoch.
    pub stored_at: i64,
}

impl Held {
    /// The newest timestamp the row's cells can carry: its storing time, to
    /// the end of the millisecond `stored_at` keeps (rows written before
    /// writes were timestamped when stored carry their tid's time, which can
    /// be later).
    pub fn written_at(&self) -> i64 {
        (self.stored_at + 999).max(self.id.tid.unix_micros())
    }
}

pub(crate) fn held(row: &Row) -> Result<Held, PagesError> {
    let id = render_id(row)?;
    // A row without a storing time (none is written so) counts as stored at its render time.
    let stored_at = row.timestamp(col::STORED_AT).map_or(id.tid.unix_micros(), |ms| ms * 1000);
    Ok(Held { id, stored_at })
}

/// The content columns of a read (the key columns always come back).
fn content_columns(columns: &[&'static str]) -> Vec<&'static str> {
    columns.iter().copied().filter(|c| *c != col::TID && *c != col::REV).collect()
}

pub(crate) fn found(row: Option<Row>) -> Result<Option<Found>, PagesError> {
    row.map(|row| Ok(Found { id: render_id(&row)?, row })).transpose()
}

fn check_preconditions(pre: &Preconditions, latest: Option<RenderId>) -> Result<(), PagesError> {
    if let Some(expected) = &pre.if_match {
        let matches = match latest {
            None => false,
            Some(id) => expected.trim() == "*" || expected.split(',').any(|e| e.trim().trim_start_matches("W/") == id.etag()),
        };
        if !matches {
            let now = latest.map_or_else(|| "no render".to_owned(), |id| id.etag());
            return Err(PagesError::PreconditionFailed(format!("If-Match {expected} does not match the latest render ({now})")));
        }
    }
    if let (Some(since), Some(id)) = (pre.if_unmodified_since, latest)
        && id.tid.time() > since + Duration::from_secs(1)
    {
        return Err(PagesError::PreconditionFailed(format!(
            "the latest render ({}) is newer than If-Unmodified-Since",
            rendered_at(id.tid)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(revstore_keys::rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        assert_eq!(revstore_keys::rfc3339(UNIX_EPOCH + Duration::from_micros(1_764_494_400_123_456)), "2025-11-30T09:20:00.123456Z");
        assert_eq!(revstore_keys::rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00.000000Z");
    }
}
