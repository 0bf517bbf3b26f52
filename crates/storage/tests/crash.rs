//! A `kill -9` during writes loses no acknowledged write.
//!
//! The test re-runs its own binary as a child process (the ignored
//! `child_process_crash_writer` test) which writes from many tasks at once and prints
//! `ack <n>` after each write is acknowledged. The parent kills it with SIGKILL
//! mid-stream, reopens the database and checks that every acknowledged write is
//! there and intact.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use revstore_schema::model::ColumnType::{BigInt, Blob, Text};
use revstore_schema::{Column as C, Compaction, Order, TableDef};
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ReadQuery, Store, Upsert, Value};

static LOG: TableDef = TableDef {
    name: "crash_log",
    columns: &[C::partition("writer", Text), C::clustering("n", BigInt, Order::Asc), C::regular("payload", Blob)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "",
};

const WRITERS: u64 = 16;
const CHILD_DIR: &str = "REVSTORE_CRASH_CHILD_DIR";

fn payload(n: i64) -> Vec<u8> {
    n.to_be_bytes().iter().cycle().take(2048).copied().collect()
}

/// Runs only as the child of `kill_9_loses_no_acknowledged_write`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of kill_9_loses_no_acknowledged_write"]
async fn child_process_crash_writer() {
    let dir = std::env::var(CHILD_DIR).expect("run by the crash test");
    let store = Store::new(Arc::new(EmbeddedEngine::open(dir.as_ref(), EmbeddedOptions::default()).expect("open")));
    store.ensure_tables(&[&LOG]).await.expect("tables");
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0i64.. {
                store
                    .write(Upsert::new(&LOG, [Value::from(format!("w{w}")), Value::from(n)]).set("payload", payload(n)))
                    .await
                    .expect("write");
                // One line per acknowledged write; stdout is line-buffered into the pipe.
                println!("ack w{w} {n}");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
}

#[test]
fn kill_9_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["child_process_crash_writer", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut acked: Vec<(String, i64)> = Vec::new();
    let started = Instant::now();
    while acked.len() < 3000 && started.elapsed() < Duration::from_secs(120) {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.strip_prefix("ack ") {
            let (w, n) = rest.split_once(' ').expect("ack line");
            acked.push((w.to_owned(), n.parse().expect("number")));
        }
    }
    child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
    child.wait().expect("reap");
    // Acks already in the pipe were acknowledged before the kill: count them too.
    for line in lines.map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("ack ") {
            let (w, n) = rest.split_once(' ').expect("ack line");
            acked.push((w.to_owned(), n.parse().expect("number")));
        }
    }
    assert!(acked.len() >= 1000, "the child acknowledged only {} writes", acked.len());

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = Store::new(Arc::new(EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).expect("reopen after crash")));
        store.ensure_tables(&[&LOG]).await.expect("tables");
        for w in 0..WRITERS {
            let writer = format!("w{w}");
            let rows = store.read(&ReadQuery::new(&LOG, [Value::from(writer.clone())])).await.expect("read").rows;
            let stored: std::collections::HashMap<i64, Vec<u8>> =
                rows.iter().map(|r| (r.bigint("n").expect("n"), r.blob("payload").expect("payload").to_vec())).collect();
            for (_, n) in acked.iter().filter(|(aw, _)| *aw == writer) {
                let found = stored.get(n).unwrap_or_else(|| panic!("acknowledged write {writer}/{n} lost after kill -9"));
                assert_eq!(found, &payload(*n), "write {writer}/{n} damaged");
            }
        }
    });
    eprintln!("{} writes acknowledged before SIGKILL; all of them found intact", acked.len());
}
