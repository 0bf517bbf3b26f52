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
use revstore_schema::tables::dependency_graph::TABLES;
use revstore_service::janitor_admin::{AuditSweep, AuditedTable, Stepped, Sweep, SweepError, SweepPosition};

use crate::consistency::{Budget, Direction, Pass};
use crate::graph::Graph;

/// The sweeps dependency-graph offers the janitor.
pub fn sweeps(graph: &Graph, change_retention: Duration) -> Vec<Arc<dyn Sweep>> {
    let audited = TABLES.iter().map(|t| AuditedTable::live(t)).collect();
    vec![
        Arc::new(Repair { graph: graph.clone() }),
        Arc::new(ChangeRetention { graph: graph.clone(), keep: change_retention }),
        Arc::new(AuditSweep::new(graph.store().clone(), audited)),
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
impl Sweep for ChangeRetention {
    fn task(&self) -> Task {
        Task::Retention
    }

    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let step = self.graph.forget_changes(from.after, budget, self.keep, dry_run).await?;
        let report = StepReport { partitions: step.partitions, rows: step.rows, bytes: step.bytes, ..StepReport::default() };
        Ok(Stepped { report, next: step.next.map(|p| SweepPosition::in_pass(0, Some(p))) })
    }
}
