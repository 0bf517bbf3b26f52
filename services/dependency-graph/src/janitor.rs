//! dependency-graph's sweeps for the janitor (see `revstore_service::janitor_admin`):
//!
//! - `graph`: every edge of the dependencies table looked up among its
//!   parent's dependents, then every dependents row among its child's
//!   dependencies, one-sided edges repaired; then the directory, entries of
//!   emptied partitions pruned (see `consistency.rs`). A step checks at most
//!   `ROWS_PER_BUDGET_PARTITION` rows per partition of its budget, and may
//!   stop inside a large partition and resume there.
//! - `retention`: the fragment rows of `graph_changes` older than the change
//!   retention removed (see `changes.rs`).
//! - `audit`: every table held against entitled: each edge once per
//!   direction, each directory entry and each page's latest changes, all of
//!   them live data.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use revstore_api::janitor::{StepReport, Task};
use revstore_schema::TableDef;
use revstore_schema::tables::dependency_graph::{CHANGES, TABLES};
use revstore_service::janitor_admin::{
    AuditSweep, AuditedTable, ChangedPages, EveryPage, PageVisit, Stepped, Sweep, SweepError, SweepPosition,
};
use revstore_storage::Value;

use crate::consistency::{Budget, Direction, Pass};
use crate::graph::Graph;

/// The sweeps dependency-graph offers the janitor: the repair reads every
/// edge (scope `all` only: the two rows of an edge are written in one batch,
/// so only a bug or a restore parts them); change retention visits every
/// page, or (scope `changed`) the pages whose changes came due.
/// `late_margin`: how late a journal row may land behind its time.
pub fn sweeps(graph: &Graph, change_retention: Duration, late_margin: Duration) -> Vec<Arc<dyn Sweep>> {
    let store = graph.store().clone();
    let audited = TABLES.iter().map(|t| AuditedTable::live(t)).collect();
    let audit = AuditSweep::new(store.clone(), audited);
    let retention = Arc::new(ChangeRetention { graph: graph.clone(), keep: change_retention });
    vec![
        Arc::new(Repair { graph: graph.clone() }),
        Arc::new(EveryPage::new(store, retention.clone())),
        Arc::new(ChangedPages::new(&graph.journal(), retention, late_margin)),
        Arc::new(audit.from_nodes()),
        Arc::new(audit),
    ]
}

/// The passes of the `graph` task, in order.
const PASSES: [Pass; 3] = [Pass::Edges(Direction::Dependencies), Pass::Edges(Direction::Dependents), Pass::Directory];

#[derive(Debug)]
struct Repair {
    graph: Graph,
}

#[async_trait]
impl Sweep for Repair {
    fn task(&self) -> Task {
        Task::Graph
    }

    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let pass = from.pass;
        let Some(current) = PASSES.get(pass) else { return Ok(Stepped::default()) };
        let found = self.graph.sweep(*current, from, Budget::of_partitions(budget), !dry_run, 0).await?;
        let next = match found.next {
            Some(position) => Some(position),
            None if pass + 1 < PASSES.len() => Some(SweepPosition::start_of(pass + 1)),
            None => None,
        };
        // Bytes are not counted: a repair mostly writes a missing row back.
        let report = StepReport { partitions: found.partitions, rows: found.one_sided, ..StepReport::default() };
        Ok(Stepped { report, next })
    }
}

#[derive(Debug)]
struct ChangeRetention {
    graph: Graph,
    keep: Duration,
}

#[async_trait]
impl PageVisit for ChangeRetention {
    fn task(&self) -> Task {
        Task::Retention
    }

    fn table(&self) -> &'static TableDef {
        &CHANGES
    }

    fn due_after(&self) -> Duration {
        self.keep
    }

    async fn visit(&self, page: &[Value], dry_run: bool, report: &mut StepReport) -> Result<(), SweepError> {
        let forgotten = self.graph.forget_page_changes(page, self.keep, dry_run).await?;
        report.rows += forgotten.rows;
        report.bytes += forgotten.bytes;
        Ok(())
    }
}
