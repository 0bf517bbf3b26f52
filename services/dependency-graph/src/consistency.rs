//! The check of the graph's tables against each other, and their repair: the
//! janitor's `graph` task and `GET /admin/graph/consistency`, a bounded step
//! at a time.
//!
//! Both rows of an edge are written in one batch by a writer holding the
//! page, so they diverge only by a bug, an operator's hand, or data restored
//! from backups taken apart. A step scans one table in token order from a
//! position, looks every edge found up in the other table, and answers what
//! is missing and where the next step starts; the janitor keeps that position
//! as its checkpoint. The directory pass then prunes the entries of emptied
//! buckets, which listings would otherwise read forever.
//!
//! A step is bounded in rows as well as partitions, and can stop inside a
//! partition (a template's bucket may hold hundreds of thousands of
//! dependents) and resume after the last row it checked.
//!
//! A repair holds the page it repairs and looks again before it writes: the
//! page's dependencies are what its client last wrote, so they are the
//! truth, and nothing a client removed comes back.

use revstore_keys::{Domain, rfc3339};
use revstore_schema::TableDef;
use revstore_schema::tables::dependency_graph::{DEPENDENCIES, DEPENDENT_BUCKETS, DEPENDENTS, col};
use revstore_service::janitor_admin::SweepPosition;
use revstore_storage::value::{from_hex, to_hex};
use revstore_storage::{
    Delete, ReadOrder, ReadQuery, Row, ScanPosition, ScanQuery, Slice, StoreError, Upsert, Value, clustering_key, slices_after,
};
use serde::{Deserialize, Serialize};

use crate::edge::{StoredEdge, dependency_row, dependent_delete, dependent_row};
use crate::error::GraphError;
use crate::graph::Graph;

/// Which table a step scans (the other is where it looks edges up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Scan pages' dependencies; look each up among its parent's dependents.
    Dependencies,
    /// Scan parents' dependents; look each up among its child's dependencies.
    Dependents,
}

/// The passes of the janitor's `graph` task, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    Edges(Direction),
    /// Directory entries of emptied partitions, pruned.
    Directory,
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
const LOOKUP_CHUNK: u64 = 1000;

/// Rows a step may check per partition of its budget: a step of the
/// janitor's default 100 partitions checks at most 10,000 rows, a few tens
/// of milliseconds of work, however large the partitions are.
pub(crate) const ROWS_PER_BUDGET_PARTITION: u64 = 100;

/// A check's position as text, in its answers (`next`) and requests
/// (`after`): the hex of the sweep position's bytes (the janitor's sweeps
/// keep the same position as their checkpoint).
fn position_text(position: &SweepPosition) -> String {
    to_hex(&position.to_bytes())
}

fn parse_position_text(text: &str) -> Result<SweepPosition, StoreError> {
    let bad = || StoreError::invalid("not a consistency position (the `next` of a step of this build)");
    SweepPosition::from_bytes(&from_hex(text).ok_or_else(bad)?).map_err(|_| bad())
}

/// What a step may do: partitions started and rows checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    pub partitions: u32,
    pub rows: u64,
}

impl Budget {
    pub(crate) fn of_partitions(partitions: u32) -> Self {
        Budget { partitions, rows: u64::from(partitions) * ROWS_PER_BUDGET_PARTITION }
    }
}

/// What a step found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub partitions: u64,
    pub rows: u64,
    /// Rows out of step (one-sided edges, emptied directory entries), all counted.
    pub one_sided: u64,
    /// The first of them, up to the step's `keep`.
    pub listed: Vec<OneSidedEdge>,
    /// Fixed (`repair` only).
    pub repaired: u64,
    /// Where the next step starts (in the pass it started in); `None`: the table is done.
    pub next: Option<SweepPosition>,
}

impl Pass {
    fn table(self) -> &'static TableDef {
        match self {
            Pass::Edges(Direction::Dependencies) => &DEPENDENCIES,
            Pass::Edges(Direction::Dependents) => &DEPENDENTS,
            Pass::Directory => &DEPENDENT_BUCKETS,
        }
    }
}

