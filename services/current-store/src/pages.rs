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

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use revstore_keys::{Domain, RevId, Tid, Title};
use revstore_schema::tables::current_store::{DOMAIN_PAGES, PAGE_RENDERS, SUPPRESSED, col};
use revstore_service::dump::TitleIndex;
use revstore_service::janitor_admin::Journal;
use revstore_storage::{Delete, ReadQuery, Row, Slice, Store, Upsert, Value, Write};

use crate::error::PagesError;

/// Render keys read per page of a listing.
const GRACE_PAGE: u32 = 1000;

use crate::render::{RenderBody, RenderId, StoredParts};

/// `domain_pages`, the index of each domain's pages that dumps walk: a row
/// is written with each render, timestamped with it, and removed by the
/// page's deletion (timestamped after its newest render), so a render written
/// after a deletion brings it back.
pub(crate) const PAGE_INDEX: TitleIndex = TitleIndex { table: &DOMAIN_PAGES, identities: false };

/// The write time of a page's suppression flag (`has_suppressed_revs`):
/// later than any write will ever carry, so that no delete of the page (a
/// partition tombstone at its newest render's write) removes it, and a
/// render of a suppressed revision written after the page was deleted and
/// written again is still caught by the latest read.
const SUPPRESSION_FLAG_WRITTEN_AT: i64 = 1 << 62;

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

/// The revisions whose hand-off this instance has queued, each with the
/// oldest render tid it queued one for. A render of a revision here with a
/// tid no older queues none: a hand-off queued no later than its own render
/// is durable. Anything else queues one again — a revision whose first
/// render another instance wrote, a restart, an eviction, a render older
/// than any queued — and the outbox drops the repeat when an older render
/// of the revision is held (`outbox::repeats_an_earlier_row`); old-store takes any
/// that gets through as a no-op.
#[derive(Debug, Clone)]
pub struct HandedOff(Arc<quick_cache::sync::Cache<(Domain, Title, RevId), Tid>>);

/// Revisions remembered per instance, at about 100 bytes each.
const HANDED_OFF_REVISIONS: usize = 100_000;

impl Default for HandedOff {
    fn default() -> Self {
        HandedOff(Arc::new(quick_cache::sync::Cache::new(HANDED_OFF_REVISIONS)))
    }
}

impl HandedOff {
    /// Whether a render of this revision with this tid must queue a hand-off.
    fn needs(&self, revision: &(Domain, Title, RevId), tid: Tid) -> bool {
        self.0.get(revision).is_none_or(|queued| queued > tid)
    }

    /// A hand-off of this revision for a render with this tid is durable.
    fn queued(&self, revision: (Domain, Title, RevId), tid: Tid) {
        let oldest = self.0.get(&revision).map_or(tid, |queued| queued.min(tid));
        self.0.insert(revision, oldest);
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
    pub handed_off: HandedOff,
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
        let [d, t] = key(domain, title);
        Ok(self.store.get(&SUPPRESSED, vec![d, t, Value::from(rev.as_i64())], Some(vec![col::SUPPRESSED_AT])).await?.is_some())
    }

    /// The latest render of the latest revision: the page's first row, read
    /// with the page's suppression flag. On a flagged page (one with a
    /// suppressed revision, which a write does not check) the first render
    /// whose revision is not suppressed.
    pub async fn latest(&self, domain: &Domain, title: &Title, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let mut wanted = content_columns(columns);
        wanted.push(col::HAS_SUPPRESSED_REVS);
        let page = self.store.read(&ReadQuery::new(&PAGE_RENDERS, key(domain, title)).first(1).columns(wanted)).await?;
        let flagged = page.statics.as_ref().and_then(|s| s.boolean(col::HAS_SUPPRESSED_REVS)).unwrap_or(false);
        match found(page.rows.into_iter().next())? {
            Some(first) if flagged => self.first_not_suppressed(domain, title, first, columns).await,
            first => Ok(first),
        }
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
        let query = ReadQuery::new(&SUPPRESSED, key(domain, title)).columns([col::SUPPRESSED_AT]).limit(GRACE_PAGE);
        let rows: Vec<Row> = self.store.rows(query).try_collect().await?;
        Ok(rows.iter().filter_map(|r| r.bigint(col::REV)).filter_map(|r| RevId::new(r as u64).ok()).collect())
    }

    /// The latest render of a revision: the revision's first row.
    pub async fn of_rev(&self, domain: &Domain, title: &Title, rev: RevId, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let (suppressed, found) = tokio::try_join!(self.is_suppressed(domain, title, rev), self.find_rev(domain, title, rev, columns))?;
        Ok(found.filter(|_| !suppressed))
    }

    /// [`Pages::of_rev`] without the suppression check.
    async fn find_rev(&self, domain: &Domain, title: &Title, rev: RevId, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let query = ReadQuery::new(&PAGE_RENDERS, key(domain, title))
            .slice(Slice::prefix([Value::from(rev.as_i64())]))
            .first(1)
            .columns(content_columns(columns));
        found(self.store.read(&query).await?.rows.into_iter().next())
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
        let (suppressed, found) =
            tokio::try_join!(self.is_suppressed(domain, title, rev), self.find_tid(domain, title, rev, tid, columns))?;
        Ok(found.filter(|_| !suppressed))
    }

