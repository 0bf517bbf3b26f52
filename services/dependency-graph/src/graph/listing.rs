//! Listing a page's dependencies and a parent's dependents, a bounded page at a time.

use std::collections::{BinaryHeap, VecDeque};
use std::ops::Bound;

use futures_util::TryStreamExt;
use revstore_api::ChangeKind;
use revstore_api::graph::{Dependency, DependencyList, Dependent, DependentList};
use revstore_keys::time::rfc3339_millis;
use revstore_keys::{Domain, Title};
use revstore_schema::tables::dependency_graph::{DEPENDENCIES, DEPENDENT_BUCKETS, DEPENDENTS, col};
use revstore_storage::value::encode_values;
use revstore_storage::{ReadOrder, ReadQuery, Row, Slice, Value};

use super::{Graph, MERGE_ROWS_PER_LISTING, PAGE_BYTES, READ_ROWS};
use crate::edge::{BUCKETS, StoredEdge, dependencies_key, dependents_partition, directory_key, kind_name, load_selector, weight};
use crate::error::GraphError;

/// Where a listing of dependents goes on: after this (priority, child), in
/// listing order (priority descending, then child).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct DependentsCursor {
    priority: i64,
    child: String,
}

/// One dependent as a listing reads it from its bucket.
#[derive(Debug)]
struct DependentRow {
    priority: i64,
    child: String,
    parent_selector: Option<String>,
    child_selector: Option<String>,
}

impl DependentRow {
    fn of(row: &Row) -> Result<DependentRow, GraphError> {
        let corrupt = |what: &str| GraphError::Corrupt(format!("a dependent row without a valid {what}"));
        Ok(DependentRow {
            priority: row.bigint(col::PRIORITY).ok_or_else(|| corrupt("priority"))?,
            child: row.text(col::CHILD).ok_or_else(|| corrupt("child"))?.to_owned(),
            parent_selector: row.text(col::PARENT_SELECTOR).map(str::to_owned),
            child_selector: row.text(col::CHILD_SELECTOR).map(str::to_owned),
        })
    }
}

/// One bucket of a parent's dependents in the merge: rows read ahead, and
/// where its next read starts.
struct MergedBucket {
    partition: [Value; 4],
    ahead: VecDeque<DependentRow>,
    /// The last (priority, child) read (`None`: from the query's top).
    read_through: Option<(i64, String)>,
    /// Every row of the bucket in the query's range is read.
    read_out: bool,
}

impl MergedBucket {
    /// Takes a read of `asked` rows: queued, and where the next read starts.
    fn take(&mut self, rows: Vec<DependentRow>, asked: usize) {
        self.read_out = rows.len() < asked;
        if let Some(last) = rows.last() {
            self.read_through = Some((last.priority, last.child.clone()));
        }
        self.ahead.extend(rows);
    }

    /// Whether the merge must read this bucket before it can take the next row.
    fn starved(&self) -> bool {
        self.ahead.is_empty() && !self.read_out
    }
}

/// A bucket's first row queued, ordered for a max-heap: the greatest comes
/// first in listing order (higher priority, then the smaller child).
#[derive(Debug, PartialEq, Eq)]
struct Head {
    priority: i64,
    child: String,
    bucket: usize,
}

impl Ord for Head {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.priority.cmp(&other.priority).then_with(|| other.child.cmp(&self.child))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
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
pub(super) struct PageFill {
    limit: usize,
    items: usize,
    bytes: usize,
}

impl PageFill {
    pub(super) fn new(limit: u32) -> Self {
        PageFill { limit: limit as usize, items: 0, bytes: 0 }
    }

    /// Takes an item of `weight` bytes, or says the page is full (the first
    /// item is always taken).
    pub(super) fn take(&mut self, weight: usize) -> bool {
        if self.items >= self.limit || (self.items > 0 && self.bytes + weight > PAGE_BYTES) {
            return false;
        }
        self.items += 1;
        self.bytes += weight;
        true
    }