impl Direction {
    /// The read that finds an edge's row in the other table.
    fn twin(self, edge: &OneSidedEdge) -> ReadQuery {
        match self {
            Direction::Dependencies => dependents_row(edge),
            Direction::Dependents => dependencies_row(edge),
        }
        .columns([col::CREATED])
        .first(1)
    }
}

/// The read of an edge's `graph_parent_dependents` row.
fn dependents_row(edge: &OneSidedEdge) -> ReadQuery {
    dependent_row(&edge.domain, &edge.parent, &edge.kind, edge.priority, &edge.child)
}

/// The read of an edge's `graph_dependencies` row.
fn dependencies_row(edge: &OneSidedEdge) -> ReadQuery {
    dependency_row(&edge.domain, &edge.child, edge.priority, &edge.kind, &edge.parent)
}

enum Partition {
    Done,
    /// Stopped after this row.
    Cut(Vec<Value>),
}

impl Graph {
    /// One step of the check (see the module documentation).
    pub async fn check(&self, direction: Direction, after: Option<&str>, limit: u32) -> Result<ConsistencyStep, GraphError> {
        let from = after.map(parse_position_text).transpose()?.unwrap_or_default();
        let found = self.sweep(Pass::Edges(direction), from, Budget::of_partitions(limit), false, MAX_REPORTED).await?;
        Ok(ConsistencyStep {
            direction,
            partitions: found.partitions,
            edges: found.rows,
            missing: found.listed,
            next: found.next.as_ref().map(position_text),
            checked_at: rfc3339(self.store().now()),
        })
    }

    /// One bounded step of `pass` from `from` (a position in that pass):
    /// what is out of step, repaired if `repair`.
    pub(crate) async fn sweep(
        &self,
        pass: Pass,
        from: SweepPosition,
        budget: Budget,
        repair: bool,
        keep: usize,
    ) -> Result<Found, GraphError> {
        let table = pass.table();
        let cut = |after, inside| Some(SweepPosition { pass: from.pass, after, inside, cursor: Vec::new() });
        let mut found = Found::default();
        let mut rows_left = budget.rows.max(1);
        let mut after = from.after;
        if let Some((partition, last)) = from.inside {
            found.partitions += 1;
            match self.sweep_partition(pass, &partition.key, Some(last), &mut rows_left, repair, keep, &mut found).await? {
                Partition::Cut(last) => {
                    found.next = cut(after, Some((partition, last)));
                    return Ok(found);
                }
                Partition::Done => after = Some(partition),
            }
        }
        while found.partitions < u64::from(budget.partitions) && rows_left > 0 {
            let wanted = (u64::from(budget.partitions) - found.partitions).min(100) as u32;
            let scanned = self.store().scan_range(&ScanQuery::new(table, wanted).after(after.clone())).await?;
            if scanned.partitions.is_empty() {
                // A step over an empty slice of the ring still counts, so a step always ends.
                found.partitions += 1;
            }
            let positions: Vec<ScanPosition> =
                scanned.partitions.into_iter().map(|p| ScanPosition { token: p.token, key: p.key }).collect();
            // The partitions read whole within the budget are checked
            // together: their rows in one batch of reads, their twins in
            // another (one partition at a time, a step paid two round trips
            // in sequence per partition). The first larger than a read, or
            // the one the budget ends in, and those after it, go one at a
            // time below, where a step can stop inside a partition.
            let chunk = rows_left.min(LOOKUP_CHUNK);
            let firsts = self
                .store()
                .read_many(positions.iter().map(|p| ReadQuery::new(table, p.key.iter().cloned()).limit(chunk as u32)).collect())
                .await?;
            let (mut whole, mut whole_rows) = (0, 0u64);
            for rows in &firsts {
                let n = rows.len() as u64;
                if n >= chunk || whole_rows + n > rows_left {
                    break;
                }
                (whole, whole_rows) = (whole + 1, whole_rows + n);
            }
            let groups: Vec<(&[Value], &[Row])> =
                positions[..whole].iter().zip(&firsts[..whole]).map(|(p, rows)| (p.key.as_slice(), rows.as_slice())).collect();
            self.sweep_rows(pass, &groups, repair, keep, &mut found).await?;
            found.partitions += whole as u64;
            found.rows += whole_rows;
            rows_left -= whole_rows;
            if whole > 0 {
                after = Some(positions[whole - 1].clone());
            }
            let mut spent = rows_left == 0;
            for partition in positions.into_iter().skip(whole) {
                if spent {
                    break;
                }
                found.partitions += 1;
                match self.sweep_partition(pass, &partition.key, None, &mut rows_left, repair, keep, &mut found).await? {
                    Partition::Cut(last) => {
                        found.next = cut(after, Some((partition, last)));
                        return Ok(found);
                    }
                    Partition::Done => after = Some(partition),
                }
                if rows_left == 0 {
                    spent = true;
                    break;
                }
            }
            if spent {
                break;
            }
            match scanned.next {
                None => return Ok(found),
                Some(next) => after = Some(next),
            }
        }
        found.next = cut(after, None);
        Ok(found)
    }

