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
//!
//! # Modules
//! Keys and an edge's writes are [`crate::edge`]'s. This module holds the
//! graph and its writes of a page's edge set; [`listing`] lists both
//! directions and [`pull`] records changes and answers pull checks.

mod listing;
mod pull;

pub use listing::DependentsQuery;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::TryStreamExt;
use revstore_api::ChangeKind;
use revstore_api::graph::{Edge, Replaced};
use revstore_keys::{Domain, MAX_CLOCK_SKEW, Title, TitleRules};
use revstore_schema::tables::dependency_graph::{DEPENDENCIES, col};
use revstore_service::janitor_admin::Journal;
use revstore_storage::value::decode_values;
use revstore_storage::{Delete, ReadOrder, ReadQuery, Row, ScanQuery, Slice, Store, Value, Write, slices_after};
use tokio::sync::Semaphore;

use crate::edge::{StoredEdge, dependencies_key, kind_name};
use crate::error::GraphError;

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

/// Rows listings of dependents may read ahead across the buckets they merge
/// beyond their own [`READ_ROWS`], from a pool the graph's listings share,
/// as far as it is free: a lone walk of a large parent reads a full
/// [`READ_ROWS`] from each of its 32 buckets at a time (on Cassandra the
/// walk's pace follows the rows a read takes), many at once fall back to
/// their own READ_ROWS. With every row of the largest selectors (131 KB)
/// the pool is about 540 MB, on top of [`LISTINGS_AT_ONCE`]' bound; rows of
/// real selectors are a few hundred bytes, the pool a few MB.
pub const MERGE_POOL_ROWS: usize = 4096;

/// The most rows one listing of dependents reads ahead (READ_ROWS a bucket).
pub const MERGE_ROWS_PER_LISTING: usize = 4096;

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

/// The graph of one deployment. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Graph {
    store: Store,
    /// The most edges one page may have.
    max_edges: usize,
    /// Turns for listings (see [`LISTINGS_AT_ONCE`]).
    listings: Arc<Semaphore>,
    /// Rows listings of dependents read ahead beyond their own (see [`MERGE_POOL_ROWS`]).
    merge_pool: Arc<Semaphore>,
}

impl Graph {
    pub fn new(store: Store, max_edges: usize) -> Self {
        Graph {
            store,
            max_edges,
            listings: Arc::new(Semaphore::new(LISTINGS_AT_ONCE)),
            merge_pool: Arc::new(Semaphore::new(MERGE_POOL_ROWS)),
        }
    }

    /// The graph's journal of changed pages: a recorded change enters its
    /// `graph_changes` partition, which the janitor's routine run visits
    /// once the change retention has passed.
    pub(crate) fn journal(&self) -> Journal {
        Journal::new(self.store.clone(), crate::SERVICE)
    }

    pub fn store(&self) -> &Store {
        &self.store
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
        if micros > self.store.now_micros() + MAX_CLOCK_SKEW.as_micros() as i64 {
            return Err(GraphError::Invalid(format!("{name} is more than {} s in the future", MAX_CLOCK_SKEW.as_secs())));
        }
        Ok(micros)
    }

