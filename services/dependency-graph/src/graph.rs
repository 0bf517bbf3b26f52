//! The graph: replacing a page's dependency set by diff, listing in both
//! directions, recording changes and answering pull checks.
//!
//! Layout (tables in `revstore_schema::tables::dependency_graph`, design in
//! `docs/design/dependency-graph.md`):
//! - by child: one partition per page, its edges priority descending;
//! - by parent: one partition per (parent, type, priority, bucket), where the
//!   bucket is a hash of the child (`BUCKETS` of them), so ten million
//!   dependents of a template spread over at least 32 partitions; a
//!   directory partition per (parent, type) lists the (priority, bucket)
//!   partitions in listing order;
//! - changes: the latest change time of each page, by type and selector,
//!   written once per change (O(1) whatever the number of dependents) and
//!   compared with each edge's `last_updated` by the pull check.
//!
//! Every write of an edge touches both directions in one batch (logged on
//! Cassandra); a page's edges are written a few at a time, each edge whole in
//! one batch, so a batch stays far below Cassandra's size limits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::time::{Duration, SystemTime};

use futures_util::{StreamExt, TryStreamExt};
use revstore_api::graph::{Dependency, DependencyList, Dependent, DependentList, Edge, Pending, PendingItem, Replaced};
use revstore_api::{ChangeKind, ChangeNotice};
use revstore_keys::{Domain, Title, TitleRules, murmur3_token, rfc3339};
use revstore_schema::tables::dependency_graph::{CHANGES, DEPENDENCIES, DEPENDENT_BUCKETS, DEPENDENTS, col};
use revstore_storage::{Delete, EngineKind, ReadQuery, Row, Slice, Store, Upsert, Value, Write};

use crate::error::GraphError;

/// Hash buckets of a parent's dependents, per type and priority. Part of the
/// data layout: changing it needs the data rewritten.
pub const BUCKETS: i64 = 32;

/// The most writes in one batch (an edge's writes are never split): on
/// Cassandra, far below `batch_size_fail_threshold` (50 KB) with the largest
/// selectors; on the embedded engine a batch is one SQLite transaction, and
/// larger ones load faster.
const CASSANDRA_BATCH_WRITES: usize = 48;
const EMBEDDED_BATCH_WRITES: usize = 1200;

/// The most fragments of one page whose changes a pull check reads (a page
/// changed in more fragments than this counts as changed through the ones read).
const MAX_CHANGE_SELECTORS: u32 = 1000;

/// How far in the future a change or an update may be dated (clock skew).
const MAX_FUTURE: Duration = Duration::from_secs(300);

/// The bucket of a child among its parent's dependents.
pub fn bucket(child: &str) -> i64 {
    murmur3_token(child.as_bytes()).rem_euclid(BUCKETS)
}

/// A change or dependency type as stored.
fn kind_name(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Modification => "modification",
        ChangeKind::Existence => "existence",
    }
}

fn parse_kind(name: &str) -> Option<ChangeKind> {
    match name {
        "modification" => Some(ChangeKind::Modification),
        "existence" => Some(ChangeKind::Existence),
        _ => None,
    }
}

/// A selector as stored: its ids sorted and deduplicated, as JSON text.
fn store_selector(ids: &Option<Vec<String>>) -> Option<String> {
    ids.as_ref().map(|ids| {
        let set: BTreeSet<&String> = ids.iter().collect();
        serde_json::to_string(&set).unwrap_or_default()
    })
}

fn load_selector(text: Option<&str>) -> Option<Vec<String>> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

fn now_micros() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

fn time_text(millis: i64) -> String {
    rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(millis.max(0) as u64))
}

/// One edge as the by-child table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredEdge {
    priority: i64,
    kind: ChangeKind,
    parent: String,
    parent_selector: Option<String>,
    child_selector: Option<String>,
    /// Milliseconds.
    last_updated: Option<i64>,
    created: Option<i64>,
}

impl StoredEdge {
    /// A client's edge of `child`, checked (its fields, its parent's title,
    /// no self-dependency) and in stored form.
    fn checked(child: &Title, edge: &Edge, titles: TitleRules, created: Option<i64>) -> Result<StoredEdge, GraphError> {
        edge.validate()?;
        let parent = Title::parse(&edge.parent, titles)?;
        if parent == *child {
            return Err(GraphError::Invalid(format!("{child} cannot depend on itself")));
        }
        Ok(StoredEdge {
            priority: edge.priority,
            kind: edge.kind,
            parent: parent.as_str().to_owned(),
            parent_selector: store_selector(&edge.parent_selector),
            child_selector: store_selector(&edge.child_selector),
            last_updated: None,
            created,
        })
    }

