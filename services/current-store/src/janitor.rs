//! current-store's sweeps for the janitor (see `revstore_service::janitor_admin`).
//!
//! - `retention`: all of it (a write deletes nothing): each page read whole,
//!   everything behind the newest render stored before the grace period
//!   began range-deleted (row by row where a late write, stored inside the
//!   grace period, sorts behind it), each delete timestamped just after the
//!   newest write it removes, so that a render stored after the sweep stands;
//!   where the keyspaces span several sites, the render kept goes with the
//!   deletes, so no site is left without it.
//! - `archive`: every revision current-store holds (the latest of each title,
//!   and the revisions of renders inside their grace period) is in old-store;
//!   one that is not (its hand-off lost: an outbox row deleted by hand, a
//!   restore) is sent again through old-store's API. Offered only when
//!   current-store has an old-store URL.
//! - `audit`: every table, held against entitled; in `page_renders` a page is
//!   entitled to its latest render and the renders superseded less than the
//!   grace period ago.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures_util::TryStreamExt;
use revstore_api::ArchiveBody;
use revstore_api::janitor::StepReport;
use revstore_api::janitor::Task;
use revstore_client::OldStoreClient;
use revstore_keys::{Domain, RevId, Title};
use revstore_schema::TableDef;
use revstore_schema::tables::current_store::{DOMAIN_PAGES, OUTBOX, OUTBOX_DEAD_LETTERS, OUTBOX_SHARDS, PAGE_RENDERS, SUPPRESSED, col};
use revstore_service::janitor_admin::{
    AuditSweep, AuditedTable, ChangedPages, Entitlement, EveryPage, PageVisit, Sweep, SweepError, stored_page,
};
use revstore_service::suppressions::{Hidden, HiddenSweep, Hiding, Suppressions};
use revstore_storage::{Delete, ReadQuery, Row, ScannedPartition, Slice, Store, Value, Write, row_bytes};

use crate::pages::{Held, Pages, held};
use crate::render::decode_part;

/// Rows of a page's partition read per request (a page is read whole, a
/// request at a time).
const ROWS_PER_PAGE: u32 = 256;

/// Archived revisions listed per call to old-store.
const ARCHIVE_LIST_PAGE: u32 = 1000;

/// The sweeps current-store offers the janitor.
/// `hand_off_wait`: how long after a revision's newest render the hand-off
/// check leaves it to the outbox. `late_margin`: how late a journal row may
/// land (the clock skew allowed and a storage write's timeout).
pub fn sweeps(pages: &Pages, old_store: Option<OldStoreClient>, hand_off_wait: Duration, late_margin: Duration) -> Vec<Arc<dyn Sweep>> {
    let store = pages.store.clone();
    let audited = vec![
        AuditedTable { table: &PAGE_RENDERS, entitlement: Some(Arc::new(OwedRenders { pages: pages.clone() })), scanned: true },
        AuditedTable::live(&DOMAIN_PAGES),
        AuditedTable::live(&SUPPRESSED),
        AuditedTable::live(&OUTBOX),
        AuditedTable::live(&OUTBOX_SHARDS),
        AuditedTable::live(&OUTBOX_DEAD_LETTERS),
    ];
    let audit = AuditSweep::new(store.clone(), audited);
    let journal = crate::pages::journal(&store);
    let retention = Arc::new(Retention { pages: pages.clone() });
    let mut sweeps: Vec<Arc<dyn Sweep>> = vec![
        Arc::new(HiddenSweep::new(store.clone(), Arc::new(HiddenHereAndInOldStore { pages: pages.clone(), old_store: old_store.clone() }))),
        Arc::new(EveryPage::new(store.clone(), retention.clone())),
        Arc::new(ChangedPages::new(&journal, retention, late_margin)),
        Arc::new(audit.from_nodes()),
        Arc::new(audit),
    ];
    if let Some(old_store) = old_store {
        let check = Arc::new(HandOffCheck { pages: pages.clone(), old_store, wait: hand_off_wait });
        sweeps.push(Arc::new(EveryPage::new(store, check.clone())));
        sweeps.push(Arc::new(ChangedPages::new(&journal, check, late_margin)));
    }
    sweeps
}

