//! Listing a page's dependencies and a parent's dependents, a bounded page at a time.

use std::ops::Bound;

use futures_util::{StreamExt, TryStreamExt};
use revstore_api::ChangeKind;
use revstore_api::graph::{Dependency, DependencyList, Dependent, DependentList};
use revstore_keys::time::rfc3339_millis;
use revstore_keys::{Domain, Title};
use revstore_schema::tables::dependency_graph::{DEPENDENCIES, DEPENDENT_BUCKETS, DEPENDENTS, col};
use revstore_storage::value::encode_values;
use revstore_storage::{ReadOrder, ReadQuery, Slice, Value};

use super::{DIRECTORY_ENTRIES_PER_PAGE, Graph, PAGE_BYTES, READ_ROWS};
use crate::edge::{StoredEdge, dependencies_key, dependents_partition, directory_key, kind_name, load_selector, weight};
use crate::error::GraphError;

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
        let directory_key = directory_key(domain.as_str(), parent.as_str(), kind);
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
                let partition = dependents_partition(domain.as_str(), parent.as_str(), kind, priority, b);
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
}
