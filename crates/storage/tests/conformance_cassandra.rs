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

/// A table created before its options were declared (Cassandra's defaults:
/// day-long windows, ten days of gc_grace_seconds) gets them in place when
/// the tables are ensured again, with its rows untouched.
#[tokio::test]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn declared_table_options_are_applied_in_place() {
    use revstore_storage::conformance::EXPIRING;
    use revstore_storage::{CassandraEngine, Engine};

    let keyspace = revstore_storage::testing::TestKeyspace::new("options");
    let engine = CassandraEngine::connect(keyspace.options()).await.expect("connect");
    engine.ensure_tables(&[&EXPIRING]).await.expect("create");
    let describe = || async {
        let result = engine
            .session()
            .query_unpaged(
                "SELECT compaction, gc_grace_seconds FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?",
                (keyspace.name(), EXPIRING.name),
            )
            .await
            .expect("describe");
        let rows = result.into_rows_result().expect("rows");
        let found: (std::collections::HashMap<String, String>, i32) = rows.single_row().expect("one table");
        found
    };
    let (compaction, gc_grace) = describe().await;
    assert_eq!(compaction.get("compaction_window_unit").map(String::as_str), Some("HOURS"), "{compaction:?}");
    assert_eq!(gc_grace, 10_800);

    // As an earlier version left it.
    let table = format!("\"{}\".\"{}\"", keyspace.name(), EXPIRING.name);
    let defaults =
        format!("ALTER TABLE {table} WITH compaction = {{'class': 'TimeWindowCompactionStrategy'}} AND gc_grace_seconds = 864000");
    engine.session().query_unpaged(defaults, ()).await.expect("alter back");
    engine.session().await_schema_agreement().await.expect("agreement");
    assert_eq!(describe().await.1, 864_000);

    engine.ensure_tables(&[&EXPIRING]).await.expect("ensure again");
    let (compaction, gc_grace) = describe().await;
    assert_eq!(gc_grace, 10_800, "gc_grace_seconds applied");
    assert_eq!(compaction.get("compaction_window_size").map(String::as_str), Some("1"), "{compaction:?}");
    assert_eq!(compaction.get("unchecked_tombstone_compaction").map(String::as_str), Some("true"), "{compaction:?}");
}

/// The read health the audit reports comes from the nodes: a partition read
/// from its start after most of its rows were deleted one by one (the
/// outbox's old layout) shows every tombstone the read stepped over; an
/// untouched table shows none.
#[tokio::test]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn read_health_shows_the_tombstones_a_read_steps_over() {
    use revstore_storage::conformance::{KV, TIMELINE};
    use revstore_storage::{Delete, ReadQuery, Upsert, Value};

    let keyspace = revstore_storage::testing::TestKeyspace::new("health");
    let store = revstore_storage::Store::new(std::sync::Arc::new(keyspace.connect().await));
    store.ensure_tables(&[&TIMELINE, &KV]).await.expect("create");
    let ids = revstore_keys::TidGenerator::new();
    let key = [Value::from("queue")];
    let mut written = Vec::new();
    for i in 0..300 {
        let id = ids.next();
        store.write(Upsert::new(&TIMELINE, [Value::from("queue"), Value::from(id)]).set("v", format!("row {i}"))).await.expect("write");
        written.push(id);
    }
    // The newest 250: the table is ordered newest first, so every read from
    // the partition's start steps over them to reach the live rows.
    let deleted = 250;
    for id in &written[written.len() - deleted..] {
        store.write(Delete::row(&TIMELINE, key.clone(), [Value::from(*id)])).await.expect("delete");
    }
    for _ in 0..20 {
        let page = store.read(&ReadQuery::new(&TIMELINE, key.clone()).limit(10)).await.expect("read");
        assert_eq!(page.rows.len(), 10);
    }
    let health = store.read_health(&TIMELINE).await.expect("read health").expect("Cassandra measures it");
    assert!(health.nodes >= 1, "{health:?}");
    assert!(health.tombstones_per_read_max >= deleted as u64, "every deleted row is a tombstone a read stepped over: {health:?}");
    let untouched = store.read_health(&KV).await.expect("read health").expect("Cassandra measures it");
    assert_eq!(untouched.tombstones_per_read_max, 0, "{untouched:?}");
}
