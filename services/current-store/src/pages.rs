//! current-store's model of a page, over the `Store`: where renders live,
//! which one wins, and what a write must do so that precedence and the grace
//! period hold whatever order writes arrive in.
//!
//! Tables (docs/design/current-store-writes.md):
//! - `page_renders` (domain, title) → rev DESC, tid DESC: every render of the
//!   page, with the time it was stored. The first row is the latest render
//!   (precedence is the clustering order, whatever order writes arrive in); a
//!   superseded render stays a row, so a reader who saw it can fetch it by
//!   (rev, tid), until it has been superseded for the grace period — then a
//!   later write of the page, or the janitor's retention sweep, range-deletes
//!   it. Nothing is copied when a render is superseded.
//! - `suppressed`: revisions never to be served again.
//! - `outbox`: hand-offs to old-store (and change notices to the dependency
//!   graph), written before the render becomes visible.
//! - `domain_pages`: the dump index, a row per page written with its first
//!   render.

use std::collections::BTreeMap;
use std::ops::Bound;
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

/// Render keys a write reads: enough to find the retention boundary of a
/// page re-rendered every few minutes; a page with more renders in its grace
/// period is left to the janitor's retention sweep.
pub(crate) const HEAD_ROWS: u32 = 64;
use crate::render::{RenderBody, RenderId, StoredParts};

/// `domain_pages`, the index of each domain's pages that dumps walk: a row
/// is written with a page's first render, timestamped with it, and removed
/// by the page's deletion (timestamped after its newest render).
pub(crate) const PAGE_INDEX: TitleIndex = TitleIndex { table: &DOMAIN_PAGES, identities: false };

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

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    /// The same render (revision and tid) was already stored: nothing changed.
    AlreadyStored,
}

/// Conditions a write must meet.
#[derive(Debug, Clone, Default)]
pub struct Preconditions {
    /// `If-Match`: the ETag of the latest render the writer based its render on.
    pub if_match: Option<String>,
    /// `If-Unmodified-Since`: no render of the page is newer than this.
    pub if_unmodified_since: Option<SystemTime>,
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