    /// Up to `wanted` rows of the merge pool, as many as are free now (never waits).
    fn merge_rows(&self, wanted: usize) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let free = self.merge_pool.available_permits().min(wanted);
        (free > 0).then(|| self.merge_pool.try_acquire_many(free as u32).ok()).flatten()
    }

    /// A turn to list (see [`LISTINGS_AT_ONCE`]).
    async fn listing_turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, GraphError> {
        self.listings.acquire().await.map_err(GraphError::internal)
    }

    /// Every row of a page's edges (at most `max_edges`, more only if an
    /// older setting allowed it), priority descending.
    pub(crate) async fn edge_rows_of(&self, domain: &Domain, child: &Title) -> Result<Vec<StoredEdge>, GraphError> {
        let query = ReadQuery::new(&DEPENDENCIES, dependencies_key(domain.as_str(), child.as_str())).limit(1000);
        let rows: Vec<Row> = self.store.rows(query).try_collect().await?;
        rows.iter().map(StoredEdge::of).collect()
    }

    /// Replaces a page's dependency set with `edges` (written whole when it
    /// differs from what is stored, see [`Graph::diff`]), holding the page.
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
            graph.store.apply_grouped(groups).await?;
            Ok(outcome)
        })
        .await
    }

    /// The writes that turn `stored` (a page's rows) into `wanted`, at write
    /// timestamp `at`, and what they change.
    ///
    /// A set that changes at all is written whole: every wanted edge in both
    /// directions at `at`, then the by-parent rows it no longer has, then a
    /// delete of the page's whole by-child partition at `at - 1`, which
    /// leaves exactly the rows just written. Two replaces that each read the
    /// set before the other wrote (one in each site, during a cut or within
    /// the replication delay) then converge to the set of the later clock,
    /// where writing differences only would merge the two differences into a
    /// set nobody asked for. An unchanged set writes nothing: the other
    /// replace's set, whichever it is, is one that was asked for.
    pub(crate) fn diff(
        domain: &Domain,
        child: &str,
        stored: Vec<StoredEdge>,
        wanted: &BTreeMap<(ChangeKind, String), StoredEdge>,
        at: i64,
    ) -> (Replaced, Vec<Vec<Write>>) {
        let now_ms = at / 1000;
        let mut outcome = Replaced::default();
        let mut writes: Vec<Vec<Write>> = Vec::new();
        let mut removals: Vec<Vec<Write>> = Vec::new();
        let mut kept: BTreeMap<&(ChangeKind, String), &StoredEdge> = BTreeMap::new();
        for old in &stored {
            let key = (old.kind, old.parent.clone());
            let Some((key, new)) = wanted.get_key_value(&key) else {
                outcome.removed += 1;
                removals.push(vec![old.remove_dependent(domain, child, at)]);
                continue;
            };
            kept.insert(key, old);
            let same_data = new.parent_selector == old.parent_selector && new.child_selector == old.child_selector;
            if new.priority == old.priority && same_data {
                outcome.unchanged += 1;
            } else {
                outcome.changed += 1;
            }
            if new.priority != old.priority {
                removals.push(vec![old.remove_dependent(domain, child, at)]);
            }
        }
        outcome.added = (wanted.len() - kept.len()) as u64;
        if outcome.added == 0 && outcome.changed == 0 && outcome.removed == 0 {
            return (outcome, Vec::new());
        }
        for (key, new) in wanted {
            let edge = match kept.get(key) {
                Some(old) => StoredEdge { last_updated: old.last_updated, created: old.created.or(Some(now_ms)), ..new.clone() },
                None => StoredEdge { created: Some(now_ms), ..new.clone() },
            };
            // A selector the by-parent row had and the edge no longer has is
            // cleared there; the by-child row's goes with the partition delete.
            let mut clears = Vec::new();
            if let Some(old) = kept.get(key).filter(|old| old.priority == new.priority) {
                if old.parent_selector.is_some() && new.parent_selector.is_none() {
                    clears.push(col::PARENT_SELECTOR);
                }
                if old.child_selector.is_some() && new.child_selector.is_none() {
                    clears.push(col::CHILD_SELECTOR);
                }
            }
            writes.push(edge.put(domain, child, &clears, at));
        }
        // The set first, what it drops last: a crash midway leaves an edge
        // too many (a re-render too many), not one missing (a page left
        // stale), and the retried write completes the set.
        writes.extend(removals);
        writes.push(vec![Delete::partition(&DEPENDENCIES, dependencies_key(domain.as_str(), child)).timestamp(at - 1).into()]);
        (outcome, writes)
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
            groups.push(stored.put(domain, child.as_str(), &[], now));
        }
        Ok(self.store.apply_grouped(groups).await?)
    }

    /// Writes every edge's row among its parent's dependents again from the
    /// by-child table, which is the truth: the offline step that fills
    /// `graph_parent_dependents` and `graph_parent_buckets` after an upgrade
    /// from a layout that kept them elsewhere (`revstore-migrate
    /// --rebuild-graph-dependents`, with the graph's writers stopped).
    /// Idempotent; `progress` is told the edges written so far. Answers
    /// (pages, edges).
    pub async fn rebuild_dependents(&self, mut progress: impl FnMut(u64)) -> Result<(u64, u64), GraphError> {
        let now = self.store.now_micros();
        let (mut pages, mut edges) = (0u64, 0u64);
        let mut groups = Vec::new();
        let mut partitions = std::pin::pin!(self.store.partitions(ScanQuery::new(&DEPENDENCIES, 100)));
        while let Some(partition) = partitions.try_next().await? {
            let (Some(Value::Text(domain)), Some(Value::Text(child))) = (partition.key.first(), partition.key.get(1)) else {
                return Err(GraphError::Corrupt("a graph_dependencies partition whose key does not decode".into()));
            };
            let domain =
                Domain::parse(domain).map_err(|_| GraphError::Corrupt(format!("a stored domain that does not parse: {domain:?}")))?;
            pages += 1;
            let mut rows = std::pin::pin!(self.store.rows(ReadQuery::new(&DEPENDENCIES, partition.key.clone()).limit(READ_ROWS)));
            while let Some(row) = rows.try_next().await? {
                groups.push(StoredEdge::of(&row)?.put_dependent(&domain, child, &[], now));
                edges += 1;
                if groups.len() >= 1000 {
                    self.store.apply_grouped(std::mem::take(&mut groups)).await?;
                    progress(edges);
                }
            }
        }
        if !groups.is_empty() {
            self.store.apply_grouped(groups).await?;
        }
        progress(edges);
        Ok((pages, edges))
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
            let groups = stored.iter().map(|edge| vec![edge.remove_dependent(&domain, child.as_str(), at)]).collect();
            graph.store.apply_grouped(groups).await?;
            graph.store.write(Delete::partition(&DEPENDENCIES, dependencies_key(domain.as_str(), child.as_str())).timestamp(at)).await?;
            Ok(stored.len() as u64)
        })
        .await
    }
}