    pub(super) fn is_full(&self) -> bool {
        self.items >= self.limit
    }
}

impl Graph {
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
        let key = dependencies_key(domain.as_str(), child.as_str());
        let mut fill = PageFill::new(limit);
        let mut items = Vec::new();
        let mut last: Option<Vec<Value>> = None;
        for slice in slices {
            let mut rows = std::pin::pin!(self.store.rows(ReadQuery::new(&DEPENDENCIES, key.clone()).slice(slice).limit(READ_ROWS)));
            while let Some(row) = rows.try_next().await? {
                let edge = StoredEdge::of(&row)?;
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
                    last_updated: edge.last_updated.map(rfc3339_millis),
                    created: edge.created.map(rfc3339_millis),
                });
            }
        }
        Ok(DependencyList { items, next: None })
    }

    fn cursor_scope(domain: &Domain, parent: &Title, query: &DependentsQuery) -> String {
        format!("dependents|{domain}|{parent}|{}|{}|{}", kind_name(query.kind), query.min_priority, query.max_priority)
    }

    /// A page of a page's dependents of one type, priority descending (then
    /// child), in constant memory whatever their number or the spread of
    /// their priorities: the listing merges the parent's buckets (at most
    /// [`BUCKETS`], each in listing order), reading each a few rows ahead
    /// ([`READ_ROWS`] in all, more from the merge pool when it is free); the
    /// page ends at `limit` items or at [`PAGE_BYTES`].
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
        let kind = kind_name(query.kind);
        let directory = ReadQuery::new(&DEPENDENT_BUCKETS, directory_key(domain.as_str(), parent.as_str(), kind))
            .columns([col::CREATED])
            .limit(BUCKETS as u32 * 2);
        let in_use: Vec<i64> = self.store.read(&directory).await?.rows.iter().filter_map(|row| row.bigint(col::BUCKET)).collect();
        let start = cursor.map(|c| (c.priority, c.child));
        let mut buckets: Vec<MergedBucket> = in_use
            .into_iter()
            .map(|b| MergedBucket {
                partition: dependents_partition(domain.as_str(), parent.as_str(), kind, b),
                ahead: VecDeque::new(),
                read_through: start.clone(),
                read_out: false,
            })
            .collect();
        let range =
            Slice::all().lower(Bound::Included(Value::from(query.min_priority))).upper(Bound::Included(Value::from(query.max_priority)));
        // Rows a bucket reads at once: its share of what the page needs and
        // half as much again (children fall into buckets unevenly, and a
        // second round of reads costs more than a few rows more in the
        // first), within its share of the rows the listing may read ahead.
        let even = (query.limit as usize).div_ceil(buckets.len().max(1));
        let share = even + even / 2 + 4;
        let wanted = (share * buckets.len()).min(MERGE_ROWS_PER_LISTING);
        let pooled = self.merge_rows(wanted.saturating_sub(READ_ROWS as usize));
        let ahead = READ_ROWS as usize + pooled.as_ref().map_or(0, |p| p.num_permits());
        let per_read = share.min(ahead / buckets.len().max(1)).clamp(1, READ_ROWS as usize);
        let mut heads = BinaryHeap::with_capacity(buckets.len());
        let mut fill = PageFill::new(query.limit);
        let mut items: Vec<Dependent> = Vec::new();
        let mut last: Option<DependentsCursor> = None;
        let seal = |next: DependentsCursor| -> Result<Option<String>, GraphError> {
            let bytes = serde_json::to_vec(&next).map_err(GraphError::internal)?;
            Ok(Some(self.store.seal_cursor(&scope, &bytes)))
        };
        loop {
            // Every bucket that has nothing read ahead and may have more is
            // read before the next row is taken (its next row may come first);
            // the others low on rows are topped up in the same round, unless
            // what is read ahead already covers the rest of the page.
            while buckets.iter().any(MergedBucket::starved) {
                let still_wanted = (query.limit as usize).saturating_sub(items.len());
                let top_up = buckets.iter().map(|b| b.ahead.len()).sum::<usize>() < still_wanted;
                let (mut round, mut reads) = (Vec::new(), Vec::new());
                for (i, bucket) in buckets.iter().enumerate() {
                    let low = top_up && bucket.ahead.len() * 2 <= per_read;
                    if bucket.read_out || !(bucket.starved() || low) {
                        continue;
                    }
                    let asked = per_read - bucket.ahead.len();
                    let mut read = ReadQuery::new(&DEPENDENTS, bucket.partition.clone())
                        .slice(range.clone())
                        .columns([col::PARENT_SELECTOR, col::CHILD_SELECTOR])
                        .limit(asked as u32);
                    if let Some((priority, child)) = &bucket.read_through {
                        read = read.after([Value::from(*priority), Value::from(child.as_str())]);
                    }
                    round.push((i, asked));
                    reads.push(read);
                }
                for ((i, asked), rows) in round.into_iter().zip(self.store.read_many(reads).await?) {
                    let rows = rows.iter().map(DependentRow::of).collect::<Result<Vec<_>, _>>()?;
                    let bucket = &mut buckets[i];
                    let was_empty = bucket.ahead.is_empty();
                    bucket.take(rows, asked);
                    if was_empty && let Some(first) = bucket.ahead.front() {
                        heads.push(Head { priority: first.priority, child: first.child.clone(), bucket: i });
                    }
                }
            }
            let Some(head) = heads.pop() else {
                return Ok(DependentList { items, next: None });
            };
            let bucket = &mut buckets[head.bucket];
            let row = bucket.ahead.pop_front().ok_or_else(|| GraphError::internal("a merge head without its row"))?;
            if let Some(following) = bucket.ahead.front() {
                heads.push(Head { priority: following.priority, child: following.child.clone(), bucket: head.bucket });
            }
            if !fill.take(weight(&row.child, [row.parent_selector.as_deref(), row.child_selector.as_deref()])) {
                return Ok(DependentList { items, next: last.map(seal).transpose()?.flatten() });
            }
            last = Some(DependentsCursor { priority: row.priority, child: row.child.clone() });
            items.push(Dependent {
                child: row.child,
                kind: query.kind,
                priority: row.priority,
                parent_selector: load_selector(row.parent_selector.as_deref()),
                child_selector: load_selector(row.child_selector.as_deref()),
            });
            if fill.is_full() {
                return Ok(DependentList { items, next: last.map(seal).transpose()?.flatten() });
            }
        }
    }
}