/// current-store's `hidden` task: what a page's suppression partition says
/// is hidden, written back here, then sent on to old-store with the times
/// current-store recorded (each suppression and lift, the deletion): the
/// backstop for a hand-off that never arrived (an outbox row lost, or
/// later than the delivery reads). Idempotent in old-store too: it records
/// the same times, and the newest of each wins.
#[derive(Debug)]
struct HiddenHereAndInOldStore {
    pages: Pages,
    old_store: Option<OldStoreClient>,
}

#[async_trait]
impl Hiding for HiddenHereAndInOldStore {
    fn suppressions(&self) -> Suppressions {
        self.pages.suppressions()
    }

    fn hiding_writes(&self, domain: &Domain, title: &Title, hidden: &Hidden) -> Vec<Write> {
        self.pages.hiding_writes(domain, title, hidden)
    }

    async fn forward(&self, domain: &Domain, title: &Title, hidden: &Hidden) -> Result<(), SweepError> {
        let Some(old_store) = &self.old_store else { return Ok(()) };
        let failed = |e: revstore_client::ClientError| SweepError::Dependency { service: "old-store", cause: e.to_string() };
        let (d, t) = (domain.as_str(), title.as_str());
        if let Some(through) = hidden.deleted_through {
            old_store.delete_page(d, t, through.get()).await.map_err(failed)?;
        }
        for &(rev, suppressed_at, lifted_at) in &hidden.changes {
            if let Some(at) = suppressed_at {
                old_store.suppress(d, t, rev.get(), Some(at)).await.map_err(failed)?;
            }
            if let Some(at) = lifted_at {
                old_store.lift_suppression(d, t, rev.get(), Some(at)).await.map_err(failed)?;
            }
        }
        Ok(())
    }
}

/// Range-deletes the renders superseded for longer than the grace period.
#[derive(Debug)]
struct Retention {
    pages: Pages,
}

#[async_trait]
impl PageVisit for Retention {
    fn task(&self) -> Task {
        Task::Retention
    }

    fn table(&self) -> &'static TableDef {
        &PAGE_RENDERS
    }

    /// A write supersedes the page's latest render; it is due for removal once
    /// the grace period and the clock-skew allowance have passed.
    fn due_after(&self) -> Duration {
        self.pages.grace + self.pages.clock_skew
    }

    async fn visit(&self, page: &[Value], dry_run: bool, report: &mut StepReport) -> Result<(), SweepError> {
        let store = &self.pages.store;
        let cutoff = self.pages.retention_cutoff(store.now_micros());
        let (domain, title) = stored_page(page)?;
        let (mut rows, flagged, deleted_through) = page_rows_and_statics(store, page).await?;
        if flagged || deleted_through.is_some() {
            // Renders of suppressed revisions (stored in the race with their
            // suppression) and of revisions deleted with the page are never
            // served, never a boundary, and go now.
            let suppressed = if flagged { self.pages.suppressed_revisions(&domain, &title).await? } else { Default::default() };
            let hidden_rev =
                |rev: revstore_keys::RevId| suppressed.contains(&rev) || deleted_through.is_some_and(|through| rev.as_i64() <= through);
            let (hidden, shown): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(h, _)| hidden_rev(h.id.rev));
            rows = shown;
            report.rows += hidden.len() as u64;
            report.bytes += hidden.iter().map(|(_, bytes)| bytes).sum::<u64>();
            if !dry_run && !hidden.is_empty() {
                let delete = |h: &Held| Delete::row(&PAGE_RENDERS, page.to_vec(), [Value::from(h.id.rev.as_i64()), Value::from(h.id.tid)]);
                store.apply(hidden.iter().map(|(h, _)| delete(h).timestamp(h.written_at() + 1).into()).collect()).await?;
            }
        }
        let Some(at) = rows.iter().position(|(h, _)| h.stored_at <= cutoff) else { return Ok(()) };
        // Behind the boundary, what was stored before the cutoff: a render
        // stored after it (a late write) may just have been fetched.
        let (behind, late): (Vec<_>, Vec<_>) = rows[at + 1..].iter().partition(|(h, _)| h.stored_at <= cutoff);
        if behind.is_empty() {
            return Ok(());
        }
        report.rows += behind.len() as u64;
        report.bytes += behind.iter().map(|(_, bytes)| bytes).sum::<u64>();
        if dry_run {
            return Ok(());
        }
        // Each delete timestamped just after the writes it removes (so a
        // render stored after this sweep stands, whatever its tid).
        let boundary = rows[at].0;
        let mut writes = if late.is_empty() {
            let held: Vec<Held> = behind.iter().map(|(h, _)| *h).collect();
            self.pages.behind(&domain, &title, boundary.id, &held)
        } else {
            let delete = |h: &Held| Delete::row(&PAGE_RENDERS, page.to_vec(), [Value::from(h.id.rev.as_i64()), Value::from(h.id.tid)]);
            behind.iter().map(|(h, _)| delete(h).timestamp(h.written_at() + 1).into()).collect()
        };
        // Across sites, the other site may lack the boundary (its write lost
        // with the hints of a long cut): it goes with the deletes, or no
        // delete goes.
        if store.site().count > 1 {
            let Some(carried) = self.pages.carried(&domain, &title, boundary).await? else { return Ok(()) };
            writes.push(carried);
        }
        store.apply(writes).await?;
        Ok(())
    }
}

