//! A page's writer row, taken by every change of the page's edges and given
//! back after it, leaves nothing for a scan to step over: every page has one,
//! and the janitor's sweeps read them all.

mod common;

use std::sync::Arc;

use common::{DOMAIN, Engine, Guard, TOKEN, preloaded};
use revstore_schema::tables::dependency_graph::PAGE_WRITERS;
use revstore_storage::{ScanQuery, Store};
use serde_json::json;

#[tokio::test]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn giving_a_pages_writer_row_back_leaves_no_tombstone() {
    let (service, guard) = preloaded(Engine::Cassandra, |_| async {}).await;
    let http = reqwest::Client::new();
    for page in 0..40 {
        let edges = json!({"edges": [{"parent": "Template:Infobox", "type": "modification", "priority": 500}]});
        let answer = http
            .put(service.url(&format!("/{DOMAIN}/v1/deps/Writer_page_{page}")))
            .bearer_auth(TOKEN)
            .json(&edges)
            .send()
            .await
            .expect("put");
        assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap_or_default());
    }
    let Guard::Keyspace(keyspace, _) = &guard else { unreachable!("a Cassandra keyspace") };
    let store = Store::new(Arc::new(keyspace.connect().await));
    // A scan of every page's writer row, as the janitor's sweeps read them.
    let held = store.holdings(&ScanQuery::new(&PAGE_WRITERS, 1000)).await.expect("scan");
    assert_eq!(held.partitions, 40);
    let health = store.read_health(&PAGE_WRITERS).await.expect("read health").expect("Cassandra measures it");
    // Given back by nulling two columns, each row kept two tombstones: 80 in
    // this scan. (Cassandra's histogram reports reads that met none in its
    // lowest bucket, 1.)
    assert!(health.tombstones_per_read_max <= 1, "{health:?}");
}
