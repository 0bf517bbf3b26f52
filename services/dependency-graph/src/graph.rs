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
//! one batch, so a batch stays far below Cassandra's size limits. Every change
//! of one page's edges holds the page (`writer.rs`) and writes at the page's
//! clock, so changes of a page never interleave and a removal always lands
//! above what it removes.
//!
//! Listings are bounded twice: by their item count and by [`PAGE_BYTES`] (a
//! page is cut early and says `next`), and they read [`READ_ROWS`] rows at a
//! time, at most [`LISTINGS_AT_ONCE`] of them at once, so what an anonymous
//! reader makes the service hold is bounded whatever was written.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::{StreamExt, TryStreamExt};
use revstore_api::graph::{Dependency, DependencyList, Dependent, DependentList, Edge, Pending, PendingItem, Replaced};
use revstore_api::{ChangeKind, ChangeNotice};
use revstore_keys::{Domain, Title, TitleRules, murmur3_token, rfc3339};
use revstore_schema::tables::dependency_graph::{CHANGES, DEPENDENCIES, DEPENDENT_BUCKETS, DEPENDENTS, col};
use revstore_storage::value::{decode_values, encode_values};
use revstore_storage::{Delete, EngineKind, ReadOrder, ReadQuery, Row, Slice, Store, Upsert, Value, Write, slices_after};
use tokio::sync::Semaphore;

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

/// The most a listing page's items may weigh (titles and selectors, about
/// what they take in the answer's JSON): a page is cut before the item that
/// would pass it, and always holds at least one.
pub const PAGE_BYTES: usize = 1024 * 1024;

/// Rows one storage read of a listing takes. An edge's row holds at most
/// about 131 KB (two selectors of 256 ids of 256 bytes), so one read holds at
/// most about 17 MB, and a listing at most that and its page.
pub const READ_ROWS: u32 = 128;

/// Listings (dependents, dependencies, pull checks) served at once; more
/// wait their turn (within the request timeout). With [`READ_ROWS`] and
/// [`PAGE_BYTES`], this bounds what listings hold in all to about 300 MB in
/// the worst case (rows of the largest selectors), a few MB in practice.
pub const LISTINGS_AT_ONCE: usize = 16;

/// Directory entries one listing page visits: an emptied (priority, bucket)
/// partition costs a read that finds nothing, so past this many the page
/// ends early with its `next`, and the janitor's graph task prunes them.
pub const DIRECTORY_ENTRIES_PER_PAGE: usize = 256;

/// The change rows of a page that are not a fragment's (fragment ids have no
/// control characters, so these sort before every one of them, after `""`):
/// - `ANY`: the page's latest change of any fragment or of the whole page,
///   written with every change, so an edge that uses the whole parent, or
///   one whose parent changed nothing since its last update, needs no
///   fragment row read;
/// - `FORGOTTEN`: the latest change among the fragment rows the janitor's
///   retention removed; an edge not updated since then is taken as stale
///   (a re-render too many, never one missed).
pub(crate) const ANY: &str = "\u{1}";
pub(crate) const FORGOTTEN: &str = "\u{2}";

/// An edge naming at most this many fragments has their change rows read one
/// by one; one naming more has its parent's fragment rows streamed.
const POINT_READ_FRAGMENTS: usize = 32;

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

    /// A row left by an update that outlived its edge (before dependency-graph
    /// schema 7, an update could be written above a removal): every edge is
    /// written with its `created`, so a row without it is no edge.
    pub(crate) fn is_ghost(&self) -> bool {
        self.created.is_none()
    }

    /// When the child was last brought up to date with this edge (milliseconds).
    fn baseline(&self) -> i64 {
        self.last_updated.or(self.created).unwrap_or(0)
    }

    /// About what the edge takes in a listing's JSON.
    fn weight(&self) -> usize {
        weight(&self.parent, [self.parent_selector.as_deref(), self.child_selector.as_deref()])
    }

    /// Its clustering key in the by-child table.
    fn clustering(&self) -> Vec<Value> {
        vec![Value::from(self.priority), Value::from(kind_name(self.kind)), Value::from(self.parent.as_str())]
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
    /// Turns for listings (see [`LISTINGS_AT_ONCE`]).
    listings: Arc<Semaphore>,
}

