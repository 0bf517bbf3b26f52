//! What a run reports: the JSON summary (the last line of stdout) and the
//! same figures as Prometheus metrics.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use revstore_api::janitor::{PurgeReport, Scope, TableAudit};
use serde::Serialize;

/// How a task (or the run) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    #[default]
    Completed,
    /// Stopped by the deadline or a signal; the next run resumes.
    Interrupted,
    Failed,
    /// No service of the task is configured.
    Skipped,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::Interrupted => "interrupted",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
        }
    }

    /// The worse of two (failed > interrupted > completed > skipped).
    pub fn worst(self, other: Status) -> Status {
        let rank = |s: Status| match s {
            Status::Skipped => 0,
            Status::Completed => 1,
            Status::Interrupted => 2,
            Status::Failed => 3,
        };
        if rank(other) > rank(self) { other } else { self }
    }
}

/// One service's share of a task.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Swept {
    pub status: Status,
    pub steps: u64,
    pub partitions: u64,
    /// Removed or repaired (dry run: that would be).
    pub rows: u64,
    pub bytes: u64,
    /// The first step went on from a checkpoint an earlier run left.
    pub resumed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A table's audit with its ratio spelled out.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AuditedTable {
    #[serde(flatten)]
    pub counts: TableAudit,
    /// Held over ideal bytes; `null` in JSON when bytes are held and none is entitled.
    pub overstore_ratio: f64,
    /// Bytes on disk over ideal bytes, where the storage reports the disk
    /// figure (absent otherwise; `null` when nothing is entitled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overstore_on_disk: Option<f64>,
}