    /// The latest render of the latest revision: the page's first row.
    pub async fn latest(&self, domain: &Domain, title: &Title, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let query = ReadQuery::new(&PAGE_RENDERS, key(domain, title)).first(1).columns(content_columns(columns));
        found(self.store.read(&query).await?.rows.into_iter().next())
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

    /// Stores a render. See the module documentation for what is written where.
    ///
    /// The write path (docs/design/current-store-writes.md): at once, whether the revision is suppressed and the keys of the
    /// page's newest renders (no content); then, for a revision's first
    /// render, the hand-off (and the change notice), durable before the render
    /// can be seen; then one mutation of the page's partition: the render's row
    /// and the range deletes of every render superseded for longer than the
    /// grace period that the keys read show. Every write is idempotent
    /// (explicit keys and timestamps): a failure between the two leaves a
    /// hand-off old-store takes as a duplicate, and the client's retry
    /// completes the write.
    pub async fn put(
        &self,
        domain: &Domain,
        title: &Title,
        id: RenderId,
        body: &RenderBody,
        pre: &Preconditions,
    ) -> Result<PutOutcome, PagesError> {
        body.validate()?;
        id.tid.check_render_time(self.store.now())?;
        let (suppressed, head) = tokio::try_join!(self.is_suppressed(domain, title, id.rev), self.head(domain, title))?;
        if suppressed {
            return Err(PagesError::Suppressed { rev: id.rev.get(), title: title.to_string() });
        }
        check_preconditions(pre, head.first().map(|h| h.id))?;
        let head_is_whole = head.len() < HEAD_ROWS as usize;
        let beyond_head = !head_is_whole && head.last().is_some_and(|last| last.id.is_newer_than(&id));
        if head.iter().any(|h| h.id == id) || (beyond_head && self.find_tid(domain, title, id.rev, id.tid, &[]).await?.is_some()) {
            return Ok(PutOutcome::AlreadyStored);
        }
        let [d, t] = key(domain, title);
        let first_of_revision = match head.iter().any(|h| h.id.rev == id.rev) {
            true => false,
            false if beyond_head && head.last().is_some_and(|last| last.id.rev > id.rev) => {
                self.find_rev(domain, title, id.rev, &[]).await?.is_none()
            }
            false => true,
        };
        let becomes_latest = head.first().is_none_or(|latest| id.is_newer_than(&latest.id));

        let parts = StoredParts::encode(body);
        // The janitor's routine run visits the page once this render's
        // predecessor is due for removal.
        let mut durable_first: Vec<Write> = vec![journal(&self.store).entry(&[d.clone(), t.clone()])];
        // A page's first render (or its first since the page was deleted)
        // enters the dump index before it can be seen.
        if head.is_empty() {
            durable_first.push(PAGE_INDEX.row(domain, title, id.tid).into());
        }
        if first_of_revision && self.hand_off {
            durable_first.push(self.outbox("archive", domain, title, id, parts.handoff_payload()).into());
        }
        if first_of_revision && becomes_latest && self.notify_graph {
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
        let now = self.store.now_micros();
        let mut becoming_visible: Vec<Write> = vec![
            Upsert::new(&PAGE_RENDERS, [d, t, Value::from(id.rev.as_i64()), Value::from(id.tid)])
                .set(col::STORED_AT, Value::Timestamp(now / 1000))
                .set(col::HTML, parts.html)
                .set(col::DATA_PARSOID, parts.data_parsoid)
                .set(col::SECTION_OFFSETS, parts.section_offsets)
                .timestamp(id.tid.unix_micros())
                .into(),
        ];
        // Only a render that sorts above the boundary moves it: one that
        // arrives late, behind it, deletes nothing (and is not deleted here).
        if let Some(boundary) = retention_boundary(&head, self.retention_cutoff(now))
            && id.is_newer_than(&boundary)
        {
            becoming_visible.extend(self.behind(domain, title, boundary, &head, now));
        }
        self.store.apply_in_stages(vec![durable_first, becoming_visible]).await?;
        Ok(PutOutcome::Created)
    }

    /// Renders stored at or before this time (microseconds) superseded
    /// whatever sorts behind them long enough ago to remove it.
    pub(crate) fn retention_cutoff(&self, now_micros: i64) -> i64 {
        now_micros - (self.grace + self.clock_skew).as_micros() as i64
    }

    /// The keys of a page's newest renders, with when each was stored.
    async fn head(&self, domain: &Domain, title: &Title) -> Result<Vec<Held>, PagesError> {
        let query = ReadQuery::new(&PAGE_RENDERS, key(domain, title)).columns([col::STORED_AT]).first(HEAD_ROWS);
        self.store.read(&query).await?.rows.iter().map(held).collect()
    }

    /// The range deletes of every render older than `boundary` in `rows` (a
    /// page's keys, newest first): `rev < boundary.rev`, and the renders of
    /// `boundary.rev` older than it — only where there is something there, so
    /// that a quiet page gathers no tombstones. Timestamped `now`, after
    /// every deleted row's write (its tid's time, at most the boundary's storing time).
    pub(crate) fn behind(&self, domain: &Domain, title: &Title, boundary: RenderId, rows: &[Held], now: i64) -> Vec<Write> {
        let [d, t] = key(domain, title);
        let r = Value::from(boundary.rev.as_i64());
        let mut deletes = Vec::new();
        if rows.iter().any(|h| h.id.rev < boundary.rev) {
            let older = Slice::all().upper(Bound::Excluded(r.clone()));
            deletes.push(Delete::range(&PAGE_RENDERS, [d.clone(), t.clone()], older).timestamp(now).into());
        }
        if rows.iter().any(|h| h.id.rev == boundary.rev && boundary.is_newer_than(&h.id)) {
            let older = Slice::prefix([r]).upper(Bound::Excluded(Value::from(boundary.tid)));
            deletes.push(Delete::range(&PAGE_RENDERS, [d, t], older).timestamp(now).into());
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
    /// after every write of what is held (a row carries its tid's time), even
    /// renders whose tid is ahead of this clock.
    pub async fn delete(&self, domain: &Domain, title: &Title) -> Result<(), PagesError> {
        let at = match self.head(domain, title).await?.first() {
            Some(latest) => (latest.id.tid.unix_micros() + 1).max(self.store.now_micros()),
            None => self.store.now_micros(),
        };
        let writes: Vec<Write> =
            vec![Delete::partition(&PAGE_RENDERS, key(domain, title)).timestamp(at).into(), PAGE_INDEX.delete(domain, title, at).into()];
        self.store.apply(writes).await?;
        Ok(())
    }

    /// Hides a revision: recorded as suppressed (checked on every read, so it is
    /// never served again, also not through the old-store fallback), its
    /// renders removed here, and the suppression queued for old-store.
    pub async fn suppress(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<(), PagesError> {
        let [d, t] = key(domain, title);
        let r = Value::from(rev.as_i64());
        let now_ms = revstore_keys::time::millis(self.store.now());
        let of_rev = self.all_held(domain, title, Slice::prefix([r.clone()])).await?;
        let at = of_rev.iter().map(|h| h.id.tid.unix_micros() + 1).fold(self.store.now_micros(), i64::max);
        let mut writes: Vec<Write> = vec![
            Upsert::new(&SUPPRESSED, [d.clone(), t.clone(), r.clone()]).set(col::SUPPRESSED_AT, Value::Timestamp(now_ms)).into(),
            Delete::range(&PAGE_RENDERS, [d, t], Slice::prefix([r])).timestamp(at).into(),
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

pub(crate) fn held(row: &Row) -> Result<Held, PagesError> {
    let id = render_id(row)?;
    // A row without a storing time (none is written so) counts as stored at its render time.
    let stored_at = row.timestamp(col::STORED_AT).map_or(id.tid.unix_micros(), |ms| ms * 1000);
    Ok(Held { id, stored_at })
}

/// The newest render of `rows` (a page's keys, newest first) stored at or
/// before `cutoff`: every render older than it was superseded no later than
/// it was stored, so for longer than the grace period. None when no render
/// is that old, or when one stored after the cutoff sorts behind it (a late
/// write a reader may just have fetched: the janitor deletes such pages row
/// by row).
pub(crate) fn retention_boundary(rows: &[Held], cutoff: i64) -> Option<RenderId> {
    let at = rows.iter().position(|h| h.stored_at <= cutoff)?;
    rows[at + 1..].iter().all(|h| h.stored_at <= cutoff).then_some(rows[at].id)
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