/// Where a listing of dependents goes on: the (priority, bucket) partition
/// and the last child seen in it (`None`: from the partition's start).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct DependentsCursor {
    priority: i64,
    bucket: i64,
    #[serde(default)]
    after: Option<String>,
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

/// A listing page being filled: at most `limit` items and [`PAGE_BYTES`].
struct PageFill {
    limit: usize,
    items: usize,
    bytes: usize,
}

impl PageFill {
    fn new(limit: u32) -> Self {
        PageFill { limit: limit as usize, items: 0, bytes: 0 }
    }

    /// Takes an item of `weight` bytes, or says the page is full (the first
    /// item is always taken).
    fn take(&mut self, weight: usize) -> bool {
        if self.items >= self.limit || (self.items > 0 && self.bytes + weight > PAGE_BYTES) {
            return false;
        }
        self.items += 1;
        self.bytes += weight;
        true
    }

    fn is_full(&self) -> bool {
        self.items >= self.limit
    }
}

/// About what an item with this title and these selectors takes in a listing's JSON.
fn weight(title: &str, selectors: [Option<&str>; 2]) -> usize {
    64 + title.len() + selectors.iter().flatten().map(|s| s.len()).sum::<usize>()
}

impl Graph {
    pub fn new(store: Store, max_edges: usize) -> Self {
        Graph { store, max_edges, listings: Arc::new(Semaphore::new(LISTINGS_AT_ONCE)) }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn max_edges(&self) -> usize {
        self.max_edges
    }

    fn child_key(domain: &Domain, child: &str) -> [Value; 2] {
        [Value::from(domain.as_str()), Value::from(child)]
    }

    /// The slices of a page's dependencies a listing in `order` reads from
    /// its cursor on (sealed for `scope`: the last edge it listed).
    fn resume_after(&self, scope: &str, cursor: Option<&str>, order: ReadOrder) -> Result<Vec<Slice>, GraphError> {
        let Some(cursor) = cursor else { return Ok(vec![Slice::all()]) };
        let after =
            decode_values(&self.store.open_cursor(scope, cursor)?).map_err(|_| GraphError::Invalid("cursor does not parse".into()))?;
        Ok(slices_after(&DEPENDENCIES, &after, order))
    }

    /// `micros`, unless it is further ahead of the store's time than the allowed clock skew.
    fn not_in_the_future(&self, name: &str, micros: i64) -> Result<i64, GraphError> {
        if micros > self.store.now_micros() + MAX_FUTURE.as_micros() as i64 {
            return Err(GraphError::Invalid(format!("{name} is more than {} s in the future", MAX_FUTURE.as_secs())));
        }
        Ok(micros)
    }

    /// A turn to list (see [`LISTINGS_AT_ONCE`]).
    async fn listing_turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, GraphError> {
        self.listings.acquire().await.map_err(GraphError::internal)
    }

    /// Every row of a page's edges (at most `max_edges`, more only if an
    /// older setting allowed it), priority descending, ghosts included.
    async fn edge_rows_of(&self, domain: &Domain, child: &Title) -> Result<Vec<StoredEdge>, GraphError> {
        let query = ReadQuery::new(&DEPENDENCIES, Self::child_key(domain, child.as_str())).limit(1000);
        let rows: Vec<Row> = self.store.rows(query).try_collect().await?;
        rows.iter().map(StoredEdge::of).collect()
    }

    /// The writes that store `edge` of `child` in both directions, at write
    /// timestamp `at` (the page's clock; the store's time for bulk loads). A cell with no value is not written at all (a null written is
    /// a tombstone that every read of the partition passes over), unless
    /// `clears` names it: a selector or update time the row had and must lose.
    pub(crate) fn put_edge(domain: &Domain, child: &str, edge: &StoredEdge, clears: &[&'static str], at: i64) -> Vec<Write> {
        let d = Value::from(domain.as_str());
        let kind = kind_name(edge.kind);
        let stamped = |upsert: Upsert| upsert.timestamp(at);
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
            stamped(upsert)
        };
        let mut by_child = cells(Upsert::new(
            &DEPENDENCIES,
            [d.clone(), Value::from(child), Value::from(edge.priority), Value::from(kind), Value::from(edge.parent.as_str())],
        ));
        match edge.last_updated {
            Some(updated) => by_child = by_child.set(col::LAST_UPDATED, Value::Timestamp(updated)),
            None if clears.contains(&col::LAST_UPDATED) => by_child = by_child.set(col::LAST_UPDATED, Value::Null),
            None => {}
        }
        let b = bucket(child);
        let parent_partition =
            [d.clone(), Value::from(edge.parent.as_str()), Value::from(kind), Value::from(edge.priority), Value::from(b)];
        let by_parent = cells(Upsert::new(&DEPENDENTS, parent_partition.into_iter().chain([Value::from(child)])));
        // The entry's `created` is its write time to the millisecond, so the
        // janitor can prune an emptied entry without shadowing a newer write.
        let directory = Upsert::new(
            &DEPENDENT_BUCKETS,
            [d, Value::from(edge.parent.as_str()), Value::from(kind), Value::from(edge.priority), Value::from(b)],
        )
        .set(col::CREATED, Value::Timestamp(at / 1000))
        .timestamp(at);
        vec![by_child.into(), by_parent.into(), directory.into()]
    }

    /// The writes that remove `edge` of `child` from both directions at write
    /// timestamp `at` (the directory keeps its entry: the janitor prunes it).
    pub(crate) fn remove_edge(domain: &Domain, child: &str, edge: &StoredEdge, at: i64) -> Vec<Write> {
        let d = Value::from(domain.as_str());
        let kind = kind_name(edge.kind);
        vec![
            Delete::row(
                &DEPENDENCIES,
                [d.clone(), Value::from(child)],
                [Value::from(edge.priority), Value::from(kind), Value::from(edge.parent.as_str())],
            )
            .timestamp(at)
            .into(),
            Delete::row(
                &DEPENDENTS,
                [d, Value::from(edge.parent.as_str()), Value::from(kind), Value::from(edge.priority), Value::from(bucket(child))],
                [Value::from(child)],
            )
            .timestamp(at)
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
    /// differs from what is stored, holding the page.
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
        let (owned_domain, owned_child) = (domain.clone(), child.clone());
        self.changing(domain, child.as_str(), move |graph, at| async move {
            let (domain, child) = (owned_domain, owned_child);
            let stored = graph.edge_rows_of(&domain, &child).await?;
            let (outcome, groups) = Self::diff(&domain, child.as_str(), stored, &wanted, at);
            graph.apply_groups(groups).await?;
            Ok(outcome)
        })
        .await
    }

    /// The writes that turn `stored` (a page's rows) into `wanted`, at write
    /// timestamp `at`, and what they change.
    fn diff(
        domain: &Domain,
        child: &str,
        stored: Vec<StoredEdge>,
        wanted: &BTreeMap<(ChangeKind, String), StoredEdge>,
        at: i64,
    ) -> (Replaced, Vec<Vec<Write>>) {
        let now_ms = at / 1000;
        let mut outcome = Replaced::default();
        let mut groups: Vec<Vec<Write>> = Vec::new();
        let mut removals: Vec<Vec<Write>> = Vec::new();
        let mut seen: BTreeSet<(ChangeKind, String)> = BTreeSet::new();
        // Rows of the same key as a wanted edge, left by an update that
        // outlived its edge (before schema 7): overwritten whole.
        let mut ghost_keys: BTreeSet<(i64, ChangeKind, String)> = BTreeSet::new();
        for old in &stored {
            let key = (old.kind, old.parent.clone());
            if old.is_ghost() {
                match wanted.get(&key) {
                    Some(new) if new.priority == old.priority => {
                        ghost_keys.insert((old.priority, old.kind, old.parent.clone()));
                    }
                    _ => removals.push(Self::remove_edge(domain, child, old, at)),
                }
                continue;
            }
            match wanted.get(&key) {
                None => {
                    outcome.removed += 1;
                    removals.push(Self::remove_edge(domain, child, old, at));
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
                        group.extend(Self::remove_edge(domain, child, old, at));
                    } else {
                        if old.parent_selector.is_some() && new.parent_selector.is_none() {
                            clears.push(col::PARENT_SELECTOR);
                        }
                        if old.child_selector.is_some() && new.child_selector.is_none() {
                            clears.push(col::CHILD_SELECTOR);
                        }
                    }
                    group.extend(Self::put_edge(domain, child, &replacement, &clears, at));
                    groups.push(group);
                }
            }
        }
        for (key, new) in wanted {
            if !seen.contains(key) {
                outcome.added += 1;
                let over_ghost = ghost_keys.contains(&(new.priority, new.kind, new.parent.clone()));
                let clears: &[&'static str] =
                    if over_ghost { &[col::PARENT_SELECTOR, col::CHILD_SELECTOR, col::LAST_UPDATED] } else { &[] };
                groups.push(Self::put_edge(domain, child, &StoredEdge { created: Some(now_ms), ..new.clone() }, clears, at));
            }
        }
        // Additions first, removals last: a crash midway leaves an edge too
        // many (a re-render too many), not one missing (a page left stale),
        // and the retried write completes the set.
        groups.extend(removals);
        (outcome, groups)
    }

    /// Adds edges without reading what is stored or holding the pages (a bulk
    /// load: importing a wiki's link tables, seeding a benchmark, with no
    /// other writer). An edge already stored with the same priority is
    /// overwritten; one with another priority is not removed, so use
    /// [`Graph::replace`] for pages that already have edges.
    pub async fn add_edges(&self, domain: &Domain, edges: &[(Title, Edge)], titles: TitleRules) -> Result<(), GraphError> {
        let now = self.store.now_micros();
        let mut groups = Vec::with_capacity(edges.len());
        for (child, edge) in edges {
            let stored = StoredEdge::checked(child, edge, titles, Some(now / 1000))?;
            groups.push(Self::put_edge(domain, child.as_str(), &stored, &[], now));
        }
        self.apply_groups(groups).await
    }

    /// Removes a page's dependencies from both directions, holding the page.
    /// The by-parent rows go first and the page's own partition last, so a
    /// crash midway leaves the page's set to find and remove again. Answers
    /// how many edges it had.
    pub async fn remove_page(&self, domain: &Domain, child: &Title) -> Result<u64, GraphError> {
        let (owned_domain, owned_child) = (domain.clone(), child.clone());
        self.changing(domain, child.as_str(), move |graph, at| async move {
            let (domain, child) = (owned_domain, owned_child);
            let stored = graph.edge_rows_of(&domain, &child).await?;
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
                        .timestamp(at)
                        .into(),
                    ]
                })
                .collect();
            graph.apply_groups(groups).await?;
            graph.store.write(Delete::partition(&DEPENDENCIES, Self::child_key(&domain, child.as_str())).timestamp(at)).await?;
            Ok(stored.iter().filter(|e| !e.is_ghost()).count() as u64)
        })
        .await
    }

    /// A page of a page's dependencies, priority descending, cut at `limit`
    /// items or [`PAGE_BYTES`].
    pub async fn dependencies(
        &self,
        domain: &Domain,
        child: &Title,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<DependencyList, GraphError> {
        let scope = format!("dependencies|{domain}|{child}");
        let slices = self.resume_after(&scope, cursor.as_deref(), ReadOrder::Clustering)?;
        let _turn = self.listing_turn().await?;
        let key = Self::child_key(domain, child.as_str());
        let mut fill = PageFill::new(limit);
        let mut items = Vec::new();
        let mut last: Option<Vec<Value>> = None;
        for slice in slices {
            let mut rows = std::pin::pin!(self.store.rows(ReadQuery::new(&DEPENDENCIES, key.clone()).slice(slice).limit(READ_ROWS)));
            while let Some(row) = rows.try_next().await? {
                let edge = StoredEdge::of(&row)?;
                if edge.is_ghost() {
                    continue;
                }
                if !fill.take(edge.weight()) {
                    return Ok(DependencyList { items, next: last.map(|k| self.store.seal_cursor(&scope, &encode_values(&k))) });
                }
                last = Some(edge.clustering());
                items.push(Dependency {
                    parent: edge.parent,
                    kind: edge.kind,
                    priority: edge.priority,
                    parent_selector: load_selector(edge.parent_selector.as_deref()),
                    child_selector: load_selector(edge.child_selector.as_deref()),
                    last_updated: edge.last_updated.map(time_text),
                    created: edge.created.map(time_text),
                });
            }
        }
        Ok(DependencyList { items, next: None })
    }

    fn cursor_scope(domain: &Domain, parent: &Title, query: &DependentsQuery) -> String {
        format!("dependents|{domain}|{parent}|{}|{}|{}", kind_name(query.kind), query.min_priority, query.max_priority)
    }

    /// A page of a page's dependents of one type, priority descending, in
    /// constant memory whatever their number: the listing walks the
    /// directory's (priority, bucket) partitions in order, each by child, a
    /// few rows at a time; the page ends at `limit` items, at [`PAGE_BYTES`],
    /// or after [`DIRECTORY_ENTRIES_PER_PAGE`] directory entries.
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
        let _turn = self.listing_turn().await?;
        let seal = |next: DependentsCursor| -> Result<Option<String>, GraphError> {
            let bytes = serde_json::to_vec(&next).map_err(GraphError::internal)?;
            Ok(Some(self.store.seal_cursor(&scope, &bytes)))
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
        let mut fill = PageFill::new(query.limit);
        let mut items: Vec<Dependent> = Vec::new();
        let mut entries = 0;
        for slice in slices {
            let mut directory = Box::pin(self.store.rows(ReadQuery::new(&DEPENDENT_BUCKETS, directory_key.clone()).slice(slice).limit(64)));
            while let Some(row) = directory.next().await.transpose()? {
                let (Some(priority), Some(b)) = (row.bigint(col::PRIORITY), row.bigint(col::BUCKET)) else { continue };
                entries += 1;
                if entries > DIRECTORY_ENTRIES_PER_PAGE {
                    return Ok(DependentList { items, next: seal(DependentsCursor { priority, bucket: b, after: None })? });
                }
                let mut after = cursor.as_ref().filter(|c| (c.priority, c.bucket) == (priority, b)).and_then(|c| c.after.clone());
                let partition =
                    [Value::from(domain.as_str()), Value::from(parent.as_str()), Value::from(kind), Value::from(priority), Value::from(b)];
                loop {
                    let mut slice = Slice::all();
                    if let Some(after) = &after {
                        slice = slice.lower(Bound::Excluded(Value::from(after.as_str())));
                    }
                    let rows = self.store.read(&ReadQuery::new(&DEPENDENTS, partition.clone()).slice(slice).limit(READ_ROWS)).await?.rows;
                    let read_all = (rows.len() as u32) < READ_ROWS;
                    for row in &rows {
                        let child = row.text(col::CHILD).ok_or_else(|| GraphError::Corrupt("a dependent row without a child".into()))?;
                        let (parent_selector, child_selector) = (row.text(col::PARENT_SELECTOR), row.text(col::CHILD_SELECTOR));
                        if !fill.take(weight(child, [parent_selector, child_selector])) {
                            return Ok(DependentList { items, next: seal(DependentsCursor { priority, bucket: b, after })? });
                        }
                        after = Some(child.to_owned());
                        items.push(Dependent {
                            child: child.to_owned(),
                            kind: query.kind,
                            priority,
                            parent_selector: load_selector(parent_selector),
                            child_selector: load_selector(child_selector),
                        });
                    }
                    if fill.is_full() {
                        return Ok(DependentList { items, next: seal(DependentsCursor { priority, bucket: b, after })? });
                    }
                    if read_all {
                        break;
                    }
                }
            }
        }
        Ok(DependentList { items, next: None })
    }

    /// Records a change of a page: one write, whatever the number of its
    /// dependents. The latest change per (type, selector) wins, whatever
    /// order changes arrive in; so does the page's latest change of any kind
    /// (the `ANY` row).
    pub async fn record_change(&self, domain: &Domain, notice: &ChangeNotice, titles: TitleRules) -> Result<(), GraphError> {
        let page = Title::parse(&notice.page, titles)?;
        let at = self.not_in_the_future("at", revstore_api::graph::parse_time("at", &notice.at)?)?;
        let selector = match &notice.selector {
            Some(id) => {
                revstore_api::graph::check_selector("selector", std::slice::from_ref(id))?;
                id.clone()
            }
            None => String::new(),
        };
        let partition = [Value::from(domain.as_str()), Value::from(page.as_str()), Value::from(kind_name(notice.kind))];
        let change = |selector: &str| -> Write {
            Upsert::new(&CHANGES, partition.iter().cloned().chain([Value::from(selector)]))
                .set(col::CHANGED_AT, Value::Timestamp(at / 1000))
                .timestamp(at)
                .into()
        };
        self.store.apply(vec![change(&selector), change(ANY)]).await?;
        Ok(())
    }

    /// The pull check: the page's dependencies whose parent changed (in a
    /// fragment the edge uses) after the page was last brought up to date
    /// with it, priority ascending (pull first), `limit` items or
    /// [`PAGE_BYTES`] a page. The page's edges are read [`READ_ROWS`] at a
    /// time, and for each only the change rows it needs.
    pub async fn pending(&self, domain: &Domain, child: &Title, limit: u32, cursor: Option<String>) -> Result<Pending, GraphError> {
        let scope = format!("pending|{domain}|{child}");
        let slices = self.resume_after(&scope, cursor.as_deref(), ReadOrder::Reversed)?;
        let _turn = self.listing_turn().await?;
        let key = Self::child_key(domain, child.as_str());
        let mut fill = PageFill::new(limit);
        let mut items = Vec::new();
        let mut last: Option<Vec<Value>> = None;
        for slice in slices {
            let mut rows = std::pin::pin!(
                self.store.rows(ReadQuery::new(&DEPENDENCIES, key.clone()).slice(slice).order(ReadOrder::Reversed).limit(READ_ROWS))
            );
            let mut chunk = Vec::with_capacity(READ_ROWS as usize);
            loop {
                let row = rows.try_next().await?;
                let ended = row.is_none();
                if let Some(row) = row {
                    let edge = StoredEdge::of(&row)?;
                    if !edge.is_ghost() {
                        chunk.push(edge);
                    }
                }
                if chunk.len() < READ_ROWS as usize && !ended {
                    continue;
                }
                let stale = self.stale_among(domain, &chunk).await?;
                for (edge, changed) in std::mem::take(&mut chunk).into_iter().zip(stale) {
                    let Some(changed) = changed else { continue };
                    if !fill.take(edge.weight()) {
                        let next = last.map(|k| self.store.seal_cursor(&scope, &encode_values(&k)));
                        return Ok(Pending { needs_update: true, items, next });
                    }
                    last = Some(edge.clustering());
                    items.push(PendingItem {
                        parent: edge.parent,
                        kind: edge.kind,
                        priority: edge.priority,
                        child_selector: load_selector(edge.child_selector.as_deref()),
                        changed_at: time_text(changed),
                    });
                }
                if ended {
                    break;
                }
            }
        }
        Ok(Pending { needs_update: !items.is_empty(), items, next: None })
    }

    /// For each edge, the time of its parent's change it has not caught up
    /// with, if any (milliseconds).
    async fn stale_among(&self, domain: &Domain, edges: &[StoredEdge]) -> Result<Vec<Option<i64>>, GraphError> {
        // The whole-page, any-change and forgotten rows of each parent (and
        // whether it has fragment rows), in one multi-partition read.
        let parents: Vec<(ChangeKind, String)> =
            edges.iter().map(|e| (e.kind, e.parent.clone())).collect::<BTreeSet<_>>().into_iter().collect();
        // The three summary rows sort first; a fourth row read is a fragment's.
        let queries =
            parents.iter().map(|(kind, parent)| ReadQuery::new(&CHANGES, Self::changes_key(domain, parent, *kind)).limit(4)).collect();
        let summaries: HashMap<(ChangeKind, String), ChangeSummary> =
            parents.into_iter().zip(self.store.read_many(queries).await?).map(|(key, rows)| (key, ChangeSummary::of(&rows))).collect();
        let mut stale = Vec::with_capacity(edges.len());
        for edge in edges {
            let summary = summaries.get(&(edge.kind, edge.parent.clone())).cloned().unwrap_or_default();
            let baseline = edge.baseline();
            let changed = match summary.decide(baseline, load_selector(edge.parent_selector.as_deref()).is_some()) {
                Decision::Stale(at) => Some(at),
                Decision::Fresh => None,
                Decision::ReadFragments => {
                    let uses = load_selector(edge.parent_selector.as_deref());
                    self.latest_fragment_change(domain, edge, uses.as_deref()).await?.filter(|at| *at > baseline)
                }
            };
            stale.push(changed);
        }
        Ok(stale)
    }

    fn changes_key(domain: &Domain, page: &str, kind: ChangeKind) -> [Value; 3] {
        [Value::from(domain.as_str()), Value::from(page), Value::from(kind_name(kind))]
    }

    /// The latest change of the fragments `uses` names (`None`: of any
    /// fragment) of the edge's parent: a read per fragment for a few, else
    /// the parent's fragment rows streamed.
    async fn latest_fragment_change(&self, domain: &Domain, edge: &StoredEdge, uses: Option<&[String]>) -> Result<Option<i64>, GraphError> {
        let key = Self::changes_key(domain, &edge.parent, edge.kind);
        if let Some(ids) = uses.filter(|ids| ids.len() <= POINT_READ_FRAGMENTS) {
            let queries = ids
                .iter()
                .map(|id| ReadQuery::new(&CHANGES, key.clone()).slice(Slice::prefix([Value::from(id.as_str())])).limit(1))
                .collect();
            let found = self.store.read_many(queries).await?;
            return Ok(found.iter().flatten().filter_map(|row| row.timestamp(col::CHANGED_AT)).max());
        }
        let fragments = Slice::all().lower(Bound::Excluded(Value::from(FORGOTTEN)));
        let mut rows = std::pin::pin!(self.store.rows(ReadQuery::new(&CHANGES, key).slice(fragments).limit(1000)));
        let mut latest = None;
        while let Some(row) = rows.try_next().await? {
            let used = uses.is_none_or(|ids| row.text(col::SELECTOR).is_some_and(|s| ids.iter().any(|id| id == s)));
            if used {
                latest = latest.max(row.timestamp(col::CHANGED_AT));
            }
        }
        Ok(latest)
    }

    /// Brings the page's edges up to date with a render made at `at`: all of
    /// them for a full render, or those whose child fragments `selectors`
    /// covers, holding the page (an edge removed meanwhile stays removed).
    /// Answers how many edges it updated.
    pub async fn mark_updated(&self, domain: &Domain, child: &Title, at: &str, selectors: Option<&[String]>) -> Result<u64, GraphError> {
        let rendered = self.not_in_the_future("at", revstore_api::graph::parse_time("at", at)?)? / 1000;
        if let Some(ids) = selectors {
            revstore_api::graph::check_selector("selectors", ids)?;
        }
        let selectors = selectors.map(<[String]>::to_vec);
        let (owned_domain, owned_child) = (domain.clone(), child.clone());
        self.changing(domain, child.as_str(), move |graph, clock| async move {
            let (domain, child) = (owned_domain, owned_child);
            let edges = graph.edge_rows_of(&domain, &child).await?;
            let covered = |edge: &StoredEdge| match &selectors {
                None => true,
                Some(ids) => load_selector(edge.child_selector.as_deref()).is_some_and(|uses| uses.iter().all(|u| ids.contains(u))),
            };
            let groups: Vec<Vec<Write>> = edges
                .iter()
                .filter(|edge| !edge.is_ghost() && covered(edge) && edge.last_updated.is_none_or(|u| u < rendered))
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
                        .set(col::LAST_UPDATED, Value::Timestamp(rendered))
                        .timestamp(clock)
                        .into(),
                    ]
                })
                .collect();
            let updated = groups.len() as u64;
            graph.apply_groups(groups).await?;
            Ok(updated)
        })
        .await
    }
}

