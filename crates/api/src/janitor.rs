//! The janitor's admin calls, which every service answers for its own tables:
//! the run lease, bounded sweep steps, and the storage purge. The janitor
//! (`revstore-janitor`) drives them; the service does the work, because only
//! it knows what its rows mean and only it may open its store.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::BodyError;

/// The longest lease a run may ask for: a crashed run blocks the next one at most this long.
pub const MAX_LEASE_SECS: u64 = 3600;
/// The most partitions one step may visit.
pub const MAX_STEP_PARTITIONS: u32 = 10_000;

/// The janitor's tasks; a service offers a sweep for those it has data for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// What must not be served (deleted pages, suppressed revisions) read
    /// from every site and written again in each service, so that a site
    /// that missed it during a long cut hides it too.
    Hidden,
    /// Superseded renders out of current-store's `current`, old graph changes.
    Retention,
    /// Every revision current-store holds is in old-store.
    Archive,
    /// The graph's two directions checked against each other and repaired.
    Graph,
    /// What each table holds against what readers are entitled to.
    Audit,
}

impl Task {
    pub const ALL: [Task; 5] = [Task::Hidden, Task::Retention, Task::Archive, Task::Graph, Task::Audit];

    pub fn name(self) -> &'static str {
        match self {
            Task::Hidden => "hidden",
            Task::Retention => "retention",
            Task::Archive => "archive",
            Task::Graph => "graph",
            Task::Audit => "audit",
        }
    }
}

impl std::str::FromStr for Task {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Task::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Task::ALL.iter().map(|t| t.name()).collect();
            format!("no such task; the tasks are: {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The problem kinds (`urn:revstore:problem:<kind>`) of the two refusals the
/// janitor acts on; any other error answer is a failure to it.
pub mod problems {
    /// 404 on a step: the service offers no sweep of this task (the janitor skips it).
    pub const TASK_NOT_OFFERED: &str = "janitor-task-not-offered";
    /// 409 on a lease or a step: another run holds the lease (the janitor stops).
    pub const LEASE_HELD: &str = "janitor-lease-held";
}

/// Paths of the admin calls (no domain: they are about the service's tables).
pub mod paths {
    /// `POST` takes or renews the lease, `DELETE` gives it back.
    pub const LEASE: &str = "/admin/janitor/lease";
    /// `POST`: one step of a sweep (`{task}` is one of the service's tasks).
    pub fn step(task: super::Task) -> String {
        format!("/admin/janitor/{task}/step")
    }
    /// `POST`: drop expired data the engine still keeps.
    pub const PURGE: &str = "/admin/storage/purge";
}

/// The lease that keeps two janitor runs from overlapping, as asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who runs: the run's id (a time UUID). Renewing a lease one holds extends it.
    pub holder: String,
    /// How long the lease lasts unless renewed (1 to 3600 seconds).
    pub ttl_secs: u64,
    /// Which runs the lease keeps apart (`all` when absent): a routine run
    /// and a full run each have a lease, so the hourly runs go on while a
    /// full run takes days.
    #[serde(default)]
    pub scope: Scope,
}

impl LeaseRequest {
    pub fn validate(&self) -> Result<revstore_keys::Tid, BodyError> {
        let holder = check_holder(&self.holder)?;
        if !(1..=MAX_LEASE_SECS).contains(&self.ttl_secs) {
            return Err(BodyError(format!("ttl_secs must be within 1-{MAX_LEASE_SECS}")));
        }
        Ok(holder)
    }
}

/// A holder is a run id: a time-based (version 1) UUID, which says when the
/// run started and is what the service records with its checkpoints. Its
/// time is checked as a render time's is (not before 2001, not beyond the
/// clock skew ahead): a run id from 1582 or next year is a client's mistake.
pub fn check_holder(holder: &str) -> Result<revstore_keys::Tid, BodyError> {
    let tid = revstore_keys::Tid::parse(holder).map_err(|e| BodyError(format!("holder: {e}")))?;
    tid.check_render_time(std::time::SystemTime::now()).map_err(|e| BodyError(format!("holder: {e}")))?;
    Ok(tid)
}

/// A lease granted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Lease {
    pub holder: String,
    /// RFC 3339.
    pub expires_at: String,
}

