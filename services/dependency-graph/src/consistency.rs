//! The check of the graph's two directions against each other: the
//! janitor's bounded step (`GET /admin/graph/consistency`).
//!
//! Both rows of an edge are written in one batch, so they diverge only by a
//! bug, an operator's hand, or data restored from backups taken apart. A step
//! scans up to `limit` partitions of one table in token order from a
//! position, looks every edge found up in the other table, and answers what
//! is missing and where the next step starts; the janitor keeps that
//! position as its checkpoint.

use futures_util::TryStreamExt;
use revstore_keys::rfc3339;
use revstore_schema::tables::dependency_graph::{DEPENDENCIES, DEPENDENTS, col};
use revstore_storage::{ReadQuery, Row, ScanPosition, ScanQuery, Value};
use serde::{Deserialize, Serialize};

use crate::error::GraphError;
use crate::graph::{Graph, bucket};

/// Which table a step scans (the other is where it looks edges up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Scan pages' dependencies; look each up among its parent's dependents.
    Dependencies,
    /// Scan parents' dependents; look each up among its child's dependencies.
    Dependents,
}

/// An edge one table has and the other lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OneSidedEdge {
    pub domain: String,
    pub child: String,
    pub parent: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub priority: i64,
}

/// What one step found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ConsistencyStep {
    pub direction: Direction,
    pub partitions: u64,
    pub edges: u64,
    /// Edges found in the scanned table and missing from the other.
    pub missing: Vec<OneSidedEdge>,
    /// Where the next step starts; `null` once the whole table is scanned.
    pub next: Option<String>,
    /// When the step ran (RFC 3339).
    pub checked_at: String,
}

/// The most one-sided edges a step reports (it still counts them all in `edges`).
const MAX_REPORTED: usize = 1000;

impl Graph {
    /// One step of the check (see the module documentation).
    pub async fn check(&self, direction: Direction, after: Option<&str>, limit: u32) -> Result<ConsistencyStep, GraphError> {
        let after = after.map(str::parse::<ScanPosition>).transpose()?;
        let table = match direction {
            Direction::Dependencies => &DEPENDENCIES,
            Direction::Dependents => &DEPENDENTS,
        };
        let scanned = self.store().scan_range(&ScanQuery::new(table, limit).after(after)).await?;
        let mut step = ConsistencyStep {
            direction,
            partitions: scanned.partitions.len() as u64,
            edges: 0,
            missing: Vec::new(),
            next: scanned.next.map(|p| p.to_string()),
            checked_at: rfc3339(std::time::SystemTime::now()),
        };
        for partition in &scanned.partitions {
            let rows: Vec<Row> = self.store().rows(ReadQuery::new(table, partition.key.clone()).limit(1000)).try_collect().await?;
            for row in rows {
                step.edges += 1;
                let edge = one_sided(direction, &partition.key, &row)?;
                let twin = match direction {
                    Direction::Dependencies => vec![
                        Value::from(edge.domain.as_str()),
                        Value::from(edge.parent.as_str()),
                        Value::from(edge.kind.as_str()),
                        Value::from(edge.priority),
                        Value::from(bucket(&edge.child)),
                        Value::from(edge.child.as_str()),
                    ],
                    Direction::Dependents => vec![
                        Value::from(edge.domain.as_str()),
                        Value::from(edge.child.as_str()),
                        Value::from(edge.priority),
                        Value::from(edge.kind.as_str()),
                        Value::from(edge.parent.as_str()),
                    ],
                };
                let other = match direction {
                    Direction::Dependencies => &DEPENDENTS,
                    Direction::Dependents => &DEPENDENCIES,
                };
                if self.store().get(other, twin, Some(vec![col::CREATED])).await?.is_none() && step.missing.len() < MAX_REPORTED {
                    step.missing.push(edge);
                }
            }
        }
        Ok(step)
    }
}

/// The edge a scanned row describes, from its partition key and its row.
fn one_sided(direction: Direction, key: &[Value], row: &Row) -> Result<OneSidedEdge, GraphError> {
    let text = |v: Option<&Value>| match v {
        Some(Value::Text(t)) => Some(t.clone()),
        _ => None,
    };
    let corrupt = || GraphError::Corrupt(format!("a {direction:?} row whose key does not decode"));
    Ok(match direction {
        Direction::Dependencies => OneSidedEdge {
            domain: text(key.first()).ok_or_else(corrupt)?,
            child: text(key.get(1)).ok_or_else(corrupt)?,
            parent: row.text(col::PARENT).ok_or_else(corrupt)?.to_owned(),
            kind: row.text(col::DEP_TYPE).ok_or_else(corrupt)?.to_owned(),
            priority: row.bigint(col::PRIORITY).ok_or_else(corrupt)?,
        },
        Direction::Dependents => OneSidedEdge {
            domain: text(key.first()).ok_or_else(corrupt)?,
            parent: text(key.get(1)).ok_or_else(corrupt)?,
            kind: text(key.get(2)).ok_or_else(corrupt)?,
            priority: match key.get(3) {
                Some(Value::BigInt(p)) => *p,
                _ => return Err(corrupt()),
            },
            child: row.text(col::CHILD).ok_or_else(corrupt)?.to_owned(),
        },
    })
}