    pub(crate) fn of(row: &Row) -> Result<StoredEdge, GraphError> {
        let corrupt = |what: &str| GraphError::Corrupt(format!("a dependency row without a valid {what}"));
        Ok(StoredEdge {
            priority: row.bigint(col::PRIORITY).ok_or_else(|| corrupt("priority"))?,
            kind: row.text(col::DEP_TYPE).and_then(parse_kind).ok_or_else(|| corrupt("type"))?,
            parent: row.text(col::PARENT).ok_or_else(|| corrupt("parent"))?.to_owned(),
            parent_selector: row.text(col::PARENT_SELECTOR).map(str::to_owned),
            child_selector: row.text(col::CHILD_SELECTOR).map(str::to_owned),
            last_updated: row.timestamp(col::LAST_UPDATED),
            created: row.timestamp(col::CREATED),
        })
    }
}

/// The graph of one deployment. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Graph {
    store: Store,
    /// The most edges one page may have.
    max_edges: usize,
}

/// Where a listing of dependents goes on: the (priority, bucket) partition
/// and the last child seen in it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct DependentsCursor {
    priority: i64,
    bucket: i64,
    after: String,
}

/// Which dependents to list.
#[derive(Debug, Clone)]
pub struct DependentsQuery {
    pub kind: ChangeKind,
    pub min_priority: i64,
    pub max_priority: i64,
    pub limit: u32,
    pub cursor: Option<String>,
}