impl AuditedTable {
    pub fn new(counts: TableAudit) -> Self {
        AuditedTable { counts, overstore_ratio: counts.overstore_ratio(), overstore_on_disk: counts.overstore_on_disk() }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskSummary {
    pub status: Status,
    /// How long the task took (its purge included).
    pub seconds: f64,
    /// By service name.
    pub services: BTreeMap<&'static str, Swept>,
    /// Retention: what each service's purge removed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub purged: BTreeMap<&'static str, PurgeReport>,
    /// Audit: by `service/table`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tables: BTreeMap<String, AuditedTable>,
    /// Audit: held bytes over ideal bytes, all tables together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overstore_ratio: Option<f64>,
    /// Audit: bytes on disk over ideal bytes, all the tables whose disk
    /// figure the storage reported together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overstore_on_disk: Option<f64>,
    /// Audit: the same less the nodes' rounding (Cassandra reports whole
    /// mebibytes per node and table): what the disk certainly holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overstore_on_disk_at_least: Option<f64>,
}

/// The run's summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub run: String,
    pub dry_run: bool,
    /// `changed` (a routine run) or `all`.
    pub scope: Scope,
    pub status: Status,
    pub seconds: f64,
    pub tasks: BTreeMap<&'static str, TaskSummary>,
    /// Services not configured, and why.
    pub skipped: Vec<String>,
    /// Why the run stopped early, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl TaskSummary {
    /// Totals the audit's tables into the task's ratio.
    pub fn total_audit(&mut self) {
        let mut total = TableAudit::default();
        for table in self.tables.values() {
            total.add(&table.counts);
        }
        if !self.tables.is_empty() {
            self.overstore_ratio = Some(total.overstore_ratio());
        }
        let mut on_disk = TableAudit::default();
        for table in self.tables.values().filter(|t| t.counts.bytes_on_disk.is_some()) {
            on_disk.add(&table.counts);
        }
        self.overstore_on_disk = on_disk.overstore_on_disk();
        self.overstore_on_disk_at_least = on_disk.overstore_on_disk_at_least();
    }
}

fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Summary {
    /// The run as Prometheus text exposition (for a Pushgateway or a textfile collector).
    pub fn prometheus(&self, finished_at_secs: f64) -> String {
        let mut out = String::new();
        let mut family = |name: &str, help: &str, samples: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        family("revstore_janitor_run_seconds", "How long the last run took.", vec![(String::new(), self.seconds)]);
        family(
            "revstore_janitor_run_finished_timestamp_seconds",
            "When the last run ended.",
            vec![(format!("{{status=\"{}\"}}", self.status.name()), finished_at_secs)],
        );
        if self.status == Status::Completed {
            family(
                "revstore_janitor_last_success_timestamp_seconds",
                "When a run last completed every task.",
                vec![(String::new(), finished_at_secs)],
            );
        }
        let per_service = |pick: fn(&Swept) -> u64| {
            self.tasks
                .iter()
                .flat_map(|(task, t)| {
                    t.services.iter().map(move |(service, s)| (format!("{{task=\"{task}\",service=\"{service}\"}}"), pick(s) as f64))
                })
                .collect::<Vec<_>>()
        };
        family("revstore_janitor_partitions", "Partitions the last run visited.", per_service(|s| s.partitions));
        family("revstore_janitor_rows", "Rows the last run removed or repaired (dry run: would have).", per_service(|s| s.rows));
        family("revstore_janitor_bytes", "Value bytes of the rows the last run removed.", per_service(|s| s.bytes));
        family(
            "revstore_janitor_task_completed",
            "1 when the task completed in the last run.",
            self.tasks
                .iter()
                .map(|(task, t)| (format!("{{task=\"{task}\"}}"), f64::from(u8::from(t.status == Status::Completed))))
                .collect(),
        );
        if let Some(audit) = self.tasks.get("audit") {
            family(
                "revstore_janitor_overstore_ratio",
                "Held bytes over ideal bytes, per table, as the last audit measured.",
                audit
                    .tables
                    .iter()
                    .filter(|(_, t)| t.overstore_ratio.is_finite())
                    .map(|(table, t)| (format!("{{table=\"{}\"}}", label(table)), t.overstore_ratio))
                    .collect(),
            );
            let with_table = |value: fn(&AuditedTable) -> Option<f64>| {
                let per_table = audit.tables.iter().filter_map(|(table, t)| Some((format!("{{table=\"{}\"}}", label(table)), value(t)?)));
                per_table.filter(|(_, v)| v.is_finite()).collect::<Vec<_>>()
            };
            family(
                "revstore_janitor_bytes_on_disk",
                "Bytes the storage keeps on disk for one copy of each table (tombstones, expired and superseded data not yet compacted included), as the last audit measured.",
                with_table(|t| t.counts.bytes_on_disk.map(|b| b as f64)),
            );
            let mut ratios = with_table(|t| t.overstore_on_disk);
            ratios.extend(audit.overstore_on_disk.filter(|r| r.is_finite()).map(|r| ("{table=\"all\"}".to_owned(), r)));
            family(
                "revstore_janitor_overstore_on_disk_ratio",
                "Bytes on disk over ideal bytes, per table and for all tables (table=\"all\"), as the last audit measured.",
                ratios,
            );
            family(
                "revstore_janitor_overstore_on_disk_at_least_ratio",
                "Bytes on disk less the storage's rounding over ideal bytes, all tables (table=\"all\"), as the last audit measured: what the disk certainly holds.",
                audit.overstore_on_disk_at_least.filter(|r| r.is_finite()).map(|r| ("{table=\"all\"}".to_owned(), r)).into_iter().collect(),
            );
            family(
                "revstore_janitor_tombstones_per_read_p99",
                "Tombstones one read of each table scanned, 99th percentile, the worst storage node's, as the last audit measured.",
                with_table(|t| t.counts.tombstones_per_read_p99.map(|n| n as f64)),
            );
            family(
                "revstore_janitor_tombstones_per_read_max",
                "The most tombstones one read of each table scanned, the worst storage node's, as the last audit measured.",
                with_table(|t| t.counts.tombstones_per_read_max.map(|n| n as f64)),
            );
            family(
                "revstore_janitor_largest_partition_bytes",
                "The largest partition of each table on any storage node, as the last audit measured.",
                with_table(|t| t.counts.largest_partition_bytes.map(|n| n as f64)),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_status_wins() {
        assert_eq!(Status::Completed.worst(Status::Interrupted), Status::Interrupted);
        assert_eq!(Status::Failed.worst(Status::Interrupted), Status::Failed);
        assert_eq!(Status::Skipped.worst(Status::Completed), Status::Completed);
    }

    #[test]
    fn metrics_are_prometheus_text() {
        let mut summary = Summary { run: "r".into(), seconds: 2.5, ..Summary::default() };
        let mut audit = TaskSummary::default();
        audit.services.insert("current-store", Swept { partitions: 10, ..Swept::default() });
        let counts = TableAudit {
            bytes_held: 300,
            bytes_ideal: 200,
            bytes_on_disk: Some(500),
            disk_resolution_bytes: Some(100),
            tombstones_per_read_p99: Some(12),
            tombstones_per_read_max: Some(1001),
            largest_partition_bytes: Some(3 << 20),
            ..TableAudit::default()
        };
        audit.tables.insert("current-store/page_renders".into(), AuditedTable::new(counts));
        // The embedded engine reports no disk figure: no on-disk sample, and not in the total.
        let embedded = TableAudit { bytes_held: 100, bytes_ideal: 100, ..TableAudit::default() };
        audit.tables.insert("old-store/blocks".into(), AuditedTable::new(embedded));
        audit.total_audit();
        summary.tasks.insert("audit", audit);
        let text = summary.prometheus(1_700_000_000.0);
        assert!(text.contains("revstore_janitor_partitions{task=\"audit\",service=\"current-store\"} 10\n"), "{text}");
        assert!(text.contains("revstore_janitor_overstore_ratio{table=\"current-store/page_renders\"} 1.5\n"), "{text}");
        assert!(text.contains("revstore_janitor_bytes_on_disk{table=\"current-store/page_renders\"} 500\n"), "{text}");
        assert!(text.contains("revstore_janitor_overstore_on_disk_ratio{table=\"current-store/page_renders\"} 2.5\n"), "{text}");
        assert!(text.contains("revstore_janitor_overstore_on_disk_ratio{table=\"all\"} 2.5\n"), "{text}");
        assert!(text.contains("revstore_janitor_overstore_on_disk_at_least_ratio{table=\"all\"} 2\n"), "{text}");
        assert!(!text.contains("revstore_janitor_bytes_on_disk{table=\"old-store/blocks\"}"), "{text}");
        assert!(text.contains("revstore_janitor_tombstones_per_read_p99{table=\"current-store/page_renders\"} 12\n"), "{text}");
        assert!(text.contains("revstore_janitor_tombstones_per_read_max{table=\"current-store/page_renders\"} 1001\n"), "{text}");
        assert!(text.contains("revstore_janitor_largest_partition_bytes{table=\"current-store/page_renders\"} 3145728\n"), "{text}");
        // Not measured is not reported: no healthy-looking zero for the embedded engine.
        assert!(!text.contains("revstore_janitor_tombstones_per_read_max{table=\"old-store/blocks\"}"), "{text}");
        assert!(text.contains("revstore_janitor_last_success_timestamp_seconds 1700000000\n"), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert_eq!(line.split(' ').count(), 2, "{line}");
        }
    }
}
