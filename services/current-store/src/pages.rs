//! current-store's model of a page, over the `Store`: where renders live,
//! which one wins, and what a write must do so that precedence and the grace
//! period hold whatever order writes arrive in.
//!
//! Tables (seed 000, option 1b with copy-on-update):
//! - `current` (domain, title) → rev DESC: the latest render of each revision
//!   still held, usually one. Its cells are written with the tid's time as
//!   write timestamp, so re-renders of one revision resolve by render time; a
//!   new revision's write carries a range delete of the older revisions.
//! - `by_tid` (domain, title, rev, tid): every render, kept for the grace TTL.
//!   A render is written there when it is stored, and the render it supersedes
//!   is copied there again, so any render a reader saw stays retrievable for
//!   the grace TTL after it was superseded (the VisualEditor contract), with no
//!   flag from the client.
//! - `renders` (domain, title) → rev DESC, tid DESC: the index of the renders
//!   in `by_tid`; the newest tid of a revision there is its latest render in
//!   the grace period. It shares `current`'s partition key, so a render's
//!   index rows and its `current` row are one mutation.
//! - `by_rev`: held a copy of each revision's latest render until issue #17;
//!   no longer written or read (the index and `by_tid` answer), empty one
//!   grace TTL after an upgrade; still in the schema (5) until a change drops it.
//! - `suppressed`: revisions never to be served again.
//! - `outbox`: hand-offs to old-store (and change notices to the dependency
//!   graph), written before the render becomes visible.

use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use revstore_keys::{Domain, RevId, Tid, Title, composite_key_bytes, murmur3_token};
use revstore_schema::tables::current_store::{BY_REV, BY_TID, CURRENT, OUTBOX, RENDERS, SUPPRESSED, col};
use revstore_storage::{Delete, ReadQuery, Row, Slice, Store, Upsert, Value, Write};

use crate::error::PagesError;

/// Grace-period renders read per page.
const GRACE_PAGE: u32 = 1000;
use crate::render::{RenderBody, RenderId, StoredParts};

/// Outbox rows are spread over this many partitions.
pub const OUTBOX_SHARDS: i64 = 16;

/// A render found in storage, with the stored parts that were asked for.
#[derive(Debug, Clone)]
pub struct Found {
    pub id: RenderId,
    pub row: Row,
}

/// A render's rows for the grace period (see [`Pages::grace_copy`]).
pub(crate) struct GraceCopy {
    pub content: Write,
    pub index: Write,
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
    /// Queue the first render of each revision for old-store.
    pub hand_off: bool,
    /// Queue a change notice for the dependency graph on each new revision.
    pub notify_graph: bool,
}

