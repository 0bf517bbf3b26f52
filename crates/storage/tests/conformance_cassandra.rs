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
