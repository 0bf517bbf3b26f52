//! Cassandra stopped while the engine is in use: calls fail fast with a typed
//! `Unavailable` error (never past the request timeout), and the engine recovers
//! on its own once Cassandra is back.
//!
//! The test starts, stops and restarts a node of its own with
//! `deploy/cassandra/cassandra-local` on `REVSTORE_TEST_FAULT_PORT` (default
//! 19042), so it never disturbs the node the conformance suite uses.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use revstore_storage::conformance::KV;
use revstore_storage::{CassandraEngine, CassandraOptions, Store, StoreError, Upsert, Value};

struct Node {
    script: PathBuf,
    port: String,
}

impl Node {
    fn run(&self, args: &[&str]) {
        let status =
            Command::new(&self.script).args(args).env("REVSTORE_CASSANDRA_PORT", &self.port).status().expect("run cassandra-local");
        assert!(status.success(), "cassandra-local {args:?} failed on port {}", self.port);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new(&self.script).arg("wipe").env("REVSTORE_CASSANDRA_PORT", &self.port).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "starts and stops a Cassandra node of its own: run by scripts/test, or with --ignored"]
async fn calls_fail_fast_while_cassandra_is_down_and_recover_after() {
    let node = Node {
        script: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/cassandra/cassandra-local"),
        port: std::env::var("REVSTORE_TEST_FAULT_PORT").unwrap_or_else(|_| "19042".into()),
    };
    node.run(&["start", "--fresh"]);

    let timeout = Duration::from_secs(2);
    let mut options = CassandraOptions::new([format!("127.0.0.1:{}", node.port)], "faults");
    options.request_timeout = timeout;
    let store = Store::new(Arc::new(CassandraEngine::connect(options).await.expect("connect")));
    store.ensure_tables(&[&KV]).await.expect("tables");
    let write = |v: &'static str| Upsert::new(&KV, [Value::from("key")]).set("v", v);
    store.write(write("before")).await.expect("write while up");

    node.run(&["stop"]);
    for attempt in 0..3 {
        let started = Instant::now();
        let result = store.write(write("while down")).await;
        let took = started.elapsed();
        assert!(matches!(result, Err(StoreError::Unavailable(_))), "attempt {attempt}: {result:?}");
        // Bounded by the timeout, not by the driver's own (far longer) waits;
        // the slack is for a busy machine.
        assert!(took < timeout * 3 + Duration::from_secs(2), "attempt {attempt} took {took:?}, past the {timeout:?} timeout");
        let started = Instant::now();
        let read = store.get(&KV, vec![Value::from("key")], None).await;
        assert!(matches!(read, Err(StoreError::Unavailable(_))), "attempt {attempt}: {read:?}");
        assert!(started.elapsed() < timeout * 3 + Duration::from_secs(2));
    }
    assert!(matches!(store.ping().await, Err(StoreError::Unavailable(_))));

    node.run(&["start"]);
    // The same engine, no reconnect by the caller: the driver finds the node again.
    let deadline = Instant::now() + Duration::from_secs(120);
    let row = loop {
        match store.get(&KV, vec![Value::from("key")], None).await {
            Ok(row) => break row,
            Err(StoreError::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the engine did not recover: {e}"),
        }
    };
    assert_eq!(row.and_then(|r| r.text("v").map(str::to_owned)).as_deref(), Some("before"), "data written before the outage");
    store.write(write("after")).await.expect("write after recovery");
    store.ping().await.expect("ping after recovery");
}