    /// Checks the rows of one partition after `last`, a chunk at a time, until
    /// the rows budget runs out.
    #[allow(clippy::too_many_arguments)]
    async fn sweep_partition(
        &self,
        pass: Pass,
        key: &[Value],
        last: Option<Vec<Value>>,
        rows_left: &mut u64,
        repair: bool,
        keep: usize,
        found: &mut Found,
    ) -> Result<Partition, GraphError> {
        let table = pass.table();
        let mut slices = match &last {
            Some(last) if !last.is_empty() => slices_after(table, last, ReadOrder::Clustering),
            _ => vec![Slice::all()],
        };
        slices.reverse();
        let mut resume: Option<ReadQuery> = None;
        loop {
            let query = match resume.take() {
                Some(query) => query,
                None => match slices.pop() {
                    Some(slice) => ReadQuery::new(table, key.iter().cloned()).slice(slice),
                    None => return Ok(Partition::Done),
                },
            };
            let chunk = (*rows_left).min(LOOKUP_CHUNK) as u32;
            let page = self.store().read(&query.clone().limit(chunk)).await?;
            *rows_left -= page.rows.len() as u64;
            found.rows += page.rows.len() as u64;
            let last_row = page.rows.last().map(|row| clustering_key(table, row));
            self.sweep_rows(pass, &[(key, page.rows.as_slice())], repair, keep, found).await?;
            if let Some(token) = page.next {
                if *rows_left == 0 {
                    return Ok(Partition::Cut(last_row.unwrap_or_default()));
                }
                resume = Some(query.page_token(Some(token)));
            } else if *rows_left == 0 && !slices.is_empty() {
                return Ok(Partition::Cut(last_row.or(last.clone()).unwrap_or_default()));
            }
        }
    }