/// What a parent's summary rows say of its changes.
#[derive(Debug, Clone, Copy, Default)]
struct ChangeSummary {
    whole: Option<i64>,
    any: Option<i64>,
    forgotten: Option<i64>,
    /// Whether any fragment's change is recorded.
    fragments: bool,
}

enum Decision {
    Stale(i64),
    Fresh,
    ReadFragments,
}

impl ChangeSummary {
    fn of(rows: &[Row]) -> Self {
        let mut summary = ChangeSummary::default();
        for row in rows {
            let at = row.timestamp(col::CHANGED_AT);
            match row.text(col::SELECTOR) {
                Some("") => summary.whole = at,
                Some(ANY) => summary.any = at,
                Some(FORGOTTEN) => summary.forgotten = at,
                Some(_) => summary.fragments = true,
                None => {}
            }
        }
        summary
    }

    /// Whether an edge updated at `baseline` is stale, from the summary alone if it can tell.
    fn decide(self, baseline: i64, names_fragments: bool) -> Decision {
        if let Some(at) = self.whole.filter(|at| *at > baseline) {
            return Decision::Stale(at);
        }
        match self.any {
            // Nothing at all changed since: fresh, whatever the edge uses.
            Some(any) if any <= baseline => Decision::Fresh,
            // Uses the whole parent: its latest change of any kind decides.
            Some(any) if !names_fragments => Decision::Stale(any),
            // The fragments it uses may be among those the janitor forgot.
            Some(_) if self.forgotten.is_some_and(|at| at > baseline) => Decision::Stale(self.forgotten.unwrap_or_default()),
            // A fragment changed since: its rows decide.
            Some(_) => Decision::ReadFragments,
            // No fragment change recorded (a whole-page one was decided above).
            None if !self.fragments => Decision::Fresh,
            // Changes recorded before the `ANY` row existed: look.
            None => Decision::ReadFragments,
        }
    }
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
    fn the_summary_rows_decide_what_they_can() {
        let summary = |whole, any, forgotten| ChangeSummary { whole, any, forgotten, fragments: any.is_some() };
        let stale = |d: Decision| match d {
            Decision::Stale(at) => Some(at),
            _ => None,
        };
        // A whole-page change after the baseline: stale, whatever the edge uses.
        assert_eq!(stale(summary(Some(20), Some(20), None).decide(10, true)), Some(20));
        // Nothing changed since the baseline: fresh.
        assert!(matches!(summary(Some(5), Some(9), Some(8)).decide(10, true), Decision::Fresh));
        // An edge on the whole parent takes its latest change of any kind.
        assert_eq!(stale(summary(None, Some(15), None).decide(10, false)), Some(15));
        // An edge naming fragments not updated since a forgotten change: stale.
        assert_eq!(stale(summary(None, Some(30), Some(12)).decide(10, true)), Some(12));
        // Otherwise its fragments' rows decide; so do changes from before `ANY` existed.
        assert!(matches!(summary(None, Some(30), Some(8)).decide(10, true), Decision::ReadFragments));
        // A parent that never changed, or only as a whole before the baseline: fresh.
        assert!(matches!(summary(None, None, None).decide(10, false), Decision::Fresh));
        assert!(matches!(summary(Some(5), None, None).decide(10, true), Decision::Fresh));
        let legacy = ChangeSummary { fragments: true, ..ChangeSummary::default() };
        assert!(matches!(legacy.decide(10, false), Decision::ReadFragments));
        // The reserved selectors sort between the whole page and every fragment id.
        assert!(!ANY.is_empty() && ANY < FORGOTTEN && FORGOTTEN < " " && FORGOTTEN < "!");
    }

    #[test]
    fn selectors_are_stored_sorted_and_once() {
        let ids = Some(vec!["b".to_owned(), "a".to_owned(), "b".to_owned()]);
        assert_eq!(store_selector(&ids).as_deref(), Some(r#"["a","b"]"#));
        assert_eq!(load_selector(store_selector(&ids).as_deref()), Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(store_selector(&None), None);
    }
}