/// One step of a sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepRequest {
    /// The lease holder (the run's id): a step by anyone else is refused (409).
    pub holder: String,
    /// The most partitions this step visits (1 to 10,000).
    pub budget: u32,
    /// Count what would change, change nothing. Dry runs keep their own
    /// checkpoint, so they never move a real sweep's.
    #[serde(default)]
    pub dry_run: bool,
    /// Start the sweep from the beginning instead of its checkpoint.
    #[serde(default)]
    pub restart: bool,
    /// Every page, or only the pages changed since the last completed sweep
    /// of this scope (`all` when absent).
    #[serde(default)]
    pub scope: Scope,
}

/// What a sweep visits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every partition of the swept tables: repair after a restore, the
    /// audit's full count.
    #[default]
    All,
    /// The pages the service's journal shows changed since the last completed
    /// sweep of this scope ended (every page when there was none, or when it
    /// is older than the journal keeps): a routine run.
    Changed,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::Changed => "changed",
        }
    }
}

impl StepRequest {
    pub fn validate(&self) -> Result<revstore_keys::Tid, BodyError> {
        let holder = check_holder(&self.holder)?;
        if !(1..=MAX_STEP_PARTITIONS).contains(&self.budget) {
            return Err(BodyError(format!("budget must be within 1-{MAX_STEP_PARTITIONS} partitions")));
        }
        Ok(holder)
    }
}

/// What one step did (or, dry, would have done).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StepReport {
    /// Partitions visited.
    pub partitions: u64,
    /// Rows removed or repaired (dry run: that would be).
    pub rows: u64,
    /// Value bytes of the rows removed.
    pub bytes: u64,
    /// The sweep is complete: its checkpoint is cleared, the next step starts over.
    pub done: bool,
    /// Whether this step resumed from a checkpoint an earlier run left.
    pub resumed: bool,
    /// The audit's counts per table (audit steps only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tables: BTreeMap<String, TableAudit>,
}

/// What a table holds against what it should, in value bytes (the CQL
/// serialized size of clustering, regular and static cells).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TableAudit {
    /// Partitions visited.
    pub partitions: u64,
    /// Held: what the engine keeps, expired data not yet purged included
    /// where the engine can tell (the embedded engine; on Cassandra it is the
    /// live data).
    pub rows_held: u64,
    pub bytes_held: u64,
    /// Ideal: what readers are entitled to (latest renders, renders inside
    /// their grace period, archived revisions, each edge once per direction).
    pub rows_ideal: u64,
    pub bytes_ideal: u64,
    /// On disk: what the storage nodes keep for one copy of the table —
    /// compressed, with superseded copies, tombstones and expired cells that
    /// compaction has not removed yet (Cassandra: every node's
    /// `system_views.disk_usage` summed, over the replication factor). Given
    /// by the step that ends the table's pass; absent where the engine does
    /// not report it (the embedded engine, ScyllaDB) or a node did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_on_disk: Option<u64>,
    /// How far above the truth `bytes_on_disk` may be: Cassandra rounds each
    /// node's figure up to a whole mebibyte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_resolution_bytes: Option<u64>,
    /// Tombstones one read of the table scanned on the storage nodes: the
    /// 99th percentile and the most, the worst node's (Cassandra's
    /// `system_views.tombstones_per_read`, recent reads weighing most).
    /// Cassandra warns past 1,000 and aborts a read past 100,000. Given with
    /// the disk figure; absent where the engine does not measure it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tombstones_per_read_p99: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tombstones_per_read_max: Option<u64>,
    /// The largest partition of the table on any node, in bytes (whole
    /// mebibytes, rounded up: Cassandra's `system_views.max_partition_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_partition_bytes: Option<u64>,
}

