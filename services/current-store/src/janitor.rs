//! current-store's sweeps for the janitor (see `revstore_service::janitor_admin`).
//!
//! - `retention`: `current` should hold one row per title, the latest render.
//!   A write of a new revision range-deletes the older ones in the same batch,
//!   but two writers racing on one title can leave an older revision's row
//!   behind, and nothing would ever remove it on a quiet title (seed 003). The
//!   sweep moves each such row out the way a write supersedes a render: copied
//!   into the grace tables (its grace period starts now, so a reader who saw it
//!   can still fetch it) and deleted from `current`, in one logged batch.
//!   Everything else here expires by TTL; the janitor's purge call drops what
//!   the embedded engine still keeps of it.
//! - `archive`: every revision current-store holds (the latest of each title,
//!   and the revisions of renders inside their grace period) is in old-store;
//!   one that is not (its hand-off lost: an outbox row deleted by hand, a
//!   restore) is sent again through old-store's API. Offered only when
//!   current-store has an old-store URL.
//! - `audit`: every table, held against entitled; in `current` a title is
//!   entitled to its latest row only.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use revstore_api::ArchiveBody;
use revstore_api::janitor::StepReport;
use revstore_api::janitor::Task;
use revstore_client::OldStoreClient;
use revstore_keys::{Domain, FirstLetterCase, RevId, Title, TitleRules};
use revstore_schema::tables::current_store::{BY_REV, BY_TID, CURRENT, OUTBOX, OUTBOX_DEAD_LETTERS, RENDERS, SUPPRESSED, col};
use revstore_service::janitor_admin::{AuditSweep, AuditedTable, Entitlement, Stepped, Sweep, SweepError, SweepPosition};
use revstore_storage::{Delete, ReadQuery, Row, ScanQuery, ScannedPartition, Store, Value, Write, row_bytes};

use crate::pages::Pages;
use crate::render::{StoredParts, decode_part};

/// Rows of one title's `current` partition read per visit: one latest and
/// the leftovers behind it (normally none; a title with more is finished on
/// the next run).
const ROWS_PER_TITLE: u32 = 64;

/// Revisions whose newest render is younger than this are left to the outbox
/// (it delivers within seconds; sending them again would only be a repeat).
const HAND_OFF_MARGIN: Duration = Duration::from_secs(300);

/// Archived revisions listed per call to old-store.
const ARCHIVE_LIST_PAGE: u32 = 1000;

/// The sweeps current-store offers the janitor.
pub fn sweeps(pages: &Pages, old_store: Option<OldStoreClient>) -> Vec<Arc<dyn Sweep>> {
    let store = pages.store.clone();
    let audited = vec![
        AuditedTable { table: &CURRENT, entitlement: Some(Arc::new(LatestOnly)) },
        AuditedTable::live(&BY_REV),
        AuditedTable::live(&BY_TID),
        AuditedTable::live(&RENDERS),
        AuditedTable::live(&SUPPRESSED),
        AuditedTable::live(&OUTBOX),
        AuditedTable::live(&OUTBOX_DEAD_LETTERS),
    ];
    let mut sweeps: Vec<Arc<dyn Sweep>> = vec![Arc::new(Retention { pages: pages.clone() }), Arc::new(AuditSweep::new(store, audited))];
    if let Some(old_store) = old_store {
        sweeps.push(Arc::new(HandOffCheck { pages: pages.clone(), old_store }));
    }
    sweeps
}

/// Moves rows of superseded revisions out of `current`.
#[derive(Debug)]
struct Retention {
    pages: Pages,
}

#[async_trait]
impl Sweep for Retention {
    fn task(&self) -> Task {
        Task::Retention
    }

    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let store = &self.pages.store;
        let scanned = store.scan_range(&ScanQuery::new(&CURRENT, budget).after(from.after)).await?;
        let mut report = StepReport { partitions: scanned.partitions.len() as u64, ..StepReport::default() };
        // Every title of the step in one multi-partition read.
        let reads = scanned.partitions.iter().map(|p| ReadQuery::new(&CURRENT, p.key.clone()).limit(ROWS_PER_TITLE)).collect();
        let titles = store.read_many(reads).await?;
        for (partition, rows) in scanned.partitions.iter().zip(&titles) {
            let leftovers = rows.get(1..).unwrap_or_default();
            if leftovers.is_empty() {
                continue;
            }
            report.rows += leftovers.len() as u64;
            report.bytes += leftovers.iter().map(|r| row_bytes(&CURRENT, r)).sum::<u64>();
            if !dry_run {
                store.apply_in_stages(self.supersede(&partition.key, leftovers)?).await?;
            }
        }
        Ok(Stepped { report, next: scanned.next.map(|p| SweepPosition::in_pass(0, Some(p))) })
    }
}