    /// Checks (and repairs) rows of partitions, `(partition key, rows)` in scan order.
    async fn sweep_rows(
        &self,
        pass: Pass,
        groups: &[(&[Value], &[Row])],
        repair: bool,
        keep: usize,
        found: &mut Found,
    ) -> Result<(), GraphError> {
        match pass {
            Pass::Edges(direction) => {
                let mut edges: Vec<OneSidedEdge> = Vec::new();
                for (key, rows) in groups {
                    for row in rows.iter() {
                        edges.push(one_sided(direction, key, row)?);
                    }
                }
                if edges.is_empty() {
                    return Ok(());
                }
                let twins = self.store().read_many(edges.iter().map(|edge| direction.twin(edge)).collect()).await?;
                for (edge, twin) in edges.into_iter().zip(twins) {
                    if twin.is_empty() {
                        found.one_sided += 1;
                        if repair && self.repair_edge(&edge).await? {
                            found.repaired += 1;
                        }
                        if found.listed.len() < keep {
                            found.listed.push(edge);
                        }
                    }
                }
            }
            Pass::Directory => {
                for (key, rows) in groups {
                    for row in rows.iter() {
                        if self.prune_entry(key, row, repair).await? {
                            found.one_sided += 1;
                            found.repaired += u64::from(repair);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes one edge's rows agree, holding its page and looking again first:
    /// the page's dependencies row decides. Answers
    /// whether it wrote anything.
    async fn repair_edge(&self, edge: &OneSidedEdge) -> Result<bool, GraphError> {
        let domain = Domain::parse(&edge.domain)
            .map_err(|_| GraphError::Corrupt(format!("a stored domain that does not parse: {:?}", edge.domain)))?;
        let (owned_domain, owned_edge) = (domain.clone(), edge.clone());
        self.changing(&domain, &edge.child, move |graph, at| async move {
            let (domain, edge) = (owned_domain, owned_edge);
            let by_child = graph.store().read(&dependencies_row(&edge).first(1)).await?.rows;
            let by_child = by_child.first().map(StoredEdge::of).transpose()?;
            let by_parent = !graph.store().read(&dependents_row(&edge).columns([col::CREATED]).first(1)).await?.rows.is_empty();
            let writes = match (by_child, by_parent) {
                (Some(stored), false) => stored.put(&domain, &edge.child, &[], at),
                (None, true) => {
                    vec![dependent_delete(&edge.domain, &edge.parent, &edge.kind, edge.priority, &edge.child).timestamp(at).into()]
                }
                // In step again (a client wrote meanwhile).
                _ => return Ok(false),
            };
            graph.store().apply(writes).await?;
            Ok(true)
        })
        .await
    }

    /// Prunes a directory entry whose partition holds no dependent (when
    /// `apply`). The delete is written at the entry's own write time, so an
    /// edge written to the partition since rewrites the entry above it; and
    /// the partition is looked at once more after, to put back an entry an
    /// edge written meanwhile needs. Answers whether the entry was empty.
    async fn prune_entry(&self, key: &[Value], row: &Row, apply: bool) -> Result<bool, GraphError> {
        let Some(b) = row.bigint(col::BUCKET) else {
            return Err(GraphError::Corrupt("a directory row without its bucket".into()));
        };
        let partition: Vec<Value> = key.iter().cloned().chain([Value::from(b)]).collect();
        let probe = ReadQuery::new(&DEPENDENTS, partition).columns([col::CREATED]).first(1);
        if !self.store().read(&probe).await?.rows.is_empty() {
            return Ok(false);
        }
        if apply {
            let written = row.timestamp(col::CREATED).unwrap_or(0);
            let deleted_at = written * 1000 + 999;
            let entry = [Value::from(b)];
            self.store().write(Delete::row(&DEPENDENT_BUCKETS, key.iter().cloned(), entry.clone()).timestamp(deleted_at)).await?;
            if !self.store().read(&probe).await?.rows.is_empty() {
                let again = self.store().now_micros().max(deleted_at + 1);
                let upsert = Upsert::new(&DEPENDENT_BUCKETS, key.iter().cloned().chain(entry))
                    .set(col::CREATED, Value::Timestamp(again / 1000))
                    .timestamp(again);
                self.store().write(upsert).await?;
            }
        }
        Ok(true)
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
            priority: row.bigint(col::PRIORITY).ok_or_else(corrupt)?,
            child: row.text(col::CHILD).ok_or_else(corrupt)?.to_owned(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_as_text_and_anything_else_is_refused() {
        let partition = ScanPosition { token: -5, key: vec![Value::from("en"), Value::from("Page")] };
        let position = SweepPosition {
            pass: 1,
            after: Some(ScanPosition { token: -9, key: vec![Value::from("en"), Value::from("Before")] }),
            inside: Some((partition.clone(), vec![Value::from(7i64), Value::from("modification"), Value::from("T")])),
            cursor: vec![Value::from(3i64), Value::Null],
        };
        assert_eq!(parse_position_text(&position_text(&position)).expect("parse"), position);
        // A bare scan position, odd or non-hex text: refused (a 400), never read as a position.
        for text in [partition.to_string(), "zz".to_owned(), "2".to_owned(), String::new()] {
            assert!(parse_position_text(&text).is_err(), "{text:?}");
        }
    }
}