/// Every row of a page's partition, newest first: its key, storing time and
/// bytes — read from `stored_bytes`, not from the parts.
async fn page_rows(store: &Store, key: &[Value]) -> Result<Vec<(Held, u64)>, SweepError> {
    let rows: Vec<Row> = store.rows(keys_and_sizes(key)).try_collect().await?;
    rows.iter().map(|row| Ok((held(row)?, stored_bytes(row)))).collect()
}

/// A read of a page's render keys, storing times and sizes.
fn keys_and_sizes(key: &[Value]) -> ReadQuery {
    ReadQuery::new(&PAGE_RENDERS, key.to_vec()).columns([col::STORED_AT, col::STORED_BYTES]).limit(ROWS_PER_PAGE)
}

/// A row's size as the audit counts it: `stored_bytes` (a row written
/// without one, as a test seeds, counts what was read of it).
fn stored_bytes(row: &Row) -> u64 {
    row.bigint(col::STORED_BYTES).map_or_else(|| row_bytes(&PAGE_RENDERS, row), |b| b.max(0) as u64)
}

/// [`page_rows`], whether the page is flagged as having a suppressed
/// revision, and the revision it was deleted through (read with its first rows).
async fn page_rows_and_statics(store: &Store, key: &[Value]) -> Result<(Vec<(Held, u64)>, bool, Option<i64>), SweepError> {
    let first = keys_and_sizes(key);
    let wanted = [col::STORED_AT, col::STORED_BYTES, col::HAS_SUPPRESSED_REVS, col::DELETED_THROUGH_REV];
    let mut query = Some(first.columns(wanted));
    let (mut rows, mut flagged, mut deleted_through) = (Vec::new(), false, None);
    while let Some(q) = query.take() {
        let page = store.read(&q).await?;
        if let Some(statics) = &page.statics {
            flagged |= statics.boolean(col::HAS_SUPPRESSED_REVS).unwrap_or(false);
            deleted_through = deleted_through.or(statics.bigint(col::DELETED_THROUGH_REV));
        }
        for row in &page.rows {
            rows.push((held(row)?, stored_bytes(row)));
        }
        query = page.next.map(|token| q.page_token(Some(token)));
    }
    Ok((rows, flagged, deleted_through))
}

/// A page is entitled to its latest render and to every render superseded
/// less than the grace period ago (with the clock-skew allowance): the
/// renders down to the newest one stored before that (the rows retention keeps).
#[derive(Debug)]
struct OwedRenders {
    pages: Pages,
}

#[async_trait]
impl Entitlement for OwedRenders {
    async fn ideal(&self, store: &Store, partitions: &[ScannedPartition]) -> Result<(u64, u64), SweepError> {
        let cutoff = self.pages.retention_cutoff(store.now_micros());
        let (mut rows, mut bytes) = (0, 0);
        for partition in partitions {
            let held = page_rows(store, &partition.key).await?;
            let owed = held.iter().position(|(h, _)| h.stored_at <= cutoff).map_or(held.len(), |at| at + 1);
            rows += owed as u64;
            bytes += held[..owed].iter().map(|(_, b)| b).sum::<u64>();
        }
        Ok((rows, bytes))
    }
}

/// Sends old-store the revisions it lacks.
#[derive(Debug)]
struct HandOffCheck {
    pages: Pages,
    old_store: OldStoreClient,
    /// `--hand-off-check-after`: a revision is left to the outbox this long.
    wait: Duration,
}

