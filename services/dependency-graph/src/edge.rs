//! An edge as stored, and every key of the edge tables: the one place that
//! spells out how an edge of `child` on `parent` lands in `graph_dependencies`
//! (by child), `graph_parent_dependents` (by parent, bucketed) and
//! `graph_parent_buckets` (the by-parent directory), and the writes that
//! put or remove it in both directions. The graph, the consistency check and
//! the tests build their keys here.

use std::collections::BTreeSet;

use revstore_api::ChangeKind;
use revstore_api::graph::Edge;
use revstore_keys::{Domain, Title, TitleRules, murmur3_token};
use revstore_schema::tables::dependency_graph::{DEPENDENCIES, DEPENDENT_BUCKETS, DEPENDENTS, col};
use revstore_storage::{Delete, ReadQuery, Row, Slice, Upsert, Value, Write};

use crate::error::GraphError;

/// Hash buckets of a parent's dependents, per type. Part of the data
/// layout: changing it needs the data rewritten.
pub const BUCKETS: i64 = 32;

/// The bucket of a child among its parent's dependents.
pub fn bucket(child: &str) -> i64 {
    murmur3_token(child.as_bytes()).rem_euclid(BUCKETS)
}

/// The `graph_dependencies` partition of a page: its edges.
pub fn dependencies_key(domain: &str, child: &str) -> [Value; 2] {
    [Value::from(domain), Value::from(child)]
}

/// The clustering key of an edge in its child's `graph_dependencies` partition.
pub fn dependency_clustering(priority: i64, kind: &str, parent: &str) -> [Value; 3] {
    [Value::from(priority), Value::from(kind), Value::from(parent)]
}

/// The directory partition of a parent's dependents of one type
/// (`graph_parent_buckets`): the buckets it has dependents in.
pub fn directory_key(domain: &str, parent: &str, kind: &str) -> [Value; 3] {
    [Value::from(domain), Value::from(parent), Value::from(kind)]
}

/// The `graph_parent_dependents` partition of one bucket.
pub fn dependents_partition(domain: &str, parent: &str, kind: &str, bucket: i64) -> [Value; 4] {
    [Value::from(domain), Value::from(parent), Value::from(kind), Value::from(bucket)]
}

/// The `graph_parent_dependents` partition that holds `child` among `parent`'s dependents.
pub fn dependents_partition_of(domain: &str, parent: &str, kind: &str, child: &str) -> [Value; 4] {
    dependents_partition(domain, parent, kind, bucket(child))
}

/// The clustering key of `child`'s row among its parent's dependents.
pub fn dependent_clustering(priority: i64, child: &str) -> [Value; 2] {
    [Value::from(priority), Value::from(child)]
}

/// The delete of `child`'s row among `parent`'s dependents (not stamped).
pub fn dependent_delete(domain: &str, parent: &str, kind: &str, priority: i64, child: &str) -> Delete {
    Delete::row(&DEPENDENTS, dependents_partition_of(domain, parent, kind, child), dependent_clustering(priority, child))
}

/// The delete of an edge's row in its child's partition (not stamped).
#[cfg(feature = "testsuite")]
pub fn dependency_delete(domain: &str, child: &str, priority: i64, kind: &str, parent: &str) -> Delete {
    Delete::row(&DEPENDENCIES, dependencies_key(domain, child), dependency_clustering(priority, kind, parent))
}

/// The read of one edge's row in `graph_parent_dependents`.
pub(crate) fn dependent_row(domain: &str, parent: &str, kind: &str, priority: i64, child: &str) -> ReadQuery {
    ReadQuery::new(&DEPENDENTS, dependents_partition_of(domain, parent, kind, child))
        .slice(Slice::prefix(dependent_clustering(priority, child)))
}

/// The read of one edge's row in `graph_dependencies`.
pub(crate) fn dependency_row(domain: &str, child: &str, priority: i64, kind: &str, parent: &str) -> ReadQuery {
    ReadQuery::new(&DEPENDENCIES, dependencies_key(domain, child)).slice(Slice::prefix(dependency_clustering(priority, kind, parent)))
}

/// A change or dependency type as stored.
pub(crate) fn kind_name(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Modification => "modification",
        ChangeKind::Existence => "existence",
    }
}

pub(crate) fn parse_kind(name: &str) -> Option<ChangeKind> {
    match name {
        "modification" => Some(ChangeKind::Modification),
        "existence" => Some(ChangeKind::Existence),
        _ => None,
    }
}

/// A selector as stored: its ids sorted and deduplicated, as JSON text.
pub(crate) fn store_selector(ids: &Option<Vec<String>>) -> Option<String> {
    ids.as_ref().map(|ids| {
        let set: BTreeSet<&String> = ids.iter().collect();
        serde_json::to_string(&set).unwrap_or_default()
    })
}

pub(crate) fn load_selector(text: Option<&str>) -> Option<Vec<String>> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