fn key(domain: &Domain, title: &Title) -> [Value; 2] {
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
    fn grace_secs(&self) -> u32 {
        self.grace.as_secs().clamp(1, u32::MAX as u64) as u32
    }

    pub async fn is_suppressed(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<bool, PagesError> {
        let [d, t] = key(domain, title);
        Ok(self.store.get(&SUPPRESSED, vec![d, t, Value::from(rev.as_i64())], Some(vec![col::SUPPRESSED_AT])).await?.is_some())
    }

    /// The latest render of the latest revision.
    pub async fn latest(&self, domain: &Domain, title: &Title, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let query = ReadQuery::new(&CURRENT, key(domain, title)).limit(1).columns(columns.iter().copied());
        let page = self.store.read(&query).await?;
        match page.rows.into_iter().next() {
            Some(row) => Ok(Some(Found { id: render_id(&row)?, row })),
            None => Ok(None),
        }
    }

    /// The latest render of a revision: the newer of its row in `current` (while
    /// the revision is held there) and its newest render in the grace period.
    /// Both are read: a `current` row of an older revision can outlive the
    /// range delete that should have removed it (that delete carries an
    /// earlier write time), while the grace tables received the revision's
    /// newer renders.
    pub async fn of_rev(&self, domain: &Domain, title: &Title, rev: RevId, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let (suppressed, found) = tokio::try_join!(self.is_suppressed(domain, title, rev), self.find_rev(domain, title, rev, columns))?;
        Ok(found.filter(|_| !suppressed))
    }

    /// [`Pages::of_rev`] without the suppression check: the newer of the
    /// revision's row in `current` and its newest render in the grace index.
    async fn find_rev(&self, domain: &Domain, title: &Title, rev: RevId, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
        let [d, t] = key(domain, title);
        let r = Value::from(rev.as_i64());
        let newest_in_grace = ReadQuery::new(&RENDERS, [d.clone(), t.clone()]).slice(Slice::prefix([r.clone()])).limit(1);
        let (in_current, in_grace) = tokio::try_join!(
            self.store.get(&CURRENT, vec![d.clone(), t.clone(), r.clone()], Some(columns.to_vec())),
            self.store.read(&newest_in_grace),
        )?;
        let in_current = in_current.map(|row| render_id(&row).map(|id| Found { id, row })).transpose()?;
        let grace_id = in_grace.rows.first().map(render_id).transpose()?;
        match (in_current, grace_id) {
            (Some(current), Some(grace)) if !grace.is_newer_than(&current.id) => Ok(Some(current)),
            (current, Some(grace)) => {
                // The index row is written after its `by_tid` row; should that one
                // have expired a moment earlier, `current`'s row still answers.
                let found = self.find_tid(domain, title, rev, grace.tid, columns).await?;
                Ok(found.or(current))
            }
            (current, None) => Ok(current),
        }
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
        let r = Value::from(rev.as_i64());
        if let Some(row) = self.store.get(&CURRENT, vec![d.clone(), t.clone(), r.clone()], Some(columns.to_vec())).await?
            && row.timeuuid(col::TID) == Some(tid.uuid())
        {
            return Ok(Some(Found { id: render_id(&row)?, row }));
        }
        let by_tid_columns: Vec<&'static str> = columns.iter().copied().filter(|c| *c != col::TID).collect();
        match self.store.get(&BY_TID, vec![d, t, r, Value::from(tid)], Some(by_tid_columns)).await? {
            Some(row) => Ok(Some(Found { id: render_id(&row)?, row })),
            None => Ok(None),
        }
    }

    /// Stores a render. See the module documentation for what is written where.
    ///
    /// The write path (docs/design/current-store-writes.md): two reads at once
    /// (suppression and the latest render), more only for a render that
    /// arrives after a newer one; then two stages of single-partition writes,
    /// no cross-partition batch. The first stage makes durable what must
    /// exist before the render is visible — its `by_tid` content, the copy of
    /// the render it supersedes, the hand-off and the change notice — and the
    /// second, one mutation of the page's partition key, makes it the latest
    /// and indexes both. Every write is idempotent (explicit keys and
    /// timestamps), so a failure between or within the stages leaves only
    /// unindexed `by_tid` rows that expire and a hand-off old-store takes as a
    /// duplicate, and the client's retry completes the write.
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
        let (suppressed, latest) = tokio::try_join!(
            self.is_suppressed(domain, title, id.rev),
            self.latest(domain, title, &[col::TID, col::HTML, col::DATA_PARSOID, col::SECTION_OFFSETS]),
        )?;
        if suppressed {
            return Err(PagesError::Suppressed { rev: id.rev.get(), title: title.to_string() });
        }
        check_preconditions(pre, latest.as_ref().map(|l| l.id))?;
        let becomes_latest = latest.as_ref().is_none_or(|l| id.is_newer_than(&l.id));
        let first_of_revision = if becomes_latest {
            // Newer than every render held: not stored yet (a write that failed
            // midway is written again), and its revision has a render already
            // only when it is the latest's.
            latest.as_ref().is_none_or(|l| l.id.rev != id.rev)
        } else {
            // It arrives after a newer render: it may be a retry of a stored one,
            // and its revision may have renders in the grace tables.
            if latest.as_ref().is_some_and(|l| l.id == id) || self.find_tid(domain, title, id.rev, id.tid, &[col::TID]).await?.is_some() {
                return Ok(PutOutcome::AlreadyStored);
            }
            self.find_rev(domain, title, id.rev, &[col::TID]).await?.is_none()
        };

        let parts = StoredParts::encode(body);
        let ts = id.tid.unix_micros();
        let [d, t] = key(domain, title);
        let copy = self.grace_copy(domain, title, id, &parts, ts);
        let mut durable_first: Vec<Write> = vec![copy.content];
        let mut becoming_visible: Vec<Write> = vec![copy.index];
        if becomes_latest {
            becoming_visible.push(
                Upsert::new(&CURRENT, [d.clone(), t.clone(), Value::from(id.rev.as_i64())])
                    .set(col::TID, id.tid)
                    .set(col::HTML, parts.html.clone())
                    .set(col::DATA_PARSOID, parts.data_parsoid.clone())
                    .set(col::SECTION_OFFSETS, parts.section_offsets.clone())
                    .timestamp(ts)
                    .into(),
            );
            if let Some(old) = &latest {
                // Copy-on-update: the superseded render's grace period starts now.
                let old_parts = StoredParts {
                    html: old.row.blob(col::HTML).unwrap_or_default().to_vec(),
                    data_parsoid: old.row.blob(col::DATA_PARSOID).unwrap_or_default().to_vec(),
                    section_offsets: old.row.blob(col::SECTION_OFFSETS).unwrap_or_default().to_vec(),
                };
                // Timestamped after both renders' own writes, so this copy (and
                // its fresh TTL) wins over the superseded render's first one
                // whichever writer's clock is ahead.
                let old_copy = self.grace_copy(domain, title, old.id, &old_parts, old.id.tid.unix_micros().max(ts) + 1);
                durable_first.push(old_copy.content);
                becoming_visible.push(old_copy.index);
                if id.rev > old.id.rev {
                    // Older revisions leave `current` with it (one partition, one
                    // batch). The delete is timestamped now (or the tid's time if
                    // later), so it also covers re-renders of older revisions made
                    // before this write; what a concurrent writer still adds is the
                    // janitor's.
                    let older = Slice::all().upper(std::ops::Bound::Excluded(Value::from(id.rev.as_i64())));
                    let now = self.store.now_micros();
                    becoming_visible.push(Delete::range(&CURRENT, [d.clone(), t.clone()], older).timestamp(ts.max(now)).into());
                }
            }
        }
        if first_of_revision && self.hand_off {
            durable_first.push(self.outbox("archive", domain, title, id, archive_payload(body)).into());
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
        self.store.apply_in_stages(vec![durable_first, becoming_visible]).await?;
        Ok(PutOutcome::Created)
    }

    /// A render's rows for the grace period, with the grace TTL from now: its
    /// content in `by_tid`, and its row in the `renders` index, which must be
    /// written after it (in a later stage, or the same transaction).
    fn grace_copy(&self, domain: &Domain, title: &Title, id: RenderId, parts: &StoredParts, timestamp: i64) -> GraceCopy {
        self.grace_copy_in(key(domain, title), id, parts, timestamp)
    }

    /// [`Pages::grace_copy`] for a title given by its stored key (domain, title).
    /// A render is copied when it is stored (`timestamp`: its tid's time) and
    /// again when superseded (after both renders' tids): the copies are
    /// ordered by tids, never by the writers' clocks, so the later copy's TTL
    /// (the grace period counted from the supersession) is the one kept.
    pub(crate) fn grace_copy_in(&self, [d, t]: [Value; 2], id: RenderId, parts: &StoredParts, timestamp: i64) -> GraceCopy {
        let (r, grace) = (Value::from(id.rev.as_i64()), self.grace_secs());
        GraceCopy {
            content: Upsert::new(&BY_TID, [d.clone(), t.clone(), r.clone(), Value::from(id.tid)])
                .set(col::HTML, parts.html.clone())
                .set(col::DATA_PARSOID, parts.data_parsoid.clone())
                .set(col::SECTION_OFFSETS, parts.section_offsets.clone())
                .ttl(grace)
                .timestamp(timestamp)
                .into(),
            index: Upsert::new(&RENDERS, [d, t, r, Value::from(id.tid)]).ttl(grace).timestamp(timestamp).into(),
        }
    }

    fn outbox(&self, kind: &'static str, domain: &Domain, title: &Title, id: RenderId, payload: Vec<u8>) -> Upsert {
        let row = Upsert::new(&OUTBOX, [Value::from(outbox_shard(domain, title)), Value::from(Tid::now())])
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

    /// Every grace-period render a query finds, a page at a time (a page
    /// re-rendered all day can hold thousands).
    async fn grace_renders(&self, query: ReadQuery) -> Result<Vec<Row>, PagesError> {
        Ok(self.store.rows(query.limit(GRACE_PAGE)).try_collect().await?)
    }

    /// The renders held for a title, newest first.
    pub async fn held(&self, domain: &Domain, title: &Title) -> Result<Vec<HeldRender>, PagesError> {
        let current = self.store.read(&ReadQuery::new(&CURRENT, key(domain, title)).columns([col::TID])).await?.rows;
        let grace = self.grace_renders(ReadQuery::new(&RENDERS, key(domain, title))).await?;
        let mut held: Vec<(RenderId, &'static str)> = Vec::new();
        for row in &current {
            held.push((render_id(row)?, "current"));
        }
        for row in &grace {
            let id = render_id(row)?;
            if !held.iter().any(|(h, _)| *h == id) {
                held.push((id, "grace"));
            }
        }
        let mut visible = Vec::with_capacity(held.len());
        for (id, held_in) in held {
            if !self.is_suppressed(domain, title, id.rev).await? {
                visible.push((id, held_in));
            }
        }
        visible.sort_by(|a, b| b.0.rev.cmp(&a.0.rev).then(b.0.tid.cmp(&a.0.tid)));
        Ok(visible
            .into_iter()
            .map(|(id, held_in)| HeldRender { rev: id.rev.get(), tid: id.tid.to_string(), rendered_at: rendered_at(id.tid), held_in })
            .collect())
    }

    /// Removes all of a page's content held here.
    pub async fn delete(&self, domain: &Domain, title: &Title) -> Result<(), PagesError> {
        let grace = self.grace_renders(ReadQuery::new(&RENDERS, key(domain, title))).await?;
        let ids = grace.iter().map(render_id).collect::<Result<Vec<_>, _>>()?;
        // After every write of what is held (a render's rows carry its tid's
        // time, a copy one past it), even renders whose tid is ahead of this
        // clock: the delete removes all of it.
        let at = ids.iter().map(|id| id.tid.unix_micros() + 2).fold(self.store.now_micros(), i64::max);
        let [d, t] = key(domain, title);
        let mut writes: Vec<Write> = vec![
            Delete::partition(&CURRENT, [d.clone(), t.clone()]).timestamp(at).into(),
            Delete::partition(&RENDERS, [d.clone(), t.clone()]).timestamp(at).into(),
        ];
        for id in ids {
            let r = Value::from(id.rev.as_i64());
            writes.push(Delete::partition(&BY_REV, [d.clone(), t.clone(), r.clone()]).timestamp(at).into());
            writes.push(Delete::partition(&BY_TID, [d.clone(), t.clone(), r, Value::from(id.tid)]).timestamp(at).into());
        }
        self.store.apply(writes).await?;
        Ok(())
    }

    /// Hides a revision: recorded as suppressed (checked on every read, so it is
    /// never served again, also not through the old-store fallback), its content
    /// removed here, and the suppression queued for old-store.
    pub async fn suppress(&self, domain: &Domain, title: &Title, rev: RevId) -> Result<(), PagesError> {
        let [d, t] = key(domain, title);
        let r = Value::from(rev.as_i64());
        let now_ms = revstore_keys::time::millis(self.store.now());
        let grace = self.grace_renders(ReadQuery::new(&RENDERS, key(domain, title)).slice(Slice::prefix([r.clone()]))).await?;
        let mut writes: Vec<Write> = vec![
            Upsert::new(&SUPPRESSED, [d.clone(), t.clone(), r.clone()]).set(col::SUPPRESSED_AT, Value::Timestamp(now_ms)).into(),
            Delete::row(&CURRENT, [d.clone(), t.clone()], [r.clone()]).into(),
            Delete::partition(&BY_REV, [d.clone(), t.clone(), r.clone()]).into(),
            Delete::range(&RENDERS, [d.clone(), t.clone()], Slice::prefix([r.clone()])).into(),
        ];
        for row in &grace {
            let id = render_id(row)?;
            writes.push(Delete::partition(&BY_TID, [d.clone(), t.clone(), r.clone(), Value::from(id.tid)]).into());
        }
        if self.hand_off {
            let id = RenderId { rev, tid: Tid::now() };
            writes.push(self.outbox("suppress", domain, title, id, Vec::new()).into());
        }
        self.store.apply(writes).await?;
        Ok(())
    }
}

/// The outbox shard of a page: every row of one page goes to one shard, in order.
pub fn outbox_shard(domain: &Domain, title: &Title) -> i64 {
    murmur3_token(&composite_key_bytes(&[domain.as_str().as_bytes(), title.as_str().as_bytes()])).rem_euclid(OUTBOX_SHARDS)
}

/// The body old-store's archive write takes, compressed: stored uncompressed,
/// it cost Cassandra more than its compression costs here
/// (docs/design/current-store-writes.md).
fn archive_payload(body: &RenderBody) -> Vec<u8> {
    let json = serde_json::to_vec(body).unwrap_or_default();
    revstore_codecs::Envelope::default().encode(&json, revstore_codecs::Compression::Zstd { level: 3 })
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
