//! Two replaces of one page that each read the set before the other
//! wrote: what happens when two sites change a page during a cut, or
//! within the replication delay (each site's writer row is its own).
//! (Tests only: a module of its own, so that the graph, its repair and its
//! writer need not import one another.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::TryStreamExt;
use revstore_api::ChangeKind;
use revstore_api::graph::Edge;
use revstore_keys::{Domain, Title, TitleRules};
use revstore_schema::tables::dependency_graph::{DEPENDENTS, col};
use revstore_service::janitor_admin::SweepPosition;
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ReadQuery, Row, Store};

use crate::consistency::{Budget, Direction, Pass};
use crate::edge::{StoredEdge, dependents_partition_of, kind_name};
use crate::graph::Graph;

const DOMAIN: &str = "en.wikipedia.org";

fn edge(parent: &str, priority: i64) -> Edge {
    Edge { parent: parent.into(), kind: ChangeKind::Modification, priority, parent_selector: None, child_selector: None }
}

fn wanted(child: &Title, edges: &[Edge]) -> BTreeMap<(ChangeKind, String), StoredEdge> {
    edges
        .iter()
        .map(|e| {
            let stored = StoredEdge::checked(child, e, TitleRules::default(), None).expect("a valid edge");
            ((e.kind, stored.parent.clone()), stored)
        })
        .collect()
}

/// The page's edges as (parent, priority), by child.
async fn by_child(graph: &Graph, domain: &Domain, child: &Title) -> BTreeSet<(String, i64)> {
    graph.edge_rows_of(domain, child).await.expect("read").into_iter().map(|e| (e.parent, e.priority)).collect()
}

/// The priorities `child` is listed at among `parent`'s dependents.
async fn listed_at(graph: &Graph, parent: &str, child: &Title) -> Vec<i64> {
    let kind = kind_name(ChangeKind::Modification);
    let query = ReadQuery::new(&DEPENDENTS, dependents_partition_of(DOMAIN, parent, kind, child.as_str()));
    let rows: Vec<Row> = graph.store().rows(query).try_collect().await.expect("read");
    rows.iter().filter(|r| r.text(col::CHILD) == Some(child.as_str())).filter_map(|r| r.bigint(col::PRIORITY)).collect()
}

async fn concurrent_replaces_converge_to_one_set_asked_for(store: Store) {
    let graph = Graph::new(store, 100);
    let domain = Domain::parse(DOMAIN).expect("domain");
    // B kept at its priority (the two differences merge into {C}, a set
    // nobody asked for) or moved; either site's clock the later.
    for (b_priority, later) in [(500, 1), (500, 2), (700, 1), (700, 2)] {
        let child = Title::parse(&format!("Raced_{b_priority}_{later}"), TitleRules::default()).expect("title");
        graph.replace(&domain, &child, &[edge("A", 500), edge("B", 500)], TitleRules::default()).await.expect("seed");
        // Both sites read {A, B}; one asks for {A}, the other for {B, C}.
        let stored = graph.edge_rows_of(&domain, &child).await.expect("read");
        let asked_1 = [edge("A", 500)];
        let asked_2 = [edge("B", b_priority), edge("C", 500)];
        let base = graph.store().now_micros() + 1_000;
        let (at_1, at_2) = if later == 1 { (base + 10, base) } else { (base, base + 10) };
        let (_, writes_1) = Graph::diff(&domain, child.as_str(), stored.clone(), &wanted(&child, &asked_1), at_1);
        let (_, writes_2) = Graph::diff(&domain, child.as_str(), stored, &wanted(&child, &asked_2), at_2);
        // The later clock's writes arrive first: a cut heals, hints replay.
        let (first, second) = if later == 1 { (writes_1, writes_2) } else { (writes_2, writes_1) };
        graph.store().apply_grouped(first).await.expect("first site's writes");
        graph.store().apply_grouped(second).await.expect("second site's writes");

        let expected: BTreeSet<(String, i64)> =
            if later == 1 { [("A".to_owned(), 500)].into() } else { [("B".to_owned(), b_priority), ("C".to_owned(), 500)].into() };
        assert_eq!(by_child(&graph, &domain, &child).await, expected, "the later replace's set, by child");
        for (parent, priority) in &expected {
            assert_eq!(listed_at(&graph, parent, &child).await, vec![*priority], "{parent}'s dependents list the page once");
        }
        // A parent the later set dropped no longer lists the page at a
        // priority both sites knew; it may list it where only the earlier
        // replace wrote (C, and B at 700, when {A} wins: rows the winning
        // site never saw): a dependent too many, a re-render too many,
        // which the janitor's graph task removes.
        for parent in ["A", "B"] {
            if !expected.iter().any(|(p, _)| p == parent) {
                assert!(!listed_at(&graph, parent, &child).await.contains(&500), "{parent} no longer lists the page at 500");
            }
        }
        let sweep = graph
            .sweep(Pass::Edges(Direction::Dependents), SweepPosition::default(), Budget::of_partitions(1000), true, 100)
            .await
            .expect("the janitor's graph check");
        let surplus = match (b_priority, later) {
            (_, 2) => 0,
            (500, _) => 1,
            _ => 2,
        };
        assert_eq!(sweep.listed.len(), surplus, "{:?}", sweep.listed);
        for parent in ["A", "B", "C"] {
            let at: Vec<i64> = expected.iter().filter(|(p, _)| p == parent).map(|(_, priority)| *priority).collect();
            assert_eq!(listed_at(&graph, parent, &child).await, at, "after the janitor's check, {parent}'s dependents");
        }
    }
}

#[tokio::test]
async fn concurrent_replaces_converge_to_one_set_asked_for_embedded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::new(Arc::new(EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).expect("open")));
    store.migrate(&[&revstore_schema::version::DEPENDENCY_GRAPH]).await.expect("migrate");
    concurrent_replaces_converge_to_one_set_asked_for(store).await;
}

#[tokio::test]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn concurrent_replaces_converge_to_one_set_asked_for_cassandra() {
    let keyspace = TestKeyspace::new("graph_race");
    let store = Store::new(Arc::new(keyspace.connect().await));
    store.migrate(&[&revstore_schema::version::DEPENDENCY_GRAPH]).await.expect("migrate");
    concurrent_replaces_converge_to_one_set_asked_for(store).await;
}
