//! dependency-graph's sweeps for the janitor (see `revstore_service::janitor_admin`):
//!
//! - `graph`: every edge of the dependencies table looked up among its
//!   parent's dependents, then every dependents row among its child's
//!   dependencies; one-sided edges are repaired (see `consistency.rs`).
//! - `audit`: every table held against entitled: each edge once per
//!   direction, each directory entry and each page's latest changes, all of
//!   them live data.

use std::sync::Arc;

use async_trait::async_trait;
use revstore_api::janitor::StepReport;
use revstore_schema::tables::dependency_graph::TABLES;
use revstore_service::ApiError;
use revstore_service::janitor_admin::{AuditSweep, AuditedTable, Stepped, Sweep};
use revstore_storage::ScanPosition;

use crate::consistency::Direction;
use crate::graph::Graph;

/// The sweeps dependency-graph offers the janitor.
pub fn sweeps(graph: &Graph) -> Vec<Arc<dyn Sweep>> {
    let audited = TABLES.iter().map(|t| AuditedTable::live(t)).collect();
    vec![Arc::new(Repair { graph: graph.clone() }), Arc::new(AuditSweep::new(graph.store().clone(), audited))]
}

/// The two passes, in order.
const PASSES: [Direction; 2] = [Direction::Dependencies, Direction::Dependents];

#[derive(Debug)]
struct Repair {
    graph: Graph,
}

#[async_trait]
impl Sweep for Repair {
    fn task(&self) -> &'static str {
        "graph"
    }

    async fn step(&self, from: Option<Vec<u8>>, budget: u32, dry_run: bool) -> Result<Stepped, ApiError> {
        // The position: the pass (0 or 1), then the scan position within it.
        let from = from.unwrap_or_default();
        let (pass, after) = match from.split_first() {
            None => (0, None),
            Some((pass, [])) => (*pass as usize, None),
            Some((pass, rest)) => (*pass as usize, Some(ScanPosition::from_bytes(rest)?)),
        };
        let Some(direction) = PASSES.get(pass) else { return Ok(Stepped::default()) };
        let step = self.graph.repair_step(*direction, after, budget, dry_run).await?;
        let next = match step.next {
            Some(position) => Some([vec![pass as u8], position.to_bytes()].concat()),
            None if pass + 1 < PASSES.len() => Some(vec![pass as u8 + 1]),
            None => None,
        };
        // Bytes are not counted: a repair mostly writes a missing row back.
        let report = StepReport { partitions: step.partitions, rows: step.one_sided, ..StepReport::default() };
        Ok(Stepped { report, next })
    }
}