impl Retention {
    /// The writes that move `leftovers` (rows of one title's `current`
    /// partition, older than its first row) into the grace tables, in the
    /// write path's order: the `by_tid` copies, then their index rows with the
    /// deletes from `current` (one mutation of the title's partition key).
    fn supersede(&self, title_key: &[Value], leftovers: &[Row]) -> Result<Vec<Vec<Write>>, SweepError> {
        let [domain, title] = <[Value; 2]>::try_from(title_key.to_vec())
            .map_err(|_| SweepError::corrupt("a current partition key is not (domain, title)"))?;
        let now = self.pages.store.now_micros();
        let (mut contents, mut moves) = (Vec::new(), Vec::new());
        for row in leftovers {
            let id = crate::pages::render_id(row)?;
            let parts = StoredParts {
                html: row.blob(col::HTML).unwrap_or_default().to_vec(),
                data_parsoid: row.blob(col::DATA_PARSOID).unwrap_or_default().to_vec(),
                section_offsets: row.blob(col::SECTION_OFFSETS).unwrap_or_default().to_vec(),
            };
            // Timestamped after the row's own write and its first grace copy
            // (both at its render time), so the delete and this copy win over
            // them whatever the clocks say.
            let at = now.max(id.tid.unix_micros() + 1);
            let copy = self.pages.grace_copy_in([domain.clone(), title.clone()], id, &parts, at);
            contents.push(copy.content);
            moves.push(copy.index);
            let delete = Delete::row(&CURRENT, title_key.to_vec(), [Value::from(id.rev.as_i64())]).timestamp(at);
            moves.push(delete.into());
        }
        Ok(vec![contents, moves])
    }
}

/// In `current`, a title is entitled to its latest row.
#[derive(Debug)]
struct LatestOnly;

#[async_trait]
impl Entitlement for LatestOnly {
    async fn ideal(&self, store: &Store, partitions: &[ScannedPartition]) -> Result<(u64, u64), SweepError> {
        let queries = partitions.iter().map(|p| ReadQuery::new(&CURRENT, p.key.clone()).limit(1)).collect();
        let latest = store.read_many(queries).await?;
        let rows = latest.iter().filter(|rows| !rows.is_empty()).count() as u64;
        let bytes = latest.iter().filter_map(|rows| rows.first()).map(|r| row_bytes(&CURRENT, r)).sum();
        Ok((rows, bytes))
    }
}

/// Sends old-store the revisions it lacks.
#[derive(Debug)]
struct HandOffCheck {
    pages: Pages,
    old_store: OldStoreClient,
}

#[async_trait]
impl Sweep for HandOffCheck {
    fn task(&self) -> Task {
        Task::Archive
    }

    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let store = &self.pages.store;
        let scanned = store.scan_range(&ScanQuery::new(&CURRENT, budget).after(from.after)).await?;
        let mut report = StepReport { partitions: scanned.partitions.len() as u64, ..StepReport::default() };
        for partition in &scanned.partitions {
            let (domain, title) = stored_page(&partition.key)?;
            let held = self.held_revisions(&domain, &title).await?;
            let (Some(&first), Some(&last)) = (held.first(), held.last()) else { continue };
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
        }
        Ok(Stepped { report, next: scanned.next.map(|p| SweepPosition::in_pass(0, Some(p))) })
    }
}

impl HandOffCheck {
    /// The revisions held for a title (in `current` and in the grace index),
    /// older than the hand-off margin, not suppressed, ascending.
    async fn held_revisions(&self, domain: &Domain, title: &Title) -> Result<Vec<RevId>, SweepError> {
        let key = [Value::from(domain.as_str()), Value::from(title.as_str())];
        let store = &self.pages.store;
        let mut newest: BTreeMap<i64, i64> = BTreeMap::new();
        // `current`'s tid is a cell, the grace index's part of its key.
        let latest = ReadQuery::new(&CURRENT, key.clone()).columns([col::TID]).limit(ARCHIVE_LIST_PAGE);
        let in_grace = ReadQuery::new(&RENDERS, key.clone()).limit(ARCHIVE_LIST_PAGE);
        for query in [latest, in_grace] {
            let rows = store.read(&query).await?.rows;
            for row in &rows {
                let id = crate::pages::render_id(row)?;
                let at = newest.entry(id.rev.as_i64()).or_insert(i64::MIN);
                *at = (*at).max(id.tid.unix_micros());
            }
        }
        let settled_before = store
            .now()
            .checked_sub(HAND_OFF_MARGIN)
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

/// The domain and title of a stored page key (domain, title), as stored.
fn stored_page(key: &[Value]) -> Result<(Domain, Title), SweepError> {
    let text = |i: usize| match key.get(i) {
        Some(Value::Text(t)) => Ok(t.as_str()),
        _ => Err(SweepError::corrupt("a current partition key is not (domain, title)")),
    };
    let domain = Domain::parse(text(0)?).map_err(SweepError::corrupt)?;
    // Stored titles are normalised already; case-sensitive rules keep them as they are.
    let title = Title::parse(text(1)?, TitleRules { first_letter: FirstLetterCase::Sensitive }).map_err(SweepError::corrupt)?;
    Ok((domain, title))
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
    })
}
