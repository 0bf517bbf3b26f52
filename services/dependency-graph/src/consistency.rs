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
use revstore_keys::Domain;
use revstore_keys::rfc3339;
use revstore_schema::TableDef;
use revstore_schema::tables::dependency_graph::{DEPENDENCIES, DEPENDENTS, col};
use revstore_storage::{Delete, ReadQuery, Row, ScanPosition, ScanQuery, Slice, Value, Write};
use serde::{Deserialize, Serialize};

use crate::error::GraphError;
use crate::graph::{Graph, StoredEdge, bucket};

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

/// Rows of one partition looked up in the other table per call.
const LOOKUP_CHUNK: usize = 1000;

/// What a scan of one table found.
struct OneSided {
    partitions: u64,
    edges: u64,
    /// Edges the other table lacks (all counted; the first `keep` listed).
    missing: u64,
    listed: Vec<OneSidedEdge>,
    /// Edges repaired (`Repair::Apply` only).
    repaired: u64,
    next: Option<ScanPosition>,
}

/// What to do with one-sided edges besides counting them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repair {
    No,
    Apply,
}

impl Direction {
    fn table(self) -> &'static TableDef {
        match self {
            Direction::Dependencies => &DEPENDENCIES,
            Direction::Dependents => &DEPENDENTS,
        }
    }

    /// The read that finds an edge's row in the other table.
    fn twin(self, edge: &OneSidedEdge) -> ReadQuery {
        let d = Value::from(edge.domain.as_str());
        let query = match self {
            Direction::Dependencies => ReadQuery::new(
                &DEPENDENTS,
                [
                    d,
                    Value::from(edge.parent.as_str()),
                    Value::from(edge.kind.as_str()),
                    Value::from(edge.priority),
                    Value::from(bucket(&edge.child)),
                ],
            )
            .slice(Slice::prefix([Value::from(edge.child.as_str())])),
            Direction::Dependents => ReadQuery::new(&DEPENDENCIES, [d, Value::from(edge.child.as_str())]).slice(Slice::prefix([
                Value::from(edge.priority),
                Value::from(edge.kind.as_str()),
                Value::from(edge.parent.as_str()),
            ])),
        };
        query.columns([col::CREATED]).limit(1)
    }

    /// The writes that make a one-sided edge consistent. A page's
    /// dependencies are what its client last wrote, so they are the truth:
    /// an edge only they have gets its dependents row (and directory entry)
    /// back; a dependents row whose child no longer lists the edge (a page
    /// removed or replaced halfway) is dropped.
    fn repair(self, edge: &OneSidedEdge, row: &Row) -> Result<Vec<Write>, GraphError> {
        let domain = Domain::parse(&edge.domain)
            .map_err(|_| GraphError::Corrupt(format!("a stored domain that does not parse: {:?}", edge.domain)))?;
        Ok(match self {
            Direction::Dependencies => Graph::put_edge(&domain, &edge.child, &StoredEdge::of(row)?, &[]),
            Direction::Dependents => vec![
                Delete::row(
                    &DEPENDENTS,
                    [
                        Value::from(edge.domain.as_str()),
                        Value::from(edge.parent.as_str()),
                        Value::from(edge.kind.as_str()),
                        Value::from(edge.priority),
                        Value::from(bucket(&edge.child)),
                    ],
                    [Value::from(edge.child.as_str())],
                )
                .into(),
            ],
        })
    }
}

impl Graph {
    /// One step of the check (see the module documentation).
    pub async fn check(&self, direction: Direction, after: Option<&str>, limit: u32) -> Result<ConsistencyStep, GraphError> {
        let after = after.map(str::parse::<ScanPosition>).transpose()?;
        let found = self.one_sided(direction, after, limit, Repair::No, MAX_REPORTED).await?;
        Ok(ConsistencyStep {
            direction,
            partitions: found.partitions,
            edges: found.edges,
            missing: found.listed,
            next: found.next.map(|p| p.to_string()),
            checked_at: rfc3339(std::time::SystemTime::now()),
        })
    }

    /// Up to `limit` partitions of one direction's table after `after`, and
    /// the edges among them the other table lacks, repaired if asked.
    /// Lookups go a chunk of rows at a time, so a parent with a million
    /// dependents costs a thousand multi-partition reads, not a million.
    async fn one_sided(
        &self,
        direction: Direction,
        after: Option<ScanPosition>,
        limit: u32,
        repair: Repair,
        keep: usize,
    ) -> Result<OneSided, GraphError> {
        let table = direction.table();
        let scanned = self.store().scan_range(&ScanQuery::new(table, limit).after(after)).await?;
        let mut result = OneSided {
            partitions: scanned.partitions.len() as u64,
            edges: 0,
            missing: 0,
            listed: Vec::new(),
            repaired: 0,
            next: scanned.next,
        };
        for partition in &scanned.partitions {
            let mut rows = std::pin::pin!(self.store().rows(ReadQuery::new(table, partition.key.clone()).limit(LOOKUP_CHUNK as u32)));
            let mut chunk = Vec::with_capacity(LOOKUP_CHUNK);
            loop {
                let row = rows.try_next().await?;
                let ended = row.is_none();
                if let Some(row) = row {
                    chunk.push((one_sided(direction, &partition.key, &row)?, row));
                }
                if chunk.len() == LOOKUP_CHUNK || (ended && !chunk.is_empty()) {
                    self.look_up(direction, std::mem::take(&mut chunk), repair, keep, &mut result).await?;
                }
                if ended {
                    break;
                }
            }
        }
        Ok(result)
    }

    async fn look_up(
        &self,
        direction: Direction,
        chunk: Vec<(OneSidedEdge, Row)>,
        repair: Repair,
        keep: usize,
        result: &mut OneSided,
    ) -> Result<(), GraphError> {
        result.edges += chunk.len() as u64;
        let twins = self.store().read_many(chunk.iter().map(|(edge, _)| direction.twin(edge)).collect()).await?;
        let mut fixes = Vec::new();
        for ((edge, row), twin) in chunk.into_iter().zip(twins) {
            if !twin.is_empty() {
                continue;
            }
            result.missing += 1;
            if repair == Repair::Apply {
                fixes.push(direction.repair(&edge, &row)?);
            }
            if result.listed.len() < keep {
                result.listed.push(edge);
            }
        }
        result.repaired += fixes.len() as u64;
        self.apply_groups(fixes).await
    }

    /// One step of the janitor's `graph` task: the dependencies table, then
    /// the dependents table, each edge looked up in the other and repaired
    /// unless `dry_run`. Answers (partitions, one-sided edges, next position).
    pub async fn repair_step(
        &self,
        direction: Direction,
        after: Option<ScanPosition>,
        limit: u32,
        dry_run: bool,
    ) -> Result<RepairStep, GraphError> {
        let repair = if dry_run { Repair::No } else { Repair::Apply };
        let found = self.one_sided(direction, after, limit, repair, 0).await?;
        Ok(RepairStep { partitions: found.partitions, edges: found.edges, one_sided: found.missing, next: found.next })
    }
}

/// What one step of the `graph` task found (and, unless dry, repaired).
#[derive(Debug, Clone, PartialEq)]
pub struct RepairStep {
    pub partitions: u64,
    pub edges: u64,
    pub one_sided: u64,
    pub next: Option<ScanPosition>,
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
