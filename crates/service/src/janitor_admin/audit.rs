//! The `audit` task every service offers: table by table, what the engine
//! holds against what readers are entitled to, and how reads of it fare on
//! the storage nodes (tombstones per read, the largest partition).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use revstore_api::janitor::{Scope, StepReport, TableAudit, Task};
use revstore_schema::TableDef;
use revstore_storage::{DiskUsage, ReadHealth, ScanPosition, ScanQuery, ScannedPartition, Store, TokenRange};

use super::sweep::{Stepped, Sweep, SweepError, SweepPosition};

/// What readers are entitled to in a table, when that is less than all of its
/// live data (current-store's `current` holds one latest render per title;
/// older rows there are the janitor's to move out).
#[async_trait]
pub trait Entitlement: Send + Sync + 'static {
    /// Rows and value bytes readers are entitled to in these live partitions.
    async fn ideal(&self, store: &Store, partitions: &[ScannedPartition]) -> Result<(u64, u64), SweepError>;
}

/// An audited table, and what of it readers are entitled to (`None`: all of
/// its live data: rows inside their TTL, undelivered hand-offs, edges…).
#[derive(Clone)]
pub struct AuditedTable {
    pub table: &'static TableDef,
    pub entitlement: Option<Arc<dyn Entitlement>>,
    /// Whether the audit reads its rows. A work table whose rows are deleted
    /// as they are worked off (compaction debt) is reported from the nodes
    /// only (disk, tombstones per read, largest partition): a scan of it
    /// would step over every deletion `gc_grace_seconds` still keeps.
    pub scanned: bool,
}

impl std::fmt::Debug for AuditedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditedTable")
            .field("table", &self.table.name)
            .field("all_live_data_entitled", &self.entitlement.is_none())
            .finish()
    }
}

impl AuditedTable {
    pub fn live(table: &'static TableDef) -> Self {
        AuditedTable { table, entitlement: None, scanned: true }
    }

    /// A work table, reported from the nodes only (see [`AuditedTable::scanned`]).
    pub fn unscanned(table: &'static TableDef) -> Self {
        AuditedTable { table, entitlement: None, scanned: false }
    }
}

/// The `audit` task: table by table, what the engine holds (see
/// [`Store::holdings`]) against what readers are entitled to. Changes nothing.
/// In a routine run (scope `changed`) it reads no table, only what the nodes
/// report of each (disk, tombstones per read, the largest partition): a count
/// of what the engine holds reads the whole wiki.
#[derive(Debug)]
pub struct AuditSweep {
    store: Store,
    tables: Vec<AuditedTable>,
    scope: Scope,
}

impl AuditSweep {
    pub fn new(store: Store, tables: Vec<AuditedTable>) -> Self {
        AuditSweep { store, tables, scope: Scope::All }
    }

    /// The same tables reported from the nodes only: the routine run's audit.
    pub fn from_nodes(&self) -> Self {
        let tables = self.tables.iter().map(|t| AuditedTable { scanned: false, ..t.clone() }).collect();
        AuditSweep { store: self.store.clone(), tables, scope: Scope::Changed }
    }
}

#[async_trait]
impl Sweep for AuditSweep {
    fn task(&self) -> Task {
        Task::Audit
    }

    fn scope(&self) -> Scope {
        self.scope
    }