impl TableAudit {
    pub fn add(&mut self, other: &TableAudit) {
        self.partitions += other.partitions;
        self.rows_held += other.rows_held;
        self.bytes_held += other.bytes_held;
        self.rows_ideal += other.rows_ideal;
        self.bytes_ideal += other.bytes_ideal;
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.bytes_on_disk = sum(self.bytes_on_disk, other.bytes_on_disk);
        self.disk_resolution_bytes = sum(self.disk_resolution_bytes, other.disk_resolution_bytes);
        // Read health is the worst of the parts, not their sum.
        let worst = |a: Option<u64>, b: Option<u64>| a.max(b);
        self.tombstones_per_read_p99 = worst(self.tombstones_per_read_p99, other.tombstones_per_read_p99);
        self.tombstones_per_read_max = worst(self.tombstones_per_read_max, other.tombstones_per_read_max);
        self.largest_partition_bytes = worst(self.largest_partition_bytes, other.largest_partition_bytes);
    }

    /// Bytes on disk over ideal bytes, where the disk figure is known (see
    /// [`Self::overstore_ratio`] for an empty table).
    pub fn overstore_on_disk(&self) -> Option<f64> {
        let on_disk = self.bytes_on_disk?;
        Some(ratio(on_disk, self.bytes_ideal))
    }

    /// What the nodes certainly keep over ideal bytes: the disk figure less
    /// its rounding. On a small deployment the rounding is most of the
    /// figure, so this is the ratio to alert on.
    pub fn overstore_on_disk_at_least(&self) -> Option<f64> {
        let on_disk = self.bytes_on_disk?.saturating_sub(self.disk_resolution_bytes.unwrap_or(0));
        Some(ratio(on_disk, self.bytes_ideal))
    }

    /// Held bytes over ideal bytes (1.0 for an empty table).
    pub fn overstore_ratio(&self) -> f64 {
        ratio(self.bytes_held, self.bytes_ideal)
    }
}

/// Bytes kept over bytes entitled: 1.0 when both are 0, infinite when only nothing is entitled.
fn ratio(kept: u64, ideal: u64) -> f64 {
    if ideal == 0 { if kept == 0 { 1.0 } else { f64::INFINITY } } else { kept as f64 / ideal as f64 }
}

/// What a purge removed (the embedded engine; Cassandra purges by compaction
/// and reports nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PurgeReport {
    pub rows: u64,
    pub tombstones: u64,
    pub bytes_freed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_and_budgets_are_bounded() {
        const RUN: &str = "a1b2c3d4-0000-11ee-8000-000000000000";
        let step = |holder: &str, budget| {
            StepRequest { holder: holder.into(), budget, dry_run: false, restart: false, scope: Scope::All }.validate()
        };
        assert!(step(RUN, 500).is_ok());
        // Not time UUIDs: no text of the caller's reaches a log as a holder.
        for holder in ["", "run 1", "a1b2c3d4-0000-41ee-8000-000000000000", &"x".repeat(129)] {
            assert!(step(holder, 500).is_err(), "{holder:?}");
        }
        // Time UUIDs, but not of a run: from 1582, and from far ahead.
        let ahead = revstore_keys::Tid::min_at(std::time::SystemTime::now() + std::time::Duration::from_secs(86_400));
        for holder in ["00000000-0000-1000-8000-000000000000".to_owned(), ahead.to_string()] {
            let refused = step(&holder, 500).unwrap_err().0;
            assert!(refused.contains("holder"), "{refused}");
        }
        assert!(step(RUN, 0).is_err());
        assert!(step(RUN, MAX_STEP_PARTITIONS + 1).is_err());
        assert!(LeaseRequest { holder: RUN.into(), ttl_secs: 0, scope: Scope::All }.validate().is_err());
        assert!(LeaseRequest { holder: RUN.into(), ttl_secs: MAX_LEASE_SECS + 1, scope: Scope::Changed }.validate().is_err());
        assert!(LeaseRequest { holder: RUN.into(), ttl_secs: 60, scope: Scope::All }.validate().is_ok());
    }

    #[test]
    fn the_overstore_ratio_is_held_over_ideal() {
        let audit = TableAudit { bytes_held: 300, bytes_ideal: 200, ..TableAudit::default() };
        assert_eq!(audit.overstore_ratio(), 1.5);
        assert_eq!(TableAudit::default().overstore_ratio(), 1.0);
    }
}