/// About what an item with this title and these selectors takes in a listing's JSON.
pub(crate) fn weight(title: &str, selectors: [Option<&str>; 2]) -> usize {
    64 + title.len() + selectors.iter().flatten().map(|s| s.len()).sum::<usize>()
}

/// One edge as the by-child table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredEdge {
    pub(crate) priority: i64,
    pub(crate) kind: ChangeKind,
    pub(crate) parent: String,
    pub(crate) parent_selector: Option<String>,
    pub(crate) child_selector: Option<String>,
    /// Milliseconds.
    pub(crate) last_updated: Option<i64>,
    pub(crate) created: Option<i64>,
}

impl StoredEdge {
    /// A client's edge of `child`, checked (its fields, its parent's title,
    /// no self-dependency) and in stored form.
    pub(crate) fn checked(child: &Title, edge: &Edge, titles: TitleRules, created: Option<i64>) -> Result<StoredEdge, GraphError> {
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

    /// When the child was last brought up to date with this edge (milliseconds).
    pub(crate) fn baseline(&self) -> i64 {
        self.last_updated.or(self.created).unwrap_or(0)
    }

    /// About what the edge takes in a listing's JSON.
    pub(crate) fn weight(&self) -> usize {
        weight(&self.parent, [self.parent_selector.as_deref(), self.child_selector.as_deref()])
    }

    /// Its clustering key in the by-child table.
    pub(crate) fn clustering(&self) -> Vec<Value> {
        dependency_clustering(self.priority, kind_name(self.kind), &self.parent).to_vec()
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

impl StoredEdge {
    /// The writes that store this edge of `child` in both directions, at
    /// write timestamp `at` (the page's clock; the store's time for bulk
    /// loads). A cell with no value is not written at all (a null written is
    /// a tombstone that every read of the partition passes over), unless
    /// `clears` names it: a selector or update time the row had and must lose.
    pub(crate) fn put(&self, domain: &Domain, child: &str, clears: &[&'static str], at: i64) -> Vec<Write> {
        let key = dependencies_key(domain.as_str(), child).into_iter().chain(self.clustering());
        let mut by_child = self.cells(Upsert::new(&DEPENDENCIES, key), clears, at);
        match self.last_updated {
            Some(updated) => by_child = by_child.set(col::LAST_UPDATED, Value::Timestamp(updated)),
            None if clears.contains(&col::LAST_UPDATED) => by_child = by_child.set(col::LAST_UPDATED, Value::Null),
            None => {}
        }
        let mut writes = vec![by_child.into()];
        writes.extend(self.put_dependent(domain, child, clears, at));
        writes
    }

    /// The writes that store this edge among its parent's dependents (its
    /// row and its bucket's directory entry), at write timestamp `at`.
    pub(crate) fn put_dependent(&self, domain: &Domain, child: &str, clears: &[&'static str], at: i64) -> Vec<Write> {
        let (d, kind) = (domain.as_str(), kind_name(self.kind));
        let key = dependents_partition_of(d, &self.parent, kind, child).into_iter().chain(dependent_clustering(self.priority, child));
        let by_parent = self.cells(Upsert::new(&DEPENDENTS, key), clears, at);
        // The entry's `created` is its write time to the millisecond, so the
        // janitor can prune an emptied entry without shadowing a newer write.
        let entry = directory_key(d, &self.parent, kind).into_iter().chain([Value::from(bucket(child))]);
        let directory = Upsert::new(&DEPENDENT_BUCKETS, entry).set(col::CREATED, Value::Timestamp(at / 1000)).timestamp(at);
        vec![by_parent.into(), directory.into()]
    }

    /// The cells both rows of the edge hold (selectors, `created`), at `at`.
    fn cells(&self, mut upsert: Upsert, clears: &[&'static str], at: i64) -> Upsert {
        for (column, value) in [(col::PARENT_SELECTOR, &self.parent_selector), (col::CHILD_SELECTOR, &self.child_selector)] {
            match value {
                Some(v) => upsert = upsert.set(column, v.as_str()),
                None if clears.contains(&column) => upsert = upsert.set(column, Value::Null),
                None => {}
            }
        }
        if let Some(created) = self.created {
            upsert = upsert.set(col::CREATED, Value::Timestamp(created));
        }
        upsert.timestamp(at)
    }

    /// The write that removes this edge's row among its parent's dependents.
    pub(crate) fn remove_dependent(&self, domain: &Domain, child: &str, at: i64) -> Write {
        dependent_delete(domain.as_str(), &self.parent, kind_name(self.kind), self.priority, child).timestamp(at).into()
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
    fn selectors_are_stored_sorted_and_once() {
        let ids = Some(vec!["b".to_owned(), "a".to_owned(), "b".to_owned()]);
        assert_eq!(store_selector(&ids).as_deref(), Some(r#"["a","b"]"#));
        assert_eq!(load_selector(store_selector(&ids).as_deref()), Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(store_selector(&None), None);
    }
}