    /// One pass per table, in their order.
    async fn step(&self, from: SweepPosition, budget: u32, _dry_run: bool) -> Result<Stepped, SweepError> {
        let (index, after) = (from.pass, from.after);
        let Some(audited) = self.tables.get(index) else { return Ok(Stepped::default()) };
        let table = audited.table;
        let next_table = || (index + 1 < self.tables.len()).then(|| SweepPosition::start_of(index + 1));
        if !audited.scanned {
            let audit = self.with_node_figures(table, TableAudit::default()).await;
            let report = StepReport { tables: BTreeMap::from([(table.name.to_owned(), audit)]), ..StepReport::default() };
            return Ok(Stepped { report, next: next_table() });
        }
        let held = self.store.holdings(&ScanQuery::new(table, budget).after(after.clone())).await?;
        let (rows_ideal, bytes_ideal) = match &audited.entitlement {
            None => (held.rows_live, held.bytes_live),
            Some(entitlement) => {
                let partitions = live_partitions_through(&self.store, table, after, held.next.as_ref(), budget).await?;
                entitlement.ideal(&self.store, &partitions).await?
            }
        };
        let audit = TableAudit {
            partitions: held.partitions,
            rows_held: held.rows_held,
            bytes_held: held.bytes_held,
            rows_ideal,
            bytes_ideal,
            ..TableAudit::default()
        };
        // The nodes' figures are the whole table's: given once, by the step that ends its pass.
        let audit = if held.next.is_none() { self.with_node_figures(table, audit).await } else { audit };
        let next = match &held.next {
            Some(position) => Some(SweepPosition::in_pass(index, Some(position.clone()))),
            None => next_table(),
        };
        let report =
            StepReport { partitions: held.partitions, tables: BTreeMap::from([(table.name.to_owned(), audit)]), ..StepReport::default() };
        Ok(Stepped { report, next })
    }
}

impl AuditSweep {
    /// `counts` with what the nodes report of the whole table: its disk, and
    /// how reads of it fare.
    async fn with_node_figures(&self, table: &'static TableDef, counts: TableAudit) -> TableAudit {
        let (on_disk, health) = (self.disk_usage(table).await, self.read_health(table).await);
        TableAudit {
            bytes_on_disk: on_disk.map(|d| d.bytes),
            disk_resolution_bytes: on_disk.map(|d| d.resolution),
            tombstones_per_read_p99: health.map(|h| h.tombstones_per_read_p99),
            tombstones_per_read_max: health.map(|h| h.tombstones_per_read_max),
            largest_partition_bytes: health.map(|h| h.largest_partition_bytes),
            ..counts
        }
    }

    /// What the storage keeps on disk for the table, when the engine reports
    /// it. A node that does not answer leaves the figure unknown for this run
    /// (`null` in the summary) rather than failing the audit of what the
    /// readers see.
    async fn disk_usage(&self, table: &'static TableDef) -> Option<DiskUsage> {
        match self.store.disk_usage(table).await {
            Ok(usage) => usage,
            Err(e) => {
                tracing::warn!(table = table.name, error = %e, "the storage did not report the table's disk usage; the audit goes on without it");
                None
            }
        }
    }

    /// How reads of the table fare on the storage nodes, when the engine
    /// measures it. A node that does not answer leaves the figures absent
    /// (never a healthy-looking zero), and the audit goes on.
    async fn read_health(&self, table: &'static TableDef) -> Option<ReadHealth> {
        match self.store.read_health(table).await {
            Ok(health) => health,
            Err(e) => {
                tracing::warn!(table = table.name, error = %e, "the storage did not report how reads of the table fare; the audit goes on without it");
                None
            }
        }
    }
}

/// The live partitions after `after` up to and including `through` (the end
/// of the table when `None`), at most `budget` of them: those a holdings step
/// from `after` visited.
async fn live_partitions_through(
    store: &Store,
    table: &'static TableDef,
    after: Option<ScanPosition>,
    through: Option<&ScanPosition>,
    budget: u32,
) -> Result<Vec<ScannedPartition>, SweepError> {
    let range = TokenRange { after: i64::MIN, through: through.map_or(i64::MAX, |p| p.token) };
    let scanned = store.scan_range(&ScanQuery::new(table, budget).range(range).after(after)).await?;
    let beyond = |p: &ScannedPartition| {
        through.is_some_and(|t| {
            p.token == t.token && p.key.iter().zip(&t.key).map(|(a, b)| a.cmp_same_type(b)).find(|o| o.is_ne()).is_some_and(|o| o.is_gt())
        })
    };
    Ok(scanned.partitions.into_iter().filter(|p| !beyond(p)).collect())
}
