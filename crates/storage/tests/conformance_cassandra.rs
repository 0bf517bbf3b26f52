//! The conformance suite on a real Cassandra (or ScyllaDB), one keyspace per test.
//!
//! `REVSTORE_TEST_CASSANDRA` names a node (`host:port`); `scripts/test` starts a
//! local Cassandra and sets it. These tests are `#[ignore]`d so a plain
//! `cargo test` without a cluster shows them as not run; when they are run and
//! the variable is missing or the node cannot be reached, they fail.

mod conformance_cassandra {
    use std::sync::Arc;

    use revstore_storage::conformance::{Subject, TABLES};
    use revstore_storage::{CassandraEngine, CassandraOptions, Store};

    /// Drops the test's keyspace when the test ends.
    struct KeyspaceGuard(Arc<CassandraEngine>);

    impl Drop for KeyspaceGuard {
        fn drop(&mut self) {
            let engine = self.0.clone();
            let handle = tokio::runtime::Handle::current();
            // Drop runs on a runtime thread: block on another one.
            std::thread::spawn(move || {
                let drop_keyspace = format!("DROP KEYSPACE IF EXISTS \"{}\"", engine.keyspace());
                handle.block_on(engine.session().query_unpaged(drop_keyspace, ())).expect("drop the test keyspace");
            })
            .join()
            .expect("keyspace cleanup");
        }
    }

    pub(crate) async fn subject() -> Subject {
        let node = std::env::var("REVSTORE_TEST_CASSANDRA")
            .expect("REVSTORE_TEST_CASSANDRA must name the Cassandra node to test against (scripts/test starts one)");
        let keyspace = format!("conformance_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let engine = CassandraEngine::connect(CassandraOptions::new([node.clone()], keyspace))
            .await
            .unwrap_or_else(|e| panic!("cannot reach Cassandra at {node}: {e}"));
        let engine = Arc::new(engine);
        let store = Store::new(engine.clone());
        store.ensure_tables(&TABLES).await.expect("create the test keyspace and tables");
        Subject { store, advance: Arc::new(|by| Box::pin(tokio::time::sleep(by))), guard: Box::new(KeyspaceGuard(engine)) }
    }

    revstore_storage::conformance_suite!(
        subject,
        [ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
    );
}