    /// [`Pages::of_tid`] without the suppression check.
    async fn find_tid(
        &self,
        domain: &Domain,
        title: &Title,
        rev: RevId,
        tid: Tid,
        columns: &[&'static str],
    ) -> Result<Option<Found>, PagesError> {
        let [d, t] = key(domain, title);
        let row =
            self.store.get(&PAGE_RENDERS, vec![d, t, Value::from(rev.as_i64()), Value::from(tid)], Some(content_columns(columns))).await?;
        found(row)
    }

    /// Stores a render without reading the page first (unless a
    /// precondition is sent). See the module documentation and
    /// docs/design/current-store-writes.md.
    ///
    /// Two stages. First, durable before the render can be seen: the page's
    /// journal entry (the janitor's retention sweep visits the page once the
    /// grace period has passed), its row in the dump index (so a page deleted
    /// and written again comes back), and — unless this instance has already
    /// queued one for the revision with a render no newer ([`HandedOff`]) —
    /// the revision's hand-off to old-store and its change notice. Then the
    /// render's row, one INSERT. Suppression is not checked: readers do. Nothing is deleted here: what the render supersedes stays
    /// for the grace period and is removed by the retention sweep. Every
    /// write is idempotent (explicit keys), so a retry after a failure
    /// anywhere completes the write, and a repeated write answers as the
    /// first did.
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
        // Timestamped when stored, not with the render's time: no delete made
        // before this write shadows it, whatever its tid (see `behind`).
        let now = self.store.now_micros();
        let mut durable_first: Vec<Write> =
            vec![journal(&self.store).entry(&[d.clone(), t.clone()]), PAGE_INDEX.row_written_at(domain, title, id.tid, now).into()];
        let revision = (domain.clone(), title.clone(), id.rev);
        let queue_hand_off = self.handed_off.needs(&revision, id.tid);
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
        // A suppressed revision's render is stored like any other and never
        // served (readers check suppression); its hand-off old-store skips.
        let render = Upsert::new(&PAGE_RENDERS, [d, t, Value::from(id.rev.as_i64()), Value::from(id.tid)])
            .set(col::STORED_AT, Value::Timestamp(now / 1000))
            .set(col::HTML, parts.html)
            .set(col::DATA_PARSOID, parts.data_parsoid)
            .set(col::SECTION_OFFSETS, parts.section_offsets)
            .timestamp(now);
        self.store.apply_in_stages(vec![durable_first, vec![render.into()]]).await?;
        if queue_hand_off {
            self.handed_off.queued(revision, id.tid);
        }
        Ok(())
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
        let all: Vec<RenderId> = self.all_held(domain, title, Slice::all()).await?.into_iter().map(|h| h.id).collect();
        let mut visible = Vec::with_capacity(all.len());
        let mut suppressed: BTreeMap<RevId, bool> = BTreeMap::new();
        for id in all {
            let hidden = match suppressed.get(&id.rev) {
                Some(hidden) => *hidden,
                None => *suppressed.entry(id.rev).or_insert(self.is_suppressed(domain, title, id.rev).await?),
            };
            if !hidden {
                visible.push(id);
            }
        }
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

    /// Removes all of a page's content held here: one partition tombstone,
    /// after every write of what is held (see [`Held::written_at`]), even
    /// one from a clock ahead of this one.
    pub async fn delete(&self, domain: &Domain, title: &Title) -> Result<(), PagesError> {
        let at = match self.latest(domain, title, &[col::STORED_AT]).await? {
            Some(latest) => (held(&latest.row)?.written_at() + 1).max(self.store.now_micros()),
            None => self.store.now_micros(),
        };
        let writes: Vec<Write> =
            vec![Delete::partition(&PAGE_RENDERS, key(domain, title)).timestamp(at).into(), PAGE_INDEX.delete(domain, title, at).into()];
        self.store.apply(writes).await?;
        Ok(())
    }

    /// Hides a revision: recorded as suppressed (checked on every read, so it is
    /// never served again, also not through the old-store fallback), the page
    /// flagged (so that its latest read checks), its renders removed here,
    /// and the suppression queued for old-store.
    pub async fn suppress(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<(), PagesError> {
        let [d, t] = key(domain, title);
        let r = Value::from(rev.as_i64());
        let now_ms = revstore_keys::time::millis(self.store.now());
        let of_rev = self.all_held(domain, title, Slice::prefix([r.clone()])).await?;
        let at = of_rev.iter().map(|h| h.written_at() + 1).fold(self.store.now_micros(), i64::max);
        let mut writes: Vec<Write> = vec![
            Upsert::new(&SUPPRESSED, [d.clone(), t.clone(), r.clone()]).set(col::SUPPRESSED_AT, Value::Timestamp(now_ms)).into(),
            Delete::range(&PAGE_RENDERS, [d, t], Slice::prefix([r])).timestamp(at).into(),
            suppression_flag(key(domain, title)).into(),
        ];
        if self.hand_off {
            let id = RenderId { rev, tid: Tid::now() };
            writes.push(self.outbox("suppress", domain, title, id, Vec::new()).into());
        }
        self.store.apply(writes).await?;
        Ok(())
    }
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
