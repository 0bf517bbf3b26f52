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
//! - `audit`: every table, held against entitled; in `current` a title is
//!   entitled to its latest row only.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use revstore_api::janitor::StepReport;
use revstore_schema::tables::current_store::{BY_REV, BY_TID, CURRENT, OUTBOX, OUTBOX_DEAD_LETTERS, RENDERS, SUPPRESSED, col};
use revstore_service::ApiError;
use revstore_service::janitor_admin::{AuditSweep, AuditedTable, Entitlement, Stepped, Sweep};
use revstore_storage::{Delete, ReadQuery, Row, ScanPosition, ScanQuery, ScannedPartition, Store, Value, Write, row_bytes};

use crate::pages::Pages;
use crate::render::StoredParts;

/// Rows of one title's `current` partition read per visit: one latest and
/// the leftovers behind it (normally none; a title with more is finished on
/// the next run).
const ROWS_PER_TITLE: u32 = 64;

/// The sweeps current-store offers the janitor.
pub fn sweeps(pages: &Pages) -> Vec<Arc<dyn Sweep>> {
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
    vec![Arc::new(Retention { pages: pages.clone() }), Arc::new(AuditSweep::new(store, audited))]
}

/// Moves rows of superseded revisions out of `current`.
#[derive(Debug)]
struct Retention {
    pages: Pages,
}

#[async_trait]
impl Sweep for Retention {
    fn task(&self) -> &'static str {
        "retention"
    }

    async fn step(&self, from: Option<Vec<u8>>, budget: u32, dry_run: bool) -> Result<Stepped, ApiError> {
        let store = &self.pages.store;
        let after = from.map(|b| ScanPosition::from_bytes(&b)).transpose()?;
        let scanned = store.scan_range(&ScanQuery::new(&CURRENT, budget).after(after)).await?;
        let mut report = StepReport { partitions: scanned.partitions.len() as u64, ..StepReport::default() };
        for partition in &scanned.partitions {
            let rows = store.read(&ReadQuery::new(&CURRENT, partition.key.clone()).limit(ROWS_PER_TITLE)).await?.rows;
            let leftovers = rows.get(1..).unwrap_or_default();
            if leftovers.is_empty() {
                continue;
            }
            report.rows += leftovers.len() as u64;
            report.bytes += leftovers.iter().map(|r| row_bytes(&CURRENT, r)).sum::<u64>();
            if !dry_run {
                store.apply(self.supersede(&partition.key, leftovers)?).await?;
            }
        }
        Ok(Stepped { report, next: scanned.next.map(|p| p.to_bytes()) })
    }
}

impl Retention {
    /// The batch that moves `leftovers` (rows of one title's `current`
    /// partition, older than its first row) into the grace tables.
    fn supersede(&self, title_key: &[Value], leftovers: &[Row]) -> Result<Vec<Write>, ApiError> {
        let [domain, title] =
            <[Value; 2]>::try_from(title_key.to_vec()).map_err(|_| ApiError::internal("a current partition key is not (domain, title)"))?;
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        let mut writes = Vec::new();
        for row in leftovers {
            let id = crate::pages::render_id(row).map_err(ApiError::from)?;
            let parts = StoredParts {
                html: row.blob(col::HTML).unwrap_or_default().to_vec(),
                data_parsoid: row.blob(col::DATA_PARSOID).unwrap_or_default().to_vec(),
                section_offsets: row.blob(col::SECTION_OFFSETS).unwrap_or_default().to_vec(),
            };
            writes.extend(self.pages.grace_copies_in([domain.clone(), title.clone()], id, &parts));
            // Timestamped after the row's own write (its render time), so the
            // delete wins over it whatever the clocks say.
            let delete =
                Delete::row(&CURRENT, title_key.to_vec(), [Value::from(id.rev.as_i64())]).timestamp(now.max(id.tid.unix_micros() + 1));
            writes.push(delete.into());
        }
        Ok(writes)
    }
}

/// In `current`, a title is entitled to its latest row.
#[derive(Debug)]
struct LatestOnly;

#[async_trait]
impl Entitlement for LatestOnly {
    async fn ideal(&self, store: &Store, partitions: &[ScannedPartition]) -> Result<(u64, u64), ApiError> {
        let queries = partitions.iter().map(|p| ReadQuery::new(&CURRENT, p.key.clone()).limit(1)).collect();
        let latest = store.read_many(queries).await?;
        let rows = latest.iter().filter(|rows| !rows.is_empty()).count() as u64;
        let bytes = latest.iter().filter_map(|rows| rows.first()).map(|r| row_bytes(&CURRENT, r)).sum();
        Ok((rows, bytes))
    }
}