#[async_trait]
impl PageVisit for HandOffCheck {
    fn task(&self) -> Task {
        Task::Archive
    }

    fn table(&self) -> &'static TableDef {
        &PAGE_RENDERS
    }

    fn due_after(&self) -> Duration {
        self.wait
    }

    async fn visit(&self, page: &[Value], dry_run: bool, report: &mut StepReport) -> Result<(), SweepError> {
        let (domain, title) = stored_page(page)?;
        let held = self.held_revisions(&domain, &title).await?;
        let (Some(&first), Some(&last)) = (held.first(), held.last()) else { return Ok(()) };
        let archived = self.archived_revisions(&domain, &title, first, last).await?;
        for rev in held.into_iter().filter(|rev| !archived.contains(rev)) {
            let Some(found) =
                self.pages.of_rev(&domain, &title, rev, &[col::TID, col::HTML, col::DATA_PARSOID, col::SECTION_OFFSETS]).await?
            else {
                continue; // suppressed, or gone since it was listed
            };
            let body = archive_body(&found.row)?;
            report.rows += 1;
            report.bytes += body.html.as_ref().map_or(0, |h| h.len() as u64);
            if !dry_run {
                self.old_store
                    .archive(domain.as_str(), title.as_str(), rev.get(), &found.id.tid.to_string(), &body)
                    .await
                    .map_err(|e| SweepError::Dependency { service: "old-store", cause: e.to_string() })?;
            }
        }
        Ok(())
    }
}

impl HandOffCheck {
    /// The revisions held for a title, older than the hand-off wait, not
    /// suppressed, ascending.
    async fn held_revisions(&self, domain: &Domain, title: &Title) -> Result<Vec<RevId>, SweepError> {
        let store = &self.pages.store;
        let mut newest: BTreeMap<i64, i64> = BTreeMap::new();
        for h in self.pages.all_held(domain, title, Slice::all()).await? {
            let at = newest.entry(h.id.rev.as_i64()).or_insert(i64::MIN);
            *at = (*at).max(h.id.tid.unix_micros());
        }
        let settled_before = store
            .now()
            .checked_sub(self.wait)
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_micros() as i64);
        let mut held = Vec::new();
        for (rev, newest_render) in newest {
            let Ok(rev) = RevId::new(rev as u64) else { continue };
            if newest_render < settled_before && !self.pages.is_suppressed(domain, title, rev).await? {
                held.push(rev);
            }
        }
        Ok(held)
    }

    /// The revisions old-store has archived for the title between `first` and `last`.
    async fn archived_revisions(&self, domain: &Domain, title: &Title, first: RevId, last: RevId) -> Result<BTreeSet<RevId>, SweepError> {
        let mut archived = BTreeSet::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .old_store
                .revisions(domain.as_str(), title.as_str(), first.get(), ARCHIVE_LIST_PAGE, cursor.as_deref())
                .await
                .map_err(|e| SweepError::Dependency { service: "old-store", cause: e.to_string() })?;
            let past_last = page.items.last().is_some_and(|i| i.rev >= last.get());
            archived.extend(page.items.iter().filter_map(|i| RevId::new(i.rev).ok()));
            match page.next {
                Some(next) if !past_last => cursor = Some(next),
                _ => return Ok(archived),
            }
        }
    }
}

/// old-store's body for a stored render.
fn archive_body(row: &Row) -> Result<ArchiveBody, SweepError> {
    let part = |column: &str| -> Result<Vec<u8>, SweepError> { Ok(decode_part(row.blob(column).unwrap_or_default(), column)?) };
    let json = |column: &str| -> Result<Option<serde_json::Value>, SweepError> {
        let bytes = part(column)?;
        Ok(if bytes.is_empty() {
            None
        } else {
            Some(serde_json::from_slice(&bytes).map_err(|e| SweepError::corrupt(format!("stored {column}: {e}")))?)
        })
    };
    let html = String::from_utf8(part(col::HTML)?).map_err(|e| SweepError::corrupt(format!("stored html: {e}")))?;
    Ok(ArchiveBody {
        html: Some(html),
        data_parsoid: json(col::DATA_PARSOID)?,
        section_offsets: json(col::SECTION_OFFSETS)?,
        wikitext: None,
        page: None,
    })
}