impl Graph {
    pub fn new(store: Store, max_edges: usize) -> Self {
        Graph { store, max_edges }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn max_edges(&self) -> usize {
        self.max_edges
    }

    fn child_key(domain: &Domain, child: &Title) -> [Value; 2] {
        [Value::from(domain.as_str()), Value::from(child.as_str())]
    }

    /// Every edge of a page (at most `max_edges`, more only if an older
    /// setting allowed it), priority descending.
    async fn edges_of(&self, domain: &Domain, child: &Title) -> Result<Vec<StoredEdge>, GraphError> {
        let query = ReadQuery::new(&DEPENDENCIES, Self::child_key(domain, child)).limit(1000);
        let rows: Vec<Row> = self.store.rows(query).try_collect().await?;
        rows.iter().map(StoredEdge::of).collect()
    }

    /// The writes that store `edge` of `child` in both directions. A cell
    /// with no value is not written at all (a null written is a tombstone
    /// that every read of the partition passes over), unless `clears` names
    /// it: a selector the edge had and no longer has.
    pub(crate) fn put_edge(domain: &Domain, child: &str, edge: &StoredEdge, clears: &[&'static str]) -> Vec<Write> {
        let d = Value::from(domain.as_str());
        let kind = kind_name(edge.kind);
        let cells = |mut upsert: Upsert| {
            for (column, value) in [(col::PARENT_SELECTOR, &edge.parent_selector), (col::CHILD_SELECTOR, &edge.child_selector)] {
                match value {
                    Some(v) => upsert = upsert.set(column, v.as_str()),
                    None if clears.contains(&column) => upsert = upsert.set(column, Value::Null),
                    None => {}
                }
            }
            if let Some(created) = edge.created {
                upsert = upsert.set(col::CREATED, Value::Timestamp(created));
            }
            upsert
        };
        let mut by_child = cells(Upsert::new(
            &DEPENDENCIES,
            [d.clone(), Value::from(child), Value::from(edge.priority), Value::from(kind), Value::from(edge.parent.as_str())],
        ));
        if let Some(updated) = edge.last_updated {
            by_child = by_child.set(col::LAST_UPDATED, Value::Timestamp(updated));
        }
        let b = bucket(child);
        let parent_partition =
            [d.clone(), Value::from(edge.parent.as_str()), Value::from(kind), Value::from(edge.priority), Value::from(b)];
        let by_parent = cells(Upsert::new(&DEPENDENTS, parent_partition.into_iter().chain([Value::from(child)])));
        let directory = Upsert::new(
            &DEPENDENT_BUCKETS,
            [d, Value::from(edge.parent.as_str()), Value::from(kind), Value::from(edge.priority), Value::from(b)],
        )
        .set(col::CREATED, Value::Timestamp(now_micros() / 1000));
        vec![by_child.into(), by_parent.into(), directory.into()]
    }

    /// The writes that remove `edge` of `child` from both directions (the
    /// directory keeps its row: an empty partition costs a read, not a wrong answer).
    fn remove_edge(domain: &Domain, child: &str, edge: &StoredEdge) -> Vec<Write> {
        let d = Value::from(domain.as_str());
        let kind = kind_name(edge.kind);
        vec![
            Delete::row(
                &DEPENDENCIES,
                [d.clone(), Value::from(child)],
                [Value::from(edge.priority), Value::from(kind), Value::from(edge.parent.as_str())],
            )
            .into(),
            Delete::row(
                &DEPENDENTS,
                [d, Value::from(edge.parent.as_str()), Value::from(kind), Value::from(edge.priority), Value::from(bucket(child))],
                [Value::from(child)],
            )
            .into(),
        ]
    }

    /// Applies groups of writes (each group whole in one batch), a few groups per batch.
    pub(crate) async fn apply_groups(&self, groups: Vec<Vec<Write>>) -> Result<(), GraphError> {
        let most = match self.store.kind() {
            EngineKind::Embedded => EMBEDDED_BATCH_WRITES,
            EngineKind::Cassandra => CASSANDRA_BATCH_WRITES,
        };
        let mut batch: Vec<Write> = Vec::new();
        for group in groups {
            if !batch.is_empty() && batch.len() + group.len() > most {
                self.store.apply(std::mem::take(&mut batch)).await?;
            }
            batch.extend(group);
        }
        if !batch.is_empty() {
            self.store.apply(batch).await?;
        }
        Ok(())
    }

    /// Replaces a page's dependency set with `edges`, writing only what
    /// differs from what is stored.
    pub async fn replace(&self, domain: &Domain, child: &Title, edges: &[Edge], titles: TitleRules) -> Result<Replaced, GraphError> {
        if edges.len() > self.max_edges {
            return Err(GraphError::TooManyEdges { given: edges.len(), max: self.max_edges });
        }
        let mut wanted: BTreeMap<(ChangeKind, String), StoredEdge> = BTreeMap::new();
        for edge in edges {
            let stored = StoredEdge::checked(child, edge, titles, None)?;
            let parent = stored.parent.clone();
            if wanted.insert((edge.kind, stored.parent.clone()), stored).is_some() {
                return Err(GraphError::Invalid(format!(
                    "{} appears twice with type {}: one edge per parent and type, its selectors naming every fragment",
                    parent,
                    kind_name(edge.kind)
                )));
            }
        }
        let stored = self.edges_of(domain, child).await?;
        let now_ms = now_micros() / 1000;
        let mut outcome = Replaced::default();
        let mut groups: Vec<Vec<Write>> = Vec::new();
        let mut removals: Vec<Vec<Write>> = Vec::new();
        let mut seen: BTreeSet<(ChangeKind, String)> = BTreeSet::new();
        for old in &stored {
            let key = (old.kind, old.parent.clone());
            match wanted.get(&key) {
                None => {
                    outcome.removed += 1;
                    removals.push(Self::remove_edge(domain, child.as_str(), old));
                }
                Some(new) => {
                    seen.insert(key);
                    let same_data = new.parent_selector == old.parent_selector && new.child_selector == old.child_selector;
                    if new.priority == old.priority && same_data {
                        outcome.unchanged += 1;
                        continue;
                    }
                    outcome.changed += 1;
                    let replacement = StoredEdge { last_updated: old.last_updated, created: old.created.or(Some(now_ms)), ..new.clone() };
                    let mut group = Vec::new();
                    let mut clears = Vec::new();
                    if new.priority != old.priority {
                        // A new row: nothing of the old one to clear.
                        group.extend(Self::remove_edge(domain, child.as_str(), old));
                    } else {
                        if old.parent_selector.is_some() && new.parent_selector.is_none() {
                            clears.push(col::PARENT_SELECTOR);
                        }
                        if old.child_selector.is_some() && new.child_selector.is_none() {
                            clears.push(col::CHILD_SELECTOR);
                        }
                    }
                    group.extend(Self::put_edge(domain, child.as_str(), &replacement, &clears));
                    groups.push(group);
                }
            }
        }
        for (key, new) in &wanted {
            if !seen.contains(key) {
                outcome.added += 1;
                groups.push(Self::put_edge(domain, child.as_str(), &StoredEdge { created: Some(now_ms), ..new.clone() }, &[]));
            }
        }
        // Additions first, removals last: a crash midway leaves an edge too
        // many (a re-render too many), not one missing (a page left stale),
        // and the retried write completes the set.
        groups.extend(removals);
        self.apply_groups(groups).await?;
        Ok(outcome)
    }

    /// Adds edges without reading what is stored (a bulk load: importing a
    /// wiki's link tables, seeding a benchmark). An edge already stored with
    /// the same priority is overwritten; one with another priority is not
    /// removed, so use [`Graph::replace`] for pages that already have edges.
    pub async fn add_edges(&self, domain: &Domain, edges: &[(Title, Edge)], titles: TitleRules) -> Result<(), GraphError> {
        let now_ms = now_micros() / 1000;
        let mut groups = Vec::with_capacity(edges.len());
        for (child, edge) in edges {
            let stored = StoredEdge::checked(child, edge, titles, Some(now_ms))?;
            groups.push(Self::put_edge(domain, child.as_str(), &stored, &[]));
        }
        self.apply_groups(groups).await
    }

    /// Removes a page's dependencies from both directions. The by-parent rows
    /// go first and the page's own partition last, so a crash midway leaves
    /// the page's set to find and remove again. Answers how many edges it had.
    pub async fn remove_page(&self, domain: &Domain, child: &Title) -> Result<u64, GraphError> {
        let stored = self.edges_of(domain, child).await?;
        let groups = stored
            .iter()
            .map(|edge| {
                let d = Value::from(domain.as_str());
                let kind = kind_name(edge.kind);
                vec![
                    Delete::row(
                        &DEPENDENTS,
                        [
                            d,
                            Value::from(edge.parent.as_str()),
                            Value::from(kind),
                            Value::from(edge.priority),
                            Value::from(bucket(child.as_str())),
                        ],
                        [Value::from(child.as_str())],
                    )
                    .into(),
                ]
            })
            .collect();
        self.apply_groups(groups).await?;
        self.store.write(Delete::partition(&DEPENDENCIES, Self::child_key(domain, child))).await?;
        Ok(stored.len() as u64)
    }

    /// A page of a page's dependencies, priority descending.
    pub async fn dependencies(
        &self,
        domain: &Domain,
        child: &Title,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<DependencyList, GraphError> {
        let query = ReadQuery::new(&DEPENDENCIES, Self::child_key(domain, child)).limit(limit).page_token(cursor);
        let page = self.store.read(&query).await?;
        let items = page
            .rows
            .iter()
            .map(|row| {
                let edge = StoredEdge::of(row)?;
                Ok(Dependency {
                    parent: edge.parent,
                    kind: edge.kind,
                    priority: edge.priority,
                    parent_selector: load_selector(edge.parent_selector.as_deref()),
                    child_selector: load_selector(edge.child_selector.as_deref()),
                    last_updated: edge.last_updated.map(time_text),
                    created: edge.created.map(time_text),
                })
            })
            .collect::<Result<_, GraphError>>()?;
        Ok(DependencyList { items, next: page.next })
    }

    fn cursor_scope(domain: &Domain, parent: &Title, query: &DependentsQuery) -> String {
        format!("dependents|{domain}|{parent}|{}|{}|{}", kind_name(query.kind), query.min_priority, query.max_priority)
    }

    /// A page of a page's dependents of one type, priority descending, in
    /// constant memory whatever their number: the listing walks the
    /// directory's (priority, bucket) partitions in order, each by child.
    pub async fn dependents(&self, domain: &Domain, parent: &Title, query: DependentsQuery) -> Result<DependentList, GraphError> {
        if query.min_priority > query.max_priority {
            return Err(GraphError::Invalid(format!("min_priority {} is above max_priority {}", query.min_priority, query.max_priority)));
        }
        let scope = Self::cursor_scope(domain, parent, &query);
        let cursor: Option<DependentsCursor> = match &query.cursor {
            Some(text) => {
                let bytes = self.store.open_cursor(&scope, text)?;
                Some(serde_json::from_slice(&bytes).map_err(|_| GraphError::Invalid("cursor does not parse".into()))?)
            }
            None => None,
        };
        let kind = kind_name(query.kind);
        let directory_key = [Value::from(domain.as_str()), Value::from(parent.as_str()), Value::from(kind)];
        // The directory from the cursor's partition on: the rest of its
        // priority (buckets from the cursor's), then the lower priorities.
        let mut slices = Vec::new();
        let top = match &cursor {
            Some(c) => {
                slices.push(Slice::prefix([Value::from(c.priority)]).lower(Bound::Included(Value::from(c.bucket))));
                Bound::Excluded(Value::from(c.priority))
            }
            None => Bound::Included(Value::from(query.max_priority)),
        };
        slices.push(Slice::all().lower(Bound::Included(Value::from(query.min_priority))).upper(top));
        let mut items: Vec<Dependent> = Vec::with_capacity(query.limit as usize);
        for slice in slices {
            let mut directory = Box::pin(self.store.rows(ReadQuery::new(&DEPENDENT_BUCKETS, directory_key.clone()).slice(slice).limit(64)));
            while let Some(row) = directory.next().await.transpose()? {
                let (Some(priority), Some(b)) = (row.bigint(col::PRIORITY), row.bigint(col::BUCKET)) else { continue };
                let after = cursor.as_ref().filter(|c| (c.priority, c.bucket) == (priority, b)).map(|c| c.after.clone());
                let wanted = query.limit - items.len() as u32;
                let mut partition = Slice::all();
                if let Some(after) = after {
                    partition = partition.lower(Bound::Excluded(Value::from(after)));
                }
                let rows = self
                    .store
                    .read(
                        &ReadQuery::new(
                            &DEPENDENTS,
                            [
                                Value::from(domain.as_str()),
                                Value::from(parent.as_str()),
                                Value::from(kind),
                                Value::from(priority),
                                Value::from(b),
                            ],
                        )
                        .slice(partition)
                        .limit(wanted),
                    )
                    .await?
                    .rows;
                for row in &rows {
                    let child = row.text(col::CHILD).ok_or_else(|| GraphError::Corrupt("a dependent row without a child".into()))?;
                    items.push(Dependent {
                        child: child.to_owned(),
                        kind: query.kind,
                        priority,
                        parent_selector: load_selector(row.text(col::PARENT_SELECTOR)),
                        child_selector: load_selector(row.text(col::CHILD_SELECTOR)),
                    });
                }
                if items.len() as u32 == query.limit {
                    let last = items.last().map(|d| d.child.clone()).unwrap_or_default();
                    let next = DependentsCursor { priority, bucket: b, after: last };
                    let bytes = serde_json::to_vec(&next).map_err(GraphError::internal)?;
                    return Ok(DependentList { items, next: Some(self.store.seal_cursor(&scope, &bytes)) });
                }
            }
        }
        Ok(DependentList { items, next: None })
    }

    /// Records a change of a page: one write, whatever the number of its
    /// dependents. The latest change per (type, selector) wins, whatever
    /// order changes arrive in.
    pub async fn record_change(&self, domain: &Domain, notice: &ChangeNotice, titles: TitleRules) -> Result<(), GraphError> {
        let page = Title::parse(&notice.page, titles)?;
        let at = not_in_the_future("at", revstore_api::graph::parse_time("at", &notice.at)?)?;
        let selector = match &notice.selector {
            Some(id) => {
                revstore_api::graph::check_selector("selector", std::slice::from_ref(id))?;
                id.clone()
            }
            None => String::new(),
        };
        let write = Upsert::new(
            &CHANGES,
            [Value::from(domain.as_str()), Value::from(page.as_str()), Value::from(kind_name(notice.kind)), Value::from(selector)],
        )
        .set(col::CHANGED_AT, Value::Timestamp(at / 1000))
        .timestamp(at);
        self.store.write(write).await?;
        Ok(())
    }

    /// The pull check: every dependency of the page whose parent changed
    /// (in a fragment the edge uses) after the page was last brought up to
    /// date with it, priority ascending (pull first).
    pub async fn pending(&self, domain: &Domain, child: &Title) -> Result<Pending, GraphError> {
        let edges = self.edges_of(domain, child).await?;
        // Every parent's changes in one multi-partition read.
        let parents: Vec<(ChangeKind, String)> =
            edges.iter().map(|e| (e.kind, e.parent.clone())).collect::<BTreeSet<_>>().into_iter().collect();
        let queries = parents
            .iter()
            .map(|(kind, parent)| {
                ReadQuery::new(&CHANGES, [Value::from(domain.as_str()), Value::from(parent.as_str()), Value::from(kind_name(*kind))])
                    .limit(MAX_CHANGE_SELECTORS)
            })
            .collect();
        let pages = self.store.read_many(queries).await?;
        let changes: HashMap<(ChangeKind, String), HashMap<String, i64>> = parents
            .into_iter()
            .zip(pages)
            .map(|(key, rows)| {
                let of_parent =
                    rows.iter().filter_map(|row| Some((row.text(col::SELECTOR)?.to_owned(), row.timestamp(col::CHANGED_AT)?))).collect();
                (key, of_parent)
            })
            .collect();
        let mut items = Vec::new();
        for edge in &edges {
            let Some(of_parent) = changes.get(&(edge.kind, edge.parent.clone())) else { continue };
            let uses = load_selector(edge.parent_selector.as_deref());
            let relevant = of_parent
                .iter()
                .filter(|(selector, _)| selector.is_empty() || uses.as_ref().is_none_or(|ids| ids.iter().any(|id| id == *selector)))
                .map(|(_, at)| *at)
                .max();
            let baseline = edge.last_updated.or(edge.created).unwrap_or(0);
            if let Some(changed) = relevant.filter(|at| *at > baseline) {
                items.push(PendingItem {
                    parent: edge.parent.clone(),
                    kind: edge.kind,
                    priority: edge.priority,
                    child_selector: load_selector(edge.child_selector.as_deref()),
                    changed_at: time_text(changed),
                });
            }
        }
        items.sort_by(|a, b| (a.priority, &a.parent).cmp(&(b.priority, &b.parent)));
        Ok(Pending { needs_update: !items.is_empty(), items })
    }

    /// Brings the page's edges up to date with a render made at `at`: all of
    /// them for a full render, or those whose child fragments `selectors`
    /// covers. Written with `at` as write timestamp, so an edge removed
    /// after `at` stays removed. Answers how many edges it updated.
    pub async fn mark_updated(&self, domain: &Domain, child: &Title, at: &str, selectors: Option<&[String]>) -> Result<u64, GraphError> {
        let at = not_in_the_future("at", revstore_api::graph::parse_time("at", at)?)?;
        if let Some(ids) = selectors {
            revstore_api::graph::check_selector("selectors", ids)?;
        }
        let at_ms = at / 1000;
        let edges = self.edges_of(domain, child).await?;
        let covered = |edge: &StoredEdge| match selectors {
            None => true,
            Some(ids) => load_selector(edge.child_selector.as_deref()).is_some_and(|uses| uses.iter().all(|u| ids.contains(u))),
        };
        let groups: Vec<Vec<Write>> = edges
            .iter()
            .filter(|edge| covered(edge) && edge.last_updated.is_none_or(|u| u < at_ms))
            .map(|edge| {
                vec![
                    Upsert::new(
                        &DEPENDENCIES,
                        [
                            Value::from(domain.as_str()),
                            Value::from(child.as_str()),
                            Value::from(edge.priority),
                            Value::from(kind_name(edge.kind)),
                            Value::from(edge.parent.as_str()),
                        ],
                    )
                    .set(col::LAST_UPDATED, Value::Timestamp(at_ms))
                    .timestamp(at)
                    .into(),
                ]
            })
            .collect();
        let updated = groups.len() as u64;
        self.apply_groups(groups).await?;
        Ok(updated)
    }
}

fn not_in_the_future(name: &str, micros: i64) -> Result<i64, GraphError> {
    if micros > now_micros() + MAX_FUTURE.as_micros() as i64 {
        return Err(GraphError::Invalid(format!("{name} is more than {} s in the future", MAX_FUTURE.as_secs())));
    }
    Ok(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_spread_children_evenly() {
        let mut counts = [0u32; BUCKETS as usize];
        for i in 0..32_000 {
            counts[bucket(&format!("Page_{i}")) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }

    #[test]
    fn selectors_are_stored_sorted_and_once() {
        let ids = Some(vec!["b".to_owned(), "a".to_owned(), "b".to_owned()]);
        assert_eq!(store_selector(&ids).as_deref(), Some(r#"["a","b"]"#));
        assert_eq!(load_selector(store_selector(&ids).as_deref()), Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(store_selector(&None), None);
    }
}
