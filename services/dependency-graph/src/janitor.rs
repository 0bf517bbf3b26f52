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
use revstore_service::janitor_admin::{AuditSweep, AuditedTable, Stepped, Sweep, SweepError};
use revstore_storage::ScanPosition;

use crate::consistency::{Budget, Direction, Pass, ScanCut};
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

/// The first byte of a position in the current form: `CUT_FORM + pass`, then
/// a [`ScanCut`]. A position whose first byte is a bare pass (0 or 1) is one
/// written before steps could stop inside a partition: the pass, then a plain
/// scan position.
const CUT_FORM: u8 = 0x10;

fn parse_position(from: &[u8]) -> Result<(usize, ScanCut), SweepError> {
    let bad = SweepError::position;
    Ok(match from.split_first() {
        None => (0, ScanCut::default()),
        Some((tag, rest)) if *tag >= CUT_FORM => {
            let cut = if rest.is_empty() { ScanCut::default() } else { ScanCut::from_bytes(rest).map_err(bad)? };
            ((tag - CUT_FORM) as usize, cut)
        }
        Some((pass, [])) => (*pass as usize, ScanCut::default()),
        Some((pass, rest)) => (*pass as usize, ScanCut { after: Some(ScanPosition::from_bytes(rest).map_err(bad)?), inside: None }),
    })
}

#[derive(Debug)]
struct Repair {
    graph: Graph,
}

#[async_trait]
impl Sweep for Repair {
    fn task(&self) -> Task {
        Task::Graph
    }

    async fn step(&self, from: Option<Vec<u8>>, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let (pass, cut) = parse_position(&from.unwrap_or_default())?;
        let Some(current) = PASSES.get(pass) else { return Ok(Stepped::default()) };
        let found = self.graph.sweep(*current, cut, Budget::of_partitions(budget), !dry_run, 0).await?;
        let next = match found.next {
            Some(cut) => Some([vec![CUT_FORM + pass as u8], cut.to_bytes()].concat()),
            None if pass + 1 < PASSES.len() => Some(vec![CUT_FORM + pass as u8 + 1]),
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

    async fn step(&self, from: Option<Vec<u8>>, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let after = from.map(|bytes| ScanPosition::from_bytes(&bytes)).transpose().map_err(SweepError::position)?;
        let step = self.graph.forget_changes(after, budget, self.keep, dry_run).await?;
        let report = StepReport { partitions: step.partitions, rows: step.rows, bytes: step.bytes, ..StepReport::default() };
        Ok(Stepped { report, next: step.next.map(|p| p.to_bytes()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_of_the_earlier_form_resume_in_their_pass() {
        let position = ScanPosition { token: 42, key: vec![revstore_storage::Value::from("en"), revstore_storage::Value::from("P")] };
        let old = [vec![1u8], position.to_bytes()].concat();
        assert_eq!(parse_position(&old).expect("old").0, 1);
        assert_eq!(parse_position(&old).expect("old").1.after, Some(position));
        assert_eq!(parse_position(&[0]).expect("pass only").0, 0);
        assert_eq!(parse_position(&[CUT_FORM + 2]).expect("new").0, 2);
    }
}
