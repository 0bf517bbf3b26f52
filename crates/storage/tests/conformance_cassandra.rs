//! The conformance suite on a real Cassandra (or ScyllaDB), one keyspace per test.
//!
//! `REVSTORE_TEST_CASSANDRA` names a node (`host:port`); `scripts/test` starts a
//! local Cassandra and sets it. These tests are `#[ignore]`d so a plain
//! `cargo test` without a cluster shows them as not run; when they are run and
//! the variable is missing or the node cannot be reached, they fail.

mod conformance_cassandra {
    use std::sync::Arc;

    use revstore_storage::Store;
    use revstore_storage::conformance::{Subject, TABLES};
    use revstore_storage::testing::TestKeyspace;

    pub(crate) async fn subject() -> Subject {
        let keyspace = TestKeyspace::new("conformance");
        let engine = Arc::new(keyspace.connect().await);
        let store = Store::new(engine);
        store.ensure_tables(&TABLES).await.expect("create the test keyspace and tables");
        Subject { store, advance: Arc::new(|by| Box::pin(tokio::time::sleep(by))), guard: Box::new(keyspace) }
    }

    revstore_storage::conformance_suite!(
        subject,
        [ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
    );
}

/// A datacenter named with a bare factor creates the keyspace with
/// NetworkTopologyStrategy in that datacenter (the local node's is `datacenter1`).
#[tokio::test]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn a_named_datacenter_gets_network_topology_replication() {
    use revstore_storage::{CassandraEngine, Engine};

    let keyspace = revstore_storage::testing::TestKeyspace::new("datacenter");
    let mut options = keyspace.options();
    // A bare factor: the test's own (`REVSTORE_CASSANDRA_REPLICATION`, 3 on the local cluster) or 1.
    let factor = match options.replication {
        revstore_schema::cql::Replication::Simple { factor } => factor,
        revstore_schema::cql::Replication::NetworkTopology { .. } => 1,
    };
    options.replication = revstore_schema::cql::Replication::Simple { factor };
    options.datacenter = Some("datacenter1".to_owned());
    let engine = CassandraEngine::connect(options).await.expect("connect");
    engine.ensure_tables(&revstore_storage::conformance::TABLES).await.expect("create the keyspace");
    let result = engine
        .session()
        .query_unpaged("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?", (keyspace.name(),))
        .await
        .expect("read the keyspace's replication");
    let rows = result.into_rows_result().expect("rows");
    let (replication,): (std::collections::HashMap<String, String>,) = rows.single_row().expect("one keyspace");
    assert_eq!(
        replication.get("class").map(String::as_str),
        Some("org.apache.cassandra.locator.NetworkTopologyStrategy"),
        "{replication:?}"
    );
    assert_eq!(replication.get("datacenter1").cloned(), Some(factor.to_string()), "{replication:?}");
}
